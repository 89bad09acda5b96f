"""``watch``: membership changes as they happen, one line (or one JSON object) each.

A :class:`~kvpool_client.core.membership.view.MembershipView` follows etcd (and re-reads
after an outage); each snapshot it publishes is compared with the one before, so
the changes printed are exactly what clients placing keys see, resyncs included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from kvpool_client.admin import format as fmt
from kvpool_client.admin.cluster import config_json, config_line, record_json
from kvpool_client.admin.exits import CliError, ExitCode
from kvpool_client.admin.session import open_session
from kvpool_client.core.membership.records import ClusterConfig, NodeRecord

if TYPE_CHECKING:  # etcd's client comes with the etcd extra, and watch runs only with --etcd
    from kvpool_client.core.membership.etcd import EtcdStore
    from kvpool_client.core.membership.view import Membership


@dataclass(frozen=True, slots=True)
class NodeChange:
    """A node ``joined``, ``left``, changed ``state``, or had another field ``updated``."""

    event: str
    node_id: str
    before: NodeRecord | None
    after: NodeRecord | None

    def changed(self) -> dict[str, list[object]]:
        """Fields that differ, as ``{name: [old, new]}`` (empty when joined or left)."""
        if self.before is None or self.after is None:
            return {}
        old, new = record_json(self.before), record_json(self.after)
        return {k: [old[k], new[k]] for k in new if old[k] != new[k]}


@dataclass(frozen=True, slots=True)
class ConfigChange:
    """The cluster config was written (``before`` None: created) or deleted (``after`` None)."""

    before: ClusterConfig | None
    after: ClusterConfig | None
    event: str = "config"


Change = NodeChange | ConfigChange


def diff(old: Membership, new: Membership) -> list[Change]:
    """The changes that turn ``old`` into ``new``: nodes by id, then the config."""
    changes: list[Change] = []
    for node_id in sorted(old.nodes.keys() | new.nodes.keys()):
        before, after = old.nodes.get(node_id), new.nodes.get(node_id)
        if before == after:
            continue
        if before is None:
            event = "joined"
        elif after is None:
            event = "left"
        else:
            event = "state" if before.state != after.state else "updated"
        changes.append(NodeChange(event, node_id, before, after))
    if old.config != new.config:
        changes.append(ConfigChange(old.config, new.config))
    return changes


def change_json(change: Change, at: float) -> dict[str, object]:
    """One JSON-lines record: ``time`` (unix seconds), ``event``, and what changed."""
    if isinstance(change, ConfigChange):
        return {
            "time": at,
            "event": "config",
            "config": None if change.after is None else config_json(change.after),
            "previous": None if change.before is None else config_json(change.before),
        }
    return {
        "time": at,
        "event": change.event,
        "node_id": change.node_id,
        "node": None if change.after is None else record_json(change.after),
        "previous": None if change.before is None else record_json(change.before),
        "changed": change.changed(),
    }


def snapshot_json(snapshot: Membership, cluster: str, at: float) -> dict[str, object]:
    """The first JSON-lines record: every node and the config when the watch started."""
    return {
        "time": at,
        "event": "snapshot",
        "cluster": cluster,
        "revision": snapshot.revision,
        "nodes": [record_json(snapshot.nodes[n]) for n in sorted(snapshot.nodes)],
        "config": None if snapshot.config is None else config_json(snapshot.config),
    }


def change_text(change: Change) -> str:
    """One line for people: ``joined  node-3  joining  127.0.0.1:50051 ...``."""
    if isinstance(change, ConfigChange):
        if change.after is None:
            return "config   deleted"
        if change.before is None:
            return f"config   created: {config_line(change.after)}"
        old, new = config_json(change.before), config_json(change.after)
        return "config   " + ", ".join(f"{k} {old[k]} -> {v}" for k, v in new.items() if old[k] != v)
    if change.event == "joined":
        assert change.after is not None
        return f"joined   {change.node_id}  {_describe(change.after)}"
    if change.event == "left":
        assert change.before is not None
        return f"left     {change.node_id}  (was {change.before.state} at {change.before.address})"
    changed = change.changed()
    state = changed.pop("state", None)
    parts = [f"{k} {_show(old)} -> {_show(new)}" for k, (old, new) in changed.items()]
    if state is not None:  # the state leads: it is what the event is about
        parts.insert(0, f"{state[0]} -> {state[1]}")
    return f"{change.event:<8} {change.node_id}  {', '.join(parts)}"


def _describe(record: NodeRecord) -> str:
    endpoints = " ".join(f"{t}://{a}" for t, a in sorted(record.data_endpoints.items())) or "-"
    return f"{record.state}  {record.address}  {endpoints}  weight {record.weight:g}  {fmt.size(record.capacity_bytes)}"


def _config_text(config: ClusterConfig | None) -> str:
    return "no config stored yet" if config is None else f"config {config_line(config)}"


def _show(value: object) -> str:
    return json.dumps(value, sort_keys=True) if isinstance(value, dict) else str(value)


class _Printer:
    """Prints each change at once (a pipe must see it now, not at exit) and counts them."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.seen = 0

    def header(self, snapshot: Membership, cluster: str) -> None:
        """The state the changes start from: a ``snapshot`` record (not counted), or a line."""
        if self.as_json:
            print(json.dumps(snapshot_json(snapshot, cluster, round(time.time(), 3)), sort_keys=True), flush=True)
            return
        states = ", ".join(f"{r.node_id} {r.state}" for r in (snapshot.nodes[n] for n in sorted(snapshot.nodes)))
        count = len(snapshot.nodes)
        print(
            f"watching cluster {cluster} (revision {snapshot.revision}): {count} node{'' if count == 1 else 's'}"
            f"{': ' + states if states else ''}; {_config_text(snapshot.config)}",
            flush=True,
        )

    def __call__(self, change: Change) -> None:
        now = time.time()
        if self.as_json:
            line = json.dumps(change_json(change, round(now, 3)), sort_keys=True)
        else:
            line = f"{datetime.fromtimestamp(now).strftime('%H:%M:%S.%f')[:-3]}  {change_text(change)}"
        print(line, flush=True)
        self.seen += 1


async def follow(
    store: EtcdStore,
    cluster: str,
    count: int | None,
    on_change: Callable[[Change], None],
    on_start: Callable[[Membership], None],
) -> None:
    """Call ``on_change`` for each membership change until ``count`` of them (None: forever)."""
    from kvpool_client.core.membership.view import MembershipView

    snapshots: asyncio.Queue[Membership] = asyncio.Queue()
    view = MembershipView(store, cluster)
    view.subscribe(snapshots.put_nowait)
    await view.start()
    try:
        previous = await snapshots.get()  # the first full read: the state we start from
        on_start(previous)
        seen = 0
        while count is None or seen < count:
            snapshot = await snapshots.get()
            for change in diff(previous, snapshot)[: None if count is None else count - seen]:
                on_change(change)
                seen += 1
            previous = snapshot
    finally:
        await view.close()


async def _follow_for(
    store: EtcdStore, cluster: str, count: int | None, seconds: float | None, printer: _Printer
) -> bool:
    """:func:`follow` for at most ``seconds``; False if the time ran out first."""
    try:
        async with asyncio.timeout(seconds):
            await follow(store, cluster, count, printer, lambda s: printer.header(s, cluster))
    except TimeoutError:
        return False
    return True


def run_watch(args: argparse.Namespace) -> ExitCode:
    """Print changes until Ctrl-C, ``--count`` changes or ``--timeout`` seconds.

    Returns OK, also on Ctrl-C and when the time runs out without ``--count``.

    Raises:
        CliError: TIMED_OUT when ``--timeout`` ends before ``--count`` changes.
    """
    printer = _Printer(args.json)
    try:
        with open_session(args, "watch") as session:
            finished = session.run(_follow_for(session.store, args.cluster, args.count, args.duration, printer))
    except KeyboardInterrupt:
        return ExitCode.OK
    if not finished and args.count is not None:
        raise CliError(ExitCode.TIMED_OUT, f"saw {printer.seen} of {args.count} changes in {args.duration:g} s")
    return ExitCode.OK
