"""docs/configuration.md and ``kvpool-server --help`` say what the schema declares, and stay so."""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from kvpool_client.core.settings import mapping_layer
from kvpool_client.core.settings.render import help_line
from kvpool_server.config import DOCS_BEGIN, SCHEMA, docs_with_tables

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "configuration.md"
REGENERATE = "python -m kvpool_server.config --write-docs docs/configuration.md"


def test_the_docs_tables_are_the_generated_ones() -> None:
    text = DOCS.read_text(encoding="utf-8")
    assert DOCS_BEGIN in text
    expected = docs_with_tables(text)
    diff = "\n".join(difflib.unified_diff(text.splitlines(), expected.splitlines(), "docs", "schema", lineterm=""))
    assert text == expected, f"docs/configuration.md drifted from the schema; run `{REGENERATE}`:\n{diff}"


def test_the_docs_name_every_setting_once_with_its_default() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for spec in SCHEMA:
        rows = [line for line in text.splitlines() if line.startswith(f"| `{spec.key}` |")]
        assert len(rows) == 1, f"{spec.key}: {rows}"
        assert f"`{spec.show(spec.default)}`" in rows[0], rows[0]


def test_the_docs_yaml_example_loads_as_its_flat_spelling() -> None:
    text = DOCS.read_text(encoding="utf-8")
    example = re.search(r"```yaml\n(.*?)```", text, re.DOTALL)
    assert example is not None, "the page shows a nested YAML example"
    layer = mapping_layer(SCHEMA, yaml.safe_load(example.group(1)), "example")
    assert {key: value for key, (_, value) in layer.items()} == {
        "dram_capacity": 4 << 30,
        "ssd_dir": "/var/lib/kvpool/ssd",
        "ssd_capacity": 200 << 30,
    }


def test_the_help_is_the_schema_by_section() -> None:
    env = {**os.environ, "COLUMNS": "1000"}  # no wrapping: each flag's help on one line
    result = subprocess.run(
        [sys.executable, "-m", "kvpool_server.app", "--help"], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    titles = {name: lines.index(f"{info.title} ({name}):") for name, info in SCHEMA.sections.items()}
    for spec in SCHEMA:
        at = next(n for n, ln in enumerate(lines) if re.match(rf"\s+{re.escape(spec.flag)}\b", ln))
        # argparse puts a long flag's help on the next line: the entry runs to the next flag or title.
        end = next((n for n in range(at + 1, len(lines)) if re.match(r"\s{0,4}\S", lines[n])), len(lines))
        entry = " ".join(line.strip() for line in lines[at:end])
        assert help_line(spec) in entry, f"{spec.flag}: {entry!r}"
        starts = sorted(titles.values())
        section_start = titles[spec.section]
        section_end = next((t for t in starts if t > section_start), len(lines))
        assert section_start < at < section_end, f"{spec.flag} is outside its section {spec.section}"
