"""One loader for every kvpool setting: the daemon's, the client's and kvpoolctl's.

Declare settings as dataclass fields (:func:`setting`, :func:`section`), load them from
mappings, ``KVPOOL_*`` variables and flags (:mod:`.loader`), render ``--help`` and the docs'
table from the same declarations (:mod:`.render`). Standard library only: it is imported
beside vLLM, SGLang and LMCache.
"""

from kvpool_client.core.settings.loader import Layer, argv_layer, env_layer, load, mapping_layer
from kvpool_client.core.settings.schema import (
    ENV_PREFIX,
    Report,
    Schema,
    SectionReport,
    Setting,
    check,
    section,
    setting,
)
from kvpool_client.core.settings.values import (
    ConfigError,
    GiB,
    KiB,
    MiB,
    TiB,
    did_you_mean,
    format_byte_size,
    parse_byte_size,
)

__all__ = [
    "ENV_PREFIX",
    "ConfigError",
    "GiB",
    "KiB",
    "Layer",
    "MiB",
    "Report",
    "Schema",
    "SectionReport",
    "Setting",
    "TiB",
    "argv_layer",
    "check",
    "did_you_mean",
    "env_layer",
    "format_byte_size",
    "load",
    "mapping_layer",
    "parse_byte_size",
    "section",
    "setting",
]
