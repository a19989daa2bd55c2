#!/usr/bin/env bash
# Builds narrator's CPU image with podman on a machine that cannot pull registry images
# (this project's machines): a Debian bookworm base made with debootstrap, and the
# Dockerfile's NARRATOR_FROM=prebuilt payload (the release binary and the runtime parts
# ops/setup.sh fetched). On a machine with a registry: `docker build -t narrator:cpu .`.
#
#   bash ops/images.sh            # -> localhost/narrator:cpu
#   bash ops/images.sh --gpu      # also localhost/narrator:gpu (built, cannot run here:
#                                 # no GPU; ~2.4 GB of CUDA libraries from PyPI)
#   bash ops/images.sh --tag registry.example.com/narrator:0.1.0 [--gpu] [--push]
#                                 # also tagged REPO:VERSION-cpu (and REPO:VERSION-cuda13),
#                                 # the names the Kubernetes overlays' `images:` give;
#                                 # --push pushes them
#   bash ops/images.sh --base-only  # only the Debian base, localhost/debian:bookworm
#
# One naming scheme from build to manifest: local builds are localhost/narrator:cpu and
# :gpu (docker-compose.yml builds narrator:cpu and :gpu itself); a release is
# REPO/narrator:VERSION-cpu and REPO/narrator:VERSION-cuda13 (the GPU image is tied to its
# CUDA major version), which ops/kubernetes/overlays/*/kustomization.yaml name under
# `images:` (the manifests use the logical names narrator-cpu and narrator-gpu).
#
# Installs podman, buildah, runc and debootstrap from Debian when missing (as root), and
# writes /etc/containers/containers.conf when there is none (runc; crun fails on these
# machines' cgroup set-up). The base image is cached as localhost/debian:bookworm.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
say() { printf 'images: %s\n' "$*"; }
GPU=0
TAG=""
PUSH=0
BASE_ONLY=0
while (($#)); do
    case "$1" in
        --gpu) GPU=1 ;;
        --push) PUSH=1 ;;
        --base-only) BASE_ONLY=1 ;;
        --tag)
            TAG="${2:-}"
            shift
            # REPO:VERSION, the version after the last path segment's colon.
            [[ "${TAG##*/}" == *:?* ]] || {
                echo "images: --tag needs REPO:VERSION (e.g. registry.example.com/narrator:0.1.0), got '$TAG'" >&2
                exit 2
            }
            ;;
        *)
            echo "images: unknown option '$1' (known: --gpu, --tag REPO:VERSION, --push, --base-only)" >&2
            exit 2
            ;;
    esac
    shift
done
((PUSH)) && [[ -z "$TAG" ]] && {
    echo "images: --push needs --tag REPO:VERSION" >&2
    exit 2
}
cd "$ROOT"

need=()
for tool in podman buildah runc debootstrap; do
    command -v "$tool" >/dev/null || need+=("$tool")
done
if ((${#need[@]})); then
    say "installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if [[ ! -e /etc/containers/containers.conf ]]; then
    mkdir -p /etc/containers
    cat >/etc/containers/containers.conf <<'CONF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
CONF
fi

if ! podman image exists localhost/debian:bookworm; then
    mirror="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
    mirror="${mirror:-http://deb.debian.org/debian}"
    rootfs="$(mktemp -d)"
    say "base image: debootstrap bookworm from $mirror"
    debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >/dev/null
    tar -C "$rootfs" -c . | podman import - localhost/debian:bookworm >/dev/null
    rm -rf "$rootfs"
fi

# --base-only: the Debian base alone (ops/fresh-check.sh runs the README in it).
((BASE_ONLY)) && exit 0

# Always: a binary left by README command 1 is built without the distributed mode.
cargo build --release --locked -p narrator
[[ -f .deps/ok ]] || bash ops/setup.sh
# The Dockerfile's target $1 as localhost/narrator:$1, from the prebuilt payload. Docker's
# image format keeps HEALTHCHECK (podman's default, OCI, drops it).
build_target() {
    say "building localhost/narrator:$1"
    podman build --format docker --target "$1" \
        --build-arg DEBIAN_IMAGE=localhost/debian:bookworm \
        --build-arg NARRATOR_FROM=prebuilt \
        -t "localhost/narrator:$1" .
    say "built localhost/narrator:$1: $(podman image inspect "localhost/narrator:$1" --format '{{.Size}}') bytes"
}
build_target cpu
if ((GPU)); then
    bash ops/setup.sh --gpu >/dev/null
    build_target gpu
fi
# The release names (see the top of this file), pushed when asked.
release() {
    podman tag "localhost/narrator:$1" "$2"
    say "tagged localhost/narrator:$1 as $2"
    if ((PUSH)); then
        podman push "$2"
        say "pushed $2"
    fi
}
if [[ -n "$TAG" ]]; then
    release cpu "$TAG-cpu"
    ((GPU)) && release gpu "$TAG-cuda13"
fi
