"""The integrations' pool settings: what an engine's extra config accepts, and errors that name the setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpool_client.core.errors import UsageError
from kvpool_client.integrations.namespaces import model_field
from kvpool_client.integrations.settings import PoolSettings

SOURCE = "kv_connector_extra_config"


def test_pool_settings_come_from_the_extra_config_then_the_environment() -> None:
    settings = PoolSettings.parse(
        {"nodes": "10.0.0.5:7700,10.0.0.6:7700", "replicas": 2, "model_id": "qwen"},
        SOURCE,
        env={"KVPOOL_REQUEST_TIMEOUT_S": "4"},
    )
    assert settings.client.nodes == ("10.0.0.5:7700", "10.0.0.6:7700")
    assert (settings.client.replicas, settings.client.request_timeout_s, settings.model_id) == (2, 4.0, "qwen")
    assert PoolSettings.parse({}, SOURCE, env={"KVPOOL_NODES": "127.0.0.1:1"}).client.nodes == ("127.0.0.1:1",)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"node": "127.0.0.1:1"}, "unknown key 'node' (did you mean 'nodes'?)"),
        ({"zzz": 1, "nodes": "127.0.0.1:1"}, "unknown key 'zzz'; known: nodes"),
        ({}, "kv_connector_extra_config: no kvpool nodes given"),
        (
            {"nodes": "127.0.0.1:1", "transport": "pigeon"},
            "kv_connector_extra_config: transport='pigeon': must be one of auto, tcp, shm, ucx, nixl",
        ),
        ({"nodes": "127.0.0.1:1", "lookup_threads": 0}, "kv_connector_extra_config: lookup_threads=0: must be >= 1"),
        (
            {"nodes": "127.0.0.1:1", "lookup_threads": "many"},
            "kv_connector_extra_config: lookup_threads='many': not an integer",
        ),
        ({"nodes": "127.0.0.1:1", "model_id": ""}, "kv_connector_extra_config: model_id='': must not be empty"),
        (
            {"nodes": "127.0.0.1:1", "replicas": 2, "write_quorum": 3},
            "kv_connector_extra_config: write_quorum (3) cannot exceed replicas (2)",
        ),
        (
            {"nodes": "127.0.0.1:1", "auth_token_file": "/no/such/token"},
            "kv_connector_extra_config: cannot read the token",
        ),
    ],
)
def test_a_bad_setting_is_refused_with_its_name(extra: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        PoolSettings.parse(extra, SOURCE, env={})
    assert message in str(caught.value), str(caught.value)


def test_the_token_file_is_read(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token-of-32-characters-xx\n")
    settings = PoolSettings.parse({"nodes": "127.0.0.1:1", "auth_token_file": str(token)}, SOURCE, env={})
    assert settings.client.auth_token == b"s3cret-token-of-32-characters-xx"


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen--Qwen2.5-0.5B-Instruct"),
        ("meta llama@v2", "meta_llama_v2"),
    ],
)
def test_a_hub_name_becomes_a_namespace_field(model: str, field: str) -> None:
    assert model_field(model) == field


def test_a_local_checkpoint_is_its_folder_name_and_a_digest_of_its_whole_path(tmp_path: Path) -> None:
    run42, run43 = tmp_path / "run42" / "hf", tmp_path / "run43" / "hf"
    fields = {model_field(str(run42)), model_field(str(run43) + "/"), model_field(str(run42 / ".." / "hf"))}
    assert len(fields) == 2, f"two checkpoints named hf must not share blocks: {fields}"
    assert all(f.startswith("hf-") and len(f) == len("hf-") + 10 for f in fields), fields
    assert model_field("./local model@v2").startswith("local_model_v2-")


def test_engine_keys_can_be_left_to_the_engine() -> None:
    settings = PoolSettings.parse({"nodes": "127.0.0.1:1", "locality": "local"}, SOURCE, env={}, ignore=("locality",))
    assert settings.client.nodes == ("127.0.0.1:1",)


def test_values_are_typed_by_the_shared_declarations_and_the_environment_is_named() -> None:
    settings = PoolSettings.parse(
        {"nodes": ["127.0.0.1:1", "127.0.0.1:2"], "replicas": "2", "verify_checksums": "yes", "request_timeout_s": 4},
        SOURCE,
        env={"KVPOOL_LOCATION_TTL_S": "0"},
    )
    client = settings.client
    assert client.nodes == ("127.0.0.1:1", "127.0.0.1:2") and client.replicas == 2 and client.verify_checksums is True
    assert (client.request_timeout_s, client.location_ttl_s) == (4.0, 0.0)
    with pytest.raises(UsageError) as caught:
        PoolSettings.parse({"nodes": "127.0.0.1:1"}, SOURCE, env={"KVPOOL_TRANSPORT": "pigeon"})
    assert str(caught.value) == "KVPOOL_TRANSPORT='pigeon': must be one of auto, tcp, shm, ucx, nixl", (
        "the variable is at fault"
    )
