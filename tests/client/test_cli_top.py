"""kvpoolctl top (live per-node view) and completion (shell scripts from the parser)."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import threading
import time

import pytest

from kvpool_client import BlockKeyBuilder, ClientConfig, KVPoolClient, Namespace
from kvpool_client.admin.cli import build_parser
from kvpool_client.admin.completion import bash_script, collect
from kvpool_client.admin.nodes import NodeReport
from kvpool_client.admin.top import NodeRow, Sample, node_row, render
from kvpool_client.core.proto import kvpool_pb2 as pb
from tests.client.test_cli import dead_address, kvpoolctl, one_line_error
from tests.support.daemon import DaemonProcess

NS = Namespace("top-model", "fp16", "L1-H1-D8-T4")


def report(uptime: float, hits: int, misses: int, requests: int, bytes_in: int = 0) -> NodeReport:
    info = pb.ServerInfo(node_id="n1", state="active")
    dram = pb.TierStats(name="dram", capacity_bytes=1 << 20, used_bytes=1 << 18, blocks=4, hits=hits, misses=misses)
    counters = {"requests_get": requests, "requests_put": 1, "bytes_in": bytes_in, "bytes_out": 0}
    return NodeReport("10.0.0.1:50051", info, pb.Stats(node_id="n1", uptime_s=uptime, tiers=[dram], counters=counters))


def test_rates_cover_the_interval_only() -> None:
    before = Sample(10.0, report(100.0, hits=90, misses=10, requests=1000, bytes_in=0))
    after = Sample(12.0, report(102.0, hits=93, misses=7 + 10, requests=1010, bytes_in=4096))
    row = node_row(after, before)
    assert row.requests_per_s == pytest.approx(5.0)
    assert row.bytes_in_per_s == pytest.approx(2048.0)
    assert row.hit_rate == pytest.approx(3 / 10)  # 3 hits, 7 misses in the interval; 90% since start
    assert row.cells()[4] == "25%"  # 256 KiB of 1 MiB


def test_first_sample_and_restart_give_no_rates() -> None:
    first = node_row(Sample(1.0, report(5.0, hits=3, misses=1, requests=9)), None)
    assert first.requests_per_s is None and first.hit_rate == pytest.approx(0.75)
    assert first.cells()[7] == "-"
    # Uptime went down: the node restarted and its counters began again at zero.
    restarted = node_row(
        Sample(3.0, report(1.0, hits=0, misses=0, requests=2)),
        Sample(1.0, report(50.0, hits=3, misses=1, requests=900)),
    )
    assert restarted.requests_per_s is None and restarted.hit_rate is None


def test_render_counts_unreachable_nodes() -> None:
    rows = [node_row(Sample(1.0, report(5.0, 1, 1, 1)), None), NodeRow("10.0.0.2:50051", None, "", error="refused")]
    screen = render(rows, "title")
    assert "1/2 nodes reachable, 256.0 KiB / 1.0 MiB used" in screen
    assert "10.0.0.2:50051  unreachable" in screen
    assert "no nodes" in render([], "title")


def test_top_shows_traffic_between_refreshes(daemon: DaemonProcess) -> None:
    top = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvpool_client.admin.cli",
            "--json",
            "--nodes",
            daemon.address,
            "top",
            "--count",
            "3",
            "--interval",
            "0.7",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    keys = BlockKeyBuilder(NS, 4).keys(list(range(4 * 8)))
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(top.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    # tcp: same-node gets over shm would copy out of the arena without a request top could count
    with KVPoolClient(config=ClientConfig(nodes=(daemon.address,), transport="tcp")) as client:
        assert client.put(keys, [b"kv" * 512] * len(keys)).ok
        # Traffic until top has printed every refresh: its start-up may take seconds on a busy machine.
        deadline = time.monotonic() + 60
        while reader.is_alive() and time.monotonic() < deadline:
            client.get(keys).raise_for_errors()
    err = top.communicate(timeout=30)[1]
    reader.join(10)
    assert top.returncode == 0, err
    refreshes = [json.loads(line) for line in lines]
    assert [r["refresh"] for r in refreshes] == [1, 2, 3]
    first, *later = [r["nodes"][0] for r in refreshes]
    assert first["node_id"] == daemon.node_id and first["requests_per_s"] is None
    assert any(n["requests_per_s"] > 0 and n["bytes_out_per_s"] > 0 for n in later), later
    assert later[-1]["blocks"] == len(keys)
    assert any(n["hit_rate"] == 1.0 for n in later)


def test_top_table_and_unreachable_node(daemon: DaemonProcess) -> None:
    dead = dead_address()
    result = kvpoolctl("--nodes", f"{daemon.address},{dead}", "top", "--count", "1")
    line = one_line_error(result, 3)
    assert f"cannot reach {dead}" in line
    lines = result.stdout.decode().splitlines()
    assert lines[0].startswith("kvpoolctl top: 2 node(s) from --nodes")
    assert lines[1].startswith("1/2 nodes reachable")
    assert lines[3].split()[:3] == ["NODE", "ADDRESS", "STATE"]
    assert any(line.startswith(f"{daemon.node_id}  {daemon.address}  active") for line in lines)
    assert any(f"{dead}  unreachable" in line for line in lines)


def complete(script: str, *words: str) -> list[str]:
    """What bash offers after ``words`` (the last one is the word being completed)."""
    quoted = " ".join(shlex.quote(w) for w in words)
    program = (
        f"{script}\nCOMP_WORDS=(kvpoolctl {quoted})\n"
        'COMP_CWORD=$((${#COMP_WORDS[@]}-1)); _kvpoolctl; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    result = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=10)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


@pytest.fixture(scope="module")
def bash_completion() -> str:
    result = kvpoolctl("completion", "bash")
    assert result.returncode == 0, result.stderr
    return result.stdout.decode()


def test_bash_completion_follows_the_parser(bash_completion: str) -> None:
    commands = collect(build_parser())
    assert {"status", "stats", "drain", "top", "completion", "config", "config set"} <= commands.keys()
    assert complete(bash_completion, "st") == ["status", "stats"]
    assert complete(bash_completion, "config", "s") == ["set"]
    assert complete(bash_completion, "--nodes", "a:1", "drain", "--hand") == ["--handoff"]
    assert complete(bash_completion, "lookup", "--scheme", "") == ["vllm", "sglang"]
    assert complete(bash_completion, "completion", "z") == ["zsh"]
    assert complete(bash_completion, "top", "--c") == ["--cluster", "--count"]
    assert complete(bash_completion, "--timeout", "") == []  # a free value: nothing to offer
    assert bash_completion == bash_script(build_parser(), "kvpoolctl")


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_completion_parses() -> None:
    script = kvpoolctl("completion", "zsh").stdout.decode()
    assert script.startswith("#compdef kvpoolctl")
    result = subprocess.run(["zsh", "-n", "-c", script], capture_output=True, text=True, timeout=10)
    assert result.returncode == 0, result.stderr


def test_completion_needs_a_known_shell() -> None:
    result = kvpoolctl("completion", "fish")
    assert result.returncode == 2
    assert b"invalid choice: 'fish'" in result.stderr
