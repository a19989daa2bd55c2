#!/usr/bin/env bash
# The README's two commands on a bare Debian 12, as a new user's machine would run them:
# a clean `localhost/debian:bookworm` container (debootstrap minbase, `ops/images.sh
# --base-only`) with nothing installed, its own network (so nothing of this host's
# PostgreSQL, RabbitMQ or S3 server is reachable), a fresh clone of this repository's
# HEAD, and only this host's Rust toolchain mounted (read-only). Command 1, then command 2
# (which must install and start PostgreSQL, RabbitMQ, the S3 test server, node/npm...).
# Each command's output goes to OUT/cmd1.log and OUT/cmd2.log with its time. Not in CI
# (it downloads and builds everything: the better part of an hour on 2 cores).
#
#   bash ops/fresh-check.sh [OUT]        # OUT defaults to a new temporary folder
#
# These machines reach the package registries through an intercepting proxy whose CA
# only the host trusts: the host's CA bundle is mounted and named to pip, cargo, curl and
# node. Elsewhere that is harmless (it is the host's own bundle).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$(mktemp -d)}"
mkdir -p "$OUT"
say() { printf 'fresh-check: %s\n' "$*"; }
die() {
    printf 'fresh-check: FAILED: %s\n' "$*" >&2
    exit 1
}

RUSTUP="${RUSTUP_HOME:-$HOME/.rustup}"
CARGO_BIN="${CARGO_HOME:-$HOME/.cargo}/bin"
[[ -x "$CARGO_BIN/cargo" && -d "$RUSTUP/toolchains" ]] || die "no rustup toolchain at $RUSTUP (cargo in $CARGO_BIN)"
CA=/etc/ssl/certs/ca-certificates.crt
[[ -f "$CA" ]] || die "no CA bundle at $CA"
bash "$ROOT/ops/images.sh" --base-only

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
git clone -q "$ROOT" "$WORK/narrator"
say "clone of $(git -C "$ROOT" rev-parse --short HEAD) in a bare Debian 12 container; logs in $OUT"

# What runs inside: the README's two commands exactly, each timed.
cat >"$WORK/run.sh" <<'INNER'
set -uo pipefail
cd /src
t=$(date +%s)
bash -c 'bash ops/setup.sh && cargo run --release -p narrator --no-default-features -- run examples/sample.md --out out/sample' >/out/cmd1.log 2>&1
echo "command 1: exit $? in $(($(date +%s) - t)) s" | tee -a /out/cmd1.log
t=$(date +%s)
bash -c 'bash ops/test.sh' >/out/cmd2.log 2>&1
echo "command 2: exit $? in $(($(date +%s) - t)) s" | tee -a /out/cmd2.log
INNER

# The shared corpus beside the checkout (../shared: Alice's 12 chapters, which the text and
# pipeline tests read), read-only where this checkout has one; --privileged for the fault
# test that mounts a small tmpfs (CI runs the command as root on the machine itself).
SHARED=()
[[ -d "$ROOT/../shared/corpus" ]] && SHARED=(-v "$(cd "$ROOT/.." && pwd)/shared:/shared:ro")
podman run --rm --privileged \
    "${SHARED[@]}" \
    -v "$WORK/narrator:/src" \
    -v "$WORK/run.sh:/run.sh:ro" \
    -v "$OUT:/out" \
    -v "$RUSTUP:/opt/rustup:ro" \
    -v "$CARGO_BIN:/opt/cargo-bin:ro" \
    -v "$CA:/etc/ssl/host-ca.crt:ro" \
    -e CI=true \
    -e RUSTUP_HOME=/opt/rustup \
    -e CARGO_HOME=/root/.cargo \
    -e RUSTUP_TOOLCHAIN="$(rustup show active-toolchain 2>/dev/null | cut -d' ' -f1)" \
    -e PATH=/opt/cargo-bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    -e SSL_CERT_FILE=/etc/ssl/host-ca.crt \
    -e CARGO_HTTP_CAINFO=/etc/ssl/host-ca.crt \
    -e PIP_CERT=/etc/ssl/host-ca.crt \
    -e REQUESTS_CA_BUNDLE=/etc/ssl/host-ca.crt \
    -e NODE_EXTRA_CA_CERTS=/etc/ssl/host-ca.crt \
    -e npm_config_cafile=/etc/ssl/host-ca.crt \
    localhost/debian:bookworm bash /run.sh
grep -h "^command [12]: " "$OUT/cmd1.log" "$OUT/cmd2.log" || die "no result line in $OUT"
grep -q "^command 1: exit 0 " "$OUT/cmd1.log" || die "command 1 failed: tail $OUT/cmd1.log"
grep -q "^command 2: exit 0 " "$OUT/cmd2.log" || die "command 2 failed: tail $OUT/cmd2.log"
say "ok: both README commands pass on a bare Debian 12"
