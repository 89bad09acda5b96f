"""kvpoolctl as a real subprocess against a real daemon: output, exit codes, messages."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvpool_client import BlockKey, BlockKeyBuilder, KVPoolClient, Namespace
from kvpool_client.admin import format as fmt
from tests.support.daemon import DaemonProcess
from tests.support.waiting import wait_until

NS = Namespace("cli-model", "fp16", "L1-H1-D8-T4")
BLOCK_SIZE = 4
LOOKUP_ARGS = (
    "--namespace-model",
    NS.model,
    "--dtype",
    NS.dtype,
    "--layout",
    NS.layout,
    "--block-size",
    str(BLOCK_SIZE),
)


def kvpoolctl(
    *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run ``python -m kvpool_client.admin.cli`` with no KVPOOL_* settings leaking in from the caller."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KVPOOL_")}
    return subprocess.run(
        [sys.executable, "-m", "kvpool_client.admin.cli", *args],
        input=stdin,
        capture_output=True,
        timeout=30,
        env={**clean, **(env or {})},
    )


def ok(result: subprocess.CompletedProcess[bytes]) -> str:
    assert result.returncode == 0, result.stderr.decode()
    assert result.stderr == b""
    return result.stdout.decode()


def one_line_error(result: subprocess.CompletedProcess[bytes], code: int) -> str:
    """Assert the exit code and that stderr is exactly one line; return that line."""
    assert result.returncode == code, (result.stdout, result.stderr)
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def dead_address() -> str:
    """A loopback address nothing listens on: bind an ephemeral port, then free it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_status_table_and_json(daemon: DaemonProcess) -> None:
    table = ok(kvpoolctl("status", "--nodes", daemon.address)).splitlines()
    assert table[0].split() == [
        "NODE",
        "ADDRESS",
        "STATE",
        "DATA",
        "DRAM",
        "USED",
        "BLOCKS",
        "HIT",
        "RATE",
        "UPTIME",
        "METRICS",
    ]
    assert len(table) == 2
    row = table[1]
    assert row.startswith(f"{daemon.node_id}  ") and f"  {daemon.address}  active  tcp://{daemon.data_address}" in row
    assert "0 B / 64.0 MiB" in row
    metrics_url = f"http://127.0.0.1:{daemon.metrics_port}/metrics"
    assert daemon.metrics_port > 0 and row.endswith(f"  {metrics_url}"), row
    # Aligned: each header starts where its column starts.
    assert row.index(daemon.address) == table[0].index("ADDRESS")

    report = json.loads(ok(kvpoolctl("--json", "status", "--nodes", daemon.address)))
    (node,) = report["nodes"]
    assert node["reachable"] is True
    assert node["node_id"] == daemon.node_id and node["address"] == daemon.address
    assert node["data_endpoints"]["tcp"] == daemon.data_address
    assert set(node["data_endpoints"]) == {"tcp", "shm"}, node["data_endpoints"]
    assert node["dram_capacity_bytes"] == 64 << 20 and node["blocks"] == 0
    assert node["hit_rate"] is None and node["uptime_s"] >= 0
    assert node["metrics_url"] == metrics_url
    with urllib.request.urlopen(metrics_url, timeout=10) as scrape:  # the URL status shows is the one that answers
        text = scrape.read().decode()
    assert f'kvpool_node_info{{node_id="{daemon.node_id}"' in text, text[:2000]


def test_status_shows_a_dash_where_metrics_are_off(daemon_factory: Callable[..., DaemonProcess]) -> None:
    quiet = daemon_factory("--dram-capacity", "16MiB", "--slab-size", "1MiB", "--metrics-port", "-1")
    table = ok(kvpoolctl("status", "--nodes", quiet.address)).splitlines()
    assert table[1].endswith("  -"), table
    (node,) = json.loads(ok(kvpoolctl("--json", "status", "--nodes", quiet.address)))["nodes"]
    assert node["metrics_url"] == "", node


def test_put_get_round_trip_and_stats(daemon: DaemonProcess, tmp_path: Path) -> None:
    data = os.urandom(3000) + b"\x00\xff" * 100
    source = tmp_path / "block.bin"
    source.write_bytes(data)
    key = hashlib.sha256(b"round-trip").hexdigest()
    put = json.loads(
        ok(kvpoolctl("put", str(source), "--key", key, "--namespace", "dbg", "--json", "--nodes", daemon.address))
    )
    assert put == {"key": key, "namespace": "dbg", "node": daemon.address, "bytes": len(data), "status": "OK"}

    target = tmp_path / "out.bin"
    env = {"KVPOOL_NODES": daemon.address}  # the default for --nodes
    ok(kvpoolctl("get", "--key", key, "--namespace", "dbg", "-o", str(target), env=env))
    assert target.read_bytes() == data
    assert kvpoolctl("get", "--key", key, "--namespace", "dbg", "-o", "-", env=env).stdout == data

    # --name is the sha256 of the name; a second put of the same key is not an error.
    again = ok(kvpoolctl("put", "-", "--name", "round-trip", "--namespace", "dbg", stdin=data, env=env))
    assert f"key        {key}" in again and "ALREADY_EXISTS" in again

    def node_stats() -> dict[str, Any]:
        (node,) = json.loads(ok(kvpoolctl("stats", daemon.node_id, "--json", env=env)))["nodes"]
        return node

    def reads(node: dict[str, Any]) -> int:  # gets that asked the node: GET over tcp, LOCATE over shm
        return node["counters"].get("requests_get", 0) + node["counters"].get("requests_locate", 0)

    # kvpoolctl on the daemon's node reads the block through the node's shared index: no request,
    # no hit; the read reaches the node as a touch of the block's recency, within half a second.
    node = wait_until(
        node_stats, lambda n: reads(n) == 2 or n["counters"]["shared_index_touches"] >= 1, "both gets seen by the node"
    )
    (dram,) = node["tiers"]
    assert dram["blocks"] == 1 and dram["hits"] == reads(node) and node["counters"]["requests_put"] == 2, node
    text = ok(kvpoolctl("stats", env=env))
    assert f"node {daemon.node_id} at {daemon.address}" in text and "requests_put" in text


def test_rm_then_get_exits_4(daemon: DaemonProcess, tmp_path: Path) -> None:
    env = {"KVPOOL_NODES": daemon.address}
    block = tmp_path / "b"
    block.write_bytes(b"x" * 100)
    ok(kvpoolctl("put", str(block), "--name", "doomed", "--namespace", "dbg", env=env))
    assert "status     OK" in ok(kvpoolctl("rm", "--name", "doomed", "--namespace", "dbg", env=env))

    missing = kvpoolctl("get", "--name", "doomed", "--namespace", "dbg", "-o", str(tmp_path / "out"), env=env)
    assert "no block dbg/" in one_line_error(missing, 4)
    assert not (tmp_path / "out").exists()
    assert "check --namespace" in one_line_error(kvpoolctl("rm", "--name", "doomed", "--namespace", "dbg", env=env), 4)


def test_lookup_counts_leading_hits(daemon: DaemonProcess, tmp_path: Path) -> None:
    tokens = list(range(100, 126))  # 6 full blocks of 4 and 2 tokens left over
    keys = BlockKeyBuilder(NS, BLOCK_SIZE).keys(tokens)
    stored = [0, 1, 2, 4]  # a gap at block 3: only 3 leading blocks are reusable
    with KVPoolClient([daemon.address]) as client:
        assert client.put([keys[i] for i in stored], [b"kv" * 8] * len(stored)).ok
    spaced = tmp_path / "tokens.txt"
    spaced.write_text(" ".join(map(str, tokens[:10])) + ",\n" + ", ".join(map(str, tokens[10:])) + "\n")

    result = json.loads(ok(kvpoolctl("lookup", str(spaced), *LOOKUP_ARGS, "--json", "--nodes", daemon.address)))
    assert result["namespace"] == NS.id
    assert (result["tokens"], result["full_blocks"]) == (26, 6)
    assert (result["leading_blocks"], result["leading_tokens"], result["stored_blocks"]) == (3, 12, 4)
    assert [b["hash"] for b in result["blocks"]] == [k.hash.hex() for k in keys]
    assert [b["stored"] for b in result["blocks"]] == [True, True, True, False, True, False]

    as_json = tmp_path / "tokens.json"
    as_json.write_text(json.dumps(tokens))
    text = ok(kvpoolctl("lookup", str(as_json), *LOOKUP_ARGS, "--verbose", "--nodes", daemon.address))
    assert "3 leading blocks = 12 tokens" in text and "4 of 6 blocks" in text
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.split()[:1] in (["0"], ["3"])}
    assert rows["0"] == ["0", "0-3", keys[0].hash.hex(), "yes"]
    assert rows["3"] == ["3", "12-15", keys[3].hash.hex(), "no"]


def test_unreachable_node_exits_3_with_a_hint(daemon: DaemonProcess) -> None:
    dead = dead_address()
    status = kvpoolctl("status", "--nodes", dead)
    line = one_line_error(status, 3)
    assert line == f"kvpoolctl: error: cannot reach {dead}: is kvpool-server running? set --nodes or KVPOOL_NODES"
    assert f"{dead}  unreachable" in status.stdout.decode()

    # A live node still gets its row; the dead one makes the exit code 3.
    both = kvpoolctl("--json", "status", "--nodes", f"{daemon.address},{dead}")
    one_line_error(both, 3)
    live, down = json.loads(both.stdout)["nodes"]
    assert live["reachable"] is True and down == {"address": dead, "reachable": False, "error": down["error"]}

    got = kvpoolctl("get", "--name", "x", "--namespace", "dbg", "-o", "-", env={"KVPOOL_NODES": dead})
    assert f"cannot reach {dead}" in one_line_error(got, 3)
    lookup = kvpoolctl("lookup", "-", *LOOKUP_ARGS, "--nodes", dead, stdin=b"1 2 3 4")
    assert f"cannot reach {dead}" in one_line_error(lookup, 3)


@pytest.mark.parametrize(
    ("args", "stdin", "says"),
    [
        ((), None, "required: COMMAND"),
        (("get", "--name", "x", "-o", "-"), None, "--namespace"),
        (("rm", "--key", "zz", "--namespace", "n"), None, "'zz' is not hex"),
        (("rm", "--key", "aa", "--name", "b", "--namespace", "n"), None, "not allowed with"),
        (("--nodes", "nohost", "status"), None, "'nohost' is not host:port"),
        (("status", "--timeout", "0"), None, "expected a positive number"),
        (("lookup", "-", *LOOKUP_ARGS), b"1 2 three", "token 2 is 'three'"),
        (("lookup", "-", *LOOKUP_ARGS), b"[1, true]", "JSON list of integers"),
        (("lookup", "/no/such/tokens", *LOOKUP_ARGS), None, "cannot read /no/such/tokens"),
        (("lookup", "-", *LOOKUP_ARGS, "--tp-rank", "1"), b"1", "tp_rank"),
    ],
)
def test_bad_arguments_exit_2(args: tuple[str, ...], stdin: bytes | None, says: str) -> None:
    # Nothing listens on the dead address: usage errors must be found before any node is asked.
    result = kvpoolctl(*args, stdin=stdin, env={"KVPOOL_NODES": dead_address()})
    assert result.returncode == 2, result.stderr
    assert says in result.stderr.decode()


def test_help_documents_exit_codes() -> None:
    text = ok(kvpoolctl("--help"))
    for line in ("0  success", "1  unexpected error", "2  usage error", "3  a node is unreachable", "4  not found"):
        assert line in text
    assert "KVPOOL_NODES" in text


def test_table_formatter() -> None:
    assert fmt.table(("A", "NUM"), [("xyz", 5), ("q", 1234)], right=(1,)).splitlines() == [
        "A     NUM",
        "xyz     5",
        "q    1234",
    ]
    assert [fmt.size(n) for n in (0, 1023, 1536, 64 << 20)] == ["0 B", "1023 B", "1.5 KiB", "64.0 MiB"]
    assert [fmt.duration(s) for s in (42, 303, 7500, 273600)] == ["42s", "5m 03s", "2h 05m", "3d 04h"]
    with pytest.raises(ValueError):
        fmt.table(("A", "B"), [("only one",)])
    offers = {"tcp": "10.0.0.1:7", "shm": "/dev/shm/kvpool-1", "nixl": "kvpool-arena-ab"}
    assert fmt.endpoints(offers) == "tcp://10.0.0.1:7 +nixl +shm", "the status column names the one-sided plane"


def test_flush_empties_one_namespace_and_keeps_the_others(daemon: DaemonProcess) -> None:
    keep = [BlockKey("tenant-a", b"a%02d" % i) for i in range(5)]
    flush = [BlockKey("tenant-b", b"b%02d" % i) for i in range(7)]
    with KVPoolClient([daemon.address]) as client:
        client.put(keep + flush, [b"x" * 4096] * 12).raise_for_errors()
    env = {**os.environ, "KVPOOL_NODES": daemon.address}
    result = json.loads(ok(kvpoolctl("flush", "--namespace", "tenant-b", "--json", env=env)))
    assert result == {"namespace": "tenant-b", "nodes": 1, "deleted": 7}, result
    with KVPoolClient([daemon.address]) as client:
        assert client.exists(flush) == [False] * 7 and client.exists(keep) == [True] * 5
        assert client.flush_namespace("tenant-b") == 0


def test_flush_by_model_empties_every_namespace_of_the_model(daemon: DaemonProcess) -> None:
    qwen = [Namespace("Qwen2.5-0.5B", "bf16", "L24", tp, 2) for tp in (0, 1)]
    other = Namespace("Qwen2.5-0.5B-Instruct", "bf16", "L24")  # a model whose name merely starts alike
    keys = [BlockKey(ns.id, b"k%02d" % i) for ns in (*qwen, other) for i in range(3)]
    with KVPoolClient([daemon.address]) as client:
        client.put(keys, [b"x" * 4096] * len(keys)).raise_for_errors()
        assert client.flush_namespace(qwen[1]) == 3, "a Namespace is flushed by its id"
    env = {**os.environ, "KVPOOL_NODES": daemon.address}
    missed = kvpoolctl("flush", "--namespace", "Qwen2.5-0.5B", env=env)
    assert missed.returncode == 0 and b"--model Qwen2.5-0.5B" in missed.stderr, missed
    result = json.loads(ok(kvpoolctl("flush", "--model", "Qwen2.5-0.5B", "--json", env=env)))
    assert result == {"model": "Qwen2.5-0.5B", "nodes": 1, "deleted": 3}, result
    with KVPoolClient([daemon.address]) as client:
        assert client.exists(keys) == [False] * 6 + [True] * 3


def test_both_binaries_say_their_version() -> None:
    for module in ("kvpool_client.admin.cli", "kvpool_server.app"):
        run = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0 and run.stdout.split()[1][0].isdigit(), run


def test_namespaces_sums_blocks_and_bytes_per_namespace(daemon: DaemonProcess) -> None:
    with KVPoolClient([daemon.address]) as client:
        client.put([BlockKey("tenant-a", b"a%02d" % i) for i in range(3)], [b"x" * 1000] * 3).raise_for_errors()
        client.put([BlockKey("tenant-b", b"b%02d" % i) for i in range(2)], [b"y" * 4096] * 2).raise_for_errors()
    env = {**os.environ, "KVPOOL_NODES": daemon.address}
    listed = json.loads(ok(kvpoolctl("namespaces", "--json", env=env)))["namespaces"]
    mine = [row for row in listed if row["namespace"] in ("tenant-a", "tenant-b")]
    assert mine == [
        {"namespace": "tenant-a", "tier": "dram", "blocks": 3, "bytes": 3000, "nodes": 1},
        {"namespace": "tenant-b", "tier": "dram", "blocks": 2, "bytes": 8192, "nodes": 1},
    ], listed
    table = ok(kvpoolctl("namespaces", env=env))
    assert table.splitlines()[0].split() == ["NAMESPACE", "TIER", "BLOCKS", "BYTES", "NODES"], table
