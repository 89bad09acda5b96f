#!/opt/kvpool/bin/python3
"""The image's health check: ask the daemon's standard gRPC health service.

Exit 0 when the daemon answers SERVING on 127.0.0.1:$KVPOOL_GRPC_PORT within the
timeout, 1 otherwise (with the reason on stderr), as HEALTHCHECK expects.

Usage: kvpool-healthcheck [--address HOST:PORT] [--service NAME] [--timeout SECONDS]
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def main(argv: list[str] | None = None) -> int:
    port = os.environ.get("KVPOOL_GRPC_PORT", "50051")
    parser = argparse.ArgumentParser(prog="kvpool-healthcheck", description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=f"127.0.0.1:{port}", help="control address (default: %(default)s)")
    parser.add_argument("--service", default="", help="health service name; '' is the whole server")
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds to wait (default: %(default)s)")
    args = parser.parse_args(argv)
    with grpc.insecure_channel(args.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout)
        except grpc.RpcError as exc:
            print(f"kvpool-healthcheck: {args.address}: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        print(f"kvpool-healthcheck: {args.address}: {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
