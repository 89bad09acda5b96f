"""Node failures are logged once per interval per node and cause, with what was left unsaid counted."""

from __future__ import annotations

import logging

import pytest

from kvpool_client.core.errors import AuthenticationError, NodeUnavailable
from kvpool_client.failure_log import FailureLog, describe, node_label
from tests.support.clock import FakeClock


def test_one_line_per_node_and_cause_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    failures = FailureLog(interval_s=30, clock=clock)
    down = NodeUnavailable("connection refused")
    with caplog.at_level(logging.WARNING, logger="kvpool.client"):
        assert failures.note("node-1 (10.0.0.5:7700)", down)
        assert not failures.note("node-1 (10.0.0.5:7700)", down)
        assert failures.note("node-2 (10.0.0.6:7700)", down), "another node is another line"
        assert failures.note("node-1 (10.0.0.5:7700)", AuthenticationError("token")), "another cause too"
        clock.advance(30)
        assert failures.note("node-1 (10.0.0.5:7700)", down)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4, lines
    assert lines[0] == "kvpool node node-1 (10.0.0.5:7700): UNAVAILABLE: connection refused"
    assert "refused this client's token" in lines[2]
    assert lines[3].endswith("(1 more since the last report)")


def test_a_static_node_is_named_once() -> None:
    assert node_label("10.0.0.5:7700", "10.0.0.5:7700") == "10.0.0.5:7700"
    assert node_label("node-1", "10.0.0.5:7700") == "node-1 (10.0.0.5:7700)"
    assert describe(NodeUnavailable("gone")) == "UNAVAILABLE: gone"
