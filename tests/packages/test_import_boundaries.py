"""The packages' import boundaries: the protocol core stands alone, the daemon uses only
the core of the client package, and importing a corner of the SDK loads only that corner."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = "kvpool_client.core"
# The daemon's repair copies blocks between its peers as a client of them: the one place
# the daemon uses the SDK above the core.
SERVER_USES_SDK = {"kvpool_server.membership.copies": {"kvpool_client.aio"}}


def modules(package: str) -> Iterator[tuple[str, Path]]:
    for path in sorted((ROOT / package.replace(".", "/")).rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        yield name.removesuffix(".__init__"), path


def imported(path: Path) -> set[str]:
    """Absolute module names ``path`` imports (``from a import b`` counts ``a``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_core_imports_neither_the_sdk_nor_the_daemon() -> None:
    def foreign(name: str) -> bool:
        return (
            (inside(name, "kvpool_client") and not inside(name, CORE))
            or inside(name, "kvpool_server")
            or inside(name, "bench")
        )

    outside = {module: sorted(filter(foreign, imported(path))) for module, path in modules(CORE)}
    assert {m: names for m, names in outside.items() if names} == {}


# The wire protocol is pure: frames, codecs, the connection's state machine and the shared-memory
# layouts need the standard library, the core's errors and, for the published index's key
# digests, xxhash; nothing that does I/O or depends on a runtime.
WIRE = "kvpool_client.core.wire"
WIRE_MAY_IMPORT = ("kvpool_client.core.errors", "xxhash")


def test_the_wire_package_imports_only_the_standard_library_and_the_core_errors() -> None:
    def foreign(name: str) -> bool:
        top = name.split(".")[0]
        allowed = inside(name, WIRE) or any(inside(name, ok) for ok in WIRE_MAY_IMPORT)
        return not allowed and top not in sys.stdlib_module_names

    found = {module: sorted(filter(foreign, imported(path))) for module, path in modules(WIRE)}
    assert {m: names for m, names in found.items() if names} == {}


def test_the_daemon_imports_only_the_core_of_the_client_package() -> None:
    found = {}
    for module, path in modules("kvpool_server"):
        sdk = {n for n in imported(path) if inside(n, "kvpool_client") and not inside(n, CORE)}
        if sdk - SERVER_USES_SDK.get(module, set()):
            found[module] = sorted(sdk)
    assert found == {}


@pytest.mark.parametrize("package", ["kvpool_client", "kvpool_server"])
def test_installed_packages_never_import_dev_tooling(package: str) -> None:
    found = {
        module: sorted(n for n in imported(path) if inside(n, "bench") or inside(n, "tests"))
        for module, path in modules(package)
    }
    assert {m: names for m, names in found.items() if names} == {}


def loaded_by(statement: str) -> list[str]:
    """The kvpool and gRPC modules a fresh interpreter has loaded after ``statement``."""
    script = (
        f"import sys, json\n{statement}\n"
        "roots = ('kvpool_client', 'kvpool_server', 'grpc')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in roots)))"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_importing_the_wire_codec_loads_neither_client_nor_grpc() -> None:
    loaded = loaded_by("import kvpool_client.core.wire")
    assert all(inside(m, CORE) or m == "kvpool_client" for m in loaded), loaded


def test_public_names_load_on_first_use() -> None:
    loaded = loaded_by("import kvpool_client\nassert kvpool_client.BlockKey")
    assert "kvpool_client.client" not in loaded and "grpc" not in loaded, loaded
    assert "kvpool_client.client" in loaded_by("from kvpool_client import KVPoolClient")


def test_every_public_name_resolves() -> None:
    import kvpool_client

    missing = [name for name in kvpool_client.__all__ if getattr(kvpool_client, name, None) is None]
    assert missing == []
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        kvpool_client.NoSuchThing  # noqa: B018


# A client installed without the etcd extra (as beside LMCache, whose grpcio pin it conflicts
# with): a meta path finder in a fresh interpreter refuses etcd3aio as pip would have left it out.
_WITHOUT_ETCD = """
import sys
class NoEtcd:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "etcd3aio":
            raise ImportError("No module named 'etcd3aio'")
sys.meta_path.insert(0, NoEtcd())
from kvpool_client.admin.cli import main
sys.exit(main(sys.argv[1:]))
"""


def kvpoolctl_without_etcd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT_ETCD, *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_kvpoolctl_runs_without_the_etcd_extra_and_says_what_etcd_commands_need() -> None:
    helped = kvpoolctl_without_etcd("--help")
    assert helped.returncode == 0 and "kvpoolctl" in helped.stdout, helped
    refused = kvpoolctl_without_etcd("config", "get", "--etcd", "127.0.0.1:1")
    assert refused.returncode == 2, refused
    assert "etcd extra" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
