"""Demo workload: an engine's view of kvpool on a local 3-node pool.

Starts etcd and three daemons on 127.0.0.1 (each registers itself; the cluster
keeps 2 replicas of every block), then plays multi-turn chats that share a
system prompt, the way a prefill node would: hash the prompt into block keys, ask
the pool how many leading blocks it holds, load those into KV tensors, "compute"
the rest, and write the new blocks back. Every loaded block is checked against
the bytes that were written. Last, one daemon is killed with SIGKILL and the
longest prompt is served again: its blocks come from the surviving replicas.

Run: python bench/demo.py [--nodes host:port,...] [--conversations 6 --turns 4]
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvpool_client import BlockKey, BlockKeyBuilder, ClientConfig, KVPoolClient, Namespace
from kvpool_client.core.membership.records import ClusterConfig
from tests.support.daemon import LocalCluster

# Qwen2.5-0.5B's KV shape: 24 layers x (K, V) x 2 KV heads x head_dim 64, 16 tokens per block, bf16.
LAYERS, KV_HEADS, HEAD_DIM, BLOCK_TOKENS = 24, 2, 64, 16
BLOCK_SHAPE = (LAYERS, 2, KV_HEADS, BLOCK_TOKENS, HEAD_DIM)
NAMESPACE = Namespace("demo-qwen2.5-0.5b", "bf16", f"L{LAYERS}-KV2-H{KV_HEADS}-D{HEAD_DIM}-T{BLOCK_TOKENS}")


@dataclass(frozen=True, slots=True)
class TurnReport:
    conversation: int
    turn: int
    prompt_tokens: int
    blocks: int
    hit_blocks: int
    loaded_bytes: int
    written_blocks: int
    millis: float


def kv_block_for(key: BlockKey) -> torch.Tensor:
    """The KV bytes a model would compute for a block: deterministic from its key."""
    generator = torch.Generator().manual_seed(int.from_bytes(key.hash[:8], "little"))
    return torch.randn(BLOCK_SHAPE, generator=generator).to(torch.bfloat16)


def make_conversations(count: int, turns: int, seed: int) -> list[list[list[int]]]:
    """Token ids of each turn's prompt: shared system prompt + growing history."""
    rng = random.Random(seed)
    system = [rng.randrange(32000) for _ in range(512)]
    chats = []
    for _ in range(count):
        history, prompts = list(system), []
        for _ in range(turns):
            history += [rng.randrange(32000) for _ in range(rng.randrange(80, 300))]
            prompts.append(list(history))
            history += [rng.randrange(32000) for _ in range(rng.randrange(40, 120))]  # the model's answer
        chats.append(prompts)
    return chats


def serve_turn(client: KVPoolClient, builder: BlockKeyBuilder, tokens: list[int]) -> tuple[int, int, int]:
    """One prefill: load the cached prefix, compute and store the rest.

    Returns:
        (blocks hit, bytes loaded, blocks written).
    """
    keys = builder.keys(tokens)
    hits = client.lookup(keys)
    pages = [torch.empty(BLOCK_SHAPE, dtype=torch.bfloat16) for _ in range(hits)]
    loaded = client.get(keys[:hits], pages)
    loaded.raise_for_errors()
    for key, page in zip(keys[:hits], pages, strict=True):
        if not torch.equal(page, kv_block_for(key)):
            raise AssertionError(f"block {key} came back with wrong bytes")
    missing = keys[loaded.prefix_hits :]
    written = client.put(missing, [kv_block_for(k) for k in missing])
    written.raise_for_errors()
    return hits, sum(p.numel() * p.element_size() for p in pages), written.stored


def run(client: KVPoolClient, chats: list[list[list[int]]]) -> list[TurnReport]:
    builder = BlockKeyBuilder(NAMESPACE, block_size=BLOCK_TOKENS, seed="0")
    reports: list[TurnReport] = []
    turns = len(chats[0])
    for turn in range(turns):  # round-robin, like concurrent users
        for index, prompts in enumerate(chats):
            start = time.perf_counter()
            hits, loaded, written = serve_turn(client, builder, prompts[turn])
            millis = (time.perf_counter() - start) * 1e3
            blocks = len(prompts[turn]) // BLOCK_TOKENS
            reports.append(TurnReport(index, turn, len(prompts[turn]), blocks, hits, loaded, written, millis))
            print(
                f"chat {index} turn {turn}: {len(prompts[turn]):5d} tokens, {blocks:3d} blocks, "
                f"{hits:3d} from the pool ({loaded / 2**20:6.1f} MiB loaded), {written:3d} written, {millis:6.1f} ms"
            )
    return reports


def summarize(client: KVPoolClient, addresses: list[str], reports: list[TurnReport]) -> None:
    blocks = sum(r.blocks for r in reports)
    hits = sum(r.hit_blocks for r in reports)
    loaded = sum(r.loaded_bytes for r in reports)
    print(
        f"\n{len(reports)} prefills, {blocks} blocks: {hits} loaded from the pool ({hits / blocks:.0%}), "
        f"{blocks - hits} computed; {loaded / 2**20:.1f} MiB loaded, every block verified"
    )
    for address in addresses:
        stats = client.stats(address)
        dram = stats.tiers[0]
        # no per-node hits: same-node reads copy out of the arena without asking the daemon
        print(f"  {stats.node_id:>8} {address}: {dram.blocks:4d} blocks, {dram.used_bytes / 2**20:6.1f} MiB used")


def survive_a_crash(cluster: LocalCluster, client: KVPoolClient, prompt: list[int]) -> None:
    """Kill one daemon with SIGKILL, then serve the longest prompt again from the replicas."""
    victim = cluster.daemons[0]
    victim.stop(signal.SIGKILL)
    print(f"\nkilled {victim.node_id} (SIGKILL); serving the longest prompt again ...")
    start = time.perf_counter()
    hits, loaded, written = serve_turn(client, BlockKeyBuilder(NAMESPACE, BLOCK_TOKENS, seed="0"), prompt)
    millis = (time.perf_counter() - start) * 1e3
    blocks = len(prompt) // BLOCK_TOKENS
    print(
        f"{blocks} blocks, {hits} from the surviving replicas ({loaded / 2**20:.1f} MiB), "
        f"{written} recomputed, {millis:.1f} ms, every block verified"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", help="use running nodes (host:port,...) instead of starting 3 locally")
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    chats = make_conversations(args.conversations, args.turns, args.seed)
    if args.nodes:
        nodes = args.nodes.split(",")
        with KVPoolClient(nodes) as client:
            summarize(client, nodes, run(client, chats))
        return 0
    print("starting a local kvpool on 127.0.0.1: etcd and 3 daemons, 2 replicas per block ...")
    flags = ("--dram-capacity", "256MiB", "--slab-size", "1MiB", "--lease-ttl-s", "3")
    with LocalCluster(3, *flags, config=ClusterConfig(replicas=2)) as cluster:  # clients and repair read R=2
        print("etcd:", cluster.etcd_endpoints[0], " nodes:", ", ".join(cluster.addresses), "\n")
        config = ClientConfig(etcd_endpoints=cluster.etcd_endpoints, cluster=cluster.cluster)
        with KVPoolClient(config=config) as client:
            summarize(client, cluster.addresses, run(client, chats))
            survive_a_crash(cluster, client, max((p[-1] for p in chats), key=len))
    return 0


if __name__ == "__main__":
    sys.exit(main())
