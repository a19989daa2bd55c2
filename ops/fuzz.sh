#!/usr/bin/env bash
# The long run of the property tests of every parser and decoder (not in CI): each
# property of crates/narrator-text, crates/narrator-engine and crates/narrator-broker
# (tests/properties.rs; harness in tests/support/properties.rs) with --cases inputs
# instead of the suite's 256, then a table: per property, cases tried and failures.
#
#   bash ops/fuzz.sh [--cases 100000] [--seed N] [--crate narrator-text] [--log FILE]
#
# Properties whose every input is a bomb of megabytes run a tenth of --cases. A failing
# property stops at its first failure, shrinks it and prints the minimal input and the
# seed to replay it with (NARRATOR_PROPTEST_SEED); the script exits non-zero.
#
# Build: the release profile with debug assertions and overflow checks on (an overflow
# is a panic here, as in a debug build, not a silent wrap), through the profile's
# environment variables: its artifacts sit beside, not over, those of
# `cargo build --release`. The first run compiles the three crates' dependencies in that
# profile (some minutes on two cores).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CASES=100000 SEED="" CRATES=(narrator-text narrator-engine narrator-broker) LOG=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --cases) CASES="$2"; shift 2 ;;
        --seed) SEED="$2"; shift 2 ;;
        --crate) CRATES=("$2"); shift 2 ;;
        --log) LOG="$2"; shift 2 ;;
        -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "fuzz: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
[[ "$CASES" =~ ^[0-9]+$ ]] || { echo "fuzz: --cases takes a number" >&2; exit 2; }
cd "$ROOT"
LOG="${LOG:-$(mktemp -t narrator-fuzz.XXXXXX)}"
: >"$LOG"
export NARRATOR_PROPTEST_CASES="$CASES"
[[ -n "$SEED" ]] && export NARRATOR_PROPTEST_SEED="$SEED"
export CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true

say() { printf '[fuzz %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
started=$(date +%s)
status=0
for crate in "${CRATES[@]}"; do
    say "building $crate's properties (release, with overflow checks)"
    exe=$(cargo test --release -p "$crate" --test properties --no-run --message-format=json \
        | grep -o '"executable":"[^"]*"' | tail -n 1 | cut -d'"' -f4)
    [[ -x "$exe" ]] || { echo "fuzz: no test binary for $crate" >&2; exit 1; }
    say "running $crate's properties: $CASES cases each (log: $LOG)"
    t0=$(date +%s)
    # Run as `cargo test` would (from the crate's folder), without holding cargo's lock.
    if ! (cd "crates/$crate" && "$exe" --nocapture --test-threads=2) >>"$LOG" 2>&1; then
        status=1
        say "$crate: a property FAILED (the minimal input is in $LOG)"
    fi
    say "$crate done in $(( $(date +%s) - t0 )) s"
done
elapsed=$(( $(date +%s) - started ))

echo
echo "| property | cases | failures | largest peak | slowest parse | seed |"
echo "|---|---|---|---|---|---|"
# property NAME: N cases, F failures, largest peak X MiB (input B bytes), slowest parse S s, T s in all, seed Z; outcomes: ...
sed -n 's/^property \([a-z_]*\): \([0-9]*\) cases, \([0-9]*\) failures, largest peak \([0-9.]* MiB\) (input [0-9]* bytes), slowest parse \([0-9.]* s\), [0-9.]* s in all, seed \([0-9]*\).*/| \1 | \2 | \3 | \4 | \5 | \6 |/p' "$LOG"
read -r props total failed < <(awk '/^property [a-z_]+: [0-9]+ cases, [0-9]+ failures/ {
    p++; c += $3; f += $5 } END { print p + 0, c + 0, f + 0 }' "$LOG")
echo
say "$props properties, $total cases, $failed failures, ${elapsed} s ($(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown))"
if grep -q '^test result: FAILED' "$LOG" || [[ "$failed" != 0 ]]; then
    status=1
fi
exit "$status"
