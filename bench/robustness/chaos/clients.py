"""Client workers (separate processes): puts, verified gets and deletes of their own blocks.

Each block's key is the blake2b of its bytes, so any read can be checked. A worker
records every request, every block a put acknowledged on two nodes, and every read
answered NOT_FOUND, for the verdicts after the run.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import random
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

from bench.robustness.chaos.settings import NS, SoakSettings, client_config
from kvpool_client import BlockKey, ErrorCode, KVPoolClient, NodeUnavailable
from kvpool_client.core.errors import RequestTimeout

PUT_OK = (ErrorCode.OK, ErrorCode.ALREADY_EXISTS)
UNREACHED = "unreached"  # a read answered TIMEOUT, UNAVAILABLE, ...: neither bytes nor a miss


@dataclass(slots=True)
class Acked:
    """A block a put acknowledged on two nodes."""

    hash: bytes
    stored_on: tuple[str, ...]
    sent_at: float
    deleted_at: float | None = None


@dataclass
class WorkerResult:
    """What one worker saw, sent back to the run when its deadline passes."""

    # (time, op, keys, ok, misses, unreached, wrong): one row per request
    events: list[tuple[float, str, int, int, int, int, int]] = field(default_factory=list)
    acked: list[Acked] = field(default_factory=list)
    # (time, hash, the client's read order then) of reads answered NOT_FOUND
    misses: list[tuple[float, bytes, tuple[str, ...]]] = field(default_factory=list)
    suspects: list[bytes] = field(default_factory=list)  # not read back before their delete: checked at the end
    verified_before_delete: int = 0
    deletes_unreached: int = 0
    below_quorum: int = 0
    exceptions: list[str] = field(default_factory=list)


def block_for(worker: int, seq: int, size: int) -> tuple[BlockKey, bytes]:
    """Deterministic bytes for (worker, seq); the key is their blake2b."""
    data = random.Random(worker * 1_000_003 + seq).randbytes(size)
    return BlockKey(NS, hashlib.blake2b(data, digest_size=32).digest()), data


class Worker:
    """One client's loop: puts, verified gets and deletes of its own blocks."""

    def __init__(self, index: int, settings: SoakSettings, client: KVPoolClient) -> None:
        self.index, self.s, self.client = index, settings, client
        self.rng = random.Random(settings.seed * 7919 + index)
        self.result = WorkerResult()
        self.live: list[Acked] = []
        self.seq = 0
        self.names: dict[str, str] = {}  # address -> node name: stored_on names addresses, the verdicts names

    def run(self, deadline: float) -> WorkerResult:
        while time.monotonic() < deadline:
            try:
                self.step()
            except Exception as exc:  # the client reports failures per key; a raise is a finding
                where = "/".join(f.name for f in traceback.extract_tb(exc.__traceback__)[1:4])
                self.result.exceptions.append(f"{time.monotonic():.2f} {where}: {type(exc).__name__}: {exc}")
                time.sleep(0.05)
        return self.result

    def step(self) -> None:
        if len(self.live) > self.s.live_per_worker:
            self.delete_oldest()
        elif len(self.live) < 2 * self.s.batch or self.rng.random() < self.s.put_share:
            self.put()
        else:
            self.get()

    def put(self) -> None:
        pairs = [block_for(self.index, self.seq + i, self.s.block) for i in range(self.s.batch)]
        self.seq += self.s.batch
        sent = time.monotonic()
        result = self.client.put([k for k, _ in pairs], [d for _, d in pairs])
        self.names.update((m.address, m.node_id) for m in self.client.placement().router.members())
        below: list[BlockKey] = []
        for (key, _), status, nodes in zip(pairs, result.statuses, result.stored_on, strict=True):
            if status in PUT_OK and len(set(nodes)) >= 2:
                record = Acked(key.hash, tuple(self.names.get(n, n) for n in nodes), sent)
                self.live.append(record)
                self.result.acked.append(record)
            else:
                below.append(key)
        self.result.below_quorum += len(below)
        acked = len(pairs) - len(below)
        self.result.events.append((time.monotonic(), "put", len(pairs), acked, 0, len(below), 0))
        if below:  # a copy below quorum would sit in DRAM for good: remove it, best effort
            self.delete(below)

    def get(self) -> None:
        self.read(self.rng.sample(self.live, self.s.batch))

    def read(self, picks: list[Acked]) -> list[str]:
        """Get ``picks`` and check each: ok, wrong, miss or unreached (one verdict per block)."""
        keys = [BlockKey(NS, a.hash) for a in picks]
        router = self.client.placement().router  # the read orders this get starts from
        orders = [tuple(m.node_id for m in router.placement(k).read_order) for k in keys]
        result = self.client.get(keys)
        now, verdicts = time.monotonic(), []
        for record, order, status, buf in zip(picks, orders, result.statuses, result.buffers, strict=True):
            if status is ErrorCode.OK and buf is not None:
                verdicts.append("ok" if hashlib.blake2b(buf, digest_size=32).digest() == record.hash else "wrong")
            elif status is ErrorCode.NOT_FOUND:
                verdicts.append("miss")
                self.result.misses.append((now, record.hash, order))
            else:
                verdicts.append(UNREACHED)
        n = Counter(verdicts)
        self.result.events.append((now, "get", len(picks), n["ok"], n["miss"], n[UNREACHED], n["wrong"]))
        return verdicts

    def delete_oldest(self) -> None:
        """Read the oldest blocks a last time, then delete those that read back right.

        Every acknowledged block thus gets a verdict: read back before its delete, or
        kept (a suspect) for the final check after the faults.
        """
        doomed, self.live = self.live[: self.s.batch], self.live[self.s.batch :]
        verdicts = self.read(doomed)
        self.result.suspects += [a.hash for a, v in zip(doomed, verdicts, strict=True) if v in ("miss", UNREACHED)]
        verified = [a for a, v in zip(doomed, verdicts, strict=True) if v == "ok"]
        self.result.verified_before_delete += len(verified)
        now = time.monotonic()
        for record in verified:
            record.deleted_at = now  # from here on, no read of it is expected
        if verified:
            self.delete([BlockKey(NS, a.hash) for a in verified])

    def delete(self, keys: list[BlockKey]) -> None:
        """Delete, best effort: a delete raises, as documented, when no reader of a key answers."""
        try:
            self.client.delete(keys)
        except (NodeUnavailable, RequestTimeout):
            self.result.deletes_unreached += 1


def worker_main(index: int, settings: SoakSettings, etcd_endpoint: str, deadline: float, out: mp.Queue) -> None:
    """Process entry: run one worker until ``deadline`` (monotonic), then put its result on ``out``."""
    try:
        with KVPoolClient(config=client_config(etcd_endpoint)) as client:
            result = Worker(index, settings, client).run(deadline)
    except Exception as exc:
        result = WorkerResult(exceptions=[f"worker {index} failed: {type(exc).__name__}: {exc}"])
    out.put((index, result))
