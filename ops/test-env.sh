# Sourced by ops/test.sh and ops/loop-tests.sh: the test services' settings (the S3 test
# server s3s-fs from `ops/setup.sh --test`, its bucket and test keys) and cargo-nextest
# on PATH where setup built it. Each variable already set is kept.
export NARRATOR_S3_PORT="${NARRATOR_S3_PORT:-9010}"
export NARRATOR_S3_ENDPOINT="${NARRATOR_S3_ENDPOINT:-http://127.0.0.1:$NARRATOR_S3_PORT}"
export NARRATOR_S3_BUCKET="${NARRATOR_S3_BUCKET:-narrator}"
export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-narrator}"
export AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-narrator-secret}"
export AWS_REGION="${AWS_REGION:-us-east-1}"
if ! cargo nextest --version >/dev/null 2>&1; then
    nextest_version="$(sed -n 's/^NEXTEST_VERSION=//p' ops/setup.sh)"
    export PATH="${XDG_CACHE_HOME:-$HOME/.cache}/narrator/tools/cargo-nextest-$nextest_version/bin:$PATH"
fi
