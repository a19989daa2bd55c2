#!/usr/bin/env bash
# The whole test suite: set-up (idempotent), then every crate's unit and integration tests
# against the real voice and ONNX Runtime.
set -euo pipefail
cd "$(dirname "$0")/.."
# --gpu: ONNX Runtime's CUDA build and the CUDA wheels; tests/gpu.rs checks on this
# GPU-less machine what doctor says of them and how `--device auto` falls back.
# --test: the S3 test server and ffprobe. --kokoro: the second model family's tests.
# (The set-up also installs Prometheus, node/npm, and PostgreSQL and RabbitMQ when
# nothing answers on their ports: Debian's packages.)
SETUP=(--gpu --test --kokoro)
say() { printf 'test: %s\n' "$*"; }
die() {
    printf 'test: ERROR: %s\n' "$*" >&2
    exit 1
}
# The Debian packages first (the build needs them); then the tests build in the background
# while the rest of the set-up downloads and unpacks and the services start (on a fresh
# clone that overlaps about 100 s of set-up with the build). nextest reuses the build.
bash ops/setup.sh "${SETUP[@]}" --packages-only
build_log="$(mktemp)"
cargo test --workspace --locked --no-run >"$build_log" 2>&1 &
build_pid=$!
trap 'kill "$build_pid" 2>/dev/null || true; rm -f "$build_log"' EXIT
bash ops/setup.sh "${SETUP[@]}"
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() {
    for _ in $(seq "$2"); do port_open "$1" && return 0; sleep 1; done
    return 1
}
# narrator-db's tests need Postgres (each gets a fresh database from DATABASE_URL).
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
if ! port_open 5432; then
    cluster="$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)"
    [[ -n "$cluster" ]] || die "nothing answers on 127.0.0.1:5432 and Debian's postgresql is not installed: run \`bash ops/setup.sh --test\` as root, or start a PostgreSQL there"
    hba="/etc/postgresql/$cluster/main/pg_hba.conf"
    # The tests connect as postgres over TCP without a password (DATABASE_URL above).
    if ! grep -Eq '^host +all +(all|postgres) +127\.0\.0\.1/32 +trust' "$hba"; then
        say "letting postgres connect from 127.0.0.1 without a password (a line at the top of $hba)"
        sed -i '1i host all postgres 127.0.0.1/32 trust' "$hba"
    fi
    say "starting PostgreSQL $cluster"
    pg_ctlcluster --skip-systemctl-redirect "$cluster" main start
    wait_port 5432 30 || die "PostgreSQL $cluster did not open 127.0.0.1:5432 in 30 s (see /var/log/postgresql)"
fi
# narrator-broker's tests need RabbitMQ at 127.0.0.1:5672 (guest/guest).
if ! port_open 5672; then
    command -v rabbitmq-server >/dev/null || die "nothing answers on 127.0.0.1:5672 and Debian's rabbitmq-server is not installed: run \`bash ops/setup.sh --test\` as root, or start a RabbitMQ there"
    say "starting RabbitMQ"
    rabbitmq-server -detached
    wait_port 5672 90 || die "RabbitMQ did not open 127.0.0.1:5672 in 90 s (see /var/log/rabbitmq)"
fi
# narrator-s3's tests need an S3-compatible server (s3s-fs from ops/setup.sh --test).
source ops/test-env.sh
bash ops/s3-server.sh start
# Every Kubernetes manifest, rendered with kustomize and validated against the Kubernetes
# and KEDA schemas (offline, tools from PyPI and npm).
bash ops/k8s-check.sh
say "waiting for the tests' build"
if ! wait "$build_pid"; then
    cat "$build_log" >&2
    die "the tests did not build (cargo's output above)"
fi
tail -n 1 "$build_log"
# The runner: cargo-nextest, every test in a process of its own, several at once
# (.config/nextest.toml says how many and which may not share the machine); setup built it
# into its tools folder where it was not installed (on PATH by ops/test-env.sh).
cargo nextest run --workspace --locked "$@"
# nextest does not run documentation examples: cargo test does.
cargo test --workspace --locked --doc
