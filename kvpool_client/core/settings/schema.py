"""Declaring settings: one field per setting, grouped in sections that check themselves.

A schema is a frozen dataclass. Its fields are settings (:func:`setting`) or sections
(:func:`section`): dataclasses of settings with an optional ``check(report)`` method for
their own rules. The root may define ``check(report)`` too, for rules across sections.

Every setting has one flat key: the YAML key, ``KVPOOL_`` + the key in upper case, and
``--the-key``. In a section the key is the section's prefix + the field's name unless the
field names its own (``dram.capacity`` is ``dram_capacity``, ``dram.slab_size`` is
``slab_size``). YAML may also nest a section's settings under its name, by field name.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any

from kvpool_client.core.settings.values import CONVERTERS, ConfigError, format_byte_size, parse_byte_size

ENV_PREFIX = "KVPOOL_"
_SETTING = "kvpool.setting"
_SECTION = "kvpool.section"


@dataclasses.dataclass(frozen=True, slots=True)
class _Declared:
    help: str
    unit: str | None
    choices: tuple[str, ...]
    key: str | None
    env: bool
    doc: str


@dataclasses.dataclass(frozen=True, slots=True)
class _SectionDeclared:
    prefix: str
    title: str


def setting(
    default: Any,
    help: str,
    *,
    unit: str | None = None,
    choices: tuple[str, ...] = (),
    key: str | None = None,
    env: bool = True,
    doc: str = "",
) -> Any:
    """Declare a setting as a dataclass field.

    Args:
        default: its value when no source sets it (immutable: a tuple, not a list).
        help: one line for ``--help`` and the docs' table.
        unit: ``"bytes"``: a byte size (``512MiB``), shown that way.
        choices: the lower-case words it may take (case-insensitive on input).
        key: its flat key, when not the section's prefix + the field's name.
        env: whether ``KVPOOL_<KEY>`` sets it.
        doc: more for the docs' table (Markdown), after ``help``.
    """
    declared = _Declared(help, unit, choices, key, env, doc)
    return dataclasses.field(default=default, metadata={_SETTING: declared})


def section(cls: type, title: str, *, prefix: str = "") -> Any:
    """Declare a section: a dataclass of settings whose flat keys start with ``prefix``."""
    return dataclasses.field(default_factory=cls, metadata={_SECTION: _SectionDeclared(prefix, title)})


@dataclasses.dataclass(frozen=True, slots=True)
class Setting:
    """One setting as users spell it, with its type and declaration."""

    key: str  # the flat key
    section: str  # '' at the root
    name: str  # the field's name in its section
    kind: Any  # bool, int, float, str or tuple (of str)
    optional: bool  # None allowed (blank text means None)
    default: Any
    help: str
    unit: str | None
    choices: tuple[str, ...]
    env: bool
    doc: str

    @property
    def env_name(self) -> str:
        return ENV_PREFIX + self.key.upper()

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    @property
    def nested(self) -> str:
        """Its spelling inside its section (``dram.capacity``); the key itself at the root."""
        return f"{self.section}.{self.name}" if self.section else self.key

    def coerce(self, value: Any, where: str) -> Any:
        """``value`` from source ``where`` as this setting's type.

        Raises:
            ConfigError: ``where=value: problem``.
        """
        if self.optional and (value is None or (isinstance(value, str) and not value.strip())):
            return None
        convert = parse_byte_size if self.unit == "bytes" else CONVERTERS[self.kind]
        try:
            result: Any = convert(value)
        except ValueError as exc:
            raise ConfigError(f"{where}={value!r}: {exc}") from None
        return result.strip().lower() if self.choices else result

    def show(self, value: Any) -> str:
        """``value`` as a user would write it: ``1GiB``, ``true``, ``a,b``, ``""``."""
        if value is None:
            return "none"
        if self.unit == "bytes":
            return format_byte_size(value)
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, tuple):
            value = ",".join(value)
        return '""' if value == "" else str(value)


@dataclasses.dataclass(frozen=True, slots=True)
class SectionInfo:
    name: str
    cls: type
    title: str


class Schema:
    """The settings of a root dataclass, by flat key, in declaration order.

    Raises:
        TypeError: (at construction) a field is neither a setting nor a section, a type is
            not one the loader converts, or two settings share a key.
    """

    def __init__(self, root: type) -> None:
        self.root = root
        self.settings: dict[str, Setting] = {}
        self.sections: dict[str, SectionInfo] = {}
        hints = typing.get_type_hints(root)
        for field in dataclasses.fields(root):
            if _SECTION in field.metadata:
                declared: _SectionDeclared = field.metadata[_SECTION]
                self.sections[field.name] = SectionInfo(field.name, hints[field.name], declared.title)
                for inner in _settings_of(hints[field.name], field.name, declared.prefix):
                    self._add(inner)
            else:
                self._add(_setting_of(root, field, "", "", hints[field.name]))
        clash = set(self.sections) & set(self.settings)
        if clash:
            raise TypeError(f"{root.__name__}: section names are also keys: {sorted(clash)}")
        self._by_path = {(s.section, s.name): s for s in self.settings.values()}

    def _add(self, spec: Setting) -> None:
        if spec.key in self.settings:
            raise TypeError(f"{self.root.__name__}: two settings have the key {spec.key!r}")
        self.settings[spec.key] = spec

    def at(self, section: str, name: str) -> Setting:
        """The setting of field ``name`` in ``section`` ('' for the root)."""
        return self._by_path[(section, name)]

    def get(self, config: Any, key: str) -> Any:
        spec = self.settings[key]
        holder = getattr(config, spec.section) if spec.section else config
        return getattr(holder, spec.name)

    def build(self, values: Mapping[str, Any]) -> Any:
        """A root instance with ``values`` (flat key -> typed value) over the defaults, unchecked.

        Raises:
            KeyError: a key that is not a setting.
        """
        grouped: dict[str, dict[str, Any]] = {name: {} for name in ("", *self.sections)}
        for key, value in values.items():
            spec = self.settings[key]
            grouped[spec.section][spec.name] = value
        sections = {name: info.cls(**grouped[name]) for name, info in self.sections.items()}
        return self.root(**sections, **grouped[""])

    def flatten(self, config: Any) -> dict[str, Any]:
        """Every setting of ``config`` by flat key."""
        return {key: self.get(config, key) for key in self.settings}

    def __iter__(self) -> Iterator[Setting]:
        return iter(self.settings.values())


def _settings_of(cls: type, section_name: str, prefix: str) -> list[Setting]:
    hints = typing.get_type_hints(cls)
    return [_setting_of(cls, field, section_name, prefix, hints[field.name]) for field in dataclasses.fields(cls)]


def _setting_of(owner: type, field: dataclasses.Field[Any], section_name: str, prefix: str, hint: Any) -> Setting:
    if _SETTING not in field.metadata:
        raise TypeError(f"{owner.__name__}.{field.name}: declare it with setting(...) or section(...)")
    declared: _Declared = field.metadata[_SETTING]
    kind, optional = _kind(hint)
    if kind not in CONVERTERS or (declared.unit == "bytes" and kind is not int):
        raise TypeError(f"{owner.__name__}.{field.name}: no loader for {hint}")
    return Setting(
        key=declared.key or prefix + field.name,
        section=section_name,
        name=field.name,
        kind=kind,
        optional=optional,
        default=field.default,
        help=declared.help,
        unit=declared.unit,
        choices=declared.choices,
        env=declared.env,
        doc=declared.doc,
    )


def _kind(hint: Any) -> tuple[Any, bool]:
    """``(int, True)`` for ``int | None``; tuples of str as ``tuple``."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        others = [a for a in args if a is not type(None)]
        return (_kind(others[0])[0], True) if len(others) == 1 else (hint, True)
    if typing.get_origin(hint) is tuple:
        return tuple, False
    return hint, False


@dataclasses.dataclass(frozen=True, slots=True)
class Report:
    """Words check failures: each names where the value came from (or the key, for a default)."""

    schema: Schema
    config: Any
    origins: Mapping[str, str]  # flat key -> its source: KVPOOL_SLAB_SIZE, --slab-size, "file.yaml: slab_size"

    def fail(self, key: str, problem: str) -> typing.NoReturn:
        """Raises ConfigError: ``<source>=<value>: <problem>``."""
        value = self.schema.get(self.config, key)
        shown = repr(value) if isinstance(value, str) else self.schema.settings[key].show(value)
        raise ConfigError(f"{self.origins.get(key, key)}={shown}: {problem}")

    def describe(self, key: str) -> str:
        """``key=value (from SOURCE)`` or ``key=value (default)``, for a rule naming another setting."""
        origin = f"from {self.origins[key]}" if key in self.origins else "default"
        return f"{key}={self.schema.settings[key].show(self.schema.get(self.config, key))} ({origin})"

    def section(self, name: str) -> SectionReport:
        return SectionReport(self, name)


@dataclasses.dataclass(frozen=True, slots=True)
class SectionReport:
    """A :class:`Report` for one section's ``check``: settings are named by field."""

    report: Report
    section: str

    def fail(self, name: str, problem: str) -> typing.NoReturn:
        self.report.fail(self.report.schema.at(self.section, name).key, problem)

    def describe(self, name: str) -> str:
        return self.report.describe(self.report.schema.at(self.section, name).key)


def check(schema: Schema, config: Any, origins: Mapping[str, str] | None = None) -> None:
    """Check choices, then each section's ``check``, then the root's.

    Raises:
        ConfigError: the first rule broken, naming the setting and where its value came from.
    """
    report = Report(schema, config, origins or {})
    for spec in schema:
        if spec.choices and schema.get(config, spec.key) not in spec.choices:
            report.fail(spec.key, f"must be one of {', '.join(spec.choices)}")
    for name in schema.sections:
        rules = getattr(getattr(config, name), "check", None)
        if rules is not None:
            rules(report.section(name))
    if hasattr(config, "check"):
        config.check(report)
