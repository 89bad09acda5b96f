"""Block keys: pinned engine-compatible hashes, chaining, namespaces and validation."""

from __future__ import annotations

import dataclasses
import hashlib
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpool_client.core.errors import UsageError
from kvpool_client.core.keys import (
    BlockKey,
    BlockKeyBuilder,
    Namespace,
    sglang_page_hash,
    sha256_cbor,
    vllm_block_hash,
    vllm_root_hash,
)

# Reference values from DESIGN.md section 3, computed from vLLM's published
# sha256_cbor scheme with seed "0" (PYTHONHASHSEED=0).
VLLM_ROOT_0 = "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"
VLLM_1_16 = "202da172482d928bbc42ab25b0151e2b895f13f41002e27b2ceabcfae6d332ea"
VLLM_17_32 = "4a0a393805c6d2f0ed831000d41bb65980336c4c04895d5e26470bbec927f5bf"

# SGLang values: computed by running _sglang_get_hash_str below, a transcription of
# SGLang's published get_hash_str (sgl-project/sglang,
# python/sglang/srt/mem_cache/hicache_storage.py): sha256 over bytes.fromhex(prior)
# when prior is truthy, then t.to_bytes(4, "little", signed=False) per token; hex out.
# Tokens 1..16 with no prior, then 17..32 chained on it.
SGLANG_1_16 = "77d735ce838418aa151bd96b5b1e78ee63860892e0a95c00fe34178442be9b07"
SGLANG_17_32 = "1170426cf2449cebf4d17f087ce5bb43b6a910ce91b3f40922868e913e8ee91d"

NS = Namespace("Qwen3-0.6B", "bf16", "L24-KV2-H2-D64-T16")
FUZZ = settings(max_examples=150, deadline=timedelta(milliseconds=1000))


def _sglang_get_hash_str(token_ids: list[int], prior_hash: str | None = None) -> str:
    """SGLang's definition, kept in its own hex-in/hex-out form as an independent oracle."""
    hasher = hashlib.sha256()
    if prior_hash:
        hasher.update(bytes.fromhex(prior_hash))
    for t in token_ids:
        hasher.update(t.to_bytes(4, byteorder="little", signed=False))
    return hasher.hexdigest()


def hexes(hashes: list[bytes]) -> list[str]:
    return [h.hex() for h in hashes]


# -- strategies ---------------------------------------------------------------

tokens = st.lists(st.integers(0, 2**32 - 1), max_size=80)
block_sizes = st.integers(1, 8)
schemes = st.sampled_from(["vllm", "sglang"])
# What a Namespace field may hold: printable, no whitespace, no '@' or '/'.
fields = st.text(
    st.characters(
        exclude_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp"),
        exclude_characters="@/",
    ),
    min_size=1,
    max_size=16,
).filter(lambda s: not any(c.isspace() for c in s))


# -- vLLM scheme --------------------------------------------------------------


def test_vllm_reference_values_seed_0() -> None:
    root = vllm_root_hash("0")
    assert root.hex() == VLLM_ROOT_0, f"root: got {root.hex()}"
    first = vllm_block_hash(root, range(1, 17))
    assert first.hex() == VLLM_1_16, f"block 1..16: got {first.hex()}"
    second = vllm_block_hash(first, list(range(17, 33)), None)
    assert second.hex() == VLLM_17_32, f"block 17..32: got {second.hex()}"

    builder = BlockKeyBuilder(NS, block_size=16, seed="0")
    assert builder.root is not None and builder.root.hex() == VLLM_ROOT_0
    got = hexes(builder.hashes(list(range(1, 33))))
    assert got == [VLLM_1_16, VLLM_17_32], f"builder: got {got}"


def test_sha256_cbor_is_sha256_of_canonical_cbor() -> None:
    # Canonical CBOR of the text "0" is 0x61 0x30; the root is its sha256.
    assert sha256_cbor("0") == hashlib.sha256(b"\x61\x30").digest()
    assert sha256_cbor("0").hex() == VLLM_ROOT_0


def test_root_seed_must_be_str() -> None:
    with pytest.raises(UsageError, match="seed"):
        vllm_root_hash(0)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="seed"):
        BlockKeyBuilder(NS, 16, seed=0)  # type: ignore[arg-type]


def test_partial_block_is_not_keyed() -> None:
    builder = BlockKeyBuilder(NS, block_size=16)
    for count, want in [(0, 0), (15, 0), (16, 1), (31, 1), (32, 2), (33, 2)]:
        got = builder.hashes(list(range(1, count + 1)))
        assert len(got) == want, f"{count} tokens: got {len(got)} hashes {hexes(got)}"
    assert hexes(builder.hashes(list(range(1, 34)))) == [VLLM_1_16, VLLM_17_32]


def test_chaining_from_an_explicit_parent() -> None:
    builder = BlockKeyBuilder(NS, block_size=16)
    first = builder.hashes(list(range(1, 17)))
    got = builder.hashes(list(range(17, 33)), parent=first[0])
    assert hexes(got) == [VLLM_17_32], f"got {hexes(got)}"
    # The same tokens without the parent chain from the root: a different block.
    assert builder.hashes(list(range(17, 33)))[0].hex() != VLLM_17_32


def test_seed_changes_every_hash() -> None:
    toks = list(range(1, 33))
    a = BlockKeyBuilder(NS, 16, seed="0").hashes(toks)
    b = BlockKeyBuilder(NS, 16, seed="1").hashes(toks)
    assert all(x != y for x, y in zip(a, b, strict=True)), f"seed 0 {hexes(a)} vs seed 1 {hexes(b)}"


def test_namespace_changes_keys_not_hashes() -> None:
    toks = list(range(1, 33))
    other = Namespace("Qwen3-0.6B", "fp8", "L24-KV2-H2-D64-T16")
    a = BlockKeyBuilder(NS, 16).keys(toks)
    b = BlockKeyBuilder(other, 16).keys(toks)
    assert [k.hash for k in a] == [k.hash for k in b], "the hash must stay vLLM's own"
    assert set(a).isdisjoint(b), f"namespaces collide: {a} vs {b}"
    assert all(k.namespace == NS.id for k in a), f"got {a}"


def test_extra_keys_change_the_block_and_its_descendants() -> None:
    builder = BlockKeyBuilder(NS, 16)
    toks = list(range(1, 33))
    plain = builder.hashes(toks)
    assert builder.hashes(toks, extra_keys=[None, None]) == plain
    lora = builder.hashes(toks, extra_keys=[("lora-7",), None])
    assert lora[0] == vllm_block_hash(builder.root or b"", toks[:16], ("lora-7",))
    assert all(x != y for x, y in zip(plain, lora, strict=True)), f"{hexes(plain)} vs {hexes(lora)}"
    # An empty tuple is not None in CBOR, so it is a different block too.
    assert builder.hashes(toks, extra_keys=[(), None])[0] != plain[0]


def test_extra_keys_may_cover_the_partial_block() -> None:
    builder = BlockKeyBuilder(NS, 16)
    toks = list(range(1, 34))  # two full blocks and one token
    extra = [("salt",), None]
    assert builder.hashes(toks, extra_keys=[*extra, ("x",)]) == builder.hashes(toks, extra_keys=extra)
    for wrong in ([], [None], [None] * 4):
        with pytest.raises(UsageError, match="extra_keys"):
            builder.hashes(toks, extra_keys=wrong)


def test_non_int_tokens_are_a_usage_error() -> None:
    with pytest.raises(UsageError, match="block 1"):
        BlockKeyBuilder(NS, 2).hashes([1, 2, 3, object()])


# -- SGLang scheme ------------------------------------------------------------


def test_sglang_reference_values() -> None:
    assert _sglang_get_hash_str(list(range(1, 17))) == SGLANG_1_16
    assert _sglang_get_hash_str(list(range(17, 33)), SGLANG_1_16) == SGLANG_17_32
    first = sglang_page_hash(range(1, 17), None)
    assert first.hex() == SGLANG_1_16, f"page 1..16: got {first.hex()}"
    second = sglang_page_hash(list(range(17, 33)), first)
    assert second.hex() == SGLANG_17_32, f"page 17..32: got {second.hex()}"
    builder = BlockKeyBuilder(NS, 16, scheme="sglang")
    assert builder.root is None
    got = hexes(builder.hashes(list(range(1, 34))))
    assert got == [SGLANG_1_16, SGLANG_17_32], f"builder: got {got}"
    got = hexes(builder.hashes(list(range(17, 33)), parent=first))
    assert got == [SGLANG_17_32], f"chained: got {got}"


@pytest.mark.parametrize("bad", [-1, 2**32, 1.0])
def test_sglang_token_out_of_range(bad: object) -> None:
    with pytest.raises(UsageError, match="token"):
        BlockKeyBuilder(NS, 2, scheme="sglang").hashes([0, bad])
    with pytest.raises(UsageError, match="token"):
        sglang_page_hash([bad], None)  # type: ignore[list-item]


def test_sglang_has_no_seed_and_no_extra_keys() -> None:
    with pytest.raises(UsageError, match="seed"):
        BlockKeyBuilder(NS, 16, seed="1", scheme="sglang")
    builder = BlockKeyBuilder(NS, 16, scheme="sglang")
    with pytest.raises(UsageError, match="extra keys"):
        builder.hashes(list(range(16)), extra_keys=[("lora",)])
    assert builder.hashes(list(range(16)), extra_keys=[None]) == builder.hashes(list(range(16)))


# -- builder arguments --------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_size": 0},
        {"block_size": -16},
        {"block_size": True},
        {"block_size": 16.0},
        {"block_size": 16, "scheme": "lmcache"},
        {"block_size": 16, "namespace": ""},
        {"block_size": 16, "namespace": "x" * 256},
        {"block_size": 16, "namespace": b"ns"},
    ],
)
def test_builder_rejects_bad_arguments(kwargs: dict[str, object]) -> None:
    args = {"namespace": NS, **kwargs}
    with pytest.raises(UsageError):
        BlockKeyBuilder(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize("parent", [b"", b"x" * 65, bytearray(32), "00" * 32])
def test_builder_rejects_bad_parent(parent: object) -> None:
    with pytest.raises(UsageError, match="parent"):
        BlockKeyBuilder(NS, 4).hashes([1, 2, 3, 4], parent=parent)  # type: ignore[arg-type]


def test_builder_accepts_a_namespace_string_and_is_slotted() -> None:
    builder = BlockKeyBuilder("tenant-a/any string", 16)
    keys = builder.keys(list(range(1, 33)))
    assert [str(k) for k in keys] == [f"tenant-a/any string/{h}" for h in (VLLM_1_16, VLLM_17_32)]
    assert not hasattr(builder, "__dict__")
    with pytest.raises(AttributeError):
        builder.extra = 1  # type: ignore[attr-defined]


# -- Namespace ----------------------------------------------------------------


def test_namespace_id_and_parse() -> None:
    ns = Namespace("Qwen3-0.6B", "bf16", "L24-KV2-H2-D64-T16", tp_rank=1, tp_size=4)
    assert ns.id == "Qwen3-0.6B@bf16@L24-KV2-H2-D64-T16@tp1of4"
    assert Namespace.parse(ns.id) == ns
    assert Namespace("m", "d", "l").id == "m@d@l@tp0of1"
    assert "__slots__" in Namespace.__dict__ and "__slots__" in BlockKey.__dict__
    with pytest.raises(dataclasses.FrozenInstanceError):
        ns.model = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    "fields_",
    [
        ("", "bf16", "L"),
        ("m", "", "L"),
        ("m", "bf16", ""),
        ("a@b", "bf16", "L"),
        ("m", "bf/16", "L"),
        ("m", "bf16", "L 24"),
        ("m", "bf16", "L\t24"),
        ("m\n", "bf16", "L"),
        ("m\x00", "bf16", "L"),
        ("m\u200b", "bf16", "L"),  # zero-width space: invisible, so never in a key
        ("m\u3000", "bf16", "L"),  # ideographic space
        (5, "bf16", "L"),
    ],
)
def test_namespace_rejects_bad_fields(fields_: tuple[object, object, object]) -> None:
    with pytest.raises(UsageError, match="Namespace"):
        Namespace(*fields_)  # type: ignore[arg-type]


@pytest.mark.parametrize("rank,size", [(1, 1), (-1, 1), (0, 0), (2, 1), (True, 2), (0, 1.0), ("0", 1)])
def test_namespace_rejects_bad_tp(rank: object, size: object) -> None:
    with pytest.raises(UsageError, match="tp_rank"):
        Namespace("m", "d", "l", rank, size)  # type: ignore[arg-type]


def test_namespace_id_is_at_most_255_utf8_bytes() -> None:
    fixed = len("@d@l@tp0of1")
    assert len(Namespace("m" * (255 - fixed), "d", "l").id.encode()) == 255
    with pytest.raises(UsageError, match="255"):
        Namespace("m" * (256 - fixed), "d", "l")
    # Counted in UTF-8 bytes, not characters: 128 two-byte characters are 256 bytes.
    with pytest.raises(UsageError, match="255"):
        Namespace("é" * 128, "d", "l")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "m@d@l",
        "m@d@l@tp0of1@x",
        "m@d@l@tp0of0",
        "m@d@l@tp1of1",
        "m@d@l@tp01of2",  # leading zero: not the canonical id
        "m@d@l@tp0of01",
        "m@d@l@tp-1of2",
        "m@d@l@tp\u0661of2",  # ARABIC-INDIC DIGIT ONE is a digit to int(), not to the id
        "m@d@l@TP0OF1",
        "m@d@@tp0of1",
        "m d@d@l@tp0of1",
        None,
    ],
)
def test_namespace_parse_rejects_non_canonical(text: object) -> None:
    with pytest.raises(UsageError):
        Namespace.parse(text)  # type: ignore[arg-type]


# -- BlockKey -----------------------------------------------------------------


def test_block_key_str_equality_and_hashing() -> None:
    h = bytes.fromhex(VLLM_1_16)
    key = BlockKey(NS.id, h)
    assert str(key) == f"{NS.id}/{VLLM_1_16}"
    assert key == BlockKey(NS.id, bytes(h)) and len({key, BlockKey(NS.id, h)}) == 1
    assert BlockKey("n", b"\x00") != BlockKey("n", b"\x00\x00")
    with pytest.raises(dataclasses.FrozenInstanceError):
        key.hash = b"x"  # type: ignore[misc]


def test_block_key_limits() -> None:
    BlockKey("n" * 255, b"x" * 64)
    BlockKey("é" * 127 + "n", b"x")  # 255 UTF-8 bytes
    for namespace, digest in [
        ("", b"x"),
        ("n" * 256, b"x"),
        ("é" * 128, b"x"),
        (None, b"x"),
        ("n", b""),
        ("n", b"x" * 65),
        ("n", bytearray(b"x")),
        ("n", "x"),
    ]:
        with pytest.raises(UsageError):
            BlockKey(namespace, digest)  # type: ignore[arg-type]
            pytest.fail(f"accepted BlockKey({namespace!r}, {digest!r})")


# -- properties ---------------------------------------------------------------


@FUZZ
@given(toks=tokens, bs=block_sizes, scheme=schemes, cut=st.integers(0, 80))
def test_prefix_property(toks: list[int], bs: int, scheme: str, cut: int) -> None:
    """The keys of a prefix are a prefix of the keys: the basis of prefix lookup."""
    builder = BlockKeyBuilder(NS, bs, scheme=scheme)  # type: ignore[arg-type]
    whole = builder.keys(toks)
    part = builder.keys(toks[:cut])
    assert len(whole) == len(toks) // bs
    assert part == whole[: len(toks[:cut]) // bs], f"prefix {part} is not a prefix of {whole}"


@FUZZ
@given(toks=tokens, bs=block_sizes, scheme=schemes, blocks=st.integers(0, 10))
def test_split_and_chain_equals_whole(toks: list[int], bs: int, scheme: str, blocks: int) -> None:
    """Hashing a prefix, then the rest from its last hash, equals hashing it all."""
    builder = BlockKeyBuilder(NS, bs, scheme=scheme)  # type: ignore[arg-type]
    head, tail = toks[: blocks * bs], toks[blocks * bs :]
    first = builder.hashes(head)
    rest = builder.hashes(tail, parent=first[-1] if first else None)
    whole = builder.hashes(toks)
    assert first + rest == whole, f"split {hexes(first + rest)} vs whole {hexes(whole)}"


@FUZZ
@given(toks=tokens, bs=block_sizes, seed=st.text(max_size=8))
def test_vllm_builder_matches_the_chain_definition(toks: list[int], bs: int, seed: str) -> None:
    """Deterministic, and equal to chaining vllm_block_hash by hand from the root."""
    got = BlockKeyBuilder(NS, bs, seed=seed).hashes(toks)
    assert got == BlockKeyBuilder(NS.id, bs, seed=seed).hashes(list(toks))
    prev, want = vllm_root_hash(seed), []
    for i in range(len(toks) // bs):
        prev = vllm_block_hash(prev, toks[i * bs : (i + 1) * bs])
        want.append(prev)
    assert got == want, f"builder {hexes(got)} vs chain {hexes(want)}"
    assert all(len(h) == 32 for h in got)


@FUZZ
@given(toks=tokens, bs=block_sizes)
def test_sglang_builder_matches_sglang_definition(toks: list[int], bs: int) -> None:
    got = hexes(BlockKeyBuilder(NS, bs, scheme="sglang").hashes(toks))
    prior: str | None = None
    want = []
    for i in range(len(toks) // bs):
        prior = _sglang_get_hash_str(toks[i * bs : (i + 1) * bs], prior)
        want.append(prior)
    assert got == want, f"builder {got} vs get_hash_str {want}"


@FUZZ
@given(
    model=fields,
    dtype=fields,
    layout=fields,
    tp=st.integers(1, 1024).flatmap(lambda n: st.tuples(st.integers(0, n - 1), st.just(n))),
)
def test_namespace_parse_round_trip(model: str, dtype: str, layout: str, tp: tuple[int, int]) -> None:
    ns = Namespace(model, dtype, layout, *tp)
    back = Namespace.parse(ns.id)
    assert back == ns, f"{ns!r} -> {ns.id!r} -> {back!r}"
    assert back.id == ns.id
    assert str(BlockKey(ns.id, b"\x01")) == f"{ns.id}/01"
