"""Mooncake Store as a peer of the block benchmark: its venv's keying, the libraries it needs,
its servers' readiness, its same-host pool ring, and its place in the benchmark's cells and report.

The last test starts a real master and store node and reads through each driver when the
locked venv is built (bench/blocks.py builds it on its first run with a Mooncake system).
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench import mooncake_peer
from bench.blocks import plan_cells, plan_ratio_round
from bench.harness import report
from bench.harness.cells import Cell
from bench.harness.servers import Endpoint
from bench.harness.workload import RING_BYTES, CellSpec
from bench.mooncake_peer.drivers import RING_POOL_BYTES, PoolRing
from bench.mooncake_peer.env import ENVIRONMENT, MooncakeUnavailable, debian_packages, installed, missing_libraries
from bench.mooncake_peer.servers import MASTER_READY, NODE_READY, announced_port, mooncake_servers
from tests.environments import CACHE, ROOT, Environment

KiB, MiB, PAGE = 1 << 10, 1 << 20, 4096

# What ldd printed for the wheel's store.so on a Debian 12 machine without libibverbs1.
LDD_WITHOUT_IBVERBS = """\
/x/mooncake/store.so:
\tlinux-vdso.so.1 (0x00007ffd3a1f2000)
\tlibibverbs.so.1 => not found
\tlibglog-6ed04f2c.so.0.0.0 => /x/mooncake_transfer_engine_non_cuda.libs/libglog-6ed04f2c.so.0.0.0 (0x00007f6f)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f6f1c000000)
/x/mooncake/mooncake_master:
\tlibibverbs.so.1 => not found
"""


def test_the_venv_is_keyed_by_the_lock_file_bytes(tmp_path: Path) -> None:
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("mooncake-transfer-engine-non-cuda==0.3.13.post1\n")
    second.write_text("mooncake-transfer-engine-non-cuda==0.3.14\n")
    homes = [Environment("mooncake", str(path), ()).home for path in (first, second, first)]
    assert homes[0] == homes[2] != homes[1], homes
    assert all(home.parent == CACHE and re.fullmatch(r"mooncake-[0-9a-f]{16}", home.name) for home in homes), homes
    assert ENVIRONMENT.home.name == f"mooncake-{ENVIRONMENT.digest()}"


def test_the_lock_pins_the_non_cuda_wheel_by_version_and_hash() -> None:
    lines = [line for line in (ROOT / ENVIRONMENT.lock).read_text().splitlines() if line and not line.startswith("#")]
    assert len(lines) == 1, lines
    pinned = re.fullmatch(r"(\S+)==(\S+) --hash=sha256:([0-9a-f]{64})", lines[0])
    assert pinned is not None, lines[0]
    assert pinned.group(1, 2) == ("mooncake-transfer-engine-non-cuda", "0.3.13.post1"), lines[0]


def test_missing_libraries_come_from_ldds_not_found_lines_each_once() -> None:
    assert missing_libraries(LDD_WITHOUT_IBVERBS) == ["libibverbs.so.1"]
    assert debian_packages(missing_libraries(LDD_WITHOUT_IBVERBS)) == ["libibverbs1"]
    resolved = subprocess.run(["ldd", sys.executable], capture_output=True, text=True).stdout
    assert "=>" in resolved and missing_libraries(resolved) == [], resolved
    with pytest.raises(MooncakeUnavailable, match=r"libcuda\.so\.1"):
        debian_packages(["libibverbs.so.1", "libcuda.so.1"])


def test_a_server_is_ready_on_the_port_its_last_announcement_names() -> None:
    master_log = (
        "W1202 04:14:16.7 master.cpp:1500] something else on port 9\n"
        "I1202 04:14:16.733354  9218 master.cpp:1522] Master service started on port 31051, max_threads=2\n"
    )
    assert announced_port(master_log, MASTER_READY) == 31051
    node_log = (
        "I1202 04:14:18.817219  9337 real_client.cpp:1026] Mounting segment: 1073741824 bytes\n"
        "I1202 04:14:18.819199  9337 real_client_main.cpp:147] Starting real client service on 127.0.0.1:31054\n"
    )
    assert announced_port(node_log, NODE_READY) == 31054
    assert announced_port(node_log + node_log.replace("31054", "40000"), NODE_READY) == 40000
    assert announced_port("I1202 Mounting segment: 1073741824 bytes\n", NODE_READY) is None
    assert announced_port("", MASTER_READY) is None


@pytest.mark.parametrize("size", [64 * KiB, 384 * KiB, 2 * MiB])
@pytest.mark.parametrize("shift", [0, 16, 64])
def test_a_bursts_blocks_in_the_pool_ring_never_overlap_and_keep_their_shift(size: int, shift: int) -> None:
    address = 0x7F00_0000_0000 + 1234  # the pool need not start on a page
    ring = PoolRing(address)
    per_ring = RING_BYTES // size  # the most blocks one burst reads (the harness's ring holds that many)
    for burst in range(3):
        offsets = [ring.next(size, shift) for _ in range(per_ring)]
        assert all((address + o) % PAGE == shift for o in offsets), f"burst {burst}: a block lost its shift"
        spans = sorted((o, o + size) for o in offsets)
        assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans)), f"burst {burst}: overlap"
        assert spans[0][0] >= 0 and spans[-1][1] <= RING_POOL_BYTES, (spans[0], spans[-1], RING_POOL_BYTES)


def test_mooncake_cells_count_the_store_node_and_the_master_as_the_server() -> None:
    node = Endpoint("127.0.0.1:5", 101, also=(102,))
    endpoints: dict[str, Endpoint | None] = {"mooncake": node, "kvpool": Endpoint("127.0.0.1:6", 200)}
    specs = plan_cells(endpoints, ["mooncake", "kvpool", "memcpy"], 0.1, (0, 16))
    assert {s.server_pids for s in specs if s.system == "mooncake"} == {(101, 102)}
    assert {s.server_pids for s in specs if s.system == "kvpool"} == {(200,)}
    assert {s.server_pids for s in specs if s.system == "memcpy"} == {()}
    assert len({s.tag for s in specs}) == len(specs), "two cells share keys: Mooncake's put would not overwrite"
    shapes = {(s.system, s.batch, s.clients) for s in plan_ratio_round(endpoints, ["kvpool", "mooncake"], 0.1, 0)}
    assert ("mooncake", 1, 1) in shapes and ("mooncake-zc", 1, 1) not in shapes, shapes


def test_the_report_compares_kvpool_with_each_way_of_reading_mooncake_and_names_the_pool_destination() -> None:
    def cell(system: str, gbps: float, offset: int = 0) -> Cell:
        return Cell(system, "get", report.RATIO_BLOCK, 1, 1, gbps=gbps, ops_per_s=1.0, dest_offset=offset)

    cells = [
        cell("kvpool", 1.5), cell("kvpool-shm", 6.0), cell("mooncake", 0.5), cell("mooncake-zc", 0.75),
        cell("mooncake-local", 1.5), cell("mooncake-local-zc", 3.0), cell("mooncake-local-zc", 2.0, 16),
    ]  # fmt: skip
    by_top_bottom = {
        (s.top[0], s.bottom[0]): r for s, r in zip(report.RATIO_SPECS, report.ratios(cells, 2), strict=True)
    }
    assert by_top_bottom[("kvpool", "mooncake")].value == 3.0
    assert by_top_bottom[("kvpool", "mooncake-zc")].value == 2.0
    assert by_top_bottom[("kvpool-shm", "mooncake-local")].value == 4.0
    assert by_top_bottom[("kvpool-shm", "mooncake-local-zc")].verdict == "BELOW TARGET"
    rows = {tuple(row.split(" | ")[4:6]) for row in report.markdown_table(cells).splitlines()[2:]}
    assert ("mooncake-local-zc", "mooncake pool page+16") in rows and ("mooncake", "page+0") in rows, rows


_READ_EVERY_WAY = textwrap.dedent(
    """
    import sys
    import numpy as np
    from bench.harness.drivers import BenchError
    from bench.mooncake_peer.drivers import open_mooncake
    from bench.harness.workload import BlockRef, page_aligned

    master, node = sys.argv[1:]
    blocks = page_aligned(4 * 65536)
    blocks[:] = np.random.default_rng(7).integers(0, 256, blocks.nbytes, dtype=np.uint8)
    refs = [BlockRef(b"key-%d" % i, i * 65536) for i in range(4)]
    sources = [blocks[r.offset : r.offset + 65536].data for r in refs]
    for system, endpoint in (("mooncake", master), ("mooncake-zc", master),
                             ("mooncake-local", node), ("mooncake-local-zc", node)):
        driver = open_mooncake(system, endpoint)
        mine = [BlockRef(system.encode() + r.key, r.offset) for r in refs]
        request = driver.prepare(mine, 65536)
        driver.put(request[:1], sources[:1])
        driver.put(request[1:], sources[1:])
        targets = [page_aligned(65536 + 4096)[16 : 16 + 65536] for _ in refs]
        got = list(driver.get(request[:1], targets[:1])) + list(driver.get(request[1:], targets[1:]))
        assert all(bytes(g) == bytes(s) for g, s in zip(got, sources)), system
        driver.forget(mine)
        try:
            driver.get(request[:1], targets[:1])
        except BenchError:
            print(system, "ok", flush=True)  # read back what it wrote, and nothing once forgotten
        driver.close()
    """
)


@pytest.mark.skipif(installed() is None, reason="Mooncake's venv is not built (bench/blocks.py builds it)")
def test_each_driver_reads_back_what_it_wrote_through_a_real_master_and_store_node() -> None:
    with mooncake_servers(256 * MiB, install_packages=False) as servers:
        assert servers is not None
        run = subprocess.run([sys.executable, "-c", _READ_EVERY_WAY, servers.master, servers.store_node],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
        pids = (servers.master_pid, servers.store_node_pid)
    ok = [line.split()[0] for line in run.stdout.splitlines() if line.endswith(" ok")]
    assert ok == list(mooncake_peer.SYSTEMS), f"rc {run.returncode}\n{run.stdout}\n{run.stderr[-3000:]}"
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids), f"still running after the block: {pids}"


def test_a_cell_spec_without_a_server_has_no_server_processes() -> None:
    spec = CellSpec("memcpy", "copy", 64 * KiB, 1, 1, "", 0.1, b"t" * 8)
    assert spec.server_pids == ()
