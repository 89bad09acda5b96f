"""Tiering benchmark: reload rate of evicted blocks, and LRU vs prefix-aware hit rate.

Both parts run in one invocation, on loopback:

1. Reload rate. One daemon with a small DRAM tier (96 MiB) and an SSD tier in a
   directory on local disk (default settings: 256 MiB segments, read-ahead on). The
   same blocks are read (batches of 32 blocks of 384 KiB):
   - ``dram``: blocks resident in DRAM;
   - ``ssd``: blocks only on SSD, read in a pass larger than DRAM (each block is
     promoted into DRAM, as by default, and evicted again before the next pass),
     with the segment files' page cache dropped before the pass by
     ``posix_fadvise(POSIX_FADV_DONTNEED)``;
   - ``raw``: the same bytes read sequentially from one file of the same size in
     1 MiB ``preadv`` calls, page cache dropped the same way: the device's rate;
   - ``ssd, page cache warm``: an SSD pass right after another, its records still
     in the page cache: the SSD path's rate without the device, its CPU ceiling;
   - ``ssd, read-ahead off``: a second daemon holding the same blocks in segments
     of its own, started with ``--ssd-read-ahead 0``, whose SSD passes alternate with
     the first's in every round. Each batch then waits for its own disk reads (the
     kernel's read-ahead only).
   Reported as GB/s and the ratio ssd / raw (target >= 0.5). Beside the rates, the
   CPU seconds the daemon and the client spent in each SSD pass, and the share of
   each pass the device was busy (``/sys/dev/block/*/stat``), say whether a pass
   waited on the device or on the CPUs.
2. Hit rate. Two daemons without SSD, one per eviction policy, replay the same
   multi-turn trace (conversations of growing prefixes plus shared documents)
   whose working set is 3x DRAM. Each turn looks up its prefix, reads the hits
   and puts the rest; the hit rate is reused blocks / blocks needed. Reported per
   policy and as the ratio prefix / lru.

Run: python bench/tiering.py [--out bench/results] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvpool_client import BlockKey, KVPoolClient
from tests.support.daemon import DaemonProcess, start_daemon

BLOCK = 384 << 10
BATCH = 32  # an engine loads a prefix of tens of blocks in one get
NS = "bench@bf16@tiering@tp0of1"


@dataclass(frozen=True, slots=True)
class PassCpu:
    """CPU seconds (user + system) spent during one pass, and the pass's wall seconds."""

    daemon: float
    client: float
    wall: float


@dataclass(frozen=True, slots=True)
class ReloadResult:
    dram_gb_s: float
    ssd_gb_s: float
    raw_gb_s: float
    ssd_warm_gb_s: float  # SSD pass with its records in the page cache: no device I/O
    ssd_no_read_ahead_gb_s: float  # SSD passes of a daemon with --ssd-read-ahead 0
    data_bytes: int
    ssd_over_raw_per_round: tuple[float, ...]  # each round: an SSD pass, then a raw pass
    no_read_ahead_over_raw_per_round: tuple[float, ...]
    read_ahead_gain_per_round: tuple[float, ...]  # SSD rate with read-ahead / without, same round
    ssd_cpu_s: PassCpu  # medians over the SSD passes
    device_busy: dict[str, float | None]  # median share of each kind of pass the device was busy; None: unknown
    page_cache: str = "dropped per file with posix_fadvise(POSIX_FADV_DONTNEED) before each pass"

    @property
    def ssd_over_raw(self) -> float:
        """Median over the rounds of SSD rate / raw rate."""
        return statistics.median(self.ssd_over_raw_per_round)

    @property
    def no_read_ahead_over_raw(self) -> float:
        return statistics.median(self.no_read_ahead_over_raw_per_round)

    @property
    def read_ahead_gain(self) -> float:
        return statistics.median(self.read_ahead_gain_per_round)


@dataclass(frozen=True, slots=True)
class HitRateResult:
    policy: str
    needed_blocks: int
    hit_blocks: int
    working_set_blocks: int
    dram_blocks: int

    @property
    def hit_rate(self) -> float:
        return self.hit_blocks / self.needed_blocks


# -- part 1: reload rate -----------------------------------------------------------


def drop_page_cache(directory: Path) -> None:
    for path in directory.glob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def block_keys(prefix: bytes, n: int) -> list[BlockKey]:
    return [BlockKey(NS, prefix + b"%06d" % i) for i in range(n)]


def timed_gets(pool: KVPoolClient, keys: list[BlockKey]) -> float:
    """Seconds to read ``keys`` in batches into reused buffers; every block must hit."""
    buffers = [bytearray(BLOCK) for _ in range(BATCH)]
    started = time.perf_counter()
    for start in range(0, len(keys), BATCH):
        batch = keys[start : start + BATCH]
        result = pool.get(batch, buffers[: len(batch)])
        if result.hits != len(batch):
            raise RuntimeError(f"expected {len(batch)} hits, got {result.statuses}")
    return time.perf_counter() - started


def wait_for_demoter(pool: KVPoolClient, address: str, behind_by: int, timeout: float = 30.0) -> None:
    """Wait until at least ``behind_by`` blocks were demoted, so none is evicted unsaved."""
    deadline = time.monotonic() + timeout
    while ssd_demotions(pool, address) < behind_by:
        if time.monotonic() > deadline:
            raise RuntimeError("the demoter fell behind for 30 s")
        time.sleep(0.005)


def ssd_demotions(pool: KVPoolClient, address: str) -> int:
    return next(t.demotions for t in pool.stats(address).tiers if t.name == "ssd")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds ``pid`` has used (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def device_busy_ms(directory: Path) -> int | None:
    """Milliseconds the block device under ``directory`` has been busy, or None if unknown (tmpfs, overlay)."""
    device = os.stat(directory).st_dev
    try:
        fields = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}/stat").read_text().split()
        return int(fields[9])  # io_ticks
    except (OSError, IndexError, ValueError):
        return None


@dataclass(slots=True)
class PassMeter:
    """Wall time, CPU time of the daemon and this process, and device busy time of one pass."""

    daemon_pid: int
    directory: Path
    started: tuple[float, float, float, int | None] = (0.0, 0.0, 0.0, None)
    cpu: PassCpu = PassCpu(0.0, 0.0, 0.0)
    busy: float | None = None  # share of the pass the device was busy

    def __enter__(self) -> PassMeter:
        self.started = (
            time.perf_counter(),
            cpu_seconds(self.daemon_pid),
            cpu_seconds(os.getpid()),
            device_busy_ms(self.directory),
        )
        return self

    def __exit__(self, *exc_info: object) -> None:
        wall, daemon, client, busy = self.started
        self.cpu = PassCpu(
            cpu_seconds(self.daemon_pid) - daemon, cpu_seconds(os.getpid()) - client, time.perf_counter() - wall
        )
        now = device_busy_ms(self.directory)
        self.busy = None if busy is None or now is None else (now - busy) / 1e3 / self.cpu.wall


def raw_sequential_read(path: Path) -> float:
    """Seconds to read ``path`` front to back in 1 MiB preadv calls."""
    buffer = bytearray(1 << 20)
    fd = os.open(path, os.O_RDONLY)
    try:
        started, offset = time.perf_counter(), 0
        while (n := os.preadv(fd, [buffer], offset)) > 0:
            offset += n
        return time.perf_counter() - started
    finally:
        os.close(fd)


def write_file(path: Path, payload: bytes, count: int) -> None:
    with open(path, "wb") as file:
        for _ in range(count):
            file.write(payload)


@dataclass(slots=True)
class Rounds:
    """Seconds of each kind of pass, one per round, and what the meters saw."""

    ssd: list[float] = field(default_factory=list)
    ssd_off: list[float] = field(default_factory=list)  # the daemon with read-ahead off
    raw: list[float] = field(default_factory=list)
    warm: list[float] = field(default_factory=list)
    ssd_cpu: list[PassCpu] = field(default_factory=list)
    busy: dict[str, list[float | None]] = field(default_factory=lambda: {"ssd": [], "raw": []})


@dataclass(frozen=True, slots=True)
class SsdNode:
    """A daemon with an SSD tier, filled with the benchmark's blocks, and a client of it."""

    node: DaemonProcess
    pool: KVPoolClient
    segments: Path

    def cold_pass(self, keys: list[BlockKey], work: Path) -> tuple[float, PassMeter]:
        drop_page_cache(self.segments)
        with PassMeter(self.node.process.pid, work) as meter:
            seconds = timed_gets(self.pool, keys)
        return seconds, meter


def fill(target: SsdNode, cold: list[BlockKey], hot: list[BlockKey], payload: bytes) -> None:
    """Put ``cold`` (each batch on SSD before the next: none is evicted unsaved), then ``hot``."""
    pool, address = target.pool, target.node.address
    for start in range(0, len(cold), BATCH):
        pool.put(cold[start : start + BATCH], [payload] * len(cold[start : start + BATCH])).raise_for_errors()
        wait_for_demoter(pool, address, behind_by=start + BATCH - 64)
    pool.put(hot, [payload] * len(hot)).raise_for_errors()
    lost = pool.stats(address).counters["dram_evictions_lost"]
    if lost:
        raise RuntimeError(f"{lost} blocks were evicted before reaching SSD")


def alternate_passes(on: SsdNode, off: SsdNode, work: Path, keys: list[BlockKey], raw: Path, rounds: int) -> Rounds:
    """``rounds`` times: an SSD pass of each daemon (read-ahead on, then off, or the other
    way round every other round), a warm pass, a raw pass; page cache dropped before each cold one."""
    seen = Rounds()
    for n in range(rounds):
        for target in (on, off) if n % 2 == 0 else (off, on):
            seconds, meter = target.cold_pass(keys, work)
            if target is off:
                seen.ssd_off.append(seconds)
                continue
            seen.ssd.append(seconds)
            seen.ssd_cpu.append(meter.cpu)
            seen.busy["ssd"].append(meter.busy)
            seen.warm.append(timed_gets(on.pool, keys))  # evicted from DRAM again, still in the page cache
        drop_page_cache(work)
        with PassMeter(on.node.process.pid, work) as raw_pass:
            seen.raw.append(raw_sequential_read(raw))
        seen.busy["raw"].append(raw_pass.busy)
    return seen


def measure_reload(work: Path, data_mib: int, rounds: int) -> ReloadResult:
    """DRAM, SSD and raw-device read rates; SSD and raw alternate ``rounds`` times (the
    device's speed drifts, so each round compares passes taken seconds apart). Two daemons
    hold the same blocks, one with read-ahead off, and their passes alternate too."""
    n = (data_mib << 20) // BLOCK
    cold, hot = block_keys(b"cold", n), block_keys(b"hot", 64)  # 24 MiB of hot blocks
    ssd_cold = cold[: len(cold) - (96 << 20) // BLOCK]  # blocks surely out of DRAM
    raw, payload = work / "raw.bin", os.urandom(BLOCK)
    with ExitStack() as stack:
        on, off = (
            start_ssd_node(stack, work / name, data_mib, *extra)
            for name, extra in (("segments", ()), ("segments-off", ("--ssd-read-ahead", "0")))
        )
        for target in (on, off):
            fill(target, cold, hot, payload)
        timed_gets(on.pool, hot)  # warm-up
        dram_s = min(timed_gets(on.pool, hot) for _ in range(5))
        write_file(raw, payload, len(ssd_cold))
        drop_page_cache(work)
        raw_sequential_read(raw)  # not timed: the first read after the write runs slow, which would flatter SSD
        seen = alternate_passes(on, off, work, ssd_cold, raw, rounds)
    nbytes = len(ssd_cold) * BLOCK
    return ReloadResult(
        dram_gb_s=len(hot) * BLOCK / dram_s / 1e9,
        ssd_gb_s=nbytes / statistics.median(seen.ssd) / 1e9,
        raw_gb_s=nbytes / statistics.median(seen.raw) / 1e9,
        ssd_warm_gb_s=nbytes / statistics.median(seen.warm) / 1e9,
        ssd_no_read_ahead_gb_s=nbytes / statistics.median(seen.ssd_off) / 1e9,
        data_bytes=nbytes,
        ssd_over_raw_per_round=per_round(seen.raw, seen.ssd),
        no_read_ahead_over_raw_per_round=per_round(seen.raw, seen.ssd_off),
        read_ahead_gain_per_round=per_round(seen.ssd_off, seen.ssd),
        ssd_cpu_s=PassCpu(
            *(round(statistics.median(getattr(c, f) for c in seen.ssd_cpu), 3) for f in ("daemon", "client", "wall"))
        ),
        device_busy={
            kind: None if None in shares else round(statistics.median(shares), 2) for kind, shares in seen.busy.items()
        },
    )


def per_round(baseline: list[float], measured: list[float]) -> tuple[float, ...]:
    """Rate of ``measured`` over rate of ``baseline`` (seconds of the same bytes), per round, sorted."""
    return tuple(sorted(round(b / m, 3) for b, m in zip(baseline, measured, strict=True)))


def start_ssd_node(stack: ExitStack, segments: Path, data_mib: int, *extra: str) -> SsdNode:
    """A daemon with 96 MiB of DRAM and an SSD tier in ``segments``, stopped when ``stack`` closes."""
    node = start_daemon(
        "--dram-capacity",
        "96MiB",
        "--slab-size",
        "4MiB",
        "--log-level",
        "warning",
        "--ssd-dir",
        str(segments),
        "--ssd-capacity",
        f"{4 * data_mib}MiB",
        "--ssd-demote-share",
        "1.0",
        *extra,
    )
    stack.callback(node.remove_files)
    stack.callback(node.stop)
    pool = stack.enter_context(KVPoolClient([node.address]))
    return SsdNode(node, pool, segments)


# -- part 2: hit rate ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Turn:
    chain: int  # which prefix chain
    length: int  # blocks of the chain this turn needs
    unique: int = 0  # blocks after them that only this turn has (a question about a document)
    turn_id: int = 0


def multi_turn_trace(seed: int, conversations: int, documents: int, turns: int) -> list[Turn]:
    """Conversations grow by a few blocks per turn; documents are long shared prefixes.

    Chains ``0..documents-1`` are documents (popular ones more), each read followed
    by a question of its own; the rest are conversations (each turn extends the
    previous one). Turns interleave at random.
    """
    rng = random.Random(seed)
    doc_length = {d: rng.randint(16, 48) for d in range(documents)}
    conv_length = {documents + c: rng.randint(4, 12) for c in range(conversations)}
    trace = []
    for _ in range(turns):
        if rng.random() < 0.3:
            doc = min(int(rng.paretovariate(1.2)) - 1, documents - 1)
            trace.append(Turn(doc, doc_length[doc], unique=rng.randint(1, 4), turn_id=len(trace)))
        else:
            conv = documents + rng.randrange(conversations)
            conv_length[conv] += rng.randint(2, 6)
            trace.append(Turn(conv, conv_length[conv]))
    return trace


def turn_keys(turn: Turn) -> list[BlockKey]:
    shared = [BlockKey(NS, b"c%05d-%04d" % (turn.chain, d), depth=d) for d in range(turn.length)]
    own = [
        BlockKey(NS, b"q%06d-%04d" % (turn.turn_id, d), depth=d) for d in range(turn.length, turn.length + turn.unique)
    ]
    return shared + own


def replay(node: DaemonProcess, trace: list[Turn], block: int) -> tuple[int, int]:
    """Returns (blocks needed, blocks found) over the trace."""
    needed = found = 0
    payload = bytes(block)
    with KVPoolClient([node.address]) as pool:
        for turn in trace:
            keys = turn_keys(turn)
            hit = pool.lookup(keys)
            if hit:
                pool.get(keys[:hit])  # a read refreshes recency, like an engine's load
            if hit < len(keys):
                missing = keys[hit:]
                pool.put(missing, [payload] * len(missing))
            needed, found = needed + len(keys), found + hit
    return needed, found


def measure_hit_rates(quick: bool) -> list[HitRateResult]:
    block = 16 << 10
    trace = multi_turn_trace(seed=7, conversations=60 if quick else 120, documents=30, turns=1500 if quick else 3000)
    working_set = len({k.hash for t in trace for k in turn_keys(t)})
    dram_blocks = working_set // 3  # the working set is 3x DRAM
    results = []
    for policy in ("lru", "prefix"):
        node = start_daemon(
            "--dram-capacity",
            f"{dram_blocks * block}",
            "--slab-size",
            f"{block}",
            "--eviction-policy",
            policy,
            "--log-level",
            "warning",
            "--no-prefault-arena",
        )
        try:
            needed, found = replay(node, trace, block)
        finally:
            node.stop()
            node.remove_files()
        results.append(HitRateResult(policy, needed, found, working_set, dram_blocks))
    return results


# -- report ------------------------------------------------------------------------------


def _share(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.0%}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--quick", action="store_true", help="smaller data and trace")
    parser.add_argument("--dir", type=Path, default=None, help="where SSD files go (default: a temp dir on /var/tmp)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kvpool-tiering-", dir=args.dir or "/var/tmp"))
    try:
        reload = measure_reload(work, data_mib=256 if args.quick else 768, rounds=3 if args.quick else 7)
    finally:
        for path in sorted(work.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        work.rmdir()
    rates = measure_hit_rates(args.quick)
    lru, prefix = rates
    lines = [
        "# Tiering benchmark",
        "",
        f"Reload of {reload.data_bytes >> 20} MiB in batches of {BATCH} x {BLOCK >> 10} KiB; "
        f"page cache: {reload.page_cache}.",
        "",
        "| source | GB/s (median of the rounds) |",
        "|---|---|",
        f"| DRAM tier | {reload.dram_gb_s:.2f} |",
        f"| SSD tier | {reload.ssd_gb_s:.2f} |",
        f"| raw sequential read, same device | {reload.raw_gb_s:.2f} |",
        f"| SSD tier, page cache warm (no device I/O) | {reload.ssd_warm_gb_s:.2f} |",
        f"| SSD tier, read-ahead off (`--ssd-read-ahead 0`) | {reload.ssd_no_read_ahead_gb_s:.2f} |",
        "",
        f"**SSD / raw = {reload.ssd_over_raw:.2f}** (median of rounds {reload.ssd_over_raw_per_round}; target >= 0.5); "
        f"DRAM / SSD = {reload.dram_gb_s / reload.ssd_gb_s:.2f}; SSD with a warm page cache / raw = "
        f"{reload.ssd_warm_gb_s / reload.raw_gb_s:.2f} (the most the SSD path reaches without the device); "
        f"read-ahead off: SSD / raw = {reload.no_read_ahead_over_raw:.2f} (rounds "
        f"{reload.no_read_ahead_over_raw_per_round}); read-ahead on / off = {reload.read_ahead_gain:.2f} "
        f"(rounds {reload.read_ahead_gain_per_round})",
        "",
        f"An SSD pass (medians): {reload.ssd_cpu_s.wall:.3f} s wall; CPU: daemon {reload.ssd_cpu_s.daemon:.3f} s, "
        f"client {reload.ssd_cpu_s.client:.3f} s. Device busy: {_share(reload.device_busy['ssd'])} of an SSD pass, "
        f"{_share(reload.device_busy['raw'])} of a raw pass.",
        "",
        f"Hit rate on a multi-turn trace, working set {lru.working_set_blocks} blocks = "
        f"{lru.working_set_blocks / lru.dram_blocks:.1f}x DRAM ({lru.dram_blocks} blocks):",
        "",
        "| policy | blocks needed | blocks reused | hit rate |",
        "|---|---|---|---|",
        *(f"| {r.policy} | {r.needed_blocks} | {r.hit_blocks} | {r.hit_rate:.3f} |" for r in rates),
        "",
        f"**prefix / lru hit rate = {prefix.hit_rate / lru.hit_rate:.3f}**",
    ]
    text = "\n".join(lines) + "\n"
    (args.out / "tiering.md").write_text(text)
    payload = {
        "reload": {
            **asdict(reload),
            "ssd_over_raw": reload.ssd_over_raw,
            "no_read_ahead_over_raw": reload.no_read_ahead_over_raw,
            "read_ahead_gain": reload.read_ahead_gain,
        },
        "hit_rate": [{**asdict(r), "hit_rate": r.hit_rate} for r in rates],
    }
    (args.out / "tiering.json").write_text(json.dumps(payload, indent=2))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
