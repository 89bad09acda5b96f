"""The metric table against the daemon's source: every counter the code adds is declared.

The daemon's source is read with ``ast``: each ``<...counters>.add(...)`` call's first
argument must be a declared key (a literal, or both branches of a conditional), a prefix
of declared keys (an f-string), or a lookup listed below with the reason it is covered.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvpool_client.core.errors import ErrorCode
from kvpool_client.core.wire.frames import Op
from kvpool_server.metric_names import COUNTER_KEYS, FAMILIES, Kind
from kvpool_server.stats import Counters, UnknownCounter

SERVER = Path(__file__).resolve().parents[2] / "kvpool_server"
# Keys computed by a table lookup, with the test that covers the table.
LOOKUPS = {
    "_REQUEST_COUNTERS[request_op(event)]": "requests_<op> for every Op: test_every_op_and_error_code_has_a_key",
}


@dataclass(frozen=True, slots=True)
class CounterCall:
    where: str  # path:line
    argument: ast.expr


def counter_calls() -> list[CounterCall]:
    """Every ``.add(...)`` on something named ``counters`` or ``_counters`` in the daemon."""
    calls = []
    for path in sorted(SERVER.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add"):
                continue
            receiver = node.func.value
            name = receiver.attr if isinstance(receiver, ast.Attribute) else getattr(receiver, "id", "")
            if name in ("counters", "_counters") and node.args:
                calls.append(CounterCall(f"{path.relative_to(SERVER.parent)}:{node.lineno}", node.args[0]))
    return calls


def literal_names(argument: ast.expr) -> list[str] | None:
    """The names a literal or a conditional of literals can take; None for anything else."""
    if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
        return [argument.value]
    if isinstance(argument, ast.IfExp):
        body, orelse = literal_names(argument.body), literal_names(argument.orelse)
        return body + orelse if body is not None and orelse is not None else None
    return None


def test_the_scan_finds_the_daemons_counters() -> None:
    places = {call.where.split(":")[0] for call in counter_calls()}
    # One file of each package that counts: an empty scan must not pass for a clean one.
    for path in ("tiers/dram.py", "tiers/ssd.py", "data/session.py", "control/service.py", "membership/repair.py"):
        assert f"kvpool_server/{path}" in places, f"no counter calls found in {path}; found {sorted(places)}"


def test_every_counter_the_daemon_adds_is_declared() -> None:
    undeclared, unexplained = [], []
    for call in counter_calls():
        names = literal_names(call.argument)
        source = ast.unparse(call.argument)
        if names is not None:
            undeclared += [f"{call.where}: {name}" for name in names if name not in COUNTER_KEYS]
        elif isinstance(call.argument, ast.JoinedStr):
            prefix = literal_names(call.argument.values[0]) if call.argument.values else None
            if not prefix or not any(key.startswith(prefix[0]) for key in COUNTER_KEYS):
                undeclared.append(f"{call.where}: {source} (no declared key has its prefix)")
        elif source not in LOOKUPS:
            unexplained.append(f"{call.where}: {source}")
    assert not undeclared, f"counters added but not declared in kvpool_server/metric_names.py: {undeclared}"
    assert not unexplained, f"counter names the scan cannot check; list them in LOOKUPS with why: {unexplained}"


def test_every_op_and_error_code_has_a_key() -> None:
    missing = [f"requests_{op.name.lower()}" for op in Op] + [
        f"errors_{code.name.lower()}" for code in ErrorCode if code is not ErrorCode.OK
    ]
    assert not [key for key in missing if key not in COUNTER_KEYS]


def test_the_table_is_consistent() -> None:
    names = [family.name for family in FAMILIES]
    assert len(names) == len(set(names)), f"a family declared twice: {names}"
    assert len(COUNTER_KEYS) == len(set(COUNTER_KEYS)), "a counter key in two families"
    for family in FAMILIES:
        assert family.name.startswith("kvpool_") and not family.name.endswith("_total"), family.name
        assert family.help, family.name
        assert bool(family.series) == (family.kind is Kind.COUNTER), family
        bad = {key: labels for key, labels in family.series.items() if len(labels) != len(family.labels)}
        assert not bad, f"{family.name}: label values do not match {family.labels}: {bad}"


def test_counters_start_at_zero_and_refuse_an_undeclared_key() -> None:
    counters = Counters()
    assert counters.snapshot(zeros=True) == dict.fromkeys(COUNTER_KEYS, 0)
    assert counters.snapshot() == {}, "a plain snapshot holds the counters that moved"
    counters.add("dram_hits", 3)
    assert counters.get("dram_hits") == 3
    with pytest.raises(UnknownCounter, match=r"'dram_hit' is not declared .*did you mean 'dram_hits'"):
        counters.add("dram_hit")
    with pytest.raises(UnknownCounter, match="'no_such_counter'"):
        counters.get("no_such_counter")
    assert counters.snapshot() == {"dram_hits": 3}
    assert counters.snapshot(zeros=True) == {**dict.fromkeys(COUNTER_KEYS, 0), "dram_hits": 3}
