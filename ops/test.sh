#!/usr/bin/env bash
# The whole test suite: set-up (idempotent), then every crate's unit and integration tests
# against the real voice and ONNX Runtime.
set -euo pipefail
cd "$(dirname "$0")/.."
# --gpu: ONNX Runtime's CUDA build and the CUDA wheels; tests/gpu.rs checks on this
# GPU-less machine what doctor says of them and how `--device auto` falls back.
# --test: the S3 test server and ffprobe. --kokoro: the second model family's tests.
bash ops/setup.sh --gpu --test --kokoro
# The observability tests scrape a worker with a real Prometheus and check the alert
# rules with promtool (both in Debian's `prometheus` package).
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus >/dev/null
fi
# narrator-db's tests need Postgres (each gets a fresh database from DATABASE_URL).
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
if ! pg_isready -q -h 127.0.0.1 -p 5432 && command -v pg_ctlcluster >/dev/null \
    && ls /etc/postgresql >/dev/null 2>&1; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
fi
# narrator-broker's tests need RabbitMQ at 127.0.0.1:5672 (guest/guest).
amqp_up() { (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; }
if ! amqp_up && command -v rabbitmq-server >/dev/null; then
    rabbitmq-server -detached
    for _ in $(seq 60); do amqp_up && break; sleep 1; done
fi
# narrator-s3's tests need an S3-compatible server (s3s-fs from ops/setup.sh --test).
export NARRATOR_S3_PORT="${NARRATOR_S3_PORT:-9010}"
export NARRATOR_S3_ENDPOINT="${NARRATOR_S3_ENDPOINT:-http://127.0.0.1:$NARRATOR_S3_PORT}"
export NARRATOR_S3_BUCKET="${NARRATOR_S3_BUCKET:-narrator}"
export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-narrator}"
export AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-narrator-secret}"
export AWS_REGION="${AWS_REGION:-us-east-1}"
bash ops/s3-server.sh start
# Every Kubernetes manifest, rendered with kustomize and validated against the Kubernetes
# and KEDA schemas (offline, tools from PyPI and npm).
bash ops/k8s-check.sh
cargo test --workspace --locked "$@"
