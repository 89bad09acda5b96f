"""The metrics collector over a real tiny DRAM and SSD store, rendered and parsed back."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvpool_client.core.membership.records import NodeState
from kvpool_server.alloc.arena import SharedArena
from kvpool_server.alloc.slab import SlabAllocator
from kvpool_server.index import BlockEntry
from kvpool_server.metrics import KVPoolCollector, build_registry
from kvpool_server.stats import Counters, Latencies
from kvpool_server.tiers.dram import DramTier
from kvpool_server.tiers.ssd import SsdConfig, SsdTier
from kvpool_server.tiers.store import BlockStore

KiB = 1024


@dataclass
class FakePresence:
    state: NodeState = NodeState.ACTIVE
    session: str = "standalone"


@pytest.fixture
def counters() -> Counters:
    return Counters()


@pytest.fixture
def store(counters: Counters) -> Iterator[BlockStore]:
    directory = tempfile.mkdtemp(prefix="kvpool-metrics-")
    arena = SharedArena(directory, "kvpool-metrics-test", 64 * KiB, prefault=False)
    ssd = SsdTier(SsdConfig(f"{directory}/ssd", 256 * KiB, 64 * KiB, fsync=False), counters)
    blocks = BlockStore(DramTier(arena, SlabAllocator(64 * KiB, 16 * KiB), counters), ssd, counters)
    try:
        yield blocks
    finally:
        blocks.close()
        ssd.close()
        arena.close()
        shutil.rmtree(directory)


def scrape(collector: KVPoolCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(build_registry(collector)).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_families_follow_the_tier_counters_and_presence(store: BlockStore, counters: Counters) -> None:
    tier = store.dram
    presence = FakePresence()
    latencies = Latencies()
    collector = KVPoolCollector("node-x", "1.2.3", store, counters, latencies, presence)
    before = scrape(collector)
    assert before[("kvpool_tier_capacity_bytes", (("tier", "dram"),))] == 64 * KiB
    assert before[("kvpool_tier_blocks", (("tier", "dram"),))] == 0
    assert before[("kvpool_tier_hits_total", (("tier", "dram"),))] == 0
    assert before[("kvpool_requests_total", (("op", "get"),))] == 0
    assert before[("kvpool_node_info", (("node_id", "node-x"), ("version", "1.2.3")))] == 1
    assert before[("kvpool_tier_capacity_bytes", (("tier", "ssd"),))] == 256 * KiB
    assert before[("kvpool_tier_demotions_total", (("tier", "ssd"),))] == 0

    entry = tier.reserve(("ns", b"a"), 4 * KiB)
    assert isinstance(entry, BlockEntry)
    tier.commit(entry)
    found = tier.acquire(("ns", b"a"))
    assert found is not None
    tier.release(found)
    assert tier.acquire(("ns", b"missing")) is None
    assert store.ssd is not None and store.ssd.write(("ns", b"a"), tier.view(found), found.checksum)
    latencies.observe("get", 0.0003)
    latencies.observe("get", 2.0)
    counters.add("bytes_in", 4096)
    counters.add("requests_put")
    counters.add("errors_not_found", 2)
    presence.state, presence.session = NodeState.DRAINING, "registered"

    after = scrape(collector)
    assert after[("kvpool_tier_used_bytes", (("tier", "dram"),))] == 4 * KiB
    assert after[("kvpool_tier_blocks", (("tier", "dram"),))] == 1
    assert after[("kvpool_tier_hits_total", (("tier", "dram"),))] == 1
    assert after[("kvpool_tier_misses_total", (("tier", "dram"),))] == 1
    assert after[("kvpool_tier_blocks_written_total", (("tier", "dram"),))] == 1
    assert after[("kvpool_tier_blocks", (("tier", "ssd"),))] == 1
    assert after[("kvpool_tier_demotions_total", (("tier", "ssd"),))] == 1
    assert after[("kvpool_tier_failing", (("tier", "ssd"),))] == 0
    assert after[("kvpool_data_bytes_total", (("direction", "in"), ("transport", "tcp")))] == 4096
    assert after[("kvpool_requests_total", (("op", "put"),))] == 1
    assert after[("kvpool_request_duration_seconds_bucket", (("le", "0.00025"), ("op", "get")))] == 0
    assert after[("kvpool_request_duration_seconds_bucket", (("le", "0.0005"), ("op", "get")))] == 1
    assert after[("kvpool_request_duration_seconds_bucket", (("le", "+Inf"), ("op", "get")))] == 2
    assert after[("kvpool_request_duration_seconds_count", (("op", "get"),))] == 2
    assert after[("kvpool_request_duration_seconds_sum", (("op", "get"),))] == pytest.approx(2.0003)
    assert after[("kvpool_request_duration_seconds_count", (("op", "put"),))] == 0
    assert after[("kvpool_errors_total", (("code", "not_found"),))] == 2
    states = {labels[0][1]: v for (name, labels), v in after.items() if name == "kvpool_node_state"}
    assert states == {"joining": 0, "active": 0, "draining": 1}
    assert after[("kvpool_etcd_registered", ())] == 1
    assert after[("kvpool_etcd_session", (("session", "registered"),))] == 1
    assert after[("kvpool_etcd_session", (("session", "standalone"),))] == 0
    assert store.delete(("ns", b"a"))
    assert tier.usage().used_bytes == 0
