"""``drain`` and ``undrain``: take a node out of the write path, or put it back.

Both call the node's ``SetState``. A draining node refuses writes and keeps serving
reads; with ``--handoff`` it also copies its blocks to the nodes that own them
next. ``--wait`` polls until the change is complete: the etcd record shows the new
state and, for a hand-off, the node's ``handoff_copies``/``handoff_failures``
counters have moved and settled (the node adds its totals when it is done).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import grpc

from kvpool_client.admin import format as fmt
from kvpool_client.admin import nodes
from kvpool_client.admin.exits import CliError, ExitCode, unreachable
from kvpool_client.admin.session import ClusterSession, Target, open_session
from kvpool_client.core.auth import Credentials, open_channel
from kvpool_client.core.control import blocking_stub, translate_rpc_error
from kvpool_client.core.membership.records import NodeState
from kvpool_client.core.proto import kvpool_pb2 as pb

_POLL_S = 0.2
_HANDOFF_COUNTERS = ("handoff_copies", "handoff_failures", "handoff_planned", "handoff_finished")
_BAR_WIDTH = 30
_REFUSED = frozenset({grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT})


@dataclass(frozen=True, slots=True)
class _Outcome:
    """What a drain or undrain did, for the summary."""

    target: Target
    before: str  # the node's state before the call
    after: str
    handoff: bool
    waited_s: float | None = None
    copies: int | None = None
    failures: int | None = None
    note: str = ""

    def as_json(self) -> dict[str, object]:
        record = self.target.record
        return {
            "node_id": record.node_id if record is not None else None,
            "address": self.target.address,
            "previous_state": self.before,
            "state": self.after,
            "handoff": self.handoff,
            "waited_s": self.waited_s,
            "handoff_copies": self.copies,
            "handoff_failures": self.failures,
            "note": self.note or None,
        }


def run_drain(args: argparse.Namespace) -> ExitCode:
    """Move NODE to draining (optionally handing off its blocks); exit 2 if the node refuses."""
    return _change_state(args, NodeState.DRAINING, args.handoff)


def run_undrain(args: argparse.Namespace) -> ExitCode:
    """Move NODE back to active."""
    return _change_state(args, NodeState.ACTIVE, False)


def _change_state(args: argparse.Namespace, state: NodeState, handoff: bool) -> ExitCode:
    if not args.etcd:
        target = Target(nodes.resolve(args.node, args.nodes, args.timeout, args.credentials))
        return _apply(args, None, target, state, handoff)
    with open_session(args, args.command) as session:
        return _apply(args, session, session.resolve(args.node), state, handoff)


def _apply(
    args: argparse.Namespace, session: ClusterSession | None, target: Target, state: NodeState, handoff: bool
) -> ExitCode:
    before = nodes.probe(target.address, args.timeout, args.credentials)
    if before.error is not None or before.info is None:
        assert before.error is not None
        raise unreachable(target.address, before.error)
    if target.record is None and session is not None:
        target = Target(target.address, session.record(before.info.node_id))
    info = _set_state(target, state, handoff, args.timeout, args.credentials)
    outcome = _Outcome(target, before.info.state, info.state, handoff)
    if args.wait:
        outcome = _Waiter(args, session, target, state, before).wait(outcome)
    if args.json:
        fmt.print_json(outcome.as_json())
    else:
        print(_summary(outcome))
    if outcome.failures:
        raise CliError(ExitCode.ERROR, f"{outcome.failures} hand-off copies from {target.label} failed: see its log")
    return ExitCode.OK


def _set_state(
    target: Target, state: NodeState, handoff: bool, timeout: float, credentials: Credentials
) -> pb.ServerInfo:
    """Call SetState on the node.

    Raises:
        CliError: USAGE if the node refuses the transition (with its reason),
            UNREACHABLE if it does not answer, ERROR if it has no SetState.
    """
    channel = open_channel(target.address, credentials)
    try:
        stub = blocking_stub(channel)
        return stub.SetState(pb.SetStateRequest(state=str(state), handoff=handoff), timeout=timeout)
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        if code in _REFUSED:
            raise CliError(ExitCode.USAGE, f"{target.label} refused to become {state}: {exc.details()}") from None
        if code == grpc.StatusCode.UNIMPLEMENTED:
            raise CliError(ExitCode.ERROR, f"{target.label} has no SetState: upgrade its kvpool-server") from None
        raise unreachable(target.address, translate_rpc_error(target.address, exc)) from None
    finally:
        channel.close()


def _progress_bar(done: int, planned: int) -> str:
    """``[#####.....] 120/400 copies`` (copies stored or failed out of those planned)."""
    filled = _BAR_WIDTH * min(done, planned) // planned if planned else 0
    return f"[{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] {done}/{planned} copies"


class _Waiter:
    """Polls the node (and its etcd record) until the state change is complete."""

    def __init__(
        self,
        args: argparse.Namespace,
        session: ClusterSession | None,
        target: Target,
        state: NodeState,
        before: nodes.NodeReport,
    ) -> None:
        self._args, self._session, self._target, self._state = args, session, target, state
        self._before = before
        counters = before.stats.counters if before.stats is not None else {}
        self._baseline = {name: counters.get(name, 0) for name in _HANDOFF_COUNTERS}
        self._tty = not args.json and sys.stdout.isatty()

    def wait(self, outcome: _Outcome) -> _Outcome:
        """Block until done; returns ``outcome`` with the wait's results.

        Raises:
            CliError: TIMED_OUT after ``--wait-timeout``; UNREACHABLE if the node stops answering.
        """
        start = time.monotonic()
        blocks = self._before.dram().blocks
        skip = self._nothing_to_hand_off(outcome.handoff, blocks)
        if outcome.handoff and not skip and not self._args.json:
            limit = f"{self._args.wait_timeout:g} s"
            print(f"waiting for {self._target.label} to hand off {blocks} blocks (up to {limit})", flush=True)
        while True:
            stats = self._stats()
            handoff_done = not outcome.handoff or bool(skip) or self._moved(stats, "handoff_finished") > 0
            record_done, note = self._record_done()
            elapsed = time.monotonic() - start
            if handoff_done and record_done:
                self._progress_end()
                return self._finish(outcome, stats, elapsed, note or skip)
            if elapsed > self._args.wait_timeout:
                self._progress_end()
                raise CliError(ExitCode.TIMED_OUT, self._late_message(handoff_done))
            copied = self._moved(stats, "handoff_copies") + self._moved(stats, "handoff_failures")
            bar = f" {_progress_bar(copied, self._moved(stats, 'handoff_planned'))}" if outcome.handoff else ""
            self._progress(f"waiting for {self._target.label}: {elapsed:.1f} s{bar}")
            time.sleep(_POLL_S)

    def _moved(self, stats: pb.Stats, name: str) -> int:
        """How far counter ``name`` moved since the drain began."""
        return stats.counters.get(name, 0) - self._baseline[name]

    def _nothing_to_hand_off(self, handoff: bool, blocks: int) -> str:
        """Why a hand-off will not move any counter ('' if it will)."""
        if not handoff:
            return ""
        if blocks == 0:
            return f"{self._target.label} holds no blocks: nothing to hand off"
        record = self._target.record
        if self._session is not None and record is not None and not self._session.others_active(record.node_id):
            return f"no other active node in cluster {self._session.cluster!r}: the hand-off copies nothing"
        return ""

    def _stats(self) -> pb.Stats:
        report = nodes.probe(self._target.address, self._args.timeout, self._args.credentials)
        if report.error is not None or report.stats is None:
            assert report.error is not None
            raise unreachable(self._target.address, report.error)
        return report.stats

    def _record_done(self) -> tuple[bool, str]:
        """Whether etcd shows the new state (True without etcd), and a note if the node left."""
        record = self._target.record
        if self._session is None or record is None:
            return True, ""
        now = self._session.record(record.node_id)
        if now is None:
            return True, f"{record.node_id} left the cluster"
        return now.state is self._state, ""

    def _finish(self, outcome: _Outcome, stats: pb.Stats, elapsed: float, note: str) -> _Outcome:
        copies = failures = None
        if outcome.handoff:
            copies = stats.counters.get("handoff_copies", 0) - self._baseline["handoff_copies"]
            failures = stats.counters.get("handoff_failures", 0) - self._baseline["handoff_failures"]
        return _Outcome(
            outcome.target, outcome.before, outcome.after, outcome.handoff, round(elapsed, 3), copies, failures, note
        )

    def _late_message(self, handoff_done: bool) -> str:
        limit = f"{self._args.wait_timeout:g} s"
        if not handoff_done:
            return (
                f"hand-off from {self._target.label} not finished after {limit}: it goes on in the background; "
                f"see `kvpoolctl stats {self._args.node}` and the node's log"
            )
        return f"etcd does not show {self._target.label} as {self._state} after {limit}: is the node registered?"

    def _progress(self, text: str) -> None:
        if self._tty:
            sys.stdout.write(f"\r{text}")
            sys.stdout.flush()

    def _progress_end(self) -> None:
        if self._tty:
            sys.stdout.write("\r\033[K")
            sys.stdout.flush()


def _summary(outcome: _Outcome) -> str:
    line = f"{outcome.target.label}: {outcome.before or '?'} -> {outcome.after}"
    if outcome.handoff:
        line += ", hand-off started" if outcome.waited_s is None else ""
    if outcome.waited_s is not None:
        line += f" (done in {outcome.waited_s:.1f} s)"
    if outcome.copies is not None and (outcome.copies or outcome.failures or not outcome.note):
        line += f"\nhand-off: {outcome.copies} copies stored on other nodes, {outcome.failures} failed"
    if outcome.note:
        line += f"\n{outcome.note}"
    return line
