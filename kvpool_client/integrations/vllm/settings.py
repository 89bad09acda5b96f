"""The connector's settings (``kv_connector_extra_config``) and the namespace its blocks live in.

vLLM's block hashes name token content only; the namespace adds what else decides a
block's bytes: the model, the KV dtype, the cache layout and shape, and the parallel rank.
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
from kvpool_client.keys import Namespace

# The pool settings a user may give in kv_connector_extra_config, as ClientConfig fields.
_POOL_KEYS = ("nodes", "etcd_endpoints", "cluster", "transport", "request_timeout_s", "connect_timeout_s",
              "replicas", "write_quorum", "verify_checksums")
_OWN_KEYS = ("auth_token_file", "model_id", "lookup_threads")
KNOWN_KEYS = (*_POOL_KEYS, *_OWN_KEYS)
SETTING = "kv_connector_extra_config"

# torch dtype name -> the namespace's dtype field (kvpool_client.connector.layout's names).
_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float8_e4m3fn": "fp8e4m3",
           "float8_e5m2": "fp8e5m2", "uint8": "u8"}


@dataclass(frozen=True, slots=True)
class CacheShape:
    """What decides a vLLM block's bytes besides its tokens.

    Attributes:
        model: the model's name (vLLM's ``model`` setting, or ``model_id``).
        dtype: the KV cache's torch dtype name (``bfloat16``).
        layout: vLLM's resolved KV cache layout (``NHD``, ``HND``, ``LBNHC``...), or None.
        kind: ``mha`` or ``mla``.
        layers: attention layers on this pipeline stage.
        kv_heads: KV heads per layer on this rank; head_size: channels per head.
        block_size: tokens per block.
        tp_rank, tp_size, pp_rank, pp_size: the parallel position.
    """

    model: str
    dtype: str
    layout: str | None
    kind: str
    layers: int
    kv_heads: int
    head_size: int
    block_size: int
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1

    def namespace(self) -> Namespace:
        """The namespace of this shape's blocks. MLA's latent cache is the same on every TP
        rank, so MLA blocks are shared across ranks (tp0of1); MHA blocks are per rank.

        Raises:
            UsageError: the model name cannot be a namespace field even after cleaning.
        """
        dtype = _DTYPES.get(self.dtype, self.dtype)
        layout = (f"vllm-{self.layout or 'default'}-{self.kind}-L{self.layers}-H{self.kv_heads}"
                  f"-D{self.head_size}-T{self.block_size}-pp{self.pp_rank}of{self.pp_size}")
        if self.kind == "mla":
            return Namespace(model_field(self.model), dtype, layout)
        return Namespace(model_field(self.model), dtype, layout, self.tp_rank, self.tp_size)


def model_field(model: str) -> str:
    """``model`` as a namespace field: a local path becomes its last part, '/' becomes '--'
    (``Qwen/Qwen2.5-0.5B`` -> ``Qwen--Qwen2.5-0.5B``), whitespace and '@' become '_'."""
    text = model.rstrip("/")
    if text.startswith(("/", ".")):
        text = Path(text).name
    return "".join("_" if c.isspace() or c == "@" else c for c in text).replace("/", "--")


@dataclass(frozen=True, slots=True)
class ConnectorSettings:
    """Parsed ``kv_connector_extra_config``.

    Attributes:
        client: the pool client's settings.
        model_id: overrides the model name in the namespace (engines serving one model
            under different paths must agree on it).
        lookup_threads: threads the scheduler side asks the pool on.
    """

    client: ClientConfig
    model_id: str | None = None
    lookup_threads: int = 1

    @classmethod
    def parse(cls, extra: Mapping[str, Any] | None, env: Mapping[str, str] | None = None) -> ConnectorSettings:
        """Settings from ``extra``; pool settings it lacks come from the ``KVPOOL_*`` environment.

        Raises:
            UsageError: an unknown key (the nearest known one is named), a bad value, or no
                pool at all; each message names the setting.
        """
        extra = dict(extra or {})
        for key in extra:
            if key not in KNOWN_KEYS:
                near = difflib.get_close_matches(key, KNOWN_KEYS, n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else f"; known: {', '.join(KNOWN_KEYS)}"
                raise UsageError(f"{SETTING}: unknown key {key!r}{hint}")
        overrides = {k: extra[k] for k in _POOL_KEYS if k in extra}
        try:
            if extra.get("auth_token_file") is not None:
                overrides["auth_token"] = read_token(str(extra["auth_token_file"]))
            client = ClientConfig.from_env(env, **overrides)
        except UsageError as exc:
            raise UsageError(f"{SETTING}: {exc.args[0]}") from None
        except (TypeError, ValueError) as exc:
            raise UsageError(f"{SETTING}: {exc}") from None
        threads = extra.get("lookup_threads", 1)
        if type(threads) is not int or threads < 1:
            raise UsageError(f"{SETTING}: lookup_threads must be an int >= 1, not {threads!r}")
        model_id = extra.get("model_id")
        if model_id is not None and (not isinstance(model_id, str) or not model_id):
            raise UsageError(f"{SETTING}: model_id must be a non-empty string, not {model_id!r}")
        return cls(client, model_id, threads)

