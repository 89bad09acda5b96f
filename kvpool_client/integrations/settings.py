"""Pool settings an engine passes in its own configuration (vLLM's ``kv_connector_extra_config``,
SGLang's and LMCache's extra configs), and the model name as a namespace field.

Every integration reads the same keys, so a user learns them once; what a key does not set
comes from the ``KVPOOL_*`` environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvpool_client.core.config import ClientConfig, ClientSettings
from kvpool_client.core.errors import UsageError
from kvpool_client.core.settings import Report, Schema, env_layer, load, mapping_layer, section, setting


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """What an engine's config may set: every client setting, by its flat key, and the integration's own."""

    pool: ClientSettings = section(ClientSettings, "Pool")
    model_id: str = setting("", "the model's name in the namespace; empty: the engine's", env=False)
    lookup_threads: int = setting(1, "threads lookups run on, where the integration has its own", env=False)

    def check(self, report: Report) -> None:
        if "model_id" in report.origins and not self.model_id:
            report.fail("model_id", "must not be empty (leave it out for the engine's model name)")
        if self.lookup_threads < 1:
            report.fail("lookup_threads", "must be >= 1")


ENGINE_SCHEMA = Schema(EngineSettings)
KNOWN_KEYS = tuple(ENGINE_SCHEMA.settings)


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """Parsed pool settings.

    Attributes:
        client: the pool client's settings.
        model_id: overrides the model name in the namespace (engines serving one model
            under different paths must agree on it).
        lookup_threads: threads lookups run on, where the integration has its own.
    """

    client: ClientConfig
    model_id: str | None = None
    lookup_threads: int = 1

    @classmethod
    def parse(
        cls,
        extra: Mapping[str, Any] | None,
        source: str,
        env: Mapping[str, str] | None = None,
        ignore: tuple[str, ...] = (),
    ) -> PoolSettings:
        """Settings from ``extra``; pool settings it lacks come from the ``KVPOOL_*`` environment.

        Args:
            extra: the engine's configuration dict.
            source: its name in the engine's configuration, for messages.
            env: the environment (default ``os.environ``).
            ignore: keys of ``extra`` that belong to the engine, not to kvpool.

        Raises:
            UsageError: an unknown key (the nearest known one is named), a bad value, or no
                pool at all; each message names ``source`` (or the ``KVPOOL_*`` variable at fault).
        """
        extra = {k: v for k, v in dict(extra or {}).items() if k not in ignore}
        from_env = env_layer(ENGINE_SCHEMA, os.environ if env is None else env, strict=False, skip_blank=True)
        given = mapping_layer(ENGINE_SCHEMA, extra, source, list_known=True)
        settings, _ = load(ENGINE_SCHEMA, from_env, given)  # errors name the key's source: source or variable
        try:
            client = ClientConfig(**settings.pool.config_values())
        except UsageError as exc:  # rules across settings (no pool at all, quorum > replicas), the token file
            raise UsageError(f"{source}: {exc.args[0]}") from None
        return cls(client, settings.model_id or None, settings.lookup_threads)
