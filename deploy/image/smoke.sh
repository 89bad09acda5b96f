#!/usr/bin/env bash
# Start the kvpool-server image and talk to the daemon inside it over loopback.
#
#   deploy/image/smoke.sh [TAG]        (default TAG: kvpool:<package version>; build it first)
#
# Checks, in order: the container turns healthy (its HEALTHCHECK asks the gRPC health
# service); `kvpoolctl status` from this machine sees the node; a block put from here
# reads back byte for byte; in an image with UCX (label io.kvpool.ucx=1), the daemon
# advertises a ucx endpoint and a client reads blocks over it; /metrics counted the put;
# the daemon runs as uid 10001; kvpoolctl inside the image answers; SIGTERM stops the
# daemon cleanly (exit 0).
# The container uses --network host with ports picked free on 127.0.0.1. Needs root.
# KVPOOL_SMOKE_CLIENT=container runs the block round trip with the image's own
# kvpoolctl (for an image built from another commit than this checkout's client).
set -euo pipefail
cd "$(dirname "$0")/../.."
source deploy/image/docker.sh

VENV="${KVPOOL_VENV:-.venv}"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -n 1)"
TAG="${1:-kvpool:$VERSION}"
NAME="kvpool-smoke-$$"
WORK="$(mktemp -d /tmp/kvpool-smoke.XXXXXX)"
PY="$VENV/bin/python"
CTL="$VENV/bin/kvpoolctl"

cleanup() {
  docker_cmd rm -f "$NAME" >/dev/null 2>&1 || true
  rm -rf "$WORK"
  [[ -n "${KVPOOL_KEEP_DOCKERD:-}" ]] || kvpool_docker_down
}

fail() {
  echo "smoke: FAILED: $*" >&2
  echo "--- container log (last 30 lines) ---" >&2
  docker_cmd logs --tail 30 "$NAME" >&2 2>&1 || true
  exit 1
}

free_ports() {
  "$PY" - <<'PY'
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

# kvpoolctl for the block round trip: this checkout's, or the image's own.
block_ctl() {
  local port="$1"
  shift
  if [[ "${KVPOOL_SMOKE_CLIENT:-host}" == container ]]; then
    docker_cmd exec -i "$NAME" kvpoolctl --nodes "127.0.0.1:$port" "$@"
  else
    "$CTL" --nodes "127.0.0.1:$port" "$@"
  fi
}

# A client with transport=ucx puts and gets blocks: this checkout's, or the image's own Python.
ucx_round_trip() {
  local address="127.0.0.1:$1" used
  if [[ "${KVPOOL_SMOKE_CLIENT:-host}" == container ]]; then
    used="$(docker_cmd exec -i "$NAME" python3 - "$address" <deploy/image/ucx_round_trip.py)" || return 1
  else
    used="$("$PY" deploy/image/ucx_round_trip.py "$address")" || return 1
  fi
  [[ "$used" == *" ucx" ]] || { echo "the client used: $used" >&2; return 1; }
}

wait_healthy() {
  local status="" i
  for ((i = 0; i < 120; i++)); do
    status="$(docker_cmd inspect -f '{{.State.Status}} {{.State.Health.Status}}' "$NAME")"
    case "$status" in
      "running healthy") echo "smoke: container healthy after $((i / 2)) s"; return 0 ;;
      exited*|dead*) fail "container stopped: $status" ;;
    esac
    sleep 0.5
  done
  fail "not healthy after 60 s (state: $status)"
}

main() {
  kvpool_need_root deploy/image/smoke.sh
  kvpool_docker_up
  trap cleanup EXIT
  docker_cmd image inspect "$TAG" >/dev/null 2>&1 || fail "no image $TAG: run deploy/image/build.sh first"
  local grpc data metrics ucx ucx_env=() with_ucx
  read -r grpc data metrics ucx < <(free_ports)
  with_ucx="$(docker_cmd image inspect -f '{{index .Config.Labels "io.kvpool.ucx"}}' "$TAG")"
  # ucxx needs a writable /tmp (glibc's tmpfile()), as the chart mounts one with UCX on.
  [[ "$with_ucx" == 1 ]] && ucx_env=(--tmpfs /tmp -e KVPOOL_UCX_PORT="$ucx")
  # Locked down as the Helm chart runs it: read-only root, no capabilities.
  docker_cmd run -d --name "$NAME" --network host --shm-size 256m --health-interval 1s \
    --read-only --cap-drop ALL --security-opt no-new-privileges \
    -e KVPOOL_HOST=127.0.0.1 -e KVPOOL_GRPC_PORT="$grpc" -e KVPOOL_DATA_PORT="$data" \
    -e KVPOOL_METRICS_PORT="$metrics" -e KVPOOL_DRAM_CAPACITY=64MiB -e KVPOOL_NODE_ID=smoke-node \
    "${ucx_env[@]}" "$TAG" >/dev/null
  wait_healthy

  "$CTL" --nodes "127.0.0.1:$grpc" --json status >"$WORK/status.json" || fail "kvpoolctl status exited $?"
  "$PY" -c 'import json, sys
node = json.load(open(sys.argv[1]))["nodes"][0]
assert node["reachable"] and node["node_id"] == "smoke-node" and node["state"] == "active", node
assert node["dram_capacity_bytes"] == 64 << 20, node' "$WORK/status.json" || fail "unexpected status: $(cat "$WORK/status.json")"
  echo "smoke: kvpoolctl status sees smoke-node, active, 64 MiB"

  head -c 262144 /dev/urandom >"$WORK/block.bin"
  block_ctl "$grpc" put - --name smoke --namespace smoke <"$WORK/block.bin" >/dev/null || fail "put"
  block_ctl "$grpc" get --name smoke --namespace smoke -o - >"$WORK/back.bin" || fail "get"
  cmp -s "$WORK/block.bin" "$WORK/back.bin" || fail "the block read back differs from the one put"
  echo "smoke: a 256 KiB block put from the ${KVPOOL_SMOKE_CLIENT:-host} reads back byte for byte"

  if [[ "$with_ucx" == 1 ]]; then
    "$PY" -c 'import json, sys
endpoints = json.load(open(sys.argv[1]))["nodes"][0]["data_endpoints"]
assert endpoints.get("ucx") == f"127.0.0.1:{sys.argv[2]}", endpoints' "$WORK/status.json" "$ucx" \
      || fail "no ucx endpoint on port $ucx: $(cat "$WORK/status.json")"
    ucx_round_trip "$grpc" || fail "blocks over ucx"
    echo "smoke: the daemon advertises ucx; blocks put and read over it from the ${KVPOOL_SMOKE_CLIENT:-host}"
  else
    echo "smoke: image built without UCX (io.kvpool.ucx=$with_ucx): ucx not checked"
  fi

  "$PY" -c 'import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
line = next(l for l in text.splitlines() if l.startswith("kvpool_requests_total{op=\"put\"}"))
assert float(line.split()[-1]) >= 1, line' "$metrics" || fail "/metrics did not count the put"
  echo "smoke: /metrics counted the put"

  local uid
  uid="$(docker_cmd exec "$NAME" sh -c 'stat -c %u /proc/1')"
  [[ "$uid" == 10001 ]] || fail "the daemon runs as uid $uid, not 10001"
  docker_cmd exec "$NAME" kvpoolctl --nodes "127.0.0.1:$grpc" status >/dev/null || fail "kvpoolctl inside the image"
  echo "smoke: daemon runs as uid 10001; kvpoolctl inside the image answers"

  local start code
  start=$(date +%s)
  docker_cmd stop -t 20 "$NAME" >/dev/null
  code="$(docker_cmd inspect -f '{{.State.ExitCode}}' "$NAME")"
  [[ "$code" == 0 ]] || fail "exit code $code after SIGTERM"
  docker_cmd logs "$NAME" 2>&1 | grep -q '"stopped"' || fail "no 'stopped' log line after SIGTERM"
  echo "smoke: SIGTERM stopped the daemon cleanly in $(($(date +%s) - start)) s"
  echo "smoke: ok"
}

main
