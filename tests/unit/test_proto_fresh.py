"""The committed gRPC code must match proto/: regenerate and compare."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_matches_proto_files() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "proto" / "generate.py"), "--check"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, f"stale protobuf code:\n{run.stdout}{run.stderr}"
