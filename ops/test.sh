#!/usr/bin/env bash
# The whole test suite: set-up (idempotent), then every crate's unit and integration tests
# against the real voice and ONNX Runtime.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ops/setup.sh
# narrator-db's tests need Postgres (each gets a fresh database from DATABASE_URL).
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
if ! pg_isready -q -h 127.0.0.1 -p 5432 && command -v pg_ctlcluster >/dev/null \
    && ls /etc/postgresql >/dev/null 2>&1; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
fi
cargo test --workspace --locked "$@"
