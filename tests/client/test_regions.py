"""Blocks held in several spans of memory (Regions) against a real daemon, over TCP and shared memory.

A get into regions must leave in them exactly what a get into one buffer gets, and a put from
regions must store exactly what a put of the joined bytes stores, whatever the spans' sizes:
the regions are a destination of the one get path, not another path.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpool_client import BlockKey, ClientConfig, KVPoolClient
from kvpool_client.buffers import Regions, regions
from kvpool_client.core.errors import ErrorCode, UsageError
from tests.support.daemon import DaemonProcess, running_daemon

NS = "regions@bf16@test@tp0of1"
TRANSPORTS = ("tcp", "shm")
_serial = itertools.count()


@pytest.fixture(scope="module")
def pool_daemon() -> Iterator[DaemonProcess]:
    with running_daemon("--dram-capacity", "64MiB", "--slab-size", "1MiB") as daemon:
        yield daemon


@pytest.fixture(scope="module")
def clients(pool_daemon: DaemonProcess) -> Iterator[dict[str, KVPoolClient]]:
    made = {t: KVPoolClient(config=ClientConfig(nodes=(pool_daemon.address,), transport=t)) for t in TRANSPORTS}
    yield made
    for client in made.values():
        client.close()


def fresh_keys(count: int) -> list[BlockKey]:
    serial = next(_serial)
    return [BlockKey(NS, f"{serial}-{i}".encode().ljust(32, b"."), i) for i in range(count)]


def split(data: bytes, cuts: list[int]) -> list[bytearray]:
    """``data`` in spans cut at ``cuts`` (fractions of its length), each span its own buffer."""
    points = sorted({0, len(data), *(c * len(data) // 1000 for c in cuts)})
    return [bytearray(data[a:b]) for a, b in itertools.pairwise(points) if b > a]


def joined(target: Regions) -> bytes:
    return b"".join(bytes(v) for v in target.views)


blocks = st.lists(st.binary(min_size=1, max_size=40_000), min_size=1, max_size=4)
cut_lists = st.lists(st.integers(1, 999), max_size=12)
PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("transport", TRANSPORTS)
@given(data=blocks, cuts=cut_lists, verify=st.booleans())
@PROPERTY
def test_a_get_into_regions_fills_them_as_a_get_into_one_buffer(
    clients: dict[str, KVPoolClient], transport: str, data: list[bytes], cuts: list[int], verify: bool
) -> None:
    client = clients[transport]
    keys = fresh_keys(len(data))
    assert client.put(keys, data).stored == len(data)
    targets = [regions(split(bytes(len(d)), cuts), writable=True) for d in data]
    reader = client if not verify else KVPoolClient(config=dataclasses.replace(client.config, verify_checksums=True))
    try:
        result = reader.get(keys, targets)
    finally:
        if reader is not client:
            reader.close()
    assert result.statuses == (ErrorCode.OK,) * len(data), result.statuses
    assert [joined(t) for t in targets] == data, "regions hold other bytes than the block"
    flat = client.get(keys).buffers
    assert [bytes(b) for b in flat if b is not None] == data


@pytest.mark.parametrize("transport", TRANSPORTS)
@given(data=blocks, cuts=cut_lists)
@PROPERTY
def test_a_put_from_regions_stores_the_joined_bytes(
    clients: dict[str, KVPoolClient], transport: str, data: list[bytes], cuts: list[int]
) -> None:
    client = clients[transport]
    keys = fresh_keys(len(data))
    sources = [regions(split(d, cuts), writable=False) for d in data]
    assert client.put(keys, sources).stored == len(data)
    assert [bytes(b) for b in client.get(keys).buffers if b is not None] == data


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_regions_of_another_size_are_a_size_mismatch_and_left_as_they_were(
    clients: dict[str, KVPoolClient], transport: str
) -> None:
    client = clients[transport]
    keys = fresh_keys(2)
    client.put(keys, [b"a" * 5000, b"b" * 5000]).raise_for_errors()
    short = regions([bytearray(2000), bytearray(2000)], writable=True)
    result = client.get(keys, [short, regions([bytearray(5000)], writable=True)])
    assert result.statuses == (ErrorCode.SIZE_MISMATCH, ErrorCode.OK)
    assert joined(short) == bytes(4000), "a mismatched destination is left untouched"


def test_read_only_regions_are_refused_as_a_destination(clients: dict[str, KVPoolClient]) -> None:
    keys = fresh_keys(1)
    with pytest.raises(UsageError, match="read-only"):
        clients["tcp"].get(keys, [regions([bytearray(8)], writable=False)])
    with pytest.raises(UsageError, match="at least one region"):
        regions([], writable=True)
