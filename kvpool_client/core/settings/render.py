"""A schema as users read it: argparse flags with their help, and the docs' Markdown table."""

from __future__ import annotations

import argparse
from typing import Any

from kvpool_client.core.settings.schema import Schema, Setting

_METAVARS = {int: "N", float: "NUMBER", str: "TEXT", tuple: "A,B"}


def metavar(spec: Setting) -> str:
    """``{a,b}`` for choices, SIZE for byte sizes, SECONDS for ``*_s``, else what the type holds."""
    if spec.choices:
        return "{" + ",".join(spec.choices) + "}"
    if spec.unit == "bytes":
        return "SIZE"
    return "SECONDS" if spec.key.endswith("_s") else _METAVARS[spec.kind]


def help_line(spec: Setting) -> str:
    """The setting's help, its variable and its default: ``... [env KVPOOL_X; default: 1GiB]``."""
    env = f"env {spec.env_name}; " if spec.env else ""
    return f"{spec.help} [{env}default: {spec.show(spec.default)}]"


def add_setting_flags(parser: argparse.ArgumentParser, schema: Schema) -> None:
    """One flag per setting (``--flag/--no-flag`` for booleans), grouped by section.

    Every default is ``argparse.SUPPRESS``, so a parsed namespace holds only the flags given,
    under their flat keys.
    """
    groups: dict[str, Any] = {"": parser}
    for name, info in schema.sections.items():
        groups[name] = parser.add_argument_group(f"{info.title} ({name})")
    for spec in schema:
        kwargs: dict[str, Any] = {
            "dest": spec.key,
            "help": help_line(spec).replace("%", "%%"),
            "default": argparse.SUPPRESS,
        }
        if spec.kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["metavar"] = metavar(spec)
        groups[spec.section].add_argument(spec.flag, **kwargs)


def _cell(text: str) -> str:
    """``text`` safe in a table cell: pipes escaped, and ``<name>`` shown rather than taken for HTML."""
    return text.replace("|", "\\|").replace("<", "\\<")


def markdown_tables(schema: Schema) -> str:
    """The docs' settings tables: one per section (a heading and a table), in declaration order."""
    out: list[str] = []
    groups = [("", "")] + [(name, info.title) for name, info in schema.sections.items()]
    for name, title in groups:
        rows = [spec for spec in schema if spec.section == name]
        if not rows:
            continue
        if name:
            out += [f"### {title} (`{name}`)", ""]
        out += ["| setting | nested | default | meaning |", "| --- | --- | --- | --- |"]
        for spec in rows:
            meaning = spec.help + (f". {spec.doc}" if spec.doc else "")
            nested = f"`{spec.nested}`" if spec.section else ""
            out.append(f"| `{spec.key}` | {nested} | `{_cell(spec.show(spec.default))}` | {_cell(meaning)} |")
        out.append("")
    return "\n".join(out)
