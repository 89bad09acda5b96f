"""Loading a schema's settings from mappings (a YAML file, an engine's config), the environment and argv.

Each source gives a layer: flat key -> (where the value came from, typed value). Later layers
win; :func:`load` merges them over the defaults, builds the dataclasses and checks them, so
every error names its source (``KVPOOL_DRAM_CAPACITY``, ``--slab-size``, ``config.yaml:
dram.capacity``), the key, and for an unknown key the nearest known one.
"""

from __future__ import annotations

import argparse
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from kvpool_client.core.settings.schema import Schema, check
from kvpool_client.core.settings.values import ConfigError, did_you_mean

Layer = dict[str, tuple[str, Any]]  # flat key -> (where it came from, typed value)


def mapping_layer(schema: Schema, data: Mapping[Any, Any], source: str, *, list_known: bool = False) -> Layer:
    """Settings from a mapping of flat keys, or of section names to mappings of field names.

    Args:
        data: e.g. a parsed YAML file; ``{"dram_capacity": "1GiB"}`` or ``{"dram": {"capacity": "1GiB"}}``.
        source: its name in messages (a path, ``kv_connector_extra_config``).
        list_known: an unknown key with no near one lists the keys (for short schemas).
    Raises:
        ConfigError: an unknown key (with the nearest known one), a section that is not a
            mapping, a setting given twice, or a malformed value.
    """
    layer: Layer = {}
    for key, raw in data.items():
        if key in schema.sections:
            _section_into(layer, schema, str(key), raw, source)
        elif key in schema.settings:
            _put(layer, schema, str(key), raw, f"{source}: {key}")
        else:
            hint = did_you_mean(str(key), _spellings(schema))
            if not hint and list_known:
                hint = f"; known: {', '.join(schema.settings)}"
            raise ConfigError(f"{source}: unknown key {key!r}{hint}")
    return layer


def _section_into(layer: Layer, schema: Schema, name: str, raw: Any, source: str) -> None:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: {name}: expected a mapping of setting: value, got {type(raw).__name__}")
    fields = {spec.name: spec for spec in schema if spec.section == name}
    for inner, value in raw.items():
        spec = fields.get(inner)
        if spec is None:
            nested = f"{name}.{inner}"
            raise ConfigError(f"{source}: unknown key {nested!r}{did_you_mean(nested, _spellings(schema))}")
        _put(layer, schema, spec.key, value, f"{source}: {spec.nested}")


def _put(layer: Layer, schema: Schema, key: str, raw: Any, where: str) -> None:
    if key in layer:
        raise ConfigError(f"{where}: also set as {layer[key][0]}: keep one")
    layer[key] = (where, schema.settings[key].coerce(raw, where))


def _spellings(schema: Schema) -> list[str]:
    return [*schema.settings, *(spec.nested for spec in schema if spec.section)]


def env_layer(
    schema: Schema,
    env: Mapping[str, str],
    *,
    allowed: Collection[str] = (),
    strict: bool = True,
    skip_blank: bool = False,
) -> Layer:
    """Settings from ``KVPOOL_<KEY>`` variables.

    Args:
        allowed: other ``KVPOOL_*`` variables that are not errors (read by someone else).
        strict: an unknown ``KVPOOL_*`` variable is an error; else it is ignored.
        skip_blank: a blank variable counts as unset, and values lose surrounding spaces.
    Raises:
        ConfigError: a malformed value; with ``strict``, an unknown variable (nearest one named).
    """
    known = {spec.env_name: spec for spec in schema if spec.env}
    layer: Layer = {}
    for var, raw in sorted(env.items()):
        spec = known.get(var)
        if spec is None:
            if strict and var.startswith("KVPOOL_") and var not in allowed:
                raise ConfigError(f"{var}: unknown environment variable{did_you_mean(var, [*known, *allowed])}")
            continue
        if skip_blank:
            if not raw.strip():
                continue
            raw = raw.strip()
        layer[spec.key] = (var, spec.coerce(raw, var))
    return layer


def argv_layer(
    schema: Schema, parser: argparse.ArgumentParser, argv: Sequence[str] | None, others: Collection[str] = ()
) -> tuple[Layer, dict[str, Any]]:
    """Settings from flags (see :func:`~kvpool_client.core.settings.render.add_setting_flags`).

    Args:
        parser: raises on errors instead of exiting, and has every default SUPPRESSed.
        argv: the arguments, without the program name; None: ``sys.argv[1:]``.
        others: flags of the parser that are not settings (offered as suggestions).
    Returns:
        The settings given, and the parser's other values (``--config``, ...).
    Raises:
        ConfigError: an unknown argument (nearest flag named) or a malformed value.
    """
    namespace, extras = parser.parse_known_args(argv)
    if extras:
        flag = extras[0].split("=", 1)[0]
        hint = did_you_mean(flag, [spec.flag for spec in schema] + list(others))
        raise ConfigError(f"command line: unknown argument {extras[0]!r}{hint}")
    given = vars(namespace)
    layer = {
        key: (schema.settings[key].flag, schema.settings[key].coerce(given.pop(key), schema.settings[key].flag))
        for key in list(given)
        if key in schema.settings
    }
    return layer, given


def load(schema: Schema, *layers: Layer) -> tuple[Any, dict[str, str]]:
    """Merge ``layers`` (later ones win) over the defaults, build the config and check it.

    Returns:
        The config and, for each key some layer set, where its value came from.
    Raises:
        ConfigError: a rule of a section or of the root is broken.
    """
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for layer in layers:
        for key, (where, value) in layer.items():
            values[key], origins[key] = value, where
    config = schema.build(values)
    check(schema, config, origins)
    return config, origins
