#!/usr/bin/env bash
# Where the control plane's Postgres work goes, per statement and per segment, for books
# of several lengths (issue 32): one `narrator worker --engine null` (real phonemizer, S3
# packs, RabbitMQ, records and assembly; the engine returns silence at once) on a book of N
# generated one-sentence segments in 10 chapters, while a user polls
# `narrator status --json` once a second (what `status --watch` does) and a script waits
# with `status --wait`. Counted, not timed (counts do not depend on how busy the machine
# is), in a private PostgreSQL with pg_stat_statements preloaded (the shared one is not
# touched); RabbitMQ and the S3 test server are the shared ones.
#
#   bash ops/bench/control_plane_statements.sh [N ...]     (default 1000 6000 20000)
#   BIN=/tmp/narrator-old bash ops/bench/control_plane_statements.sh   (another build)
#
# Prints, per book: transactions and rows per segment (pg_stat_database: all the job's
# work, submit + worker + status), then one line per statement with calls, rows and
# buffer pages (shared blocks hit + read: the pages it touched, which is what grows when a
# statement reads a whole book) per segment; and the worker's RabbitMQ operations and S3
# requests and bytes per segment, as its /metrics counted them (submit's publishes of the
# book's first window are not in them). Raw rows: $OUT/statements_N.tsv and
# $OUT/metrics_N.txt (OUT: a new temporary folder unless set).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
SIZES=("$@")
((${#SIZES[@]})) || SIZES=(1000 6000 20000)
BENCH=control-plane
source "$ROOT/ops/bench/lib.sh"
bench_prepare

WORK="$(mktemp -d /tmp/narrator-cp.XXXXXX)"
chmod 755 "$WORK"
OUT="${OUT:-$WORK}"
mkdir -p "$OUT"
PG_PORT="${PG_PORT:-5462}"
METRICS_PORT="${METRICS_PORT:-9477}"
VHOST="narrator-cp-$$"
worker=""
cleanup() {
    set +e
    [[ -n "$worker" ]] && kill "$worker" 2>/dev/null && wait "$worker" 2>/dev/null
    private_pg_stop "$WORK"
    rabbitmqctl -q delete_vhost "$VHOST" >/dev/null 2>&1
    [[ "$OUT" == "$WORK" ]] || rm -rf "$WORK"
}
trap cleanup EXIT
private_pg_start "$WORK" "$PG_PORT" || die "cannot start a private PostgreSQL"
PSQL=(psql -X -qtA -h 127.0.0.1 -p "$PG_PORT" -U postgres)
rabbitmqctl -q add_vhost "$VHOST" >/dev/null
rabbitmqctl -q set_permissions -p "$VHOST" guest '.*' '.*' '.*' >/dev/null
export NARRATOR_AMQP_URL="amqp://guest:guest@127.0.0.1:5672/$VHOST"
say "private PostgreSQL :$PG_PORT with pg_stat_statements; vhost $VHOST; files in $OUT"

# Read from another database: a session on the job's would count its own reading.
pg_db() {
    "${PSQL[@]}" -d postgres -c "SELECT xact_commit + xact_rollback, tup_inserted, tup_updated, \
        tup_deleted, tup_returned, tup_fetched FROM pg_stat_database WHERE datname = '$1'"
}
# pg_stat_database is written when a backend flushes (at the latest when it exits):
# read until two looks a second apart agree.
settled() {
    local a b
    a="$(pg_db "$1")"
    for _ in $(seq 20); do
        sleep 1
        b="$(pg_db "$1")"
        [[ "$a" == "$b" ]] && break
        a="$b"
    done
    echo "$a"
}

for N in "${SIZES[@]}"; do
    DB="cp_$N"
    "${PSQL[@]}" -d postgres -c "CREATE DATABASE $DB" >/dev/null
    export NARRATOR_DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/$DB"
    "$BIN" migrate >/dev/null
    python3 ops/bench/cluster_text.py "$N" "$WORK/book_$N.md"
    "$BIN" --log info worker --engine null --id "cp-$N" --listen "127.0.0.1:$METRICS_PORT" \
        2>"$WORK/worker_$N.log" &
    worker=$!
    for _ in $(seq 600); do grep -qs "worker cp-$N ready" "$WORK/worker_$N.log" && break; sleep 0.2; done
    grep -q "worker cp-$N ready" "$WORK/worker_$N.log" || die "worker not ready: $(tail -n 5 "$WORK/worker_$N.log")"
    before="$(settled "$DB")"
    "${PSQL[@]}" -d postgres -c "SELECT pg_stat_statements_reset()" >/dev/null
    t0=$(date +%s.%N)
    job="$("$BIN" submit "$WORK/book_$N.md" --format wav --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')"
    polls=0
    while :; do
        state="$("$BIN" status "$job" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')"
        polls=$((polls + 1))
        [[ "$state" == done || "$state" == failed || "$state" == cancelled ]] && break
        sleep 1
    done
    "$BIN" status "$job" --wait --json >/dev/null || die "job of $N segments ended $state: $(tail -n 5 "$WORK/worker_$N.log")"
    t1=$(date +%s.%N)
    # The worker's client-side counts of RabbitMQ and S3 operations (its /metrics).
    curl -fsS "http://127.0.0.1:$METRICS_PORT/metrics" >"$OUT/metrics_$N.txt" || : >"$OUT/metrics_$N.txt"
    kill -TERM "$worker"
    wait "$worker" || true
    worker=""
    after="$(settled "$DB")"
    dbid="$("${PSQL[@]}" -d "$DB" -c "SELECT oid FROM pg_database WHERE datname = '$DB'")"
    "${PSQL[@]}" -d postgres -F $'\t' -c "SELECT calls, rows, shared_blks_hit + shared_blks_read, \
        round((total_plan_time + total_exec_time)::numeric, 3), \
        regexp_replace(query, '\s+', ' ', 'g') FROM pg_stat_statements WHERE dbid = $dbid \
        AND query !~* 'pg_stat_statements|pg_stat_database|^(BEGIN|COMMIT|ROLLBACK)'" >"$OUT/statements_$N.tsv"
    echo "$N|$before|$after|$polls|$t0|$t1" >>"$OUT/totals.txt"
    # The book's audio leaves the S3 test server (gigabytes at 20,000 segments).
    "$BIN" jobs prune --older-than 0s --delete-outputs >/dev/null
    say "$N segments: done in $(python3 -c "print(round($t1 - $t0, 1))") s, $polls status polls"
done
python3 ops/bench/control_plane_report.py "$OUT"
