"""bench/capacity.py's arithmetic: GB/s per core, medians over rounds, the scaling's CPU ceiling, NIC sizing."""

from __future__ import annotations

import os

import pytest

from bench.capacity import (
    Measured,
    Shape,
    cores_needed,
    daemon_times,
    per_core_gbps,
    plan_shapes,
    scaling,
    sizing_lines,
    summarize,
)
from bench.harness.cells import Cell

KiB = 1 << 10
BLOCK = 384 * KiB


def measured(shape: Shape, round_: int, gbps: float, ops: float, client: float, server: float,
             user: float = 0.3, system: float = 0.1, load: float = 0.0) -> Measured:  # fmt: skip
    cell = Cell(shape.system, shape.op, shape.block, shape.batch, shape.clients, gbps=gbps, ops_per_s=ops,
                client_cpu_us=client, server_cpu_us=server, foreign_cores=load)  # fmt: skip
    return Measured(shape, round_, cell, user, system)


def test_a_round_has_every_way_size_batch_and_client_count_once() -> None:
    shapes = plan_shapes()
    assert len(shapes) == len(set(shapes)) == 3 * 3 * 2 * 2, shapes
    assert {(s.transport, s.op) for s in shapes} == {("tcp", "get"), ("shm", "get"), ("tcp", "put")}


def test_per_core_rate_is_op_bytes_over_cpu_per_op() -> None:
    # 384 KiB per op at 100 us of CPU per op: 393216 bytes / 100e-6 s = 3.93 GB per CPU-second
    assert per_core_gbps(BLOCK, 100.0) == pytest.approx(3.93216)
    assert per_core_gbps(BLOCK, 0.0) is None and per_core_gbps(BLOCK, None) is None
    assert cores_needed(12.5, 2.5) == pytest.approx(5.0)
    assert cores_needed(12.5, None) is None


def test_a_row_holds_medians_over_rounds_and_the_gil_cap_uses_user_time_only() -> None:
    shape = Shape("kvpool", "get", BLOCK, 1, 1)
    rounds = [
        measured(shape, 0, 1.0, 2500.0, 90.0, 100.0, user=0.2, system=0.2),
        measured(shape, 1, 2.0, 5000.0, 80.0, 50.0, user=0.1, system=0.3),
        measured(shape, 2, 3.0, 7500.0, 70.0, 200.0, user=0.3, system=0.1),
    ]
    row = summarize(rounds)
    assert row is not None
    assert (row.rounds, row.gbps, row.client_us, row.daemon_us) == (3, 2.0, 80.0, 100.0)
    assert row.daemon_gbps_per_core == pytest.approx(per_core_gbps(BLOCK, 100.0))
    assert row.daemon_cores == pytest.approx(0.25)  # ops/s x daemon us per op: 0.25, 0.25, 1.5
    assert row.user_share == pytest.approx(0.5)  # 0.6 s user of 1.2 s over the three cells
    assert row.gil_cap_gbps == pytest.approx(per_core_gbps(BLOCK, 50.0))


def test_cells_that_failed_drop_out_and_none_left_is_no_row() -> None:
    shape = Shape("kvpool-shm", "get", BLOCK, 32, 1)
    failed = Measured(shape, 0, Cell("kvpool-shm", "get", BLOCK, 32, 1, error="daemon gone"), 0.0, 0.0)
    assert summarize([failed]) is None
    row = summarize([failed, measured(shape, 1, 5.0, 400.0, 2000.0, 10.0)])
    assert row is not None and row.rounds == 1 and row.gbps == 5.0


def test_scaling_pairs_cells_by_round_and_reports_the_fraction_of_the_ceiling() -> None:
    one, four = Shape("kvpool", "get", BLOCK, 32, 1), Shape("kvpool", "get", BLOCK, 32, 4)
    # one client at 100 ops/s x (5000 + 5000) us per op keeps 1.0 core busy: 2 cores allow 2x
    ones = [measured(one, r, 2.0, 100.0, 5000.0, 5000.0) for r in range(3)]
    fours = [measured(four, r, g, 100.0, 5000.0, 5000.0) for r, g in enumerate((3.0, 3.6, 2.8))]
    result = scaling(ones, fours, cpus=2)
    assert result is not None
    assert result.per_round == pytest.approx((1.5, 1.8, 1.4))
    assert (result.ratio, result.ceiling, result.fraction) == pytest.approx((1.5, 2.0, 0.75))
    assert (result.left_ceiling, result.left_fraction) == pytest.approx((2.0, 0.75))


def test_the_ceiling_on_the_cores_left_subtracts_other_processes_load() -> None:
    one, four = Shape("kvpool", "get", BLOCK, 1, 1), Shape("kvpool", "get", BLOCK, 1, 4)
    # one client keeps 0.5 cores busy: 2 cores allow 4x (the cap), the 1.0 core left by a load of 1.0 allows 2x
    result = scaling([measured(one, 0, 1.0, 2500.0, 100.0, 100.0, load=0.8)],
                     [measured(four, 0, 1.6, 4000.0, 100.0, 100.0, load=1.2)], cpus=2)  # fmt: skip
    assert result is not None
    assert (result.ceiling, result.fraction) == pytest.approx((4.0, 0.4))
    assert (result.left_ceiling, result.left_fraction) == pytest.approx((2.0, 0.8))


def test_sizing_lists_one_client_shapes_with_cores_per_nic() -> None:
    shape = Shape("kvpool", "put", BLOCK, 32, 1)
    rows = [summarize([measured(shape, 0, 2.0, 100.0, 1000.0, 5033.2)])]  # ~2.5 GB/s per daemon core
    four = summarize([measured(Shape("kvpool", "put", BLOCK, 32, 4), 0, 2.0, 100.0, 1000.0, 5033.2)])
    lines = sizing_lines([r for r in (*rows, four) if r is not None])
    assert lines[2:] == ["| put | tcp | 384 KiB x32 | 2.50 | 5.0 | 20.0 |"], lines


def test_daemon_times_reads_a_process_user_and_kernel_seconds_as_the_kernel_counts_them() -> None:
    sum(i * i for i in range(300_000))  # some user time to count
    ours, kernel = daemon_times(os.getpid()), os.times()
    assert abs(ours.user_s - kernel.user) < 0.05 and abs(ours.system_s - kernel.system) < 0.05, (ours, kernel)
    assert ours.user_s > 0.0, ours
