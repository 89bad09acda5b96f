"""One-key GETs over TCP answered by a live daemon's compiled sender, from its published index.

The daemon sends a published block of up to 256 KiB without its DRAM tier's Python; its
counters show it (``shared_index_sends``). Larger blocks, misses, a daemon without the
index and one that verifies checksums before sending take the Python path, with the
same answers. (That a block read this way keeps its place in the eviction order is tested
with the same-node reads', in ``tests/wire/test_shm_index_daemon.py``.)
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvpool_client import ErrorCode
from tests.client.test_transports import connect, new_keys, pattern
from tests.support.daemon import DaemonProcess
from tests.wire.test_shm_index_daemon import SMALL, counter

pytestmark = pytest.mark.integration
pytest.importorskip("kvpool_client.core.wire._arena_reader", reason="the compiled reader was not built here")

OK, NOT_FOUND = ErrorCode.OK, ErrorCode.NOT_FOUND
KiB = 1 << 10


def test_one_key_gets_of_published_blocks_are_sent_by_the_compiled_sender(
    daemon_factory: Callable[..., DaemonProcess],
) -> None:
    daemon = daemon_factory(*SMALL)
    small, (large,) = new_keys(4), new_keys(1)
    with connect(daemon, "tcp") as client:
        assert client.put(small, [pattern(k, 64 * KiB) for k in small]).stored == 4
        assert client.put([large], [pattern(large, 384 * KiB)]).stored == 1
        before = counter(client, daemon, "shared_index_sends")
        for key in small:
            got = client.get([key], [bytearray(64 * KiB)])
            assert got.statuses == (OK,) and bytes(got.buffers[0]) == pattern(key, 64 * KiB)
        assert counter(client, daemon, "shared_index_sends") == before + 4
        got = client.get([large], [bytearray(384 * KiB)])  # over 256 KiB: the Python path, which lets the GIL go
        assert got.statuses == (OK,) and bytes(got.buffers[0]) == pattern(large, 384 * KiB)
        assert client.get(new_keys(1), [bytearray(64 * KiB)]).statuses == (NOT_FOUND,)
        assert counter(client, daemon, "shared_index_sends") == before + 4


@pytest.mark.parametrize("flags", [("--shared-index-entries", "0"), ("--verify-checksum-on-get",)])
def test_without_the_index_or_with_checksums_verified_the_python_path_answers(
    daemon_factory: Callable[..., DaemonProcess], flags: tuple[str, ...]
) -> None:
    daemon = daemon_factory(*SMALL, *flags)
    keys = new_keys(3)
    with connect(daemon, "tcp") as client:
        assert client.put(keys, [pattern(k, 64 * KiB) for k in keys]).stored == 3
        for key in keys:
            got = client.get([key], [bytearray(64 * KiB)])
            assert got.statuses == (OK,) and bytes(got.buffers[0]) == pattern(key, 64 * KiB)
        assert counter(client, daemon, "shared_index_sends") == 0
        assert counter(client, daemon, "dram_hits") == 3
