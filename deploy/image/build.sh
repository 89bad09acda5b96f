#!/usr/bin/env bash
# Build the kvpool-server image here, pulling nothing from an image registry.
#
#   deploy/image/build.sh [TAG]        (default TAG: kvpool:<package version>)
#
# 1. a private dockerd from Debian's docker.io (deploy/image/docker.sh);
# 2. the base image: a minimal Debian rootfs with python3 made by debootstrap
#    from the apt sources this machine uses, then `docker import` (cached as
#    kvpool-base:<suite>; KVPOOL_REBUILD_BASE=1 remakes it);
# 3. a wheelhouse of kvpool with the ucx extra and its dependencies (pip, from the
#    package index);
# 4. `docker build` of deploy/Dockerfile on that wheelhouse, with no network.
# Needs root. Environment: KVPOOL_DEBIAN_MIRROR overrides the mirror read from apt;
# KVPOOL_IMAGE_REF=REF builds kvpool from that git commit instead of the working tree;
# KVPOOL_IMAGE_UCX=0 leaves the UCX data plane (kvpool[ucx]) out of the image.
set -euo pipefail
cd "$(dirname "$0")/../.."
source deploy/image/docker.sh

SUITE="${KVPOOL_IMAGE_SUITE:-bookworm}"
BASE="kvpool-base:$SUITE"
VENV="${KVPOOL_VENV:-.venv}"
CONTEXT="build/image/context"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -n 1)"
TAG="${1:-kvpool:$VERSION}"
UCX="${KVPOOL_IMAGE_UCX:-1}"

# The first Debian archive URI in this machine's apt sources (deb822 or one-line format).
debian_mirror() {
  local uri=""
  if [[ -n "${KVPOOL_DEBIAN_MIRROR:-}" ]]; then
    echo "$KVPOOL_DEBIAN_MIRROR"
    return
  fi
  if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
    uri=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
  fi
  if [[ -z "$uri" && -f /etc/apt/sources.list ]]; then
    uri=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) { print $i; exit } }' /etc/apt/sources.list)
  fi
  if [[ -z "$uri" ]]; then
    echo "no Debian mirror in /etc/apt/sources.list*: set KVPOOL_DEBIAN_MIRROR" >&2
    exit 2
  fi
  echo "$uri"
}

build_base() {
  if [[ -z "${KVPOOL_REBUILD_BASE:-}" ]] && docker_cmd image inspect "$BASE" >/dev/null 2>&1; then
    echo "base image $BASE: cached"
    return
  fi
  kvpool_install_debs debootstrap
  local mirror
  mirror="$(debian_mirror)"
  ROOTFS="$(mktemp -d /tmp/kvpool-rootfs.XXXXXX)"
  local rootfs="$ROOTFS"
  echo "base image $BASE: debootstrap $SUITE (minbase + python3) ..."
  debootstrap --variant=minbase --include=python3 --components=main "$SUITE" "$rootfs" "$mirror" \
    >"$rootfs.log" 2>&1 || { tail -n 30 "$rootfs.log" >&2; exit 1; }
  # Documentation, caches and package lists only make the image larger.
  rm -rf "$rootfs"/usr/share/{doc,man,info,locale}/* "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/var/log/* "$rootfs"/var/cache/debconf/*-old
  tar -C "$rootfs" --numeric-owner -c . | docker_cmd import \
    --change 'CMD ["/bin/bash"]' --message "debootstrap $SUITE minbase + python3" - "$BASE" >/dev/null
  rm -rf "$rootfs" "$rootfs.log"
  echo "base image $BASE: imported"
}

build_wheelhouse() {
  local want have
  want="$(docker_cmd run --rm --network none "$BASE" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  have="$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  if [[ "$want" != "$have" ]]; then
    echo "the base has Python $want but $VENV has $have: the wheels would not fit (set KVPOOL_VENV)" >&2
    exit 2
  fi
  rm -rf "$CONTEXT"
  mkdir -p "$CONTEXT/wheels"
  local source="."
  if [[ -n "${KVPOOL_IMAGE_REF:-}" ]]; then
    source="build/image/source"
    rm -rf "$source" && mkdir -p "$source"
    git archive "$KVPOOL_IMAGE_REF" | tar -x -C "$source"
  fi
  local spec="$source[server]"
  [[ "$UCX" == 0 ]] || spec="$source[server,ucx]"
  echo "wheelhouse: $spec (${KVPOOL_IMAGE_REF:-working tree}) and its dependencies for Python $want ..."
  "$VENV/bin/python" -m pip wheel --quiet --no-cache-dir --wheel-dir "$CONTEXT/wheels" "$spec" pip
  install -m 0755 deploy/image/healthcheck.py "$CONTEXT/wheels/kvpool-healthcheck"
}

ROOTFS=""
cleanup() {
  if [[ -n "$ROOTFS" ]]; then rm -rf "$ROOTFS" "$ROOTFS.log"; fi
  [[ -n "${KVPOOL_KEEP_DOCKERD:-}" ]] || kvpool_docker_down
}

main() {
  kvpool_need_root deploy/image/build.sh
  if [[ "$UCX" != 0 && "$UCX" != 1 ]]; then
    echo "KVPOOL_IMAGE_UCX must be 0 or 1, not '$UCX'" >&2
    exit 2
  fi
  trap cleanup EXIT
  if [[ ! -x "$VENV/bin/python" ]]; then
    echo "no $VENV: run 'bash deploy/dev.sh test' once, or set KVPOOL_VENV" >&2
    exit 2
  fi
  kvpool_docker_up
  build_base
  build_wheelhouse
  echo "image $TAG: docker build (UCX=$UCX) ..."
  docker_cmd build --quiet --network none --build-arg "BASE=$BASE" --build-arg "UCX=$UCX" -f deploy/Dockerfile \
    -t "$TAG" "$CONTEXT" >/dev/null
  docker_cmd image ls "$TAG" --format 'image {{.Repository}}:{{.Tag}}: {{.ID}}, {{.Size}}'
}

main
