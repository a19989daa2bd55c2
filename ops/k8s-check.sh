#!/usr/bin/env bash
# Validates ops/kubernetes offline: renders every overlay (and the base and each worker
# class) with `kubectl kustomize`, then checks every object against its schema:
#   - core Kubernetes kinds with kubernetes-validate --strict (PyPI; it bundles the
#     Kubernetes OpenAPI schemas; unknown fields are errors),
#   - KEDA kinds with @kubernetes-models/keda (npm; schemas generated from KEDA's CRDs)
#     plus the RabbitMQ trigger's metadata keys (ops/k8s/validate-keda.js).
# The validators first prove they refuse the broken manifests in ops/k8s/bad/.
# Tools are cached in .deps/k8s-venv and ops/k8s/node_modules (both ignored by git).
# Without kubectl, the files are validated one by one instead (said in the output).
#
#   bash ops/k8s-check.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KV_VERSION=1.37.0
K8S_VERSION=1.33.0
VENV="$ROOT/.deps/k8s-venv"
say() { printf 'k8s-check: %s\n' "$*"; }

if ! "$VENV/bin/kubernetes-validate" --version 2>/dev/null | grep -q "$KV_VERSION"; then
    say "installing kubernetes-validate==$KV_VERSION into .deps/k8s-venv"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==$KV_VERSION"
fi
if [[ ! -d "$ROOT/ops/k8s/node_modules/@kubernetes-models/keda" ]]; then
    command -v npm >/dev/null || {
        echo "k8s-check: ERROR: npm is missing: run \`bash ops/setup.sh --test\` (Debian's npm)" >&2
        exit 1
    }
    say "installing the KEDA schemas (npm ci in ops/k8s)"
    (cd "$ROOT/ops/k8s" && npm ci --no-audit --no-fund --silent)
fi
validate_core() { "$VENV/bin/kubernetes-validate" --strict --quiet --no-warn -k "$K8S_VERSION" "$@"; }
validate_keda() { node "$ROOT/ops/k8s/validate-keda.js" "$@"; }

# The validators can fail.
for bad in "$ROOT"/ops/k8s/bad/*.yaml; do
    if validate_core "$bad" >/dev/null 2>&1 && validate_keda "$bad" >/dev/null 2>&1; then
        say "FAILED: $(basename "$bad") was accepted, but it is invalid"
        exit 1
    fi
done
say "the validators refuse every manifest in ops/k8s/bad/"

OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
cd "$ROOT/ops/kubernetes"
if kubectl kustomize --help >/dev/null 2>&1; then
    for dir in base workers/* overlays/*; do
        name="${dir//\//-}"
        kubectl kustomize "$dir" >"$OUT/$name.yaml"
        say "rendered $dir: $(grep -c '^kind:' "$OUT/$name.yaml") objects"
    done
else
    say "kubectl not found: overlays NOT rendered; validating the resource files one by one"
    find . -name '*.yaml' ! -name kustomization.yaml ! -path './overlays/*' -exec cp --parents {} "$OUT" \;
fi
mapfile -t files < <(find "$OUT" -name '*.yaml' | sort)
validate_core "${files[@]}"
validate_keda "${files[@]}"
say "ok: every object of ops/kubernetes validates (Kubernetes $K8S_VERSION, KEDA v1alpha1)"
