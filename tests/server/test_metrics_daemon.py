"""/metrics of a live daemon under traffic: counters move, gauges match GetStats."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from kvpool_client import BlockKeyBuilder, ClientConfig, KVPoolClient, Namespace
from kvpool_client.core.errors import ErrorCode
from kvpool_server.metric_names import COUNTER_KEYS, FAMILIES
from tests.support.daemon import DaemonProcess
from tests.support.waiting import wait_until

NS = Namespace("metrics-model", "fp16", "L1-H1-D8-T4")
SMALL = ("--dram-capacity", "64MiB", "--slab-size", "1MiB")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(daemon: DaemonProcess) -> Samples:
    url = f"http://127.0.0.1:{daemon.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape_settled(daemon: DaemonProcess, before: dict, counter: tuple, wait_s: float = 5.0) -> dict:
    """A scrape once ``counter`` has moved since ``before``: the daemon counts a get's bytes and times
    it after its send returns, which can be just after the client has read every byte."""
    deadline = time.monotonic() + wait_s
    while True:
        now = scrape(daemon)
        if now.get(counter, 0) != before.get(counter, 0) or time.monotonic() > deadline:
            return now
        time.sleep(0.02)


def families(daemon: DaemonProcess) -> set[str]:
    url = f"http://127.0.0.1:{daemon.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        return {family.name for family in text_string_to_metric_families(response.read().decode())}


def counters_in(samples: Samples) -> dict[str, float | None]:
    """Each declared counter key's value in a scrape (None: its series is missing)."""
    values: dict[str, float | None] = {}
    for family in FAMILIES:
        for key, labels in family.series.items():
            values[key] = samples.get((f"{family.name}_total", tuple(sorted(zip(family.labels, labels, strict=True)))))
    return values


def disagreements(client: KVPoolClient, daemon: DaemonProcess) -> dict[str, tuple[int | None, float | None]]:
    stats, scraped = client.stats(daemon.address).counters, counters_in(scrape(daemon))
    return {key: (stats.get(key), scraped[key]) for key in COUNTER_KEYS if stats.get(key) != scraped[key]}


def dram(name: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return (name, (("tier", "dram"),))


def test_counters_move_under_traffic_and_gauges_match_stats(daemon_factory: Callable[..., DaemonProcess]) -> None:
    daemon = daemon_factory(*SMALL)
    assert daemon.metrics_port > 0
    before = scrape(daemon)
    keys = BlockKeyBuilder(NS, block_size=4).keys(list(range(64)))
    blocks = [bytes([i]) * 4096 for i in range(len(keys))]
    with KVPoolClient(config=ClientConfig(nodes=(daemon.address,), transport="tcp")) as client:  # tcp labels
        assert client.put(keys, blocks).stored == len(keys)
        assert [bytes(b) for b in client.get(keys).buffers] == blocks
        assert client.put(keys[:3], blocks[:3]).statuses == (ErrorCode.ALREADY_EXISTS,) * 3
        after = scrape_settled(daemon, before, ("kvpool_request_duration_seconds_count", (("op", "get"),)))
        stats = client.stats(daemon.address)

    moved = {name: after[name] - before[name] for name in after if name in before}
    assert moved[dram("kvpool_tier_hits_total")] == len(keys)
    received = moved[("kvpool_data_bytes_total", (("direction", "in"), ("transport", "tcp")))]
    assert received == (len(keys) + 3) * 4096, "the three blocks put again crossed the network too"
    assert moved[("kvpool_data_bytes_total", (("direction", "out"), ("transport", "tcp")))] == len(keys) * 4096
    assert moved[("kvpool_requests_total", (("op", "put"),))] >= 1
    assert moved[dram("kvpool_tier_blocks_written_total")] == len(keys), "each block written once"
    assert moved[("kvpool_puts_duplicate_total", ())] == 3, "blocks received again are counted, not written"
    assert moved[("kvpool_requests_total", (("op", "get"),))] >= 1
    gets_timed = moved[("kvpool_request_duration_seconds_count", (("op", "get"),))]
    assert gets_timed == moved[("kvpool_requests_total", (("op", "get"),))], f"{gets_timed} gets timed"
    assert moved[("kvpool_request_duration_seconds_sum", (("op", "get"),))] > 0
    (tier,) = stats.tiers
    assert after[dram("kvpool_tier_capacity_bytes")] == tier.capacity_bytes == 64 << 20
    assert after[dram("kvpool_tier_used_bytes")] == tier.used_bytes > 0
    assert after[dram("kvpool_tier_blocks")] == tier.blocks == len(keys) == 16
    ns_id = keys[0].namespace
    assert after[("kvpool_namespace_bytes", (("namespace", ns_id), ("tier", "dram")))] == tier.used_bytes, (
        "the one namespace holds every slot"
    )
    assert after[dram("kvpool_tier_hits_total")] == tier.hits
    assert after[dram("kvpool_tier_misses_total")] == tier.misses
    assert after[("kvpool_node_state", (("state", "active"),))] == 1
    assert after[("kvpool_etcd_registered", ())] == stats.counters["etcd_registered"] == 0
    ((info, value),) = [(dict(labels), v) for (name, labels), v in after.items() if name == "kvpool_node_info"]
    assert (info["node_id"], value) == (daemon.node_id, 1)


def test_metrics_port_minus_one_turns_it_off(daemon_factory: Callable[..., DaemonProcess]) -> None:
    daemon = daemon_factory(*SMALL, "--metrics-port", "-1")
    assert daemon.metrics_port == -1
    assert json.loads((daemon.workdir / "announce.json").read_text())["metrics_port"] == -1
    with KVPoolClient([daemon.address]) as client:
        assert client.stats(daemon.address).node_id == daemon.node_id


def test_every_declared_metric_is_in_the_scrape_and_every_counter_in_get_stats(
    daemon_factory: Callable[..., DaemonProcess],
    tmp_path: Path,
) -> None:
    daemon = daemon_factory(
        *SMALL, "--ssd-dir", str(tmp_path / "ssd"), "--ssd-capacity", "16MiB", "--ssd-segment-size", "2MiB"
    )
    keys = BlockKeyBuilder(NS, block_size=4).keys(list(range(16)))
    with KVPoolClient(config=ClientConfig(nodes=(daemon.address,), transport="tcp")) as client:
        assert client.put(keys, [b"x" * 4096] * len(keys)).stored == len(keys)
        assert client.get(keys).hits == len(keys)
        # The get's bytes are counted just after its send returns: wait until both views agree.
        wait_until(
            lambda: disagreements(client, daemon),
            lambda differ: not differ,
            "GetStats and /metrics to agree on every declared counter (key: (GetStats, /metrics))",
        )
        stats, scraped = dict(client.stats(daemon.address).counters), counters_in(scrape(daemon))
    assert not {family.name for family in FAMILIES} - families(daemon), "declared families missing from /metrics"
    assert set(COUNTER_KEYS) <= set(stats), f"declared counters missing from GetStats: {set(COUNTER_KEYS) - set(stats)}"
    assert set(stats) - set(COUNTER_KEYS) == {"etcd_registered"}, "GetStats reports only declared counters"
    assert scraped["requests_put"] == stats["requests_put"] >= 1
    assert scraped["bytes_in"] == stats["bytes_in"] == len(keys) * 4096
