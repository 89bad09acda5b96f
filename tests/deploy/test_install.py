"""The README's Install section, run as a newcomer would: fresh venvs, its own commands, no torch.

kvpool is not on the package index, so the README installs it from a clone (``pip install
./kvpool``, with extras) or from a wheel that one command builds. Each route here copies this
checkout as a clone holds it (git's files, none that git ignores) to a temporary ``kvpool/``,
makes a venv with ``python -m venv``, runs the README's commands word for word with that venv
first on the PATH (the dependencies come from the package index, as a user's do), then runs
what they installed from a directory outside the checkout. Every pip run there forbids torch:
an engine brings its own build, and installing kvpool must never download one.

A venv whose commands all succeeded is kept under ``.cache/packaging/`` for the same inputs
(pyproject.toml, the Install section, the package sources, this module, the interpreter), so a
rerun only repeats the checks; any change to them builds a fresh one (about a minute).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "packaging"
PACKAGES = ("kvpool_client", "kvpool_server")
# The README's commands, run in the directory that holds the clone ``kvpool/``.
CLIENT = "pip install ./kvpool"
FROM_CLONE = "pip install './kvpool[{extra}]'"  # the table's other rows: the same with an extra
BUILD = "python -m pip wheel --no-deps -w dist ./kvpool"
FROM_WHEEL = "pip install --find-links dist 'kvpool[server]'"
ROUTES = {"clone": (CLIENT,), "wheel": (BUILD, FROM_WHEEL)}
# A constraint no release meets: a resolution that wants torch fails before downloading it.
NO_TORCH = "torch<0\n"
# What the packages carry beside their .py files: type stubs and the PEP 561 markers.
TYPED = (
    "kvpool_client/core/proto/kvpool_pb2.pyi",
    "kvpool_client/core/wire/_arena_reader.pyi",
    "kvpool_client/py.typed",
    "kvpool_server/py.typed",
)
# What only the daemon needs: the client alone must not bring it into an engine's environment.
SERVER_ONLY = {"uvloop", "etcd3aio", "pyyaml", "prometheus-client", "grpcio-health-checking", "numpy"}


def install_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Install\n")
    return text[start : text.index("\n## ", start)]


def table_commands(section: str) -> list[str]:
    """The code spans of the table's command column that run something."""
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]  # below the header and rule
    spans = [span for row in rows for span in re.findall(r"`([^`]+)`", row.rsplit("|", 2)[1])]
    return [span for span in spans if span.split()[0] in ("pip", "python")]


def clone_files() -> list[str]:
    """What a clone holds: git's tracked files and the untracked ones it does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return sorted(name for name in listed.stdout.splitlines() if (ROOT / name).is_file())


def package_sources() -> list[str]:
    """The packages' Python files in a clone, the generated proto code among them."""
    return [name for name in clone_files() if name.split("/", 1)[0] in PACKAGES and name.endswith(".py")]


def copy_clone(dest: Path) -> None:
    for name in clone_files():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / name, dest / name)


def inputs_digest() -> str:
    """A hash of everything an installed venv depends on."""
    digest = hashlib.sha256(f"{sys.version}\0{install_section()}\0".encode())
    own = {"pyproject.toml", "LICENSE", Path(__file__).relative_to(ROOT).as_posix()}
    for name in clone_files():
        if name in own or name.split("/", 1)[0] in PACKAGES:
            digest.update(name.encode() + b"\0" + (ROOT / name).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def user_env(venv: Path, constraint: Path | None = None) -> dict[str, str]:
    """A user's shell with ``venv`` activated: none of this checkout's Python or kvpool settings."""
    dropped = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVPOOL_") and k not in dropped}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    if constraint is not None:
        env["PIP_CONSTRAINT"] = str(constraint)
    return env


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def shown(done: subprocess.CompletedProcess[str]) -> str:
    """What a run printed, for a failure's message."""
    argv = " ".join(map(str, done.args))
    return f"$ {argv}\nexit {done.returncode}\nstdout:\n{done.stdout[-6000:]}\nstderr:\n{done.stderr[-6000:]}"


def build(home: Path, commands: tuple[str, ...]) -> None:
    """A fresh venv at ``home``, then ``commands`` run in bash beside a copy of the checkout."""
    made = run([sys.executable, "-m", "venv", str(home)], ROOT, user_env(home))
    assert made.returncode == 0, shown(made)
    with tempfile.TemporaryDirectory(prefix="kvpool-install-") as tmp:
        work = Path(tmp)
        copy_clone(work / "kvpool")
        (work / "no-torch.txt").write_text(NO_TORCH)
        env = user_env(home, work / "no-torch.txt")
        for command in commands:
            done = run(["bash", "-euo", "pipefail", "-c", command], work, env)
            assert done.returncode == 0, f"the README's `{command}` failed in a fresh venv:\n{shown(done)}"


def installed(route: str) -> Path:
    """The venv that ``route``'s README commands make: kept from a run with the same inputs, else made now.

    Raises:
        AssertionError: a command failed; the message holds its output. No venv is kept.
    """
    CACHE.mkdir(parents=True, exist_ok=True)
    home = CACHE / f"venv-{route}-{inputs_digest()}"
    with (CACHE / "venv.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another pytest in this checkout may be making the same venv
        if (home / ".complete").exists():
            return home
        for stale in CACHE.glob(f"venv-{route}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        try:
            build(home, ROUTES[route])
        except BaseException:
            shutil.rmtree(home, ignore_errors=True)
            raise
        (home / ".complete").touch()
    return home


_INSPECT = """
import importlib, importlib.metadata, json, sys
modules = {name: importlib.import_module(name).__file__ for name in sys.argv[1:]}
dists = sorted(d.metadata["Name"].lower().replace("_", "-") for d in importlib.metadata.distributions())
print(json.dumps({"modules": modules, "dists": dists}))
"""


def from_elsewhere(home: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``argv`` run with ``home`` activated, in an empty directory outside the checkout."""
    with tempfile.TemporaryDirectory(prefix="kvpool-user-") as elsewhere:
        assert not Path(elsewhere).resolve().is_relative_to(ROOT), elsewhere
        return run(argv, Path(elsewhere), user_env(home))


def inspect(home: Path, modules: list[str]) -> tuple[dict[str, str], list[str]]:
    """Where ``modules`` import from in ``home``'s Python, and every distribution installed there."""
    done = from_elsewhere(home, [str(home / "bin" / "python"), "-c", _INSPECT, *modules])
    assert done.returncode == 0, shown(done)
    found = json.loads(done.stdout)
    return found["modules"], found["dists"]


def assert_installed_copy(home: Path, modules: dict[str, str]) -> None:
    """Each module is the venv's copy, with the same bytes as this checkout's source."""
    site = Path(sysconfig.get_path("purelib", vars={"base": str(home)}))
    for name, file in modules.items():
        path = Path(file).resolve()
        assert path.is_relative_to(site.resolve()), f"{name} imported from {path}, not from {site}"
        if path.suffix == ".py":
            relative = path.relative_to(site.resolve())
            assert path.read_bytes() == (ROOT / relative).read_bytes(), f"{relative} differs from the checkout's"


def assert_no_torch(dists: list[str]) -> None:
    torch = [d for d in dists if d == "torch" or d.startswith("nvidia-")]
    assert not torch, f"installing kvpool brought {torch}: {dists}"


def compiler_here() -> bool:
    """A C compiler and Python's headers: what the same-node reader's extension builds with."""
    headers = Path(sysconfig.get_paths()["include"], "Python.h").exists()
    return headers and any(shutil.which(cc) for cc in ("cc", "gcc"))


def test_the_install_table_runs_only_what_is_tested_here() -> None:
    """Each command is run by a route below, or is the clone's install with an extra that exists."""
    section = install_section()
    commands = table_commands(section)
    tested = {command for route in ROUTES.values() for command in route}
    assert tested <= set(commands), f"the README no longer shows {sorted(tested - set(commands))}:\n{section}"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    forms = {FROM_CLONE.format(extra=extra) for extra in extras}
    untested = [command for command in commands if command not in tested | forms]
    assert not untested, f"commands no test runs: {untested}"
    named = set(re.findall(r"the `(\w+)` extra", section))
    assert named <= set(extras), f"the README names extras pyproject.toml lacks: {sorted(named - set(extras))}"


@pytest.mark.timeout(900)
def test_the_client_installs_from_a_clone_without_the_daemons_dependencies() -> None:
    home = installed("clone")
    wanted = ["kvpool_client", *(["kvpool_client.core.wire._arena_reader"] if compiler_here() else [])]
    modules, dists = inspect(home, wanted)
    assert_installed_copy(home, modules)
    assert "kvpool" in dists, dists
    assert_no_torch(dists)
    assert not SERVER_ONLY & set(dists), f"the client alone brought {sorted(SERVER_ONLY & set(dists))}"


@pytest.mark.timeout(900)
def test_the_daemon_installs_from_the_wheel_the_readme_builds() -> None:
    home = installed("wheel")
    for program in ("kvpool-server", "kvpoolctl"):
        done = from_elsewhere(home, [str(home / "bin" / program), "--help"])
        assert done.returncode == 0 and done.stdout.startswith(f"usage: {program}"), shown(done)
    modules, dists = inspect(home, list(PACKAGES))
    assert_installed_copy(home, modules)
    assert "kvpool" in dists, dists
    assert_no_torch(dists)


def test_the_package_builds_without_a_c_compiler() -> None:
    """The compiled same-node reader is optional: with no compiler (CC fails) the README's build
    still makes a wheel, without it, and the client reads through its pure-Python path."""
    with tempfile.TemporaryDirectory(prefix="kvpool-build-") as tmp:
        work = Path(tmp)
        copy_clone(work / "kvpool")
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # `python`: this venv's
        built = run(["bash", "-euo", "pipefail", "-c", BUILD], work, {**os.environ, "CC": "/bin/false", "PATH": path})
        assert built.returncode == 0, f"the wheel did not build without a compiler:\n{shown(built)}"
        (wheel,) = (work / "dist").glob("kvpool-*.whl")
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
    missing = [name for name in [*package_sources(), *TYPED] if name not in names]
    assert not missing, f"the wheel lacks {missing}: {names}"
    assert not [n for n in names if n.endswith(".so")], f"a compiled module without a compiler: {names}"


def test_the_sdist_carries_what_a_build_from_it_needs() -> None:
    """A release's sdist: the generated proto code (proto/ is not in it), the C reader's source, the
    type markers and the files the metadata names. Built as a PEP 517 frontend does: the backend
    pyproject.toml requires, installed apart from this venv's packages."""
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    with tempfile.TemporaryDirectory(prefix="kvpool-sdist-") as tmp:
        work = Path(tmp)
        copy_clone(work / "kvpool")
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(work / "backend"), *requires]
        got = run(pip, work, dict(os.environ))
        assert got.returncode == 0, f"the build backend did not install:\n{shown(got)}"
        hook = "from setuptools import build_meta; print(build_meta.build_sdist('../sdist'))"
        built = run([sys.executable, "-c", hook], work / "kvpool", {**os.environ, "PYTHONPATH": str(work / "backend")})
        assert built.returncode == 0, f"the sdist did not build:\n{shown(built)}"
        with tarfile.open(work / "sdist" / built.stdout.split()[-1]) as archive:
            names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    building = ("kvpool_client/core/wire/_arena_reader.c", "pyproject.toml", "README.md", "LICENSE")
    missing = [name for name in [*package_sources(), *TYPED, *building] if name not in names]
    assert not missing, f"the sdist lacks {missing}: {sorted(names)}"
