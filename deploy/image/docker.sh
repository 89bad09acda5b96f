# shellcheck shell=bash
# Sourced by the image scripts: a private dockerd from Debian's docker.io package.
#
# The daemon gets its own socket, data root and exec root, so it never touches a
# docker that runs here already. It starts with no bridge and no iptables rules:
# containers run with --network host and talk over loopback only.
#   kvpool_docker_up     start it unless it answers already (installs docker.io first)
#   kvpool_docker_down   stop it if kvpool_docker_up started it in this shell
#   docker_cmd ARGS...   the docker client, pointed at that daemon

KVPOOL_DOCKER_RUN="${KVPOOL_DOCKER_RUN:-/run/kvpool-docker}"
KVPOOL_DOCKER_ROOT="${KVPOOL_DOCKER_ROOT:-/var/lib/kvpool-docker}"
KVPOOL_DOCKER_HOST="unix://$KVPOOL_DOCKER_RUN/docker.sock"
_KVPOOL_DOCKERD_STARTED=""

# The docker.io client matches its daemon's API; a newer client elsewhere on PATH may not.
_kvpool_docker_client() {
  if [[ -x /usr/bin/docker ]]; then echo /usr/bin/docker; else command -v docker; fi
}

docker_cmd() {
  DOCKER_BUILDKIT=0 "$(_kvpool_docker_client)" -H "$KVPOOL_DOCKER_HOST" "$@"
}

kvpool_need_root() {
  if [[ $(id -u) -ne 0 ]]; then
    echo "$1 needs root (dockerd and debootstrap do): rerun with sudo" >&2
    exit 2
  fi
}

kvpool_install_debs() {
  local missing=() pkg
  for pkg in "$@"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    echo "installing ${missing[*]} with apt-get" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

kvpool_docker_up() {
  if docker_cmd version >/dev/null 2>&1; then
    return 0
  fi
  kvpool_install_debs docker.io
  mkdir -p "$KVPOOL_DOCKER_RUN" "$KVPOOL_DOCKER_ROOT"
  # setsid: the daemon outlives neither a failed start nor kvpool_docker_down, but a
  # Ctrl-C in the caller's terminal does not reach it half-way through a build.
  setsid dockerd \
    --host "$KVPOOL_DOCKER_HOST" \
    --data-root "$KVPOOL_DOCKER_ROOT" \
    --exec-root "$KVPOOL_DOCKER_RUN/exec" \
    --pidfile "$KVPOOL_DOCKER_RUN/dockerd.pid" \
    --bridge=none --iptables=false --ip6tables=false --ip-masq=false \
    >"$KVPOOL_DOCKER_RUN/dockerd.log" 2>&1 &
  _KVPOOL_DOCKERD_STARTED=$!
  local i
  for ((i = 0; i < 120; i++)); do
    if docker_cmd version >/dev/null 2>&1; then
      return 0
    fi
    if ! kill -0 "$_KVPOOL_DOCKERD_STARTED" 2>/dev/null; then
      echo "dockerd exited at start; its log ($KVPOOL_DOCKER_RUN/dockerd.log) ends with:" >&2
      tail -n 20 "$KVPOOL_DOCKER_RUN/dockerd.log" >&2
      _KVPOOL_DOCKERD_STARTED=""
      return 1
    fi
    sleep 0.5
  done
  echo "dockerd did not answer on $KVPOOL_DOCKER_HOST within 60 s; see $KVPOOL_DOCKER_RUN/dockerd.log" >&2
  kvpool_docker_down
  return 1
}

kvpool_docker_down() {
  local pid="$_KVPOOL_DOCKERD_STARTED" i
  [[ -n "$pid" ]] || return 0
  _KVPOOL_DOCKERD_STARTED=""
  kill -TERM "$pid" 2>/dev/null || return 0
  for ((i = 0; i < 100; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.2
  done
  kill -KILL "$pid" 2>/dev/null || true
}
