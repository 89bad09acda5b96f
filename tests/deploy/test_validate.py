"""The chart and manifests pass deploy/validate.sh, and its checks catch what they claim to."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.deploy.chart import CHART, ENV, ROOT, container, daemon_config, env_of, find, helm_binary, render, run


@pytest.fixture(scope="module", autouse=True)
def helm() -> str:
    """The pinned helm binary; the Python tools deploy/check_manifests.py needs, for every test here."""
    return helm_binary()


def test_validate_script_passes(helm: str) -> None:
    result = run("bash", "deploy/validate.sh", timeout=110)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "== ok" in result.stdout
    # Every example values file was rendered and checked against every version.
    for values in CHART.glob("ci/*-values.yaml"):
        assert f"ok   build/validate/{values.name.removesuffix('-values.yaml')}.yaml" in result.stdout


def check(tmp_path: Path, manifest: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "objects.yaml"
    path.write_text(textwrap.dedent(manifest))
    return run(sys.executable, "deploy/check_manifests.py", "--kube-versions", "1.28-1.29", path)


@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        pytest.param(
            """
            apiVersion: v1
            kind: Service
            metadata: {name: s}
            spec: {ports: [{port: 1, nodePortt: 2}]}
            """,
            "'nodePortt' was unexpected",
            id="unknown-field",
        ),
        pytest.param(
            """
            apiVersion: policy/v1beta1
            kind: PodDisruptionBudget
            metadata: {name: p}
            spec: {maxUnavailable: 1}
            """,
            "unknown apiVersion/kind",
            id="removed-api-version",
        ),
        pytest.param(
            """
            apiVersion: monitoring.coreos.com/v1
            kind: ServiceMonitor
            metadata: {name: m}
            spec: {selector: {}, endpoints: [{port: metrics, intervall: 5s}]}
            """,
            "'intervall' was unexpected",
            id="crd-field",
        ),
        pytest.param(
            """
            apiVersion: v1
            kind: ConfigMap
            metadata: {name: kvpool}
            data:
              kvpool.yaml: |
                dram_capacity: 1GiB
                slab_sise: 16MiB
            """,
            "unknown key 'slab_sise'",
            id="daemon-config-key",
        ),
        pytest.param(
            """
            apiVersion: v1
            kind: ConfigMap
            metadata: {name: dashboard}
            data:
              kvpool.json: '{"panels": [{"targets": [{"expr": "rate(kvpool_made_up_total[5m])"}]}]}'
            """,
            "kvpool_made_up is not defined",
            id="dashboard-metric",
        ),
    ],
)
def test_check_manifests_rejects(tmp_path: Path, manifest: str, expected: str) -> None:
    result = check(tmp_path, manifest)
    assert result.returncode == 1, result.stdout
    assert expected in result.stdout


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"config.host": "127.0.0.1"}, "config"),  # the chart owns the bind address
        ({"etcd.enabled": "false"}, "externalEtcd.endpoints"),  # no etcd at all
        ({"etcd.replicaCount": "2"}, "replicaCount"),  # no majority with 2
        ({"ssd.volume.type": "nfs"}, "ssd.volume.type"),
    ],
)
def test_values_schema_rejects(helm: str, values: dict[str, str], expected: str) -> None:
    sets = ",".join(f"{k}={v}" for k, v in values.items())
    result = run(helm, "template", "kvpool", CHART, "--set", sets)
    assert result.returncode != 0
    assert expected in result.stderr


def test_grace_period_fits_drain_and_shutdown(helm: str) -> None:
    result = run(
        helm,
        "template",
        "kvpool",
        CHART,
        "--set",
        "drain.timeoutSeconds=300,config.shutdown_grace_s=15,ssd.enabled=true,ssd.shutdownFlushSeconds=40",
    )
    assert result.returncode == 0, result.stderr
    # 300 (drain) + 15 (daemon grace) + 40 (SSD flush) + 10 (margin).
    assert "terminationGracePeriodSeconds: 365" in result.stdout
    assert "--wait --wait-timeout 300" in result.stdout


# -- security: the chart wires the Secret's files into the daemon, its probes and its clients --

SECURE = (
    "secrets.existingSecret=kvpool-tls,security.token=true,security.tls.enabled=true,"
    "security.tls.clientAuth=true,security.tls.dataPlane=true"
)


def test_security_values_reach_the_daemon_config_probes_and_clients(helm: str) -> None:
    objects = render(helm, "-f", CHART / "ci/security-values.yaml")
    secrets, etcd = "/etc/kvpool/secrets", "/etc/kvpool/etcd"
    expected = {
        "auth_token_file": f"{secrets}/token",
        "tls_cert_file": f"{secrets}/tls.crt",
        "tls_key_file": f"{secrets}/tls.key",
        "tls_client_ca_file": f"{secrets}/ca.crt",
        "data_tls": True,
        "etcd_ca_file": f"{etcd}/ca.crt",
        "etcd_cert_file": f"{etcd}/tls.crt",
        "etcd_key_file": f"{etcd}/tls.key",
    }
    config = daemon_config(objects)
    assert {key: config.get(key) for key in expected} == expected
    daemon = container(objects)
    env = env_of(daemon)
    # kvpoolctl (preStop drain) and the daemon's own hand-offs read the client-side variables.
    assert env["KVPOOL_TLS_CA_FILE"] == f"{secrets}/ca.crt"
    assert env["KVPOOL_TLS_CLIENT_CERT_FILE"] == f"{secrets}/tls.crt"
    assert env["KVPOOL_AUTH_TOKEN_FILE"] == f"{secrets}/token"
    assert env["KVPOOL_ETCD_CERT_FILE"] == f"{etcd}/tls.crt"
    assert "KVPOOL_ADVERTISE_HOST" not in env and "POD_IP" in env
    assert "kvpool.kvpool.svc.cluster.local" in daemon["command"][-1]
    mounts = {m["mountPath"] for m in daemon["volumeMounts"]}
    assert {secrets, etcd, "/etc/kvpool/probe.py"} <= mounts
    # gRPC probes cannot do TLS: exec probes run the ConfigMap's script, with the client certificate.
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        command = daemon[probe]["exec"]["command"]
        assert command[:2] == ["python3", "/etc/kvpool/probe.py"] and f"{secrets}/tls.crt" in command, probe
    assert daemon["readinessProbe"]["exec"]["command"][-2:] == ["--service", "kvpool.v1.KVPool"]
    assert "probe.py" in find(objects, "ConfigMap")["data"]
    assert find(objects, "Service")["spec"]["publishNotReadyAddresses"] is True
    test_pod = next(o for o in objects if o["kind"] == "Pod")
    assert env_of(test_pod["spec"]["containers"][0])["KVPOOL_ETCD_CA_FILE"] == f"{etcd}/ca.crt"


def test_token_alone_keeps_grpc_probes(helm: str) -> None:
    objects = render(helm, "--set", "secrets.existingSecret=kvpool-tls,security.token=true")
    config = daemon_config(objects)
    assert config["auth_token_file"] == "/etc/kvpool/secrets/token"
    assert not {"tls_cert_file", "data_tls", "etcd_ca_file"} & config.keys()
    daemon = container(objects)
    assert daemon["readinessProbe"]["grpc"]["service"] == "kvpool.v1.KVPool"  # the health service needs no token
    assert "command" not in daemon and "KVPOOL_ADVERTISE_HOST" in env_of(daemon)


def test_defaults_set_the_token_only(helm: str) -> None:
    config = daemon_config(render(helm))
    assert config["auth_token_file"] == "/etc/kvpool/secrets/token"
    assert not {"tls_cert_file", "data_tls", "etcd_ca_file"} & config.keys()


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            "secrets.existingSecret=s,security.tls.dataPlane=true",
            "security.tls.dataPlane=true needs security.tls.enabled=true",
        ),
        (
            "secrets.existingSecret=s,security.tls.clientAuth=true",
            "security.tls.clientAuth=true needs security.tls.enabled=true",
        ),
        ("security.token=false,security.tls.enabled=true", "security.tls.enabled reads the kvpool Secret"),
        ("security.tls.enabled=true", "needs secrets.tls.cert, secrets.tls.key and secrets.tls.ca"),
        ("secrets.token=short", "16..1024 printable ASCII"),
        ("security.token=false,secrets.create=true,secrets.token=has space in 0123456789", "without spaces"),
        ("secrets.create=true,secrets.tls.cert=c,secrets.tls.key=k,security.tls.enabled=true", "secrets.tls.ca"),
        ("secrets.existingSecret=s,security.etcdTls.enabled=true", "needs an external etcd"),
        (
            "etcd.enabled=false,externalEtcd.endpoints={http://e:2379},secrets.existingSecret=s,security.etcdTls.enabled=true",
            "must all be https:// URLs",
        ),
        (
            "etcd.enabled=false,externalEtcd.endpoints={https://e:2379},security.token=false,security.etcdTls.enabled=true",
            "needs etcd's CA",
        ),
        (
            "etcd.enabled=false,externalEtcd.endpoints={https://e:2379},security.etcdTls.enabled=true",
            "takes etcd's CA from secrets.tls.ca",
        ),
        ("security.etcdTls.clientCert=true", "need security.etcdTls.enabled=true"),
        ("etcd.enabled=false,externalEtcd.endpoints={https://e:2379,http://f:2379}", "mix https:// and plaintext"),
        ("config.tls_cert_file=/x", "config"),  # security: owns the daemon's security settings
    ],
)
def test_inconsistent_security_values_fail(helm: str, values: str, expected: str) -> None:
    result = run(helm, "template", "kvpool", CHART, "--set", values)
    assert result.returncode != 0, result.stdout[-2000:]
    assert expected in result.stderr


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI to make certificates")
def test_rendered_security_config_and_probe_work_against_a_daemon(helm: str, tmp_path: Path) -> None:
    """The daemon starts with the rendered config (mTLS on both ports, the token), and the probe script passes."""
    from bench.harness.pki import make_ca, openssl
    from tests.support.daemon import start_daemon

    objects = render(helm, "--set", SECURE)
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    ca_cert, ca_key = make_ca(tmp_path, "ca")
    # One certificate for every daemon: the headless Service's per-pod names.
    (tmp_path / "san.ext").write_text("subjectAltName=DNS:*.kvpool.kvpool.svc.cluster.local\n")
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=kvpool",
        "-keyout",
        str(secrets / "tls.key"),
        "-out",
        str(tmp_path / "tls.csr"),
    )
    openssl(
        "x509",
        "-req",
        "-in",
        str(tmp_path / "tls.csr"),
        "-CA",
        str(ca_cert),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        str(tmp_path / "san.ext"),
        "-out",
        str(secrets / "tls.crt"),
    )
    shutil.copy(ca_cert, secrets / "ca.crt")
    (secrets / "token").write_text("0123456789abcdef0123456789abcdef\n")

    def local(text: str) -> str:
        return text.replace("/etc/kvpool/secrets", str(secrets)).replace(
            "/etc/kvpool/probe.py", str(tmp_path / "probe.py")
        )

    config_file = tmp_path / "kvpool.yaml"
    config_file.write_text(local(find(objects, "ConfigMap")["data"]["kvpool.yaml"]))
    (tmp_path / "probe.py").write_text(find(objects, "ConfigMap")["data"]["probe.py"])
    node = start_daemon(
        "--dram-capacity",
        "16MiB",
        "--slab-size",
        "1MiB",
        "--no-prefault-arena",
        "--metrics-port",
        "-1",
        env={"KVPOOL_CONFIG": str(config_file)},
    )
    try:
        daemon = container(objects)
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            command = [local(a) for a in daemon[probe]["exec"]["command"]]
            command[0] = sys.executable
            command[command.index("--port") + 1] = str(node.grpc_port)
            ok = subprocess.run(command, env={**ENV, "POD_IP": "127.0.0.1"}, capture_output=True, text=True, timeout=30)
            assert ok.returncode == 0, f"{probe}: {ok.stderr}"
        # Without the client certificate the daemon refuses the handshake (mTLS), and the probe says so.
        bare = [a for a in command if a not in (str(secrets / "tls.crt"), str(secrets / "tls.key"), "--cert", "--key")]
        refused = subprocess.run(bare, env={**ENV, "POD_IP": "127.0.0.1"}, capture_output=True, text=True, timeout=30)
        assert refused.returncode == 1 and "probe:" in refused.stderr
    finally:
        node.stop()
        node.remove_files()


# -- the UCX data plane: dataPlane.ucx renders into the daemon's config, its ports and the NetworkPolicy --


def policy_ports(objects: list[dict]) -> list[dict]:
    """The ports of the NetworkPolicy's first rule (engines and daemons: control and data planes)."""
    return find(objects, "NetworkPolicy")["spec"]["ingress"][0]["ports"]


def test_ucx_values_reach_the_daemon_config_ports_and_policy(helm: str) -> None:
    objects = render(helm, "-f", CHART / "ci/ucx-values.yaml")
    config = daemon_config(objects)
    assert {k: v for k, v in config.items() if k.startswith("ucx_")} == {
        "ucx_port": 50053,
        "ucx_tls": "tcp,sm",
        "ucx_progress_mode": "blocking",
        "ucx_net_devices": "eth0",
    }
    daemon = container(objects)
    assert {"name": "ucx", "containerPort": 50053, "protocol": "TCP"} in daemon["ports"]
    assert env_of(daemon)["UCX_TCP_PORT_RANGE"] == "50100-50163"
    # ucxx needs a writable /tmp (glibc's tmpfile()) under the read-only root.
    assert {"name": "tmp", "mountPath": "/tmp"} in daemon["volumeMounts"]
    assert {"name": "ucx", "port": 50053, "targetPort": "ucx"} in find(objects, "Service")["spec"]["ports"]
    # UCX's TCP lanes are dialled by either side, so the daemons admit the range besides the listener.
    ports = policy_ports(objects)
    assert {"port": 50053, "protocol": "TCP"} in ports
    assert {"port": 50100, "endPort": 50163, "protocol": "TCP"} in ports


def test_ucx_is_off_by_default(helm: str) -> None:
    objects = render(helm)
    assert not [k for k in daemon_config(objects) if k.startswith("ucx_")]
    daemon = container(objects)
    assert [p["name"] for p in daemon["ports"]] == ["grpc", "data", "metrics"]
    assert "UCX_TCP_PORT_RANGE" not in env_of(daemon)
    assert "/tmp" not in {m["mountPath"] for m in daemon["volumeMounts"]}
    assert [p["name"] for p in find(objects, "Service")["spec"]["ports"]] == ["grpc", "data", "metrics"]
    assert len(policy_ports(objects)) == 2


def test_gpu_values_set_ucx_through_data_plane_values(helm: str) -> None:
    """One way to set UCX: the RDMA example uses dataPlane.ucx, not UCX_* variables in extraEnv."""
    objects = render(helm, "-f", CHART / "ci/gpu-ssd-hostnetwork-values.yaml")
    config = daemon_config(objects)
    assert (config["ucx_tls"], config["ucx_net_devices"]) == ("rc,tcp,sm", "mlx5_0:1")
    env = env_of(container(objects))
    assert not {"UCX_TLS", "UCX_NET_DEVICES"} & env.keys()
    assert env["RAPIDS_LIBUCX_PREFER_SYSTEM_LIBRARY"] == "true"


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            "dataPlane.ucx.enabled=true,secrets.existingSecret=s,security.tls.enabled=true,security.tls.dataPlane=true",
            "dataPlane.ucx.enabled=true cannot be combined with security.tls.dataPlane=true: UCX has no TLS",
        ),
        (
            "dataPlane.ucx.enabled=true,dataPlane.ucx.port=50052",
            "dataPlane.ucx.port 50052: must differ from ports.data",
        ),
        ("dataPlane.ucx.enabled=true,dataPlane.ucx.tcpPortRange=9400-9500", "holds ports.metrics (9477)"),
        ("dataPlane.ucx.enabled=true,dataPlane.ucx.tcpPortRange=50053-50060", "holds dataPlane.ucx.port (50053)"),
        ("dataPlane.ucx.enabled=true,dataPlane.ucx.tcpPortRange=60000-50000", "must be FIRST-LAST"),
        ("extraEnv[0].name=UCX_TLS,extraEnv[0].value=rc", "extraEnv UCX_TLS: the chart sets it from dataPlane.ucx.tls"),
        ("extraEnv[0].name=KVPOOL_UCX_PORT,extraEnv[0].value=1", "from dataPlane.ucx.port"),
        ("dataPlane.ucx.tls={}", "dataPlane.ucx.tls"),  # schema: at least one transport
        ("dataPlane.ucx.progressMode=spin", "dataPlane.ucx.progressMode"),
        ("config.ucx_port=50053", "config"),  # dataPlane.ucx owns the daemon's ucx_* settings
    ],
)
def test_inconsistent_ucx_values_fail(helm: str, values: str, expected: str) -> None:
    result = run(helm, "template", "kvpool", CHART, "--set", values)
    assert result.returncode != 0, result.stdout[-2000:]
    assert expected in result.stderr


def test_rendered_ucx_config_starts_a_daemon_that_serves_ucx(helm: str, tmp_path: Path) -> None:
    """The daemon starts with the rendered config and environment, advertises `ucx`, and serves a client over it."""
    from kvpool_client.transport.ucx import import_error
    from tests.support.daemon import start_daemon
    from tests.support.etcd import free_port

    if (missing := import_error()) is not None:
        pytest.skip(f"ucxx cannot be imported: {missing}")
    port = free_port("0.0.0.0")  # UCX's listener binds every interface
    objects = render(
        helm,
        "-f",
        CHART / "ci/ucx-values.yaml",
        "--set",
        f"dataPlane.ucx.port={port},dataPlane.ucx.tcpPortRange={port + 1}-{port + 32},"
        # ucx_round_trip.py (the image's smoke test too) speaks to the daemon without a token.
        "dataPlane.ucx.netDevices={lo},security.token=false",
    )
    config = daemon_config(objects)
    assert config["ucx_port"] == port and config["ucx_net_devices"] == "lo"
    config_file = tmp_path / "kvpool.yaml"
    config_file.write_text(find(objects, "ConfigMap")["data"]["kvpool.yaml"])
    ucx_env = {k: v for k, v in env_of(container(objects)).items() if k.startswith("UCX_")}
    node = start_daemon(
        "--dram-capacity",
        "16MiB",
        "--slab-size",
        "1MiB",
        "--no-prefault-arena",
        "--metrics-port",
        "-1",
        env={"KVPOOL_CONFIG": str(config_file), **ucx_env},
    )
    try:
        client = subprocess.run(
            [sys.executable, ROOT / "deploy/image/ucx_round_trip.py", node.address],
            cwd=ROOT,
            env=ENV,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert client.returncode == 0, client.stderr[-3000:] + node.log()[-2000:]
        assert client.stdout.split() == [f"127.0.0.1:{port}", "ucx"]
    finally:
        node.stop()
        node.remove_files()


def test_a_tenants_secret_is_mounted_whole_and_named_in_the_daemon_config(helm: str) -> None:
    objects = render(helm, "--set", "security.tenants.existingSecret=kvpool-tenants,security.tenants.key=t.yaml")
    assert daemon_config(objects)["auth_tenants_file"] == "/etc/kvpool/tenants/t.yaml"
    daemon = container(objects)
    mount = next(m for m in daemon["volumeMounts"] if m["name"] == "tenants")
    assert mount == {"name": "tenants", "mountPath": "/etc/kvpool/tenants", "readOnly": True}, "no subPath"
    pod = find(objects, "DaemonSet")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "tenants")
    assert volume["secret"]["secretName"] == "kvpool-tenants"
    assert "auth_tenants_file" not in daemon_config(render(helm)), "no tenants unless asked"


def test_tenants_need_the_token(helm: str) -> None:
    failed = run(helm, "template", "kvpool", CHART, "--set", "security.tenants.existingSecret=t,security.token=false")
    assert failed.returncode != 0 and "security.tenants.existingSecret needs security.token=true" in failed.stderr
