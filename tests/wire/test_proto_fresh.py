"""The committed gRPC code must match proto/: regenerate and compare."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.environments import ENVIRONMENTS, ensure

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_matches_proto_files() -> None:
    python = ensure(ENVIRONMENTS["oldest"])  # the protoc the committed code was made with
    run = subprocess.run(
        [str(python), str(ROOT / "proto" / "generate.py"), "--check"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, f"stale protobuf code:\n{run.stdout}{run.stderr}"
