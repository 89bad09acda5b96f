"""The README's main command runs as its sample output shows: the demo on a local cluster."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_loads_prefixes_from_the_pool_and_survives_a_killed_node() -> None:
    done = subprocess.run(
        [sys.executable, "bench/demo.py", "--conversations", "3", "--turns", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, f"demo exited {done.returncode}:\n{out}\n{done.stderr[-3000:]}"
    summary = re.search(r"(\d+) prefills, (\d+) blocks: (\d+) loaded from the pool .* every block verified", out)
    assert summary is not None and int(summary[3]) > 0, f"no blocks came from the pool:\n{out}"
    nodes = re.findall(r"node-\d 127\.0\.0\.1:\d+: +(\d+) blocks", out)
    assert len(nodes) == 3 and all(int(n) > 0 for n in nodes), f"three nodes holding blocks expected:\n{out}"
    crash = re.search(r"(\d+) blocks, (\d+) from the surviving replicas .* 0 recomputed, .* every block verified", out)
    assert crash is not None and crash[1] == crash[2], f"the killed node's blocks were not all served:\n{out}"
