"""One UCX build per process: ucxx's and NIXL's are told apart by where their core library lies."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from kvpool_client.core.channels.nixl_agent import import_error as nixl_import_error
from kvpool_client.core.channels.ucx_builds import loaded_builds, nixl_build, other_build

SITE = "/venv/lib/python3.11/site-packages"
UCXX, NIXL = f"{SITE}/libucx/lib", f"{SITE}/nixl_cu12.libs"
UCXX_LIBS = f"""\
7f0000000000-7f0000001000 r-xp 00000000 fd:01 1 {SITE}/libucx/lib/libucs.so
7f0000001000-7f0000002000 r-xp 00000000 fd:01 2 {SITE}/libucx/lib/libucs_signal.so
7f0000002000-7f0000003000 r-xp 00000000 fd:01 3 {SITE}/libucx/lib/libucp.so
"""
NIXL_LIBS = f"""\
7f0000003000-7f0000004000 r-xp 00000000 fd:01 4 {SITE}/nixl_cu12.libs/libucs-14c218c5.so.0.0.0
7f0000004000-7f0000005000 r-xp 00000000 fd:01 5 {SITE}/nixl_cu12.libs/ucx/libuct_cma.so.0.0.0
"""
OTHER = "7f0000005000-7f0000006000 r-xp 00000000 fd:01 6 /usr/lib/libucsomething_else.so\n[heap]\n"


@pytest.mark.parametrize(
    ("maps", "builds", "beside_nixl", "nixl"),
    [
        ("", set(), None, None),
        (OTHER, set(), None, None),
        (UCXX_LIBS, {UCXX}, UCXX, None),
        (NIXL_LIBS, {NIXL}, None, NIXL),
        (UCXX_LIBS + NIXL_LIBS, {UCXX, NIXL}, UCXX, NIXL),
    ],
)
def test_builds_are_known_by_their_core_library(
    tmp_path: Path, maps: str, builds: set[str], beside_nixl: str | None, nixl: str | None
) -> None:
    path = tmp_path / "maps"
    path.write_text(maps)
    assert loaded_builds(str(path)) == builds
    assert other_build("nixl", str(path)) == beside_nixl
    assert nixl_build(str(path)) == nixl


def test_a_process_without_maps_refuses_nothing(tmp_path: Path) -> None:
    assert loaded_builds(str(tmp_path / "absent")) == set()


_UCXX_FIRST = """
from kvpool_client.core.channels.nixl_agent import NixlUnavailable
from kvpool_client.transport.nixl import LocalAgent
from kvpool_client.transport.ucx import import_error
assert import_error() is None
try:
    LocalAgent(1.0).available(required=True)
except NixlUnavailable as exc:
    print("refused:", exc)
"""

_NIXL_FIRST = """
import sys
from kvpool_client.transport.nixl import LocalAgent
from kvpool_client.transport.ucx import import_error
assert LocalAgent(1.0).available(required=True)
print("ucx:", import_error(), "| ucxx imported:", "ucxx" in sys.modules)
"""

# Whether ucxx is installed, asked without importing it: that would load its UCX here.
needs_both = pytest.mark.skipif(
    nixl_import_error() is not None or importlib.util.find_spec("ucxx") is None, reason="needs both nixl and ucxx"
)


def run(source: str) -> str:
    """``source`` in a Python process of its own (this one may have loaded either build)."""
    done = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


@needs_both
def test_nixl_refuses_a_process_that_loaded_ucxx() -> None:
    """Measured: beside ucxx's libraries NIXL's UCX finds only TCP, and would emulate every read."""
    out = run(_UCXX_FIRST)
    assert "refused:" in out and "libucx" in out, out


@needs_both
def test_ucxx_is_not_even_imported_beside_nixl() -> None:
    out = run(_NIXL_FIRST)
    assert "NIXL's UCX is loaded" in out and "ucxx imported: False" in out, out
