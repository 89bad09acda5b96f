"""A well-behaved client's throughput while hundreds of hostile connections press on the daemon.

Each round measures the client's batch-32 puts and gets of 384 KiB blocks alone, then with
hostile peers connected (interleaved, so the machine's drift falls on both): a third announce
a 256 MiB put and send nothing, a third trickle a put one byte per second, a third send puts
of blocks the daemon already holds and stop after one byte (their payload is to be drained).
It reports the ratio with / alone (target >= 0.7) and the daemon's RSS before, during and
after, from /proc.

    python bench/robustness/hostile.py [--peers 300] [--rounds 3] [--seconds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import statistics
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kvpool_client import BlockKey, ClientConfig, KVPoolClient  # noqa: E402
from kvpool_client.core.wire import PutRequest, encode  # noqa: E402
from tests.support.daemon import running_daemon  # noqa: E402
from tests.support.rawwire import RawConnection  # noqa: E402

MiB = 1 << 20
BLOCK = 384 * 1024
BATCH = 32
NS = "hostile@bf16@bench@tp0of1"


def keys(tag: str, count: int) -> list[BlockKey]:
    return [BlockKey(NS, hashlib.sha256(f"{tag}-{i}".encode()).digest()) for i in range(count)]


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return int(next(line for line in status if line.startswith("VmRSS:")).split()[1]) / 1024


def client_gbps(address: str, seconds: float, tag: str) -> float:
    """Bytes put and got per second by one client, batches of 32, for ``seconds``."""
    with KVPoolClient(config=ClientConfig(nodes=(address,), transport="tcp")) as client:
        return round_trips_gbps(client, seconds, lambda serial: keys(f"{tag}-{serial}", BATCH))


def round_trips_gbps(client: KVPoolClient, seconds: float, batch_keys: Callable[[int], list[BlockKey]]) -> float:
    """Bytes put and got per second by ``client`` for ``seconds``: each batch (``batch_keys(serial)``,
    of 384 KiB blocks) put, got, deleted."""
    blocks = [bytes([i]) * BLOCK for i in range(BATCH)]
    moved, serial = 0, 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        batch = batch_keys(serial)
        serial += 1
        client.put(batch, blocks[: len(batch)]).raise_for_errors()
        client.get(batch).raise_for_errors()
        client.delete(batch)
        moved += 2 * len(batch) * BLOCK
    return moved / (time.perf_counter() - started) / 1e9


def hostile(stack: ExitStack, data_address: str, peers: int, held: list[BlockKey], stop: threading.Event) -> None:
    """Open ``peers`` hostile connections; trickling ones get a byte a second until ``stop``."""
    tricklers = []
    for i in range(peers):
        conn = stack.enter_context(RawConnection(data_address))
        kind = i % 3
        if kind == 0:  # 64 x 4 MiB announced, nothing sent
            hashes = [k.hash for k in keys(f"stall-{i}", 64)]
            conn.send(encode(PutRequest(i + 1, NS, hashes, [4 * MiB] * 64)))
        elif kind == 1:  # a put trickled one byte at a time
            frame = encode(PutRequest(i + 1, NS, [keys(f"trickle-{i}", 1)[0].hash], [4 * MiB]))
            conn.send(frame)
            tricklers.append(conn)
        else:  # blocks the node holds: their payload is drained, one byte comes
            conn.send(encode(PutRequest(i + 1, NS, [k.hash for k in held], [BLOCK] * len(held))) + b"\0")

    def trickle() -> None:
        while not stop.wait(1.0):
            for conn in tricklers:
                with contextlib.suppress(OSError):  # dropped by its deadline: what should happen
                    conn.send(b"\0")

    threading.Thread(target=trickle, daemon=True).start()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    ratios, rss = [], {"before": 0.0, "during": 0.0, "after": 0.0}
    with running_daemon("--dram-capacity", "1GiB", "--slab-size", "4MiB", "--io-timeout-s", "30") as daemon:
        pid = daemon.process.pid
        held = keys("held", 8)
        with KVPoolClient([daemon.address]) as client:
            client.put(held, [b"h" * BLOCK] * len(held)).raise_for_errors()
        for round_ in range(args.rounds):
            alone = client_gbps(daemon.address, args.seconds, f"alone-{round_}")
            rss["before"] = max(rss["before"], rss_mib(pid))
            stop = threading.Event()
            with ExitStack() as stack:
                hostile(stack, daemon.data_address, args.peers, held, stop)
                pressed = client_gbps(daemon.address, args.seconds, f"pressed-{round_}")
                rss["during"] = max(rss["during"], rss_mib(pid))
                stop.set()
            ratios.append(pressed / alone)
            print(
                f"round {round_}: alone {alone:.2f} GB/s, with {args.peers} hostile peers {pressed:.2f} GB/s "
                f"({pressed / alone:.2f})",
                flush=True,
            )
        rss["after"] = rss_mib(pid)
    print(
        f"with hostile peers / alone: {statistics.median(ratios):.2f} (target >= 0.7; rounds "
        f"{', '.join(f'{r:.2f}' for r in ratios)})"
    )
    print(f"daemon RSS: before {rss['before']:.0f} MiB, during {rss['during']:.0f} MiB, after {rss['after']:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
