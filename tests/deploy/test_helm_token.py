"""The chart's token: generated at install, kept across upgrades, read by the daemons and their clients.

`lookup`, which keeps the token on upgrade, needs a cluster: these tests run it through
`helm template --dry-run=server` against a stand-in API server on 127.0.0.1 (tests/deploy/apiserver.py)
that serves the Secret an earlier install left.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
import yaml

from tests.deploy.apiserver import serving
from tests.deploy.chart import (
    CHART,
    ROOT,
    container,
    daemon_config,
    env_of,
    find,
    helm_binary,
    render,
    render_notes,
    run,
)

SECRET = "kvpool-secrets"  # the chart's Secret for release kvpool: <fullname>-secrets
GENERATED = re.compile(r"[A-Za-z0-9]{48}")
TOKEN_FILE = "/etc/kvpool/secrets/token"


@pytest.fixture(scope="module")
def helm() -> str:
    return helm_binary()


def token_of(objects: list[dict]) -> str:
    return base64.b64decode(find(objects, "Secret", SECRET)["data"]["token"]).decode()


def pod_spec(objects: list[dict], kind: str) -> dict:
    obj = next(o for o in objects if o["kind"] == kind)
    return obj["spec"] if kind == "Pod" else obj["spec"]["template"]["spec"]


def secret_volume(spec: dict) -> str | None:
    """The Secret a pod mounts at /etc/kvpool/secrets (None: nothing there)."""
    mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0].get("volumeMounts", [])}
    name = mounts.get("/etc/kvpool/secrets")
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    return volumes[name]["secret"]["secretName"] if name else None


def test_a_default_install_generates_a_token_that_the_daemons_and_helm_test_read(helm: str) -> None:
    objects = render(helm)
    secret = find(objects, "Secret", SECRET)
    assert GENERATED.fullmatch(token_of(objects)), secret["data"]
    # helm uninstall leaves it, so a reinstall finds it (the upgrade path below) and keeps the token.
    assert secret["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert daemon_config(objects)["auth_token_file"] == TOKEN_FILE
    for kind in ("DaemonSet", "Pod"):  # the daemons (and their preStop kvpoolctl), and `helm test`
        spec = pod_spec(objects, kind)
        assert secret_volume(spec) == SECRET, kind
        assert env_of(spec["containers"][0])["KVPOOL_AUTH_TOKEN_FILE"] == TOKEN_FILE, kind


def test_each_render_without_a_cluster_draws_a_new_token(helm: str) -> None:
    first, second = token_of(render(helm)), token_of(render(helm))
    assert GENERATED.fullmatch(first) and GENERATED.fullmatch(second)
    assert first != second


def lookup_render(
    helm: str, tmp_path: Path, served: dict[str, bytes] | None, *args: str
) -> tuple[list[dict], list[str]]:
    """Render against a stand-in cluster holding ``served`` as the Secret's data (None: no Secret)."""
    secrets = {}
    if served is not None:
        data = {key: base64.b64encode(value).decode() for key, value in served.items()}
        secrets[("kvpool", SECRET)] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "data": data,
            "metadata": {"name": SECRET, "namespace": "kvpool"},
        }
    with serving(secrets) as api:
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
        objects = render(helm, "--dry-run=server", *args, env={"KUBECONFIG": str(kubeconfig)})
    return objects, api.requests


def test_an_upgrade_keeps_the_token_of_the_secret_in_the_cluster(helm: str, tmp_path: Path) -> None:
    kept = "a-token-from-the-first-install-0123456789"
    objects, requests = lookup_render(helm, tmp_path, {"token": kept.encode()})
    assert token_of(objects) == kept
    assert f"/api/v1/namespaces/kvpool/secrets/{SECRET}" in requests, requests
    assert daemon_config(objects)["auth_token_file"] == TOKEN_FILE


@pytest.mark.parametrize(
    "served",
    [None, {"tls.crt": b"-----BEGIN CERTIFICATE-----"}],
    ids=["no Secret yet", "a Secret without a token"],  # the latter: made with security.token=false
)
def test_without_a_token_in_the_cluster_the_chart_draws_one(helm: str, tmp_path: Path, served: dict | None) -> None:
    objects, requests = lookup_render(helm, tmp_path, served)
    assert GENERATED.fullmatch(token_of(objects))
    assert f"/api/v1/namespaces/kvpool/secrets/{SECRET}" in requests, requests


def test_a_token_in_the_values_wins_over_the_cluster(helm: str, tmp_path: Path) -> None:
    given = "0123456789abcdef0123456789abcdef"
    objects, _ = lookup_render(
        helm, tmp_path, {"token": b"the-one-in-the-cluster-0123456789"}, "--set", f"secrets.token={given}"
    )
    assert token_of(objects) == given


def test_the_notes_say_where_the_generated_token_is(helm: str, tmp_path: Path) -> None:
    notes = render_notes(helm, tmp_path)
    assert f"kubectl -n kvpool get secret {SECRET} -o jsonpath='{{.data.token}}' | base64 -d" in notes, notes
    assert f"KVPOOL_AUTH_TOKEN_FILE={TOKEN_FILE}" in notes
    assert "WARNING" not in notes


def test_opting_out_renders_no_token_and_warns_loudly(helm: str, tmp_path: Path) -> None:
    objects = render(helm, "--set", "security.token=false")
    assert not [o for o in objects if o["kind"] == "Secret"]
    assert "auth_token_file" not in daemon_config(objects)
    spec = pod_spec(objects, "DaemonSet")
    assert secret_volume(spec) is None and "KVPOOL_AUTH_TOKEN_FILE" not in env_of(container(objects))
    notes = render_notes(helm, tmp_path, "--set", "security.token=false")
    assert (
        "WARNING: security.token=false: the daemons take every data connection and gRPC call without a token." in notes
    ), notes
    assert "only the NetworkPolicy limits who reaches them" in notes
    open_notes = render_notes(helm, tmp_path, "--set", "security.token=false,networkPolicy.enabled=false")
    assert "nothing limits who reaches them" in open_notes, open_notes


def test_a_token_can_reach_the_engines_before_the_daemons_require_it(helm: str, tmp_path: Path) -> None:
    """Turning the token on in a running cluster: secrets.create first (a token, not required), then the default."""
    staged = ("--set", "security.token=false,secrets.create=true")
    objects = render(helm, *staged)
    token = token_of(objects)
    assert GENERATED.fullmatch(token) and "auth_token_file" not in daemon_config(objects)
    assert secret_volume(pod_spec(objects, "DaemonSet")) == SECRET
    assert f"The Secret {SECRET} holds a token already" in render_notes(helm, tmp_path, *staged)
    upgraded, _ = lookup_render(helm, tmp_path, {"token": token.encode()})
    assert token_of(upgraded) == token and daemon_config(upgraded)["auth_token_file"] == TOKEN_FILE


def test_an_existing_secret_is_mounted_as_is(helm: str, tmp_path: Path) -> None:
    objects = render(helm, "--set", "secrets.existingSecret=mine")
    assert not [o for o in objects if o["kind"] == "Secret"]
    assert secret_volume(pod_spec(objects, "DaemonSet")) == "mine"
    assert daemon_config(objects)["auth_token_file"] == TOKEN_FILE
    assert "was generated" not in render_notes(helm, tmp_path, "--set", "secrets.existingSecret=mine")


def test_the_plain_manifests_read_a_secret_that_the_user_creates() -> None:
    """deploy/k8s/ holds no token (a random one would differ at every rendering): the header says how to make it."""
    text = (ROOT / "deploy/k8s/kvpool.yaml").read_text()
    objects = [doc for doc in yaml.safe_load_all(text) if doc]
    assert not [o for o in objects if o["kind"] == "Secret"]
    assert secret_volume(pod_spec(objects, "DaemonSet")) == SECRET
    assert daemon_config(objects)["auth_token_file"] == TOKEN_FILE
    assert (
        f'#   kubectl -n kvpool create secret generic {SECRET} --from-literal=token="$(openssl rand -hex 32)"' in text
    )


def test_a_daemon_on_the_rendered_config_admits_only_clients_with_the_generated_token(
    helm: str, tmp_path: Path
) -> None:
    """The Secret's token, at the paths the chart gives the daemon and its clients, is one the daemon accepts."""
    from kvpool_client import BlockKey, ClientConfig, KVPoolClient
    from kvpool_client.core.errors import AuthenticationError, ErrorCode
    from tests.support.daemon import start_daemon

    objects = render(helm)
    (tmp_path / "token").write_text(token_of(objects))
    (tmp_path / "token").chmod(0o600)
    local = {TOKEN_FILE: str(tmp_path / "token")}
    config = {k: local.get(v, v) if isinstance(v, str) else v for k, v in daemon_config(objects).items()}
    (tmp_path / "kvpool.yaml").write_text(yaml.safe_dump(config))
    node = start_daemon(
        "--dram-capacity",
        "16MiB",
        "--slab-size",
        "1MiB",
        "--no-prefault-arena",
        "--metrics-port",
        "-1",
        "--shm-dir",
        str(tmp_path),
        env={"KVPOOL_CONFIG": str(tmp_path / "kvpool.yaml")},
    )
    try:
        env = {k: local.get(v, v) for k, v in env_of(container(objects)).items() if k == "KVPOOL_AUTH_TOKEN_FILE"}
        key = [BlockKey("chart@test", b"k")]
        with KVPoolClient(config=ClientConfig.from_env({**env, "KVPOOL_NODES": node.address})) as pool:
            assert pool.put(key, [b"x" * 4096]).statuses == (ErrorCode.OK,), node.log()[-2000:]
        with KVPoolClient(config=ClientConfig(nodes=(node.address,))) as pool, pytest.raises(AuthenticationError):
            pool.stats(node.address)
    finally:
        node.stop()
        node.remove_files()


def test_helm_lint_passes_with_the_token_off_and_on(helm: str) -> None:
    for values in ("security.token=false", "security.token=true"):
        result = run(helm, "lint", "--strict", "--quiet", CHART, "--set", values)
        assert result.returncode == 0, result.stdout + result.stderr
