#!/usr/bin/env bash
# The whole test suite: set-up (idempotent), then every crate's unit and integration tests
# against the real voice and ONNX Runtime.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ops/setup.sh
cargo test --workspace --locked "$@"
