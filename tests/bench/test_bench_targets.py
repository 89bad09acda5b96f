"""The transports benchmark's target ratios: from one pass, and as medians of interleaved rounds."""

from __future__ import annotations

from bench.harness import report
from bench.harness.cells import Cell as BlockCell
from bench.transports import TARGETS, Cell, target_ratios, target_shapes, targets

KiB, MiB = 1 << 10, 1 << 20


def cells(gbps: dict[tuple[str, int, int], float]) -> list[Cell]:
    return [Cell(system, block, clients, value, 1) for (system, block, clients), value in gbps.items()]


def every_target_cell(value: float) -> dict[tuple[str, int, int], float]:
    return {shape: value for shape in target_shapes(("memcpy", "tcp", "ucx", "shm"))}


def test_each_shape_is_measured_once_and_only_for_systems_present() -> None:
    shapes = target_shapes(("memcpy", "tcp", "shm"))
    assert len(shapes) == len(set(shapes))
    assert {system for system, _, _ in shapes} == {"memcpy", "tcp", "shm"}  # no ucx cell without ucx
    assert ("ucx", 2 * MiB, 1) in target_shapes(("memcpy", "tcp", "ucx", "shm"))


def test_a_ratio_is_its_two_cells_and_none_when_one_is_missing() -> None:
    gbps = every_target_cell(1.0) | {("ucx", 2 * MiB, 1): 5.0, ("tcp", 2 * MiB, 1): 2.5}
    del gbps[("shm", 384 * KiB, 4)]
    by_name = dict(zip((spec.name for spec in TARGETS), target_ratios(cells(gbps)), strict=True))
    assert by_name["ucx / tcp, 2 MiB x32, 1 client"] == 2.0, by_name
    assert by_name["shm: 4 clients / 1, 384 KiB x32"] is None, by_name


def test_rounds_give_the_median_of_per_round_ratios_beside_the_full_pass() -> None:
    full = every_target_cell(1.0)
    rounds = [every_target_cell(1.0) | {("ucx", 2 * MiB, 1): ratio} for ratio in (1.5, 2.5, 2.1)]
    from_pass, medians = targets(cells(full), [cells(r) for r in rounds], cpus=2)
    ucx = next(i for i, spec in enumerate(TARGETS) if spec.top == ("ucx", 2 * MiB, 1))
    assert from_pass[ucx].value == 1.0 and from_pass[ucx].rounds == ()
    assert medians[ucx].value == 2.1 and medians[ucx].rounds == (1.5, 2.5, 2.1), medians[ucx]
    assert medians[ucx].verdict == "ok"
    ceiling = next(r for r in medians if r.target is None)
    assert ceiling.verdict == "(reference)", ceiling


def test_the_block_benchmark_reads_memcpy_references_from_its_copy_cells() -> None:
    def cell(system: str, batch: int, clients: int, gbps: float) -> BlockCell:
        return BlockCell(system, report.read_op(system), report.RATIO_BLOCK, batch, clients, gbps=gbps)

    measured = [cell("memcpy", 32, 1, 4.0), cell("memcpy", 32, 4, 6.0), cell("socket", 32, 1, 2.0)]
    by_name = {r.name: r for r in report.ratios(measured, cpus=2)}
    memcpy = by_name["384 KiB memcpy batch-32: 4 clients / 1 client"]
    assert memcpy.value == 1.5 and memcpy.verdict == "(reference)", memcpy
    assert by_name["384 KiB raw socket batch-32: 4 clients / 1 client"].value is None  # its 4-client cell is missing
    assert "target" not in report.ratio_lines([memcpy]), report.ratio_lines([memcpy])


def test_a_scaling_ratio_carries_the_ceiling_its_one_client_cell_leaves() -> None:
    def cell(system: str, batch: int, clients: int, ops: float, client_us: float, server_us: float | None) -> BlockCell:
        return BlockCell(system, report.read_op(system), report.RATIO_BLOCK, batch, clients, gbps=ops / 1000,
                         ops_per_s=ops, client_cpu_us=client_us, server_cpu_us=server_us)  # fmt: skip

    measured = [
        cell("kvpool", 1, 1, 4000, 150, 200),  # 4000/s x 350 us = 1.4 cores busy
        cell("kvpool", 1, 4, 5000, 200, 180),
        cell("memcpy", 32, 1, 400, 1000, None),  # 0.4 cores: four clients could all run at once
        cell("memcpy", 32, 4, 1200, 1000, None),
        cell("redis", 1, 1, 3000, 250, 120),
    ]
    by_name = {r.name: r for r in report.ratios(measured, cpus=2)}
    single = by_name["384 KiB kvpool single get: 4 clients / 1 client"]
    assert single.value == 1.25 and single.ceiling is not None and abs(single.ceiling - 2 / 1.4) < 1e-9, single
    assert "CPU ceiling 1.43" in report.ratio_lines([single]), report.ratio_lines([single])
    assert by_name["384 KiB memcpy batch-32: 4 clients / 1 client"].ceiling == 4.0  # capped at the clients
    assert by_name["384 KiB get, 1 client: kvpool single / Redis GET"].ceiling is None  # not a scaling ratio
    assert by_name["384 KiB kvpool batch-32 get: 4 clients / 1 client"].ceiling is None  # no one-client cell
    medians = {r.name: r for r in report.round_ratios([measured, measured], cpus=4)}
    assert medians[single.name].ceiling == 4 / 1.4, medians[single.name]


def test_a_transport_scaling_target_carries_the_ceiling_of_its_one_client_cell() -> None:
    measured = [
        Cell("tcp", 384 * KiB, 1, 3.0, 10, client_cores=0.6, server_cores=0.7),  # 1.3 cores busy
        Cell("tcp", 384 * KiB, 4, 4.0, 10, client_cores=1.2, server_cores=0.7),
        Cell("memcpy", 384 * KiB, 1, 6.0, 10, client_cores=1.0),  # no server
        Cell("memcpy", 384 * KiB, 4, 10.0, 10, client_cores=2.0),
        Cell("ucx", 2 * MiB, 1, 6.0, 10, client_cores=0.9, server_cores=0.9),
    ]
    full, medians = targets(measured, [measured, measured], cpus=2)
    by_name = {r.name: r for r in full}
    tcp = by_name["tcp: 4 clients / 1, 384 KiB x32"]
    assert tcp.ceiling is not None and abs(tcp.ceiling - 2 / 1.3) < 1e-9, tcp
    assert by_name["memcpy: 4 clients / 1, 384 KiB x32 (the machine's ceiling)"].ceiling == 2.0
    assert by_name["ucx / tcp, 2 MiB x32, 1 client"].ceiling is None  # not a scaling target
    assert by_name["shm: 4 clients / 1, 384 KiB x32"].ceiling is None  # not measured
    assert {r.name: r for r in medians}[tcp.name].ceiling == tcp.ceiling


def test_a_scaling_target_is_judged_on_the_fraction_of_its_ceiling_it_reaches() -> None:
    def cell(system: str, batch: int, clients: int, ops: float) -> BlockCell:
        # 1000 ops/s x 1000 us = one core busy with one client: two cores allow four clients twice as much
        return BlockCell(system, report.read_op(system), report.RATIO_BLOCK, batch, clients, gbps=ops / 1000,
                         ops_per_s=ops, client_cpu_us=600, server_cpu_us=400)  # fmt: skip

    measured = [cell("kvpool", 32, 1, 1000), cell("kvpool", 32, 4, 1700), cell("socket", 32, 1, 1000),
                cell("socket", 32, 4, 1500)]  # fmt: skip
    by_name = {r.name: r for r in report.ratios(measured, cpus=2)}
    batch = by_name["384 KiB kvpool batch-32 get: 4 clients / 1 client"]
    assert (batch.value, batch.ceiling, batch.fraction) == (1.7, 2.0, 0.85), batch
    assert batch.verdict == "BELOW TARGET", batch  # 1.7 is over 1.5, but 0.85 of the ceiling is under 0.9
    line = report.ratio_lines([batch])
    assert "CPU ceiling 2.00, 0.85 of it (target >= 0.9 of its CPU ceiling) BELOW TARGET" in line, line
    socket = by_name["384 KiB raw socket batch-32: 4 clients / 1 client"]
    assert socket.verdict == "(reference)" and "0.75 of it" in report.ratio_lines([socket]), socket
    unmeasured = report.Ratio("no CPU", 1.7, 0.9, of_ceiling=True)
    assert unmeasured.verdict == "n/a", unmeasured  # no ceiling: nothing to judge the fraction by
