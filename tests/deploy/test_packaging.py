"""kvpool installs beside the engines that import it: pip's own resolver says so.

An engine imports kvpool's client into its environment, so the client's requirements
must fit the engine's pins (vLLM's torch==2.14.0, SGLang's grpcio>=1.81.1 and
protobuf>=6.33.5, LMCache's grpcio==1.78.0 and protobuf<7). Each check asks pip to
resolve this checkout (with its torch extra) beside one engine, without installing
anything. It needs the package index; a passing resolution is remembered for the same
pyproject.toml under .cache/, so reruns cost nothing.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "packaging"
ENGINES = ("vllm==0.33.0", "sglang==0.5.23", "lmcache==0.5.6")
# What an engine pins and kvpool must never override.
ENGINE_OWNED = ("torch",)


def _resolve(engine: str) -> dict[str, str]:
    """The versions pip picks for ``kvpool[torch]`` beside ``engine`` (cached per pyproject)."""
    pyproject = (ROOT / "pyproject.toml").read_bytes()
    key = hashlib.sha256(pyproject + engine.encode()).hexdigest()[:16]
    cached = CACHE / f"{engine}-{key}.json"
    if cached.exists():
        return dict(json.loads(cached.read_text()))
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--dry-run",
                "--ignore-installed",
                "--quiet",
                "--disable-pip-version-check",
                "--report",
                str(report),
                f"{ROOT}[torch]",
                engine,
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert run.returncode == 0, f"pip cannot install kvpool beside {engine}:\n{run.stderr[-4000:]}"
        installs = json.loads(report.read_text())["install"]
    versions = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"] for i in installs}
    CACHE.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(versions, sort_keys=True))
    return versions


@pytest.fixture(scope="module")
def resolutions() -> dict[str, dict[str, str] | BaseException]:
    """Every engine's resolution, asked of pip at once (each waits on the package index)."""
    with ThreadPoolExecutor(len(ENGINES)) as pool:
        futures = {engine: pool.submit(_resolve, engine) for engine in ENGINES}
    return {engine: f.exception() or f.result() for engine, f in futures.items()}


@pytest.mark.parametrize("engine", ENGINES)
def test_kvpool_resolves_beside_the_engine(engine: str, resolutions: dict[str, dict[str, str] | BaseException]) -> None:
    versions = resolutions[engine]
    if isinstance(versions, BaseException):
        raise versions
    name, _, version = engine.partition("==")
    assert versions.get(name) == version, f"pip did not keep {engine}: {versions.get(name)}"
    assert "kvpool" in versions, sorted(versions)


def test_users_requirements_pin_nothing_the_engines_own() -> None:
    """Ranges only: no exact pin of torch, protobuf or grpcio in what users install."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    shipped = [
        *project["dependencies"],
        *(r for name in ("server", "etcd", "torch", "ucx", "nixl") for r in extras[name]),
    ]
    for text in shipped:
        req = Requirement(text)
        if req.name in ("torch", "protobuf", "grpcio"):
            exact = [s for s in req.specifier if s.operator in ("==", "===")]
            assert not exact, f"{text}: an exact pin makes kvpool uninstallable beside an engine"
    torch = [Requirement(r) for r in extras["torch"] if Requirement(r).name in ENGINE_OWNED]
    assert torch and all(s.operator == ">=" for r in torch for s in r.specifier), torch
