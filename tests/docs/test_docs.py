"""The README's and docs' code blocks run as written against real daemons, or say why they cannot.

Every ``python`` and ``bash`` block of README.md and docs/*.md runs here, in page order,
in a fresh directory per page, against one local cluster (etcd and two daemons) that the
environment names as a user's shell would: ``KVPOOL_ETCD_ENDPOINTS`` and ``KVPOOL_CLUSTER``,
with ``kvpoolctl`` on the PATH. A block that cannot run here carries ``<!-- not-run: why -->``
on the line before its fence (see tests/support/doc_blocks.py). A block followed by a ``text``
block shows what it printed: its first line (a table's header, a command's message) must still
be what a run prints, digits aside.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.daemon import LocalCluster
from tests.support.doc_blocks import PYTHON, Block, blocks, problems
from tests.support.etcd import requires_etcd

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TO_RUN = [page for page in PAGES if any(b.to_run for b in blocks(page))]
BLOCK_TIMEOUT_S = 120
# Small daemons; the slab fits the examples' largest block (192 KiB) many times over.
DAEMON_FLAGS = ("--dram-capacity", "64MiB", "--slab-size", "1MiB", "--log-level", "warning")


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(2, *DAEMON_FLAGS, cluster="demo") as local:
        yield local


def shell_env(cluster: LocalCluster) -> dict[str, str]:
    """A user's environment pointing at ``cluster``: no other KVPOOL_* setting leaks in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVPOOL_")}
    assert cluster.etcd is not None
    env["KVPOOL_ETCD_ENDPOINTS"] = cluster.etcd.endpoint
    env["KVPOOL_CLUSTER"] = cluster.cluster
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # kvpoolctl, kvpool-server
    env["COLUMNS"] = "80"  # argparse wraps --help to the terminal's width: the one the pages show
    return env


def run_block(block: Block, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``block`` as a user pasting it would: python with this interpreter, shell blocks in bash -e."""
    if block.lang in PYTHON:
        argv = [sys.executable, "-c", block.code]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", block.code]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)


def shape(line: str) -> str:
    """``line`` with every number as 0 and runs of spaces as one: what stays from run to run."""
    return re.sub(r"\s+", " ", re.sub(r"\d+", "0", line)).strip()


def first_line(text: str) -> str:
    return next((line for line in text.splitlines() if line.strip()), "")


def output_drift(shown: str, printed: str) -> str:
    """How a page's output block differs from what a run printed ('' if it does not).

    Numbers, addresses and times change from run to run, so the first line is compared
    with its digits as 0, and every other line without digits (headers, messages) must
    be among the lines printed.
    """
    if shape(first_line(shown)) != shape(first_line(printed)):
        return f"the page shows {first_line(shown)!r} first, a run prints {first_line(printed)!r}"
    printed_lines = {shape(line) for line in printed.splitlines()}
    stale = [line for line in shown.splitlines() if line.strip() and not re.search(r"\d", line)
             and shape(line) not in printed_lines]  # fmt: skip
    return f"lines a run no longer prints: {stale}" if stale else ""


def test_every_runnable_block_is_run_or_says_why_not() -> None:
    found = [issue for page in PAGES for issue in problems(page)]
    assert not found, "\n".join(found)
    marked = [b for page in PAGES for b in blocks(page) if b.runnable and not b.to_run]
    assert all(len(b.not_run or "") >= 10 for b in marked), [(b.where, b.not_run) for b in marked]


@requires_etcd
@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", TO_RUN, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_blocks_run_as_written(page: Path, cluster: LocalCluster, tmp_path: Path) -> None:
    env = shell_env(cluster)
    for block in (b for b in blocks(page) if b.to_run):
        run = run_block(block, tmp_path, env)
        shown = f"{block.where} exited {run.returncode}:\n{block.code}\nstdout:\n{run.stdout}\nstderr:\n{run.stderr}"
        assert run.returncode == 0, shown
        drift = output_drift(block.output, run.stdout) if block.output is not None else ""
        assert not drift, f"{block.where}: {drift}\n{shown}"


def alert_metrics(page: Path) -> set[str]:
    """The kvpool metric families the page's Prometheus rules (yaml blocks with ``expr:``) query."""
    names: set[str] = set()
    for block in blocks(page):
        if block.lang == "yaml" and "expr:" in block.code:
            rules = yaml.safe_load(block.code)
            exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
            names |= {n for e in exprs for n in re.findall(r"\bkvpool_[a-z_]+", str(e))}
    return names


@requires_etcd
def test_alert_rules_query_metrics_the_daemon_exports(cluster: LocalCluster) -> None:
    queried = alert_metrics(ROOT / "docs" / "operations.md")
    assert queried, "docs/operations.md has no alert rules"
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.daemons[0].metrics_port}/metrics", timeout=10) as r:
        exported = set(re.findall(r"^(kvpool_[a-z_]+)", r.read().decode(), re.M))
    missing = sorted(queried - exported)
    assert not missing, f"the alert rules query metrics no daemon exports: {missing}; exported: {sorted(exported)}"
