"""Mooncake's own venv, keyed by bench/mooncake_peer/lock.txt, and the Debian libraries its wheel links.

The wheel goes into ``.cache/venvs/mooncake-HASH`` (tests/environments.py builds it: ``pip
install --no-deps -r`` the lock, HASH from the lock's bytes), never into the project's venv.
Benchmark workers run the project's interpreter and import ``mooncake.store`` from that venv's
site-packages (same Python minor version: the wheel is cp311). The wheel bundles most of its
libraries but links the system's ``libibverbs`` even for TCP; :func:`ensure` checks its
binaries with ``ldd`` and installs the Debian packages of what is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.environments import Environment
from tests.environments import ensure as ensure_venv

ENVIRONMENT = Environment("mooncake", "bench/mooncake_peer/lock.txt", ())
# Libraries the wheel links but does not bundle, and the Debian package of each.
DEBIAN_PACKAGES = {"libibverbs.so.1": "libibverbs1"}
_NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found", re.MULTILINE)


class MooncakeUnavailable(RuntimeError):
    """Mooncake cannot run on this machine; the message says why."""


@dataclass(frozen=True, slots=True)
class MooncakeInstall:
    """Where the locked wheel is installed."""

    site_packages: Path

    @property
    def package(self) -> Path:
        return self.site_packages / "mooncake"

    @property
    def master(self) -> Path:
        return self.package / "mooncake_master"

    @property
    def store_node(self) -> Path:
        """The standalone store process (a client that mounts a global segment and serves it)."""
        return self.package / "mooncake_client"

    def linked(self) -> list[Path]:
        """The binaries whose shared libraries must resolve."""
        return [self.package / "store.so", self.master, self.store_node]


def site_packages(home: Path) -> Path:
    """A venv's site-packages for this interpreter's Python version."""
    return home / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def installed() -> MooncakeInstall | None:
    """The venv of the current lock if it was built completely (what workers use), else None."""
    home = ENVIRONMENT.home
    return MooncakeInstall(site_packages(home)) if (home / ".complete").exists() else None


def missing_libraries(ldd_output: str) -> list[str]:
    """Library names ``ldd`` reported as not found, each once, in order."""
    return list(dict.fromkeys(_NOT_FOUND.findall(ldd_output)))


def debian_packages(libraries: list[str]) -> list[str]:
    """The Debian packages providing ``libraries``.

    Raises:
        MooncakeUnavailable: a library no known package provides.
    """
    unknown = [lib for lib in libraries if lib not in DEBIAN_PACKAGES]
    if unknown:
        raise MooncakeUnavailable(f"mooncake links libraries no known Debian package provides: {', '.join(unknown)}")
    return list(dict.fromkeys(DEBIAN_PACKAGES[lib] for lib in libraries))


def ensure(install_packages: bool) -> MooncakeInstall:
    """Build the venv if needed and make its binaries' libraries resolve.

    Args:
        install_packages: install missing Debian packages with apt-get (else report them).

    Raises:
        MooncakeUnavailable: pip failed, or a library is missing and could not be installed.
    """
    try:
        ensure_venv(ENVIRONMENT)
    except subprocess.CalledProcessError as exc:
        raise MooncakeUnavailable(f"pip could not install {ENVIRONMENT.lock} (exit {exc.returncode})") from exc
    install = installed()
    if install is None:
        raise MooncakeUnavailable(f"{ENVIRONMENT.home} is incomplete after building it")
    missing = _unresolved(install)
    if missing and install_packages and shutil.which("apt-get"):
        _apt_install(debian_packages(missing))
        missing = _unresolved(install)
    if missing:
        raise MooncakeUnavailable(
            f"mooncake's binaries need {', '.join(missing)} (Debian: {' '.join(debian_packages(missing))})"
        )
    return install


def _unresolved(install: MooncakeInstall) -> list[str]:
    output = subprocess.run(["ldd", *map(str, install.linked())], capture_output=True, text=True).stdout
    return missing_libraries(output)


def _apt_install(packages: list[str]) -> None:
    print(f"mooncake: installing Debian's {' '.join(packages)} with apt-get", file=sys.stderr)
    command = ["apt-get", "install", "-y", "-qq", *packages]
    environ = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(command, capture_output=True, env=environ).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, env=environ)
        subprocess.run(command, capture_output=True, env=environ)
