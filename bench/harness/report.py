"""Results out: a JSON file of every cell, a markdown table, plots, and the target ratios."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import mooncake_peer
from bench.harness.cells import Cell
from bench.harness.workload import KiB, MiB

SYSTEMS = ("kvpool", "kvpool-shm", "redis", *mooncake_peer.SYSTEMS, "socket", "memcpy")


@dataclass(frozen=True, slots=True)
class Ratio:
    name: str
    value: float | None  # None: a cell it needs is missing; over rounds, their median
    target: float | None  # None: a reference, measured beside the targets (e.g. the machine's ceiling)
    rounds: tuple[float, ...] = ()  # one value per interleaved round, when measured so
    ceiling: float | None = None  # a scaling ratio's CPU ceiling (see cpu_ceiling); over rounds, their median
    of_ceiling: bool = False  # the target is a fraction of the CPU ceiling, not a ratio

    @property
    def fraction(self) -> float | None:
        """A scaling ratio's share of its CPU ceiling; None without both."""
        return _div(self.value, self.ceiling)

    @property
    def verdict(self) -> str:
        judged = self.fraction if self.of_ceiling else self.value
        if judged is None:
            return "n/a"
        if self.target is None:
            return "(reference)"
        return "ok" if judged >= self.target else "BELOW TARGET"


Shape = tuple[
    str, int, int
]  # a cell: (system, batch, clients) of a 384 KiB get; transports.py: (system, block, clients)


@dataclass(frozen=True, slots=True)
class RatioSpec:
    name: str
    top: Shape
    bottom: Shape
    target: float | None  # None: a reference
    of_ceiling: bool = False  # ``target`` is the fraction of its CPU ceiling a scaling ratio must reach

    @property
    def scaling(self) -> bool:
        """Whether this is one shape with more clients over the same with one client."""
        return self.top[:2] == self.bottom[:2] and self.bottom[2] == 1


# The targets the daemon and client are tuned against. A scaling target is a fraction of the
# ratio's CPU ceiling: four clients cannot beat what the cores allow, only come close to it.
SCALING_TARGET = 0.9


def _scaling(name: str, system: str, batch: int) -> RatioSpec:
    return RatioSpec(name, (system, batch, 4), (system, batch, 1), SCALING_TARGET, of_ceiling=True)


RATIO_SPECS = (
    RatioSpec("384 KiB get, 1 client: kvpool single / Redis GET", ("kvpool", 1, 1), ("redis", 1, 1), 1.5),
    RatioSpec(
        "384 KiB get, 1 client: kvpool batch-32 / raw socket batch-32", ("kvpool", 32, 1), ("socket", 32, 1), 0.9
    ),
    _scaling("384 KiB kvpool single get: 4 clients / 1 client", "kvpool", 1),
    _scaling("384 KiB kvpool batch-32 get: 4 clients / 1 client", "kvpool", 32),
    # The same daemon read the way a client on its node reads it (the DaemonSet case).
    RatioSpec("384 KiB get, 1 client: kvpool-shm single / Redis GET", ("kvpool-shm", 1, 1), ("redis", 1, 1), 1.3),
    RatioSpec("384 KiB get, 1 client: kvpool-shm single / memcpy", ("kvpool-shm", 1, 1), ("memcpy", 1, 1), 0.5),
    _scaling("384 KiB kvpool-shm single get: 4 clients / 1 client", "kvpool-shm", 1),
    _scaling("384 KiB kvpool-shm batch-32 get: 4 clients / 1 client", "kvpool-shm", 32),
    # What two cores leave four clients with no kvpool in the way: the reach of the scaling targets.
    # The raw socket's fraction of its own CPU ceiling is what this machine lets the simplest server reach.
    RatioSpec("384 KiB raw socket batch-32: 4 clients / 1 client", ("socket", 32, 4), ("socket", 32, 1), None),
    RatioSpec("384 KiB memcpy batch-32: 4 clients / 1 client", ("memcpy", 32, 4), ("memcpy", 32, 1), None),
    # Mooncake Store, the system users compare kvpool with: its bytes and zero-copy APIs over TCP, and
    # its same-host mode (bytes, and zero-copy into its own shared pool) against kvpool's same-node reads.
    RatioSpec("384 KiB get, 1 client: kvpool single / Mooncake TCP get", ("kvpool", 1, 1), ("mooncake", 1, 1), 2.5),
    RatioSpec(
        "384 KiB get, 1 client: kvpool single / Mooncake TCP get_into", ("kvpool", 1, 1), ("mooncake-zc", 1, 1), 2.5
    ),
    RatioSpec(
        "384 KiB get, 1 client: kvpool-shm single / Mooncake same-host get",
        ("kvpool-shm", 1, 1),
        ("mooncake-local", 1, 1),
        3.0,
    ),
    RatioSpec(
        "384 KiB get, 1 client: kvpool-shm single / Mooncake same-host get_into its pool",
        ("kvpool-shm", 1, 1),
        ("mooncake-local-zc", 1, 1),
        3.0,
    ),
)
RATIO_BLOCK = 384 * KiB


def read_op(system: str) -> str:
    """The op of a system's read cells: memcpy copies, the others get."""
    return "copy" if system == "memcpy" else "get"


def ratio_shapes(systems: Sequence[str]) -> list[Shape]:
    """The read cells the ratios compare, among ``systems``, each once."""
    shapes = [shape for spec in RATIO_SPECS for shape in (spec.top, spec.bottom)]
    return [shape for i, shape in enumerate(shapes) if shape not in shapes[:i] and shape[0] in systems]


def size_label(nbytes: int) -> str:
    return f"{nbytes // MiB} MiB" if nbytes % MiB == 0 else f"{nbytes // KiB} KiB"


def find(
    cells: Sequence[Cell], system: str, op: str, block: int, batch: int, clients: int, dest_offset: int = 0
) -> Cell | None:
    shape = (system, op, block, batch, clients, dest_offset)
    for cell in cells:
        if (cell.system, cell.op, cell.block_size, cell.batch, cell.clients, cell.dest_offset) == shape:
            return cell
    return None


def ratios(cells: Sequence[Cell], cpus: int) -> list[Ratio]:
    """Every target ratio, from ``cells`` only; scaling ratios with their ceiling on ``cpus`` cores."""

    def cell(shape: Shape) -> Cell | None:
        system, batch, clients = shape
        return find(cells, system, read_op(system), RATIO_BLOCK, batch, clients)

    def gbps(shape: Shape) -> float | None:
        found = cell(shape)
        return found.gbps if found is not None else None

    def ceiling(spec: RatioSpec) -> float | None:
        return cpu_ceiling(cell(spec.bottom), spec.top[2], cpus) if spec.scaling else None

    return [
        Ratio(
            spec.name,
            _div(gbps(spec.top), gbps(spec.bottom)),
            spec.target,
            ceiling=ceiling(spec),
            of_ceiling=spec.of_ceiling,
        )
        for spec in RATIO_SPECS
    ]


def scaling_ceiling(busy: float | None, clients: int, cpus: int) -> float | None:
    """How far ``clients`` clients could scale over one that kept ``busy`` cores busy (its own
    and the server's CPU) on ``cpus`` cores; None when ``busy`` was not measured.

    If each op cost as much CPU with more clients, ``cpus`` cores would do ``cpus`` /
    ``busy`` times as much (and no more than ``clients`` times). More processes than
    cores tend to make each op cost more (switches, colder caches), rarely less, so a
    scaling target above this figure asks for cheaper ops, not for more parallelism.
    """
    return min(float(clients), cpus / busy) if busy else None


def cpu_ceiling(one: Cell | None, clients: int, cpus: int) -> float | None:
    """:func:`scaling_ceiling` of ``one``, a one-client cell: it kept ``ops/s x CPU per op`` cores busy."""
    if one is None or one.ops_per_s is None or one.client_cpu_us is None:
        return None
    busy = one.ops_per_s * (one.client_cpu_us + (one.server_cpu_us or 0.0)) / 1e6
    return scaling_ceiling(busy, clients, cpus)


def round_ratios(rounds: Sequence[Sequence[Cell]], cpus: int) -> list[Ratio]:
    """Every target ratio per round of interleaved cells, and their median.

    Both cells of a ratio were measured within seconds of each other in each round,
    so a noisy stretch of the machine falls on both instead of on one of them.
    """
    per_round = [ratios(cells, cpus) for cells in rounds]
    merged = []
    for i, spec in enumerate(RATIO_SPECS):
        values = tuple(v for r in per_round if (v := r[i].value) is not None)
        ceilings = [c for r in per_round if (c := r[i].ceiling) is not None]
        median = statistics.median(values) if values else None
        ceiling = statistics.median(ceilings) if ceilings else None
        merged.append(Ratio(spec.name, median, spec.target, values, ceiling, spec.of_ceiling))
    return merged


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def markdown_table(cells: Sequence[Cell]) -> str:
    """Every cell, ordered so the systems of one shape sit next to each other."""
    order = {name: i for i, name in enumerate(SYSTEMS)}
    rows = sorted(
        cells, key=lambda c: (c.op != "put", c.block_size, c.batch, c.clients, order.get(c.system, 99), c.dest_offset)
    )
    lines = [
        "| op | block | batch | clients | system | destination | GB/s | ops/s | p50 us | p99 us | client CPU us/op "
        "| server CPU us/op | other load |",
        "|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in rows:
        metrics = [
            _num(c.gbps, 2),
            _num(c.ops_per_s, 0),
            _num(c.p50_us, 0),
            _num(c.p99_us, 0),
            _num(c.client_cpu_us, 0),
            _num(c.server_cpu_us, 0),
            _num(c.foreign_cores, 2),
        ]
        if not c.ok:
            metrics = ["missing"] + [""] * 6
        lines.append(
            f"| {c.op} | {size_label(c.block_size)} | {c.batch} | {c.clients} | {c.system} | {destination(c)} | "
            + " | ".join(metrics)
            + " |"
        )
    return "\n".join(lines)


def destination(cell: Cell) -> str:
    """Where a read cell's blocks landed: ``page+N`` (in Mooncake's shared pool for its same-host
    zero-copy reads); a put has none."""
    if cell.op == "put":
        return "-"
    where = "mooncake pool " if cell.system in mooncake_peer.POOL_SYSTEMS else ""
    return f"{where}page+{cell.dest_offset}"


def alignment_lines(cells: Sequence[Cell]) -> str:
    """Each read shape measured at other destination offsets: GB/s by offset, and as a
    ratio to the page-aligned destination of the same run."""
    lines = []
    shifted = [c for c in cells if c.dest_offset and c.op != "put"]
    for shape in dict.fromkeys((c.system, c.op, c.block_size, c.batch, c.clients) for c in shifted):
        aligned = find(cells, *shape)
        figures = [f"page+0 {_num(aligned.gbps if aligned else None, 2)}"]
        for c in (c for c in shifted if (c.system, c.op, c.block_size, c.batch, c.clients) == shape):
            ratio = _div(c.gbps, aligned.gbps if aligned else None)
            figures.append(f"page+{c.dest_offset} {_num(c.gbps, 2)} ({_num(ratio, 2)}x)")
        system, op, block, batch, clients = shape
        lines.append(f"- {system} {op} {size_label(block)} x{batch} c{clients}: " + ", ".join(figures) + " GB/s")
    return "\n".join(lines)


CEILING_NOTE = (
    "CPU ceiling: the scaling the machine's cores allow if every op costs the CPU (client and server) "
    "it cost with one client; a target above it needs cheaper ops, not more parallelism."
)
SCALING_NOTE = (
    f"The block benchmark's scaling targets are {SCALING_TARGET} of that ceiling; the raw socket's own "
    "fraction of its ceiling is what this machine lets the simplest server reach."
)


ALIGNMENT_NOTE = (
    "Gets into destinations 16 and 64 bytes past a page, beside the page-aligned ones above (ratio to "
    "those): sources (the arena, memcpy's region) are page-aligned, so +16 puts the destination 16 bytes "
    "past the source modulo a page, as a large numpy array or bytearray lies (malloc maps those: a page plus 16)."
)


def ratio_lines(values: Sequence[Ratio]) -> str:
    lines = []
    for r in values:
        rounds = f" (rounds: {', '.join(f'{v:.2f}' for v in r.rounds)})" if r.rounds else ""
        of = " of its CPU ceiling" if r.of_ceiling else ""
        goal = f" (target >= {r.target}{of})" if r.target is not None else ""
        ceiling = f"; CPU ceiling {r.ceiling:.2f}, {_num(r.fraction, 2)} of it" if r.ceiling is not None else ""
        value = _num(r.value, 2) if r.value is not None else "n/a"
        lines.append(f"- {r.name}: {value}{rounds}{ceiling}{goal} {r.verdict}")
    return "\n".join(lines)


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def write_json(path: Path, cells: Sequence[Cell], meta: dict[str, Any], rounds: Sequence[Sequence[Cell]] = ()) -> None:
    def rows(values: list[Ratio]) -> list[dict[str, Any]]:
        return [{**asdict(r), "verdict": r.verdict} for r in values]

    document = {
        "meta": meta,
        "cells": [asdict(c) for c in cells],
        "ratios": rows(ratios(cells, meta["cpus"])),
        "ratio_rounds": {
            "cells": [[asdict(c) for c in r] for r in rounds],
            "ratios": rows(round_ratios(rounds, meta["cpus"])),
        },
    }
    path.write_text(json.dumps(document, indent=2))


def write_markdown(
    path: Path, cells: Sequence[Cell], meta: dict[str, Any], rounds: Sequence[Sequence[Cell]] = ()
) -> None:
    errors = [
        f"- {c.system} {c.op} {size_label(c.block_size)} x{c.batch} c{c.clients}: {c.error}" for c in cells if not c.ok
    ]
    text = [
        "# kvpool block benchmark (loopback)",
        "",
        f"Run: {meta.get('started')}, {meta.get('cpus')} CPUs, {'quick' if meta.get('quick') else 'full'} mode, "
        f"{meta.get('duration_s')} s per cell. GB/s = 1e9 bytes/s over all clients; latency per call; "
        "CPU us/op = CPU time (user + kernel) of all clients, and of the server process, per call "
        "while timed; "
        "other load = cores used meanwhile by processes outside the benchmark (noise; "
        f"mean {meta.get('mean_other_load_cores')}).",
        "",
        markdown_table(cells),
        "",
        "## Ratios",
        "",
        "From the cells above:",
        "",
        ratio_lines(ratios(cells, meta["cpus"])),
        "",
        f"{CEILING_NOTE} {SCALING_NOTE}",
    ]
    if rounds:
        text += ["", f"Over {len(rounds)} rounds of only the cells they compare, interleaved (median):", ""]
        text.append(ratio_lines(round_ratios(rounds, meta["cpus"])))
    if alignment := alignment_lines(cells):
        text += ["", "## Destinations at offsets from a page", "", ALIGNMENT_NOTE, "", alignment]
    if errors:
        text += ["", "## Missing cells", "", *errors]
    path.write_text("\n".join(text) + "\n")


def write_plots(out: Path, cells: Sequence[Cell]) -> list[Path]:
    """Grouped bars of GB/s per system per block size: one PNG per op kind."""
    import matplotlib

    matplotlib.use("Agg")
    written = []
    for op, title in (("get", "get (memcpy: copy)"), ("put", "put")):
        path = out / f"blocks_{op}.png"
        _plot_op(path, [c for c in cells if c.op == op or (op == "get" and c.op == "copy")], title)
        written.append(path)
    return written


def _plot_op(path: Path, cells: Sequence[Cell], title: str) -> None:
    import matplotlib.pyplot as plt

    blocks = sorted({c.block_size for c in cells})
    systems = [s for s in SYSTEMS if any(c.system == s for c in cells)]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), sharey=True)
    width = 0.8 / max(1, len(systems))
    for ax, (clients, batch) in zip(axes.flat, ((1, 1), (1, 32), (4, 1), (4, 32)), strict=True):
        for i, system in enumerate(systems):
            values = [_gbps_of(cells, system, b, batch, clients) for b in blocks]
            ax.bar([x + (i - (len(systems) - 1) / 2) * width for x in range(len(blocks))], values, width, label=system)
        ax.set_xticks(range(len(blocks)), [size_label(b) for b in blocks])
        ax.set_title(f"{clients} client{'s' if clients > 1 else ''}, batch {batch}")
        ax.set_ylabel("GB/s")
        ax.grid(axis="y", alpha=0.3)
    if systems:
        axes.flat[0].legend()
    fig.suptitle(f"kvpool vs baselines on loopback: {title}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _gbps_of(cells: Sequence[Cell], system: str, block: int, batch: int, clients: int) -> float:
    for c in cells:
        shape = (c.system, c.block_size, c.batch, c.clients, c.dest_offset)
        if shape == (system, block, batch, clients, 0) and c.gbps is not None:
            return c.gbps
    return 0.0
