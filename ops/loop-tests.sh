#!/usr/bin/env bash
# The supervision and fair-share tests run again and again, to catch the ones that fail
# only now and then: the `seams` tests (narrator-worker) and the `control_plane` tests
# (narrator-system-tests), N runs in a row, with the environment ops/test.sh sets up.
#
#   bash ops/loop-tests.sh [--times N] [-- NEXTEST-ARGS...]
#
#   --times N   runs (default 20)
#   -- ARGS     passed on to `cargo nextest run` (e.g. `-- -E 'test(wedged)'`)
#
# PostgreSQL and RabbitMQ must answer on 127.0.0.1:5432 and :5672 (`bash ops/test.sh`
# starts them); the S3 test server is started here (ops/s3-server.sh). Each run's output
# goes to a log folder, kept when a run fails. Prints one line per run, then
# `loop: N runs, F failed` (F: runs with a failure) and every failing test with how many
# runs it failed in. Exit status 1 if any run failed.
set -euo pipefail
cd "$(dirname "$0")/.."

TIMES=20
while (($#)); do
    case "$1" in
        --times) TIMES="${2:?--times needs N}"; shift 2 ;;
        --) shift; break ;;
        -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "loop-tests: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[[ "$TIMES" =~ ^[1-9][0-9]*$ ]] || { echo "loop-tests: --times needs a positive number" >&2; exit 2; }
say() { printf 'loop: %s\n' "$*"; }
die() {
    printf 'loop: ERROR: %s\n' "$*" >&2
    exit 1
}

# The services, as ops/test.sh sets them up.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port_open 5432 || die "nothing answers on 127.0.0.1:5432 (PostgreSQL): run \`bash ops/test.sh\` once"
port_open 5672 || die "nothing answers on 127.0.0.1:5672 (RabbitMQ): run \`bash ops/test.sh\` once"
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
# The S3 settings and the runner, as ops/test.sh has them.
source ops/test-env.sh
bash ops/s3-server.sh start
cargo nextest --version >/dev/null 2>&1 || die "cargo-nextest not found: run \`bash ops/setup.sh\`"

logs="$(mktemp -d "${TMPDIR:-/tmp}/narrator-loop.XXXXXX")"
declare -A failed_in=()
failed=0
for run in $(seq "$TIMES"); do
    log="$logs/run-$run.log"
    started=$SECONDS
    rc=0
    cargo nextest run --locked --no-fail-fast \
        -p narrator-worker -p narrator-system-tests \
        -E 'binary_id(narrator-worker::seams) | binary_id(narrator-system-tests::control_plane)' \
        "$@" >"$log" 2>&1 || rc=$?
    # nextest's status lines (`FAIL [ 1.2s] BINARY TEST`, SIGSEGV, TIMEOUT, ...), repeated
    # in its final summary: each failing test once per run.
    names="$(sed -nE 's/^ *(FAIL|SIG[A-Z]+|TIMEOUT|ABORT|LEAK-FAIL) +\[[^]]*\] +(\([^)]*\) +)?//p' "$log" | sort -u)"
    if ((rc != 0)) && [[ -z "$names" ]]; then
        names="(no test failed: cargo nextest exited $rc, see $log)"
    fi
    if [[ -n "$names" ]]; then
        failed=$((failed + 1))
        while IFS= read -r name; do
            failed_in["$name"]=$((${failed_in["$name"]:-0} + 1))
        done <<<"$names"
        say "run $run/$TIMES: FAILED in $((SECONDS - started)) s: $(paste -sd, - <<<"$names")"
    else
        say "run $run/$TIMES: ok in $((SECONDS - started)) s ($(grep -Eo '[0-9]+ tests? run: [0-9]+ passed' "$log" | tail -n 1))"
        rm -f "$log"
    fi
done

say "$TIMES runs, $failed failed"
for name in "${!failed_in[@]}"; do
    printf '  %s/%s  %s\n' "${failed_in[$name]}" "$TIMES" "$name"
done | sort -k3
if ((failed > 0)); then
    say "logs of the failed runs: $logs"
    exit 1
fi
rmdir "$logs" 2>/dev/null || true
