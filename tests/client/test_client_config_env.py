"""Both clients take their settings from the KVPOOL_* environment unless given a ClientConfig."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpool_client import AsyncKVPoolClient, ClientConfig, KVPoolClient
from kvpool_client.core.errors import UsageError


@pytest.mark.parametrize("client_class", [KVPoolClient, AsyncKVPoolClient])
def test_a_client_without_config_reads_the_environment(
    client_class: type, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("a-token-of-at-least-sixteen-bytes\n")
    monkeypatch.setenv("KVPOOL_NODES", "10.0.0.5:7700,10.0.0.6:7700")
    monkeypatch.setenv("KVPOOL_AUTH_TOKEN_FILE", str(token))
    monkeypatch.setenv("KVPOOL_REQUEST_TIMEOUT_S", "4")
    client = client_class()
    assert client.config.nodes == ("10.0.0.5:7700", "10.0.0.6:7700")
    assert client.config.auth_token == b"a-token-of-at-least-sixteen-bytes"
    assert client.config.request_timeout_s == 4.0
    explicit = client_class(["127.0.0.1:1"])
    assert explicit.config.nodes == ("127.0.0.1:1",), "nodes given replace KVPOOL_NODES"
    assert explicit.config.auth_token == b"a-token-of-at-least-sixteen-bytes", (
        "the rest still comes from the environment"
    )
    given = client_class(config=ClientConfig(nodes=("127.0.0.1:2",)))
    assert given.config.auth_token is None, "a ClientConfig is taken as it is"


def test_no_nodes_anywhere_says_where_to_put_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVPOOL_NODES", raising=False)
    monkeypatch.delenv("KVPOOL_ETCD_ENDPOINTS", raising=False)
    with pytest.raises(UsageError, match="KVPOOL_NODES"):
        KVPoolClient()
