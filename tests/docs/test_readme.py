"""The README's client example runs as written against a real daemon."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support.daemon import DaemonProcess

ROOT = Path(__file__).resolve().parents[2]


def client_example() -> str:
    """The first python block under the README's "Client API" heading."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Client API") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "no python block under '## Client API'"
    return match[1]


def test_the_client_example_stores_then_finds_its_blocks(daemon: DaemonProcess) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVPOOL_")} | {"KVPOOL_NODES": daemon.address}
    runs = [
        subprocess.run(
            [sys.executable, "-c", client_example()], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        for _ in range(2)
    ]
    for run in runs:
        assert run.returncode == 0, f"the README example failed:\n{run.stdout}\n{run.stderr}"
    assert [r.stdout.strip() for r in runs] == ["0 of 6 blocks came from the pool", "6 of 6 blocks came from the pool"]
