"""bench/single_gets.py's summary: medians over rounds, and kvpool's ratios to Redis taken round by round."""

from __future__ import annotations

from bench.harness.cells import Cell
from bench.single_gets import parse_size, summary

KiB = 1 << 10


def cell(system: str, gbps: float, client: float, server: float, block: int = 64 * KiB) -> Cell:
    return Cell(system, "get", block, 1, 1, gbps=gbps, client_cpu_us=client, server_cpu_us=server)


def test_sizes_take_units_or_bytes() -> None:
    assert [parse_size(s) for s in ("64KiB", "2MiB", "1000")] == [64 * KiB, 2 << 20, 1000]


def test_the_gbps_ratio_is_the_median_of_the_rounds_and_cpu_the_ratio_of_the_medians() -> None:
    rounds = {
        ("kvpool", 64 * KiB): [cell("kvpool", g, c, 30.0) for g, c in ((1.0, 30.0), (3.0, 40.0), (1.2, 50.0))],
        ("redis", 64 * KiB): [cell("redis", g, 40.0, 20.0) for g in (1.0, 1.0, 2.0)],
    }
    lines = summary(rounds, [64 * KiB])
    assert "| kvpool | 64 KiB | 1.20 | 40.0 | 30.0 | 70.0 |" in lines, lines
    assert lines[-1] == (
        "64 KiB single get, kvpool / Redis: GB/s 1.00 (rounds 1.00, 3.00, 0.60; target >= 1.5: BELOW TARGET); "
        "CPU per get (client + server) 1.17 (target < 1: ABOVE TARGET)"
    ), lines


def test_targets_are_judged_and_the_raw_socket_is_a_reference() -> None:
    rounds = {
        ("kvpool", 64 * KiB): [cell("kvpool", g, 20.0, 20.0) for g in (2.0, 1.6)],
        ("redis", 64 * KiB): [cell("redis", 1.0, 40.0, 20.0), cell("redis", 1.0, 40.0, 20.0)],
        ("socket", 64 * KiB): [cell("socket", g, 10.0, 10.0) for g in (3.0, 2.0)],
    }
    lines = summary(rounds, [64 * KiB])
    assert "target >= 1.5: ok" in lines[-2] and "(target < 1: ok)" in lines[-2], lines
    assert lines[-1] == "64 KiB, socket / Redis: GB/s 2.50 (Python at both ends, no protocol)", lines


def test_a_failed_cell_drops_out_of_its_round() -> None:
    failed = Cell("redis", "get", 64 * KiB, 1, 1, error="server unavailable")
    rounds = {
        ("kvpool", 64 * KiB): [cell("kvpool", 1.0, 30.0, 30.0), cell("kvpool", 2.0, 30.0, 30.0)],
        ("redis", 64 * KiB): [failed, cell("redis", 1.0, 40.0, 20.0)],
    }
    assert "GB/s 2.00 (rounds 2.00;" in summary(rounds, [64 * KiB])[-1]
