"""bench/streams.py's summary: medians per cell, and per shape the per-round ratios of its systems."""

from __future__ import annotations

from bench.harness.cells import Cell
from bench.streams import BATCH, shapes, summary

KiB = 1 << 10


def cell(system: str, gbps: float, clients: int = 1, op: str = "get") -> Cell:
    return Cell(system, op, 384 * KiB, BATCH, clients, gbps=gbps, client_cpu_us=2000.0, server_cpu_us=3000.0)


def test_every_system_is_measured_for_every_shape() -> None:
    planned = shapes(["get", "put"], [384 * KiB], [1, 4])
    assert len(planned) == len(set(planned)) == 2 * 2 * 3, planned
    assert {s for s, *_ in planned} == {"kvpool", "kvpool-one-stream", "socket"}


def test_ratios_are_taken_round_by_round_and_their_median_reported() -> None:
    cells = {
        ("kvpool", "get", 384 * KiB, BATCH, 1): [cell("kvpool", g) for g in (4.0, 3.0, 3.3)],
        ("kvpool-one-stream", "get", 384 * KiB, BATCH, 1): [cell("kvpool-one-stream", g) for g in (2.0, 3.0, 3.0)],
        ("socket", "get", 384 * KiB, BATCH, 1): [cell("socket", 4.0), Cell("socket", "get", 384 * KiB, BATCH, 1,
                                                                           error="down"), cell("socket", 3.0)],
    }  # fmt: skip
    lines = summary(cells)
    assert "| kvpool | get | 384 KiB | 1 | 3.30 | 2,000 | 3,000 |" in lines, lines
    assert lines[-1] == (
        "get 384 KiB x32, 1 client(s): kvpool / kvpool-one-stream 1.10 (rounds 2.00, 1.00, 1.10); "
        "kvpool / socket 1.05 (rounds 1.00, 1.10); kvpool-one-stream / socket 0.75 (rounds 0.50, 1.00)"
    ), lines
