"""The launch flags of docs/sglang.md: what the tests run is what users copy."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

DOC = Path(__file__).resolve().parents[3] / "docs" / "sglang.md"


def launch_flags() -> list[str]:
    """The arguments of the doc's ``python -m sglang.launch_server`` command, shell-split."""
    blocks = re.findall(r"```bash\n(python -m sglang\.launch_server.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 1, f"docs/sglang.md needs one launch_server block, found {len(blocks)}"
    return shlex.split(blocks[0].replace("\\\n", " "))


def flag(flags: list[str], name: str) -> str:
    """The value after ``name`` in ``flags``."""
    assert name in flags, f"docs/sglang.md's command has no {name}"
    return flags[flags.index(name) + 1]
