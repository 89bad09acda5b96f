"""Rendering for people and scripts: aligned text tables, sizes, durations, JSON."""

from __future__ import annotations

import json
import sys
from collections.abc import Collection, Iterable, Mapping, Sequence

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def size(n: int) -> str:
    """``n`` bytes in binary units: ``"0 B"``, ``"512 B"``, ``"1.5 KiB"``, ``"64.0 MiB"``."""
    if n < 1024:
        return f"{n} B"
    value, unit = n / 1024, _UNITS[0]
    for larger in _UNITS[1:]:
        if value < 1024:
            break
        value, unit = value / 1024, larger
    return f"{value:.1f} {unit}"


def duration(seconds: float) -> str:
    """The two largest units of ``seconds``: ``"42s"``, ``"5m 03s"``, ``"2h 05m"``, ``"3d 04h"``."""
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def percent(part: int, whole: int) -> str:
    """``part / whole`` as ``"12.5%"``; ``"-"`` when ``whole`` is 0."""
    return "-" if whole == 0 else f"{100 * part / whole:.1f}%"


# Transports without an address of their own: the shared arena's path is local, and a node's NIXL
# agent is reached through its data endpoint.
_NAMED_ONLY = ("nixl", "shm")


def endpoints(by_transport: Mapping[str, str]) -> str:
    """Network endpoints as URLs; the same-node arena and the one-sided plane only as "+shm", "+nixl"."""
    cell = " ".join(f"{t}://{a}" for t, a in sorted(by_transport.items()) if t not in _NAMED_ONLY)
    for transport in _NAMED_ONLY:
        if transport in by_transport:
            cell = f"{cell} +{transport}".strip()
    return cell or "-"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], right: Collection[int] = ()) -> str:
    """Columns padded to their widest cell, two spaces apart.

    Args:
        right: indices of columns to right-align (numbers).

    Raises:
        ValueError: a row has a different number of cells than ``headers``.
    """
    return _align([list(headers), *rows], right)


def key_values(pairs: Iterable[tuple[str, object]]) -> str:
    """Two aligned columns without a header: ``name  value``."""
    return _align([list(p) for p in pairs], ())


def _align(rows: Sequence[Sequence[object]], right: Collection[int]) -> str:
    cells = [[str(c) for c in row] for row in rows]
    if not cells:
        return ""
    n = len(cells[0])
    if any(len(row) != n for row in cells):
        raise ValueError(f"every row needs {n} cells")
    widths = [max(len(row[i]) for row in cells) for i in range(n)]
    lines = []
    for row in cells:
        padded = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def print_json(value: object) -> None:
    """Write ``value`` to stdout as indented JSON and a newline."""
    json.dump(value, sys.stdout, indent=2)
    sys.stdout.write("\n")
