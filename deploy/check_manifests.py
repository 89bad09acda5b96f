"""Check rendered Kubernetes manifests: schemas, the daemon's config, the dashboard's metrics.

Usage: python deploy/check_manifests.py [--kube-versions 1.28-1.33] RENDERED.yaml ...

For every object in every file, and every Kubernetes minor version in the range:
- objects of built-in kinds must pass kubernetes-validate's strict schema for that
  version; a kind or apiVersion it has no schema for is an error, not a warning;
- custom resources (ServiceMonitor) must pass the strict schema in deploy/schemas/.
Then, once per file:
- the daemon's config file in the kvpool ConfigMap must load with kvpool-server's own
  loader (kvpool_server.config), with the pod's environment and mount points (stand-in
  files for the Secret's: the token, certificates and keys);
- the TLS health probe script in that ConfigMap, if any, must compile;
- a Grafana dashboard may use only metric families the daemon defines.
Exit 0 when all pass, 1 otherwise; each problem is one line on stdout.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from kubernetes_validate import utils as kv

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = ROOT / "deploy/schemas"
CRD_SCHEMAS = {("monitoring.coreos.com/v1", "ServiceMonitor"): SCHEMAS / "servicemonitor-monitoring-v1.json"}
_METRIC_RE = re.compile(r"\b(kvpool_[a-z0-9_]+)")
_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")

# Each schema is read once, not once per object (kubernetes-validate reads it every call).
kv.schema_contents = functools.lru_cache(maxsize=None)(kv.schema_contents)


def versions(spec: str) -> list[str]:
    """``"1.28-1.33"`` -> ``["1.28.0", ..., "1.33.0"]``; ``"1.30"`` -> ``["1.30.0"]``."""
    first, _, last = spec.partition("-")
    major, low = (int(p) for p in first.split("."))
    high = int((last or first).split(".")[1])
    return [f"{major}.{minor}.0" for minor in range(low, high + 1)]


def documents(path: Path) -> Iterator[dict[str, Any]]:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc:
            yield doc


def label(obj: dict[str, Any]) -> str:
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


@functools.cache
def _crd_validator(api_version: str, kind: str) -> jsonschema.protocols.Validator | None:
    path = CRD_SCHEMAS.get((api_version, kind))
    if path is None:
        return None
    schema = json.loads(path.read_text())
    return jsonschema.validators.validator_for(schema)(schema)


def schema_problems(obj: dict[str, Any], version: str) -> list[str]:
    """Why ``obj`` fails its strict schema for Kubernetes ``version`` (empty: it passes)."""
    crd = _crd_validator(obj.get("apiVersion", ""), obj.get("kind", ""))
    if crd is not None:
        return [f"{'.'.join(map(str, e.path)) or '(root)'}: {e.message}" for e in crd.iter_errors(obj)]
    try:
        kv.validate(obj, version, strict=True)
    except kv.ValidationError as exc:
        return [f"{'.'.join(map(str, exc.path)) or '(root)'}: {exc.message}"]
    except kv.SchemaNotFoundError as exc:
        return [f"unknown apiVersion/kind: {exc.message}"]
    return []


def config_problems(obj: dict[str, Any]) -> list[str]:
    """Load the kvpool ConfigMap's daemon config with the daemon's own loader, as the pod would."""
    if str(ROOT) not in sys.path:  # this checkout's daemon, whatever the venv installed
        sys.path.insert(0, str(ROOT))
    from kvpool_server.config import ConfigError, load_config

    text = obj.get("data", {}).get("kvpool.yaml")
    if text is None:
        return []
    settings = yaml.safe_load(text) or {}
    with tempfile.TemporaryDirectory() as tmp:
        # The pod mounts /dev/shm and the SSD volume; here, stand-in directories.
        for key in ("shm_dir", "ssd_dir"):
            if settings.get(key):
                settings[key] = str(Path(tmp, key))
                Path(settings[key]).mkdir()
        # The Secret's files (token, certificates, keys): stand-ins, checked for existence only.
        for key in [k for k in settings if k.endswith("_file") and k != "announce_file"]:
            if settings[key]:
                settings[key] = str(Path(tmp, key))
                Path(settings[key]).write_text("0123456789abcdef0123456789abcdef\n")
        config_file = Path(tmp, "kvpool.yaml")
        config_file.write_text(yaml.safe_dump(settings))
        env = {
            "KVPOOL_CONFIG": str(config_file),
            "KVPOOL_NODE_ID": "node-1",
            "KVPOOL_ADVERTISE_HOST": "10.0.0.1",
            "KVPOOL_CLUSTER": "default",
            "KVPOOL_ETCD_ENDPOINTS": "http://etcd:2379",
        }
        try:
            load_config([], env)
        except ConfigError as exc:
            return [f"kvpool.yaml does not load in kvpool-server: {exc}"]
    return []


def probe_problems(obj: dict[str, Any]) -> list[str]:
    """The TLS health probe script the ConfigMap may carry must at least compile."""
    text = obj.get("data", {}).get("probe.py")
    if text is None:
        return []
    try:
        compile(text, "probe.py", "exec")
    except SyntaxError as exc:
        return [f"probe.py does not compile: line {exc.lineno}: {exc.msg}"]
    return []


@functools.cache
def daemon_metric_source() -> str:
    return "\n".join(p.read_text() for p in sorted((ROOT / "kvpool_server").rglob("*.py")))


def defined(name: str, source: str) -> bool:
    """Whether the daemon's source names family ``name``: literally, or as an f-string
    prefix (``f"kvpool_tier_{suffix}"``) plus the rest as a string (``"hits"``)."""
    if f'"{name}"' in source:
        return True
    prefixes = re.findall(r'f"(kvpool_[a-z0-9_]*)\{', source)
    return any(name.startswith(p) and f'"{name[len(p) :]}"' in source for p in prefixes)


def family(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def dashboard_problems(obj: dict[str, Any]) -> list[str]:
    """Metric families a dashboard ConfigMap names that no daemon module defines."""
    problems = []
    for key, text in obj.get("data", {}).items():
        if not key.endswith(".json"):
            continue
        exprs = [t.get("expr", "") for p in json.loads(text).get("panels", []) for t in p.get("targets", [])]
        used = {family(m) for e in exprs for m in _METRIC_RE.findall(e)}
        source = daemon_metric_source()
        for name in sorted(used):
            if not defined(name, source):
                problems.append(f"{key}: metric family {name} is not defined under kvpool_server/")
    return problems


def check_file(path: Path, kube_versions: list[str]) -> list[str]:
    problems = []
    objects = list(documents(path))
    if not objects:
        return [f"{path}: no objects"]
    for obj in objects:
        where = f"{path.name}: {label(obj)}"
        for version in kube_versions:
            problems += [f"{where}: Kubernetes {version}: {p}" for p in schema_problems(obj, version)]
        if obj.get("kind") == "ConfigMap":
            problems += [f"{where}: {p}" for p in config_problems(obj)]
            problems += [f"{where}: {p}" for p in probe_problems(obj)]
            problems += [f"{where}: {p}" for p in dashboard_problems(obj)]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kube-versions", default="1.28-1.33", help="minor versions to check (default: %(default)s)")
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    kube_versions = versions(args.kube_versions)
    failed = 0
    for path in args.files:
        problems = check_file(path, kube_versions)
        for problem in problems:
            print(f"ERROR {problem}")
        count = len(list(documents(path)))
        print(f"{'FAIL' if problems else 'ok  '} {path}: {count} objects x Kubernetes {args.kube_versions}")
        failed += bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
