"""Pool settings an engine passes in its own configuration (vLLM's ``kv_connector_extra_config``,
SGLang's and LMCache's extra configs), and the model name as a namespace field.

Every integration reads the same keys, so a user learns them once; what a key does not set
comes from the ``KVPOOL_*`` environment.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpool_client.auth import read_token
from kvpool_client.config import ClientConfig
from kvpool_client.errors import UsageError

# The pool settings a user may give, as ClientConfig fields.
_POOL_KEYS = ("nodes", "etcd_endpoints", "cluster", "transport", "request_timeout_s", "connect_timeout_s",
              "replicas", "write_quorum", "verify_checksums")
_OWN_KEYS = ("auth_token_file", "model_id", "lookup_threads")
KNOWN_KEYS = (*_POOL_KEYS, *_OWN_KEYS)


# torch dtype name -> the namespace's dtype field (kvpool_client.connector.layout's names).
_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float8_e4m3fn": "fp8e4m3",
           "float8_e5m2": "fp8e5m2", "uint8": "u8"}


def dtype_field(torch_dtype: str) -> str:
    """A torch dtype's name (``bfloat16``, ``torch.bfloat16``) as a namespace field (``bf16``)."""
    name = torch_dtype.removeprefix("torch.")
    return _DTYPES.get(name, name)


def model_field(model: str) -> str:
    """``model`` as a namespace field: a local path becomes its last part, '/' becomes '--'
    (``Qwen/Qwen2.5-0.5B`` -> ``Qwen--Qwen2.5-0.5B``), whitespace and '@' become '_'."""
    text = model.rstrip("/")
    if text.startswith(("/", ".")):
        text = Path(text).name
    return "".join("_" if c.isspace() or c == "@" else c for c in text).replace("/", "--")


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
    def parse(cls, extra: Mapping[str, Any] | None, source: str, env: Mapping[str, str] | None = None,
              ignore: tuple[str, ...] = ()) -> PoolSettings:
        """Settings from ``extra``; pool settings it lacks come from the ``KVPOOL_*`` environment.

        Args:
            extra: the engine's configuration dict.
            source: its name in the engine's configuration, for messages.
            env: the environment (default ``os.environ``).
            ignore: keys of ``extra`` that belong to the engine, not to kvpool.

        Raises:
            UsageError: an unknown key (the nearest known one is named), a bad value, or no
                pool at all; each message names ``source``.
        """
        extra = {k: v for k, v in dict(extra or {}).items() if k not in ignore}
        for key in extra:
            if key not in KNOWN_KEYS:
                near = difflib.get_close_matches(key, KNOWN_KEYS, n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else f"; known: {', '.join(KNOWN_KEYS)}"
                raise UsageError(f"{source}: unknown key {key!r}{hint}")
        overrides = {k: extra[k] for k in _POOL_KEYS if k in extra}
        try:
            if extra.get("auth_token_file") is not None:
                overrides["auth_token"] = read_token(str(extra["auth_token_file"]))
            client = ClientConfig.from_env(env, **overrides)
        except UsageError as exc:
            raise UsageError(f"{source}: {exc.args[0]}") from None
        except (TypeError, ValueError) as exc:
            raise UsageError(f"{source}: {exc}") from None
        threads = extra.get("lookup_threads", 1)
        if type(threads) is not int or threads < 1:
            raise UsageError(f"{source}: lookup_threads must be an int >= 1, not {threads!r}")
        model_id = extra.get("model_id")
        if model_id is not None and (not isinstance(model_id, str) or not model_id):
            raise UsageError(f"{source}: model_id must be a non-empty string, not {model_id!r}")
        return cls(client, model_id, threads)
