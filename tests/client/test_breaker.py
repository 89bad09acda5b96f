"""The per-node circuit breaker, driven by a fake clock: open at once, back off, one probe, close."""

from __future__ import annotations

import random
import threading

import pytest

from kvpool_client.breaker import CircuitBreaker, CircuitState
from tests.support.clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def exact(clock: FakeClock, probe_timeout_s: float = 30.0) -> CircuitBreaker:
    """A breaker without jitter, so back-offs are exact."""
    return CircuitBreaker(clock, jitter=0.0, probe_timeout_s=probe_timeout_s)


def test_an_unknown_node_is_closed_and_allowed(clock: FakeClock) -> None:
    breaker = exact(clock)
    assert breaker.state("n1") is CircuitState.CLOSED
    assert all(breaker.allow("n1") for _ in range(5)), "a closed circuit lets every request through"
    assert breaker.open_nodes() == []


def test_one_failure_opens_at_once_and_skips_until_the_backoff_ends(clock: FakeClock) -> None:
    breaker = exact(clock)
    assert breaker.failure("n1") == 0.5
    assert breaker.state("n1") is CircuitState.OPEN
    assert not breaker.allow("n1"), "the request right after a failure must skip the node"
    clock.advance(0.49)
    assert not breaker.allow("n1")
    assert breaker.allow("n2"), "other nodes are unaffected"
    clock.advance(0.01)
    assert breaker.allow("n1"), "back-off over: one probe goes through"


def test_only_one_probe_at_a_time(clock: FakeClock) -> None:
    breaker = exact(clock)
    breaker.failure("n1")
    clock.advance(0.5)
    assert breaker.allow("n1")
    assert breaker.state("n1") is CircuitState.HALF_OPEN
    assert not breaker.allow("n1") and not breaker.allow("n1"), "a second request while the probe is out"
    breaker.success("n1")
    assert breaker.state("n1") is CircuitState.CLOSED
    assert breaker.allow("n1") and breaker.allow("n1")


def test_failed_probes_double_the_backoff_up_to_the_cap(clock: FakeClock) -> None:
    breaker = exact(clock)
    backoffs = []
    for _ in range(8):
        backoffs.append(breaker.failure("n1"))
        clock.advance(backoffs[-1] - 0.001)
        assert not breaker.allow("n1")
        clock.advance(0.001)
        assert breaker.allow("n1"), "probe after exactly the back-off"
    assert backoffs == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0], backoffs


def test_success_resets_the_backoff(clock: FakeClock) -> None:
    breaker = exact(clock)
    for _ in range(3):
        breaker.failure("n1")
    breaker.success("n1")
    assert breaker.failure("n1") == 0.5, "after a success the next failure starts over"


def test_a_lost_probe_is_replaced_after_the_probe_timeout(clock: FakeClock) -> None:
    breaker = exact(clock, probe_timeout_s=5.0)
    breaker.failure("n1")
    clock.advance(0.5)
    assert breaker.allow("n1")  # the probe's caller never reports (cancelled)
    clock.advance(4.9)
    assert not breaker.allow("n1")
    clock.advance(0.1)
    assert breaker.state("n1") is CircuitState.OPEN
    assert breaker.allow("n1"), "a stuck half-open circuit must not shut a node out forever"


def test_jitter_stays_within_bounds_and_varies() -> None:
    breaker = CircuitBreaker(FakeClock(), jitter=0.2, rng=random.Random(7))
    draws = [breaker.backoff(1) for _ in range(200)]
    assert all(0.4 <= d <= 0.5 for d in draws), (min(draws), max(draws))
    assert len(set(draws)) > 150, "jitter must spread clients apart"
    capped = [breaker.backoff(50) for _ in range(50)]
    assert all(8.0 <= d <= 10.0 for d in capped), (min(capped), max(capped))


def test_gate_decides_once_per_node(clock: FakeClock) -> None:
    breaker = exact(clock)
    breaker.failure("down")
    clock.advance(0.5)
    gate = breaker.gate()
    assert gate("down") and gate("down"), "every key of one round agrees with the probe's verdict"
    assert not breaker.allow("down"), "the gate claimed the single probe"
    assert not breaker.gate()("down"), "a new round sees the probe in flight"
    assert gate("up")


def test_reset_forgets_failures(clock: FakeClock) -> None:
    breaker = exact(clock)
    breaker.failure("n1")
    breaker.reset("n1")
    assert breaker.state("n1") is CircuitState.CLOSED and breaker.allow("n1")


def test_settings_are_validated() -> None:
    for kwargs in ({"initial_backoff_s": 0}, {"initial_backoff_s": 2, "max_backoff_s": 1}, {"jitter": 1.0}):
        with pytest.raises(ValueError):
            CircuitBreaker(**kwargs)  # type: ignore[arg-type]


def test_threads_agree_on_a_single_probe(clock: FakeClock) -> None:
    breaker = exact(clock)
    breaker.failure("n1")
    clock.advance(1)
    allowed: list[bool] = []
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        allowed.append(breaker.allow("n1"))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert allowed.count(True) == 1, allowed


def test_failures_of_requests_already_in_flight_count_as_one_outage(clock: FakeClock) -> None:
    """Five pieces of one batch failing together must not stretch the back-off to 8 s."""
    breaker = exact(clock)
    backoffs = [breaker.failure("n1") for _ in range(5)]
    assert backoffs[0] == 0.5 and all(b <= 0.5 for b in backoffs[1:]), backoffs
    clock.advance(0.5)
    assert breaker.allow("n1"), "the probe is due after the first back-off"
    assert breaker.failure("n1") == 1.0, "a failed probe is a second outage step"
