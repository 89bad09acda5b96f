"""LMCache chunk keys as pool keys: the encoding docs/lmcache.md states, exactly."""

from __future__ import annotations

import pytest
import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryFormat

from kvpool_client.core.errors import UsageError
from kvpool_client.integrations.lmcache.keys import ChunkFormat, ChunkKeys, chunk_hash_bytes

QWEN = ChunkFormat.of(MemoryFormat.KV_2LTD, 256, [torch.Size([2, 24, 256, 128])], [torch.bfloat16])


def key(
    chunk_hash: int,
    model: str = "Qwen/Qwen2.5-0.5B",
    worker: int = 0,
    world: int = 1,
    configs: dict[str, str] | None = None,
) -> CacheEngineKey:
    return CacheEngineKey(model, world, worker, chunk_hash, torch.bfloat16, configs)


def test_a_chunk_key_maps_to_the_documented_namespace_and_hash() -> None:
    mapped = ChunkKeys(QWEN, None).key(key(0x1234, worker=1, world=2))
    assert mapped.namespace == "Qwen--Qwen2.5-0.5B@bf16@lmcache-KV_2LTD-T256-2x24x256x128@tp1of2"
    assert mapped.hash == bytes.fromhex("000000000000001234")


@pytest.mark.parametrize(
    ("chunk_hash", "encoded"),
    [
        (0, "000000000000000000"),
        (-1, "ffffffffffffffffff"),
        (2**64 - 1, "00ffffffffffffffff"),
        (-(2**63), "ff8000000000000000"),
    ],
)
def test_signed_and_unsigned_64_bit_hashes_stay_apart(chunk_hash: int, encoded: str) -> None:
    assert chunk_hash_bytes(chunk_hash).hex() == encoded


def test_tags_are_part_of_the_key_and_a_foreign_hash_is_refused() -> None:
    keys = ChunkKeys(QWEN, None)
    plain = keys.key(key(7))
    tagged = keys.key(key(7, configs={"lmcache.tag.user": "alice"}))
    other = keys.key(key(7, configs={"lmcache.tag.user": "bob"}))
    assert tagged.hash[:9] == plain.hash and len(tagged.hash) == 41
    assert len({plain, tagged, other}) == 3
    with pytest.raises(ValueError):
        chunk_hash_bytes(2**80)


def test_model_id_and_formats_decide_the_namespace() -> None:
    assert ChunkKeys(QWEN, "qwen-prod").namespace(key(1)).startswith("qwen-prod@bf16@")
    mla = ChunkFormat.of(MemoryFormat.KV_MLA_FMT, 256, [torch.Size([1, 61, 256, 576])], [torch.bfloat16])
    assert ChunkKeys(mla, None).namespace(key(1)).split("@")[2] == "lmcache-KV_MLA_FMT-T256-1x61x256x576"
    with pytest.raises(UsageError):
        ChunkKeys(QWEN, None).namespace(key(1, worker=1, world=1))
