"""Fenced code blocks of a Markdown page, as a reader copies them: no I/O beyond reading the file.

A block in a language a user runs (``python``, ``bash``, ...) is either run by
``tests/docs/test_docs.py`` or carries, on the line right before its fence, the
marker ``<!-- not-run: why -->`` naming why it cannot run here (it needs Kubernetes, a GPU,
an engine, takes minutes, ...). A ``text`` block right after a runnable block is its output,
as printed by a real run.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

RUNNABLE = frozenset({"python", "py", "python3", "bash", "sh", "shell", "console", "zsh"})
PYTHON = frozenset({"python", "py", "python3"})
OUTPUT = "text"
_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[^`\s]*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*not-run:(?P<why>.*?)-->\s*$")
_ANY_MARKER = re.compile(r"<!--\s*not-run")


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced block.

    Attributes:
        path: the page.
        line: 1-based line of the opening fence.
        lang: the fence's language ("" when it names none).
        code: the block's text, dedented to the fence.
        not_run: the marker's reason; None when the block is unmarked.
        output: the ``text`` block that follows it (what a run printed), or None.
    """

    path: Path
    line: int
    lang: str
    code: str
    not_run: str | None = None
    output: str | None = None

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.lang in RUNNABLE

    @property
    def to_run(self) -> bool:
        """Runnable and not marked: the docs test must run it."""
        return self.runnable and self.not_run is None


@dataclass(frozen=True, slots=True)
class _Raw:
    line: int
    end: int  # 0-based index of the closing fence
    lang: str
    code: str
    marker: str | None


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path`` in page order, each with its marker and output block.

    Raises:
        ValueError: a fence is never closed.
    """
    raws = _raw_blocks(path)
    lines = path.read_text().splitlines()
    found: list[Block] = []
    for index, raw in enumerate(raws):
        following = raws[index + 1] if index + 1 < len(raws) else None
        output = None
        if following is not None and following.lang == OUTPUT and following.marker is None:
            between = lines[raw.end + 1 : following.line - 1]
            if not any(text.strip() for text in between):
                output = following.code
        found.append(Block(path, raw.line, raw.lang, raw.code, raw.marker, output))
    return found


def problems(path: Path) -> list[str]:
    """What breaks the page's contract with the docs test: unnamed fences, bad or stray markers."""
    lines = path.read_text().splitlines()
    found = blocks(path)
    marked_lines = {b.line - 1 for b in found if b.not_run is not None}  # 1-based line of each used marker
    issues = [f"{b.where}: name the block's language (text for output or diagrams)" for b in found if not b.lang]
    issues += [f"{b.where}: a not-run marker needs a reason" for b in found if b.not_run == ""]
    issues += [f"{b.where}: a not-run marker on a {b.lang} block: only runnable blocks take one"
               for b in found if b.not_run is not None and not b.runnable]  # fmt: skip
    for number, text in enumerate(lines, 1):
        if _ANY_MARKER.search(text) and number not in marked_lines:
            issues.append(f"{path.name}:{number}: a not-run marker must be the line right before a fence")
    return issues


def _raw_blocks(path: Path) -> list[_Raw]:
    lines = path.read_text().splitlines()
    raws: list[_Raw] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        close = next((j for j in range(index + 1, len(lines)) if lines[j].strip() == "```"), None)
        if close is None:
            raise ValueError(f"{path.name}:{index + 1}: a fence that is never closed")
        marker = _MARKER.match(lines[index - 1]) if index else None
        code = textwrap.dedent("\n".join(lines[index + 1 : close])) + "\n"
        why = marker["why"].strip() if marker else None
        raws.append(_Raw(index + 1, close, opening["lang"], code, why))
        index = close + 1
    return raws
