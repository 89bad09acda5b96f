"""A stand-in Kubernetes API server on 127.0.0.1, enough for the chart's `lookup` of its Secret.

`helm template --dry-run=server` runs the chart's `lookup` calls against the cluster of its
kubeconfig: helm asks the discovery document of the core group (``GET /api/v1``) once, then
``GET /api/v1/namespaces/<ns>/secrets/<name>`` per lookup. This server answers those two from
a dict of Secrets and 404 for anything else, and records every path, so a test can run the
chart's real upgrade path (a Secret already in the cluster) with helm's own client code. It is
not a cluster: no other resource, no auth, no watch.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_CORE_V1 = {
    "kind": "APIResourceList",
    "groupVersion": "v1",
    "resources": [
        {"name": "secrets", "singularName": "secret", "namespaced": True, "kind": "Secret", "verbs": ["get", "list"]}
    ],
}
_NOT_FOUND = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}


@dataclass
class ApiServer:
    """What the stand-in serves and what it was asked (paths without the query string)."""

    secrets: dict[tuple[str, str], dict[str, Any]]
    port: int = 0
    requests: list[str] = field(default_factory=list)

    def answer(self, path: str) -> tuple[int, dict[str, Any]]:
        self.requests.append(path)
        if path == "/api/v1":
            return 200, _CORE_V1
        parts = path.strip("/").split("/")  # api v1 namespaces NS secrets NAME
        if len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "secrets":
            secret = self.secrets.get((parts[3], parts[5]))
            if secret is not None:
                return 200, secret
        return 404, _NOT_FOUND

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig whose current context is this server."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "stand-in",
            "clusters": [{"name": "stand-in", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "stand-in", "user": {"token": "unused"}}],
            "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "stand-in"}}],
        }
        path.write_text(json.dumps(config))
        path.chmod(0o600)  # helm warns about a kubeconfig that others can read
        return path


def _handler(api: ApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # http.server's name
            code, body = api.answer(self.path.split("?")[0])
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:  # requests are recorded, not logged
            pass

    return Handler


@contextmanager
def serving(secrets: dict[tuple[str, str], dict[str, Any]]) -> Iterator[ApiServer]:
    """Serve ``secrets`` ({(namespace, name): Secret object}) on an ephemeral loopback port."""
    api = ApiServer(secrets)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(api))
    api.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, name="stand-in-apiserver", daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
