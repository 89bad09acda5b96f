"""Kubernetes exec probe: the daemon's gRPC health service, over TLS.

Kubernetes' own gRPC probes cannot do TLS. This asks the standard health service
on 127.0.0.1:PORT, verifying the daemon's certificate with the CA, under the name
the daemon advertises: <POD_IP with dashes>.<suffix> (the certificate carries
*.<suffix>). With mTLS it presents a client certificate. The health service needs
no token. Exit 0 when the service is SERVING, 1 otherwise (the reason on stderr).

Usage: python3 probe.py --port 50051 --ca CA.crt (--server-name-suffix SUFFIX | --server-name NAME)
                        [--cert tls.crt --key tls.key] [--service NAME] [--timeout SECONDS]
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def server_name(args: argparse.Namespace) -> str:
    """The name to verify: --server-name, or this pod's DNS name from $POD_IP and --server-name-suffix."""
    if args.server_name:
        return args.server_name
    pod_ip = os.environ.get("POD_IP", "")
    if not pod_ip:
        raise SystemExit("probe: POD_IP is not set (needed with --server-name-suffix)")
    return pod_ip.replace(".", "-").replace(":", "-") + "." + args.server_name_suffix


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="probe.py", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to dial (default: %(default)s)")
    parser.add_argument("--port", type=int, required=True, help="the daemon's gRPC port")
    parser.add_argument("--ca", required=True, help="PEM CA that issued the daemon's certificate")
    parser.add_argument("--cert", default="", help="PEM client certificate, for mTLS")
    parser.add_argument("--key", default="", help="PEM key of --cert")
    names = parser.add_mutually_exclusive_group(required=True)
    names.add_argument("--server-name", default="", help="the name the daemon's certificate must carry")
    names.add_argument("--server-name-suffix", default="", help="verify <POD_IP with dashes>.SUFFIX")
    parser.add_argument("--service", default="", help="health service name; '' is the whole server")
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds to wait (default: %(default)s)")
    args = parser.parse_args(argv)
    name = server_name(args)
    try:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=read(args.ca),
            private_key=read(args.key) if args.key else None,
            certificate_chain=read(args.cert) if args.cert else None,
        )
    except OSError as exc:
        print(f"probe: cannot read the TLS files: {exc}", file=sys.stderr)
        return 1
    address = f"{args.host}:{args.port}"
    options = [("grpc.ssl_target_name_override", name), ("grpc.default_authority", name)]
    with grpc.secure_channel(address, credentials, options=options) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout
            )
        except grpc.RpcError as exc:
            print(f"probe: {address} as {name}: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        print(f"probe: {address} {args.service or '(server)'}: {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
