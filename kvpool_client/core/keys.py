"""Block keys: the (namespace, block hash) pair a block of KV cache is stored under.

Hashes are byte-identical to vLLM's ``sha256_cbor`` or SGLang HiCache's page hashes, so
connectors pass them straight through; the namespace keeps models and layouts apart.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, NewType

import cbor2

from kvpool_client.core.errors import UsageError
from kvpool_client.core.wire.frames import MAX_HASH_BYTES, MAX_NAMESPACE_BYTES

BlockHash = NewType("BlockHash", bytes)  # 32-byte sha256 digest for both schemes
Scheme = Literal["vllm", "sglang"]
ExtraKeys = tuple[object, ...] | None  # vLLM's per-block extra keys

_HASH_LENGTHS = range(1, MAX_HASH_BYTES + 1)
# '@' splits Namespace ids and '/' splits BlockKey text: either in a field is ambiguous.
_FORBIDDEN = frozenset("@/")
# ASCII digits without leading zeros, so each Namespace has exactly one id.
_TP_RE = re.compile(r"tp(0|[1-9][0-9]*)of([1-9][0-9]*)")


def _check_field(name: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise UsageError(f"Namespace.{name} must be a non-empty str, got {value!r}")
    # isprintable() rejects control, format and separator characters except ' '.
    if not value.isprintable() or any(c.isspace() or c in _FORBIDDEN for c in value):
        raise UsageError(f"Namespace.{name} must be printable, no whitespace/'@'/'/': {value!r}")


def _check_namespace_str(namespace: object) -> None:
    if not isinstance(namespace, str) or not namespace:
        raise UsageError(f"namespace must be a non-empty str, got {namespace!r}")
    # At most 63 code points is at most 252 UTF-8 bytes: skip encoding short ones.
    if len(namespace) > MAX_NAMESPACE_BYTES // 4:
        size = len(namespace.encode("utf-8", "surrogatepass"))  # count, not validate
        if size > MAX_NAMESPACE_BYTES:
            raise UsageError(f"namespace is {size} UTF-8 bytes, at most {MAX_NAMESPACE_BYTES}")


@dataclass(frozen=True, slots=True)
class Namespace:
    """What a cached block belongs to: model, dtype, KV layout and TP shard.

    Raises:
        UsageError: a field is empty or holds whitespace, control characters, '@'
            or '/'; not ``0 <= tp_rank < tp_size``; or ``id`` exceeds 255 UTF-8 bytes.
    """

    model: str
    dtype: str
    layout: str  # free-form, e.g. "L24-KV2-H2-D64-T16"
    tp_rank: int = 0
    tp_size: int = 1

    def __post_init__(self) -> None:
        for name in ("model", "dtype", "layout"):
            _check_field(name, getattr(self, name))
        # bool is an int subclass, and True as a rank is surely a mistake.
        ints = all(type(v) is int for v in (self.tp_rank, self.tp_size))
        if not ints or not 0 <= self.tp_rank < self.tp_size:
            raise UsageError(f"need 0 <= tp_rank < tp_size, got {self.tp_rank}, {self.tp_size}")
        size = len(self.id.encode("utf-8"))
        if size > MAX_NAMESPACE_BYTES:
            raise UsageError(f"Namespace id is {size} UTF-8 bytes, at most {MAX_NAMESPACE_BYTES}")

    @property
    def id(self) -> str:
        """The canonical string ``model@dtype@layout@tp{rank}of{size}``."""
        return f"{self.model}@{self.dtype}@{self.layout}@tp{self.tp_rank}of{self.tp_size}"

    def __str__(self) -> str:
        return self.id

    @classmethod
    def parse(cls, id: str) -> Namespace:  # ``id`` mirrors the property
        """Return the Namespace whose :attr:`id` is ``id``.

        Raises:
            UsageError: ``id`` is not canonical or a field fails validation.
        """
        parts = id.split("@") if isinstance(id, str) else []
        match = _TP_RE.fullmatch(parts[3]) if len(parts) == 4 else None
        if match is None:
            raise UsageError(f"not a namespace id (model@dtype@layout@tpRofS): {id!r}")
        return cls(parts[0], parts[1], parts[2], int(match[1]), int(match[2]))


def namespace_id(namespace: Namespace | str) -> str:
    """The id a namespace is stored under: ``namespace.id``, or the string as it is.

    Raises:
        UsageError: neither a Namespace nor a str of 1..255 UTF-8 bytes.
    """
    if isinstance(namespace, Namespace):
        return namespace.id
    _check_namespace_str(namespace)
    return namespace


def check_model(model: str) -> None:
    """Raises UsageError: ``model`` could not be a Namespace's model field."""
    _check_field("model", model)


@dataclass(frozen=True, slots=True)
class BlockKey:
    """The key a block is stored under; ``str()`` gives ``namespace/hexhash``.

    Raises:
        UsageError: ``namespace`` is not a str of 1..255 UTF-8 bytes or ``hash`` not 1..64 bytes.
    """

    namespace: str  # a Namespace.id, or any other non-empty string
    hash: bytes
    # Position in its prefix chain (0: the first block), when known: a hint that lets
    # the pool evict a chain's tail before its head. Not part of the key's identity.
    depth: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        _check_namespace_str(self.namespace)
        if not isinstance(self.hash, bytes) or len(self.hash) not in _HASH_LENGTHS:
            raise UsageError(f"BlockKey.hash must be 1..{MAX_HASH_BYTES} bytes: {self.hash!r}")
        if self.depth is not None and (type(self.depth) is not int or self.depth < 0):
            raise UsageError(f"BlockKey.depth must be None or an int >= 0: {self.depth!r}")

    def __str__(self) -> str:
        return f"{self.namespace}/{self.hash.hex()}"


def sha256_cbor(obj: object) -> bytes:
    """Return the sha256 of ``obj``'s canonical CBOR encoding (vLLM's ``sha256_cbor``).

    Raises:
        cbor2.CBOREncodeError: ``obj`` holds a type CBOR cannot encode.
    """
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def vllm_root_hash(seed: str) -> BlockHash:
    """Return vLLM's ``NONE_HASH`` for ``seed`` (its PYTHONHASHSEED): the first parent.

    Raises:
        UsageError: ``seed`` is not a str (``0`` and ``"0"`` hash differently).
    """
    if not isinstance(seed, str):
        raise UsageError(f"seed must be a str like PYTHONHASHSEED, got {seed!r}")
    return BlockHash(sha256_cbor(seed))


def vllm_block_hash(parent: bytes, token_ids: Sequence[int], extra_keys: ExtraKeys = None) -> BlockHash:
    """Return vLLM's block hash, ``sha256_cbor((parent, tuple(token_ids), extra_keys))``.

    Raises:
        cbor2.CBOREncodeError: a token (vLLM hashes Python ints) or extra key CBOR cannot encode.
    """
    return BlockHash(sha256_cbor((parent, tuple(token_ids), extra_keys)))


def sglang_page_hash(token_ids: Sequence[int], prior: bytes | None) -> BlockHash:
    """Return SGLang HiCache's ``get_hash_str`` as bytes: the sha256 of ``prior`` (the
    previous page's digest, None for a first page) then each token as uint32 little-endian.

    Raises:
        UsageError: a token id is not an int in range.
    """
    return BlockHash(hashlib.sha256((prior or b"") + _pack_tokens(token_ids)).digest())


def _pack_tokens(token_ids: Sequence[int]) -> bytes:
    try:
        return struct.pack(f"<{len(token_ids)}I", *token_ids)
    except struct.error as exc:
        raise UsageError(f"token ids must be ints in [0, 2**32): {exc}") from exc


class BlockKeyBuilder:
    """Turns a token sequence into the chained hashes and keys of its full blocks.

    Args:
        namespace: the namespace of every key, as a Namespace or an id string.
        block_size: tokens per block (vLLM block size, SGLang page size).
        seed: vLLM's PYTHONHASHSEED; the sglang scheme has none, so only "0".
        scheme: which engine's hash scheme to reproduce.

    Raises:
        UsageError: an argument is invalid (for sglang, any seed but "0" too).
    """

    __slots__ = ("_namespace", "_block_size", "_scheme", "_root")

    def __init__(self, namespace: Namespace | str, block_size: int, seed: str = "0", scheme: Scheme = "vllm") -> None:
        ns = namespace.id if isinstance(namespace, Namespace) else namespace
        _check_namespace_str(ns)
        if type(block_size) is not int or block_size < 1:
            raise UsageError(f"block_size must be a positive int, got {block_size!r}")
        if scheme not in ("vllm", "sglang"):
            raise UsageError(f"scheme must be 'vllm' or 'sglang', got {scheme!r}")
        # Ignoring a seed silently would let a caller believe it isolates them.
        if scheme == "sglang" and seed != "0":
            raise UsageError("the sglang scheme has no seed; leave it at its default")
        self._namespace: str = ns
        self._block_size: int = block_size
        self._scheme: Scheme = scheme
        # SGLang's first page has no prior; b"" hashes the same as none.
        self._root: bytes = vllm_root_hash(seed) if scheme == "vllm" else b""

    @property
    def root(self) -> BlockHash | None:
        """The first block's parent: vLLM's NONE_HASH, or None for sglang."""
        return BlockHash(self._root) if self._root else None

    def hashes(
        self, token_ids: Sequence[int], parent: bytes | None = None, extra_keys: Sequence[ExtraKeys] | None = None
    ) -> list[BlockHash]:
        """Return the chained hashes of the full blocks of ``token_ids`` (a trailing
        partial block gets none: engines cache only full blocks).

        Args:
            token_ids: the tokens, starting at a block boundary.
            parent: hash of the block before ``token_ids[0]``; None chains from root.
            extra_keys: vllm only: one entry per block; an entry for a trailing
                partial block is allowed and ignored.

        Raises:
            UsageError: a bad ``parent``; ``extra_keys`` of the wrong length or
                given to the sglang scheme; a token the scheme cannot encode.
        """
        bs = self._block_size
        n_full = len(token_ids) // bs
        n_any = -(-len(token_ids) // bs)  # ceil: counts a trailing partial block
        if parent is not None and not (isinstance(parent, bytes) and len(parent) in _HASH_LENGTHS):
            raise UsageError(f"parent must be None or 1..{MAX_HASH_BYTES} bytes: {parent!r}")
        if extra_keys is not None and len(extra_keys) not in (n_full, n_any):
            raise UsageError(f"extra_keys has {len(extra_keys)} entries for {n_full} full blocks")
        sglang = self._scheme == "sglang"
        if sglang and extra_keys is not None and any(e is not None for e in extra_keys):
            raise UsageError("the sglang scheme has no extra keys")
        prev: bytes = parent if parent is not None else self._root
        out: list[BlockHash] = []
        try:
            for i in range(n_full):
                block = token_ids[i * bs : (i + 1) * bs]
                if sglang:
                    prev = sglang_page_hash(block, prev)
                else:
                    extra = extra_keys[i] if extra_keys is not None else None
                    prev = vllm_block_hash(prev, block, extra)
                out.append(prev)
        except cbor2.CBOREncodeError as exc:
            # Typically numpy or torch scalars: vLLM hashes Python ints.
            raise UsageError(f"cannot hash block {len(out)}: {exc}") from exc
        return out

    def keys(
        self,
        token_ids: Sequence[int],
        parent: bytes | None = None,
        extra_keys: Sequence[ExtraKeys] | None = None,
        first_depth: int | None = None,
    ) -> list[BlockKey]:
        """Return :meth:`hashes` as BlockKeys in this builder's namespace (same Raises).

        Each key carries its depth in the chain: from 0 without ``parent``, from
        ``first_depth`` with one (unknown, None, if that is not given).
        """
        ns = self._namespace
        start = 0 if parent is None else first_depth
        hashes = self.hashes(token_ids, parent, extra_keys)
        return [BlockKey(ns, h, None if start is None else start + i) for i, h in enumerate(hashes)]
