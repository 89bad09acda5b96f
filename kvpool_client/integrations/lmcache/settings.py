"""The plugin's settings, read from LMCache's ``extra_config``.

LMCache builds a remote storage plugin with ``cls(loop=, local_cpu_backend=, config=)``
only: it does not say under which plugin name it was loaded. The plugin finds its name
itself: the one entry of ``remote_storage_plugins`` whose ``module_path`` and
``class_name`` resolve to its class. Its pool settings are then the other
``remote_storage_plugin.<name>.<setting>`` keys (``nodes``, ``auth_token_file``,
``transport``, ...: :mod:`kvpool_client.integrations.settings`).

No LMCache import here: the config is read through its attributes.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kvpool_client.core.errors import UsageError
from kvpool_client.integrations.settings import PoolSettings

PREFIX = "remote_storage_plugin."
_LOADER_KEYS = ("module_path", "class_name")  # LMCache's own keys under the plugin's prefix
_UNUSED = ("lookup_threads",)  # pool settings with no meaning here: LMCache owns the threads


@dataclass(frozen=True, slots=True)
class PluginSettings:
    """What the plugin was configured with.

    Attributes:
        name: the plugin name in ``remote_storage_plugins`` (``kvpool``).
        pool: the pool's settings.
        partial_chunks: LMCache's ``save_unfull_chunk``: a request's last chunk may be
            shorter than ``chunk_size`` and is read back as such.
    """

    name: str
    pool: PoolSettings
    partial_chunks: bool = False

    @property
    def source(self) -> str:
        """How messages name these settings."""
        return source_of(self.name)


def source_of(name: str) -> str:
    return f"extra_config {PREFIX}{name}.*"


def read_settings(config: Any, cls: type, env: Mapping[str, str] | None = None) -> PluginSettings:
    """The settings of the plugin whose class is ``cls``, from an ``LMCacheEngineConfig``.

    Args:
        config: LMCache's engine config (``remote_storage_plugins``, ``extra_config``,
            ``save_unfull_chunk`` and the settings :func:`check_lmcache` checks are read).
        cls: the connector class LMCache loaded.
        env: the environment for settings the config lacks (default ``os.environ``).

    Raises:
        UsageError: no plugin entry, or more than one, names ``cls``; an unknown or bad
            setting, or no pool at all (the message names the key); etcd membership asked
            for where its client cannot import; an LMCache setting the plugin cannot
            serve (:func:`check_lmcache`).
    """
    extra = _extra_config(config)
    name = plugin_name(extra, config.remote_storage_plugins or (), cls)
    source = source_of(name)
    check_lmcache(config, source)
    prefix = f"{PREFIX}{name}."
    ours = {k[len(prefix) :]: v for k, v in extra.items() if k.startswith(prefix)}
    ours = {k: v for k, v in ours.items() if k not in _LOADER_KEYS}
    for key in _UNUSED:
        if key in ours:
            raise UsageError(f"{source}: {prefix}{key} has no meaning in LMCache (it runs the plugin's calls)")
    pool = PoolSettings.parse(ours, source, env)
    if pool.client.uses_etcd:
        _check_etcd(source, prefix)
    return PluginSettings(name, pool, bool(getattr(config, "save_unfull_chunk", False)))


def check_lmcache(config: Any, source: str) -> None:
    """Refuse LMCache's own settings under which the plugin would load but never work.

    Raises:
        UsageError: naming the LMCache setting and the value to use instead:

            - ``use_layerwise``: LMCache then stores one key per layer; the pool stores
              whole chunks.
            - ``remote_serde`` other than ``naive``: LMCache hands the plugin its
              serializer's output instead of its chunks. CacheGen's is an encoded byte
              buffer of another size, so every put fails (and a get would hand LMCache
              raw bytes where it decodes); KIVI's takes no reference of its own, so the
              plugin would send from memory LMCache already freed.
            - ``enable_scheduler_bypass_lookup``: vLLM's scheduler then answers lookups from
              its own LMCache engine, which LMCache 0.5.6 builds without a local CPU
              backend and so without remote backends (it asserts one): the pool is never
              asked and gives no hits, while the workers store into it for nothing.
    """
    if getattr(config, "use_layerwise", False):
        raise UsageError(
            f"{source}: LMCache's use_layerwise is not supported (the pool stores whole chunks); "
            "set use_layerwise: false"
        )
    serde = getattr(config, "remote_serde", "naive")
    if serde != "naive":
        raise UsageError(
            f"{source}: LMCache's remote_serde {serde!r} is not supported (the pool stores LMCache's "
            "chunks as they are, and other serdes hand the plugin encoded or unowned objects); "
            "set remote_serde: naive"
        )
    if getattr(config, "enable_scheduler_bypass_lookup", False):
        raise UsageError(
            f"{source}: LMCache's enable_scheduler_bypass_lookup is not supported (the scheduler's "
            "LMCache engine has no local CPU backend, so no remote backend, and would never ask the "
            "pool); set enable_scheduler_bypass_lookup: false (the workers' lookup server asks it)"
        )


def plugin_name(extra: Mapping[str, Any], plugins: Iterable[str], cls: type) -> str:
    """The one entry of ``plugins`` whose ``module_path``/``class_name`` resolve to ``cls``.

    Raises:
        UsageError: none does, or several do (LMCache would give every one of them the
            same constructor arguments, so they could not tell their settings apart).
    """
    names = [n for n in dict.fromkeys(plugins) if _loads(extra, n, cls)]
    if len(names) == 1:
        return names[0]
    if not names:
        raise UsageError(
            f"no remote_storage_plugins entry loads {cls.__module__}.{cls.__name__} "
            f"(extra_config {PREFIX}<name>.module_path / .class_name)"
        )
    raise UsageError(
        f"remote_storage_plugins {names} all load {cls.__name__}: LMCache does not tell a "
        "plugin its name, so one LMCache engine can use one kvpool plugin entry"
    )


def _loads(extra: Mapping[str, Any], name: str, cls: type) -> bool:
    module_path = extra.get(f"{PREFIX}{name}.module_path")
    class_name = extra.get(f"{PREFIX}{name}.class_name")
    if not isinstance(module_path, str) or not isinstance(class_name, str):
        return False
    try:  # LMCache imported it already: this is a lookup in sys.modules
        return getattr(importlib.import_module(module_path), class_name, None) is cls
    except ImportError:
        return False


def _extra_config(config: Any) -> dict[str, Any]:
    extra = config.extra_config
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        raise UsageError(f"LMCache extra_config must be a mapping, not {type(extra).__name__}")
    return dict(extra)


def _check_etcd(source: str, prefix: str) -> None:
    """etcd membership needs ``kvpool[etcd]``, whose grpcio (>= 1.78.1) LMCache 0.5.6's pin
    (grpcio 1.78.0) excludes: say so at start rather than at the first call."""
    try:
        importlib.import_module("kvpool_client.core.membership.etcd")
    except ImportError as exc:
        raise UsageError(
            f"{source}: etcd_endpoints needs kvpool[etcd], which cannot be imported here ({exc}); "
            f"LMCache 0.5.6 pins grpcio 1.78.0 and the etcd client needs >= 1.78.1, so give the "
            f"daemons as {prefix}nodes instead (and unset KVPOOL_ETCD_ENDPOINTS)"
        ) from None
