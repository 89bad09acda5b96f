"""Generate the Python gRPC code for proto/kvpool/v1/*.proto into kvpool_client/core/proto/.

Usage: deploy/dev.sh proto [--check]

It runs in the test environment "oldest" (tests/environments.py), whose grpcio-tools 1.78
writes protobuf 6.31.1 gencode: the generated code then runs on every protobuf runtime the
client accepts (6.31.1 and later, 7.x included) and needs grpcio >= 1.78.0. ``--check``
regenerates into a temporary folder and exits 1 if the committed code differs, so CI
catches a .proto edited without regenerating.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "kvpool_client" / "core" / "proto"
PROTOS = sorted(p.relative_to(PROTO_DIR) for p in (PROTO_DIR / "kvpool").rglob("*.proto"))
# protoc names imports after the proto package path; the modules live flat in kvpool_client.core.proto.
IMPORT_FROM = "from kvpool.v1 import"
IMPORT_TO = "from kvpool_client.core.proto import"


def generate(out: Path) -> list[Path]:
    """Run protoc into ``out`` and flatten the modules; return the files written."""
    with tempfile.TemporaryDirectory() as raw:
        args = ["protoc", f"-I{PROTO_DIR}", f"--python_out={raw}", f"--pyi_out={raw}", f"--grpc_python_out={raw}"]
        if protoc.main([*args, *map(str, PROTOS)]) != 0:
            raise SystemExit("protoc failed")
        written = []
        for src in sorted(Path(raw).rglob("*.py*")):
            dst = out / src.name
            dst.write_text(src.read_text().replace(IMPORT_FROM, IMPORT_TO))
            written.append(dst)
        return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if committed code is stale")
    if not parser.parse_args().check:
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        for path in generate(OUT_DIR):
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    with tempfile.TemporaryDirectory() as fresh:
        stale = [p.name for p in generate(Path(fresh)) if not _same(p, OUT_DIR / p.name)]
    if stale:
        print(f"stale generated code: {stale}; run: deploy/dev.sh proto", file=sys.stderr)
        return 1
    print("generated protobuf code matches proto/")
    return 0


def _same(fresh: Path, committed: Path) -> bool:
    return committed.exists() and filecmp.cmp(fresh, committed, shallow=False)


if __name__ == "__main__":
    sys.exit(main())
