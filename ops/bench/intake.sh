#!/usr/bin/env bash
# The producers' intake (issue 44, docs/PRODUCERS.md), measured with pika.
#
#   bash ops/bench/intake.sh [--requests 2000] [--segments 20] [--workers 2]
#                            [--latency 20] [--no-flood] [--no-latency]
#   BIN=PATH measures another build the same way.
#
# flood: REQUESTS requests, each a book of SEGMENTS one-sentence segments, published at
# once by 4 pika producers (ops/bench/intake_publish.py) to WORKERS null-engine workers
# whose engines are held (NARRATOR_TEST_RUN_MS: a run takes 10 min), so what is measured
# is the intake alone: read, plan, record, first window, reply, ack. Prints the requests
# accepted per second (the last reply against the common start), the Postgres statements
# and transactions per request (a private PostgreSQL with pg_stat_statements: the top
# statements by calls), and the workers' RabbitMQ publishes per request (their /metrics;
# each request is also one delivery and one ack, which they do not count), with the
# workers' and Postgres' CPU.
#
# latency: LATENCY one-sentence requests with the real voice (en_US-joe-medium), one after
# the other, through WORKERS workers: request -> reply and request -> job.done (its event
# on narrator.events), median and p95.
#
# Services as many_books.sh: a private PostgreSQL, the shared RabbitMQ (a fresh vhost per
# phase), the S3 test server. Raw files in $OUT (a new temporary folder unless set).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
REQUESTS=2000 SEGMENTS=20 WORKERS=2 LATENCY=20 FLOOD=1 LAT=1
while (($#)); do
    case "$1" in
    --requests) REQUESTS="$2"; shift 2 ;;
    --segments) SEGMENTS="$2"; shift 2 ;;
    --workers) WORKERS="$2"; shift 2 ;;
    --latency) LATENCY="$2"; shift 2 ;;
    --no-flood) FLOOD=0; shift ;;
    --no-latency) LAT=0; shift ;;
    *) echo "usage: $0 [--requests N] [--segments N] [--workers N] [--latency N] [--no-flood] [--no-latency]" >&2; exit 2 ;;
    esac
done
BENCH=intake
source "$ROOT/ops/bench/lib.sh"
PY="$ROOT/.deps/clients-venv/bin/python"
[[ -x "$PY" ]] || die "no pika: run \`bash ops/setup.sh --test\` (it makes .deps/clients-venv)"
bench_prepare
WORK="$(mktemp -d /tmp/narrator-intake.XXXXXX)"
OUT="${OUT:-$WORK}"
mkdir -p "$OUT"
PG_PORT="${PG_PORT:-5464}"
METRICS_PORT="${METRICS_PORT:-9490}"
PIDS=()
VHOSTS=()
stop_workers() {
    for p in "${PIDS[@]}"; do kill -s "${1:-TERM}" "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    PIDS=()
}
cleanup() {
    set +e
    stop_workers
    private_pg_stop "$WORK"
    for v in "${VHOSTS[@]}"; do rabbitmqctl -q delete_vhost "$v" >/dev/null 2>&1; done
    [[ "$OUT" == "$WORK" ]] || rm -rf "$WORK"
}
trap cleanup EXIT
private_pg_start "$WORK" "$PG_PORT" || die "cannot start a private PostgreSQL"
PSQL=(psql -X -qtA -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres)
export NARRATOR_DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres"

# A fresh vhost and database state for a phase; WORKERS workers started with "$@".
phase() {
    local name="$1"
    shift
    local vhost="narrator-intake-$name-$$"
    VHOSTS+=("$vhost")
    rabbitmqctl -q add_vhost "$vhost" >/dev/null
    rabbitmqctl -q set_permissions -p "$vhost" guest '.*' '.*' '.*' >/dev/null
    export NARRATOR_AMQP_URL="amqp://guest:guest@127.0.0.1:5672/$vhost"
    "${PSQL[@]}" -c "DROP SCHEMA public CASCADE; CREATE SCHEMA public; CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null
    "$BIN" migrate >/dev/null
    for w in $(seq "$WORKERS"); do
        "$BIN" --log info worker --id "in-$w" --listen "127.0.0.1:$((METRICS_PORT + w))" "$@" \
            2>"$WORK/$name-worker$w.log" &
        PIDS+=($!)
        for _ in $(seq 1500); do grep -qs "worker in-$w ready" "$WORK/$name-worker$w.log" && break; sleep 0.2; done
        grep -qs "worker in-$w ready" "$WORK/$name-worker$w.log" \
            || die "worker in-$w not ready: $(tail -n 3 "$WORK/$name-worker$w.log")"
    done
}

worker_ticks() {
    local w=0 p
    for p in "${PIDS[@]}"; do w=$((w + $(ticks "$p"))); done
    echo "$w"
}
# Busy and total jiffies of the whole machine (/proc/stat's cpu line).
machine() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8}' /proc/stat; }
beam="$(pgrep -o beam.smp || echo 0)"
xacts() { "${PSQL[@]}" -c "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = 'postgres'"; }

if ((FLOOD)); then
    # The engines held: the workers only serve the intake (and its first windows).
    NARRATOR_TEST_RUN_MS=600000 phase flood --engine null
    say "flood: $REQUESTS requests x $SEGMENTS segments, $WORKERS workers; files in $OUT"
    "${PSQL[@]}" -c "SELECT pg_stat_statements_reset()" >/dev/null
    x0="$(xacts)" pg0="$(pg_ticks "$WORK")" w0="$(worker_ticks)" b0="$(ticks "$beam")" m0="$(machine)"
    "$PY" ops/bench/intake_publish.py flood "$NARRATOR_AMQP_URL" --requests "$REQUESTS" \
        --segments "$SEGMENTS" >"$OUT/flood.json"
    x1="$(xacts)" pg1="$(pg_ticks "$WORK")" w1="$(worker_ticks)" b1="$(ticks "$beam")" m1="$(machine)"
    for w in $(seq "$WORKERS"); do
        curl -fsS "http://127.0.0.1:$((METRICS_PORT + w))/metrics" || true
    done >"$OUT/flood-metrics.txt"
    "${PSQL[@]}" -F $'\t' -c "SELECT calls, rows, round((total_plan_time + total_exec_time)::numeric, 3), \
        regexp_replace(query, '\s+', ' ', 'g') FROM pg_stat_statements \
        WHERE query !~* 'pg_stat_statements|pg_stat_activity|pg_stat_database' \
          AND dbid = (SELECT oid FROM pg_database WHERE datname = 'postgres') \
        ORDER BY calls DESC" >"$OUT/flood-statements.tsv"
    jobs="$("${PSQL[@]}" -c "SELECT count(*) FROM jobs")"
    # Killed: a drain would wait for the held runs.
    stop_workers KILL
    "$PY" - "$OUT" "$REQUESTS" "$jobs" "$((x1 - x0))" "$pg0" "$pg1" "$w0" "$w1" "$(getconf CLK_TCK)" "$ROOT/ops/bench" "$b0" "$b1" "$m0" "$m1" <<'PY'
import json, sys
from pathlib import Path
out, n, jobs, xacts = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
pg0, pg1, w0, w1, hz = (int(x) for x in sys.argv[5:10])
f = json.loads((out / "flood.json").read_text())
print(f"flood: {f['requests']} requests x {f['segments_each']} segments from {f['producers']} pika producers: published and confirmed in "
      f"{f['confirmed_s']:.1f} s, last reply {f['last_reply_s']:.1f} s after the start: "
      f"{f['accepted_per_s']} accepted/s ({f['accepted']} accepted, {f['refused']} refused "
      f"{f['errors']}, {f['unanswered']} unanswered); {jobs} jobs recorded")
b0, b1 = int(sys.argv[11]), int(sys.argv[12])
(busy0, all0), (busy1, all1) = ([int(x) for x in a.split()] for a in sys.argv[13:15])
print(f"CPU-ms per request: Postgres {(pg1 - pg0) * 1000 / hz / n:.2f}, workers {(w1 - w0) * 1000 / hz / n:.2f}, "
      f"RabbitMQ (beam.smp, whole node) {(b1 - b0) * 1000 / hz / n:.2f}, the whole machine "
      f"{(busy1 - busy0) * 1000 / hz / n:.2f} (busy {100 * (busy1 - busy0) / max(1, all1 - all0):.0f} % "
      f"of its cores over the flood and its report's reads)")
rows = [l.split("\t", 3) for l in (out / "flood-statements.tsv").read_text().splitlines()]
calls = sum(int(r[0]) for r in rows if not r[3].upper().startswith(("BEGIN", "COMMIT", "ROLLBACK")))
print(f"Postgres per request: {calls / n:.2f} statements (BEGIN/COMMIT aside), {xacts / n:.2f} transactions")
for r in rows[:10]:
    print(f"  {int(r[0]) / n:6.2f} calls  {float(r[2]) / n:6.3f} ms  {r[3][:110]}")
sys.path.insert(0, sys.argv[10])
from control_plane_report import round_trips
trips = {f"{m.removeprefix('narrator_').removesuffix('_total')} {v}": x
         for (m, v), x in round_trips(out / "flood-metrics.txt").items()}
print("per request, the workers' /metrics: " + ", ".join(f"{k} {v / n:.2f}" for k, v in sorted(trips.items()))
      + " (besides: 1 delivery and 1 ack of the request)")
PY
fi

if ((LAT)); then
    phase latency
    say "latency: $LATENCY one-sentence requests with the real voice, $WORKERS workers"
    "$PY" ops/bench/intake_publish.py latency "$NARRATOR_AMQP_URL" --requests "$LATENCY" >"$OUT/latency.json"
    stop_workers
    "$PY" - "$OUT" <<'PY'
import json, sys
from pathlib import Path
l = json.loads((Path(sys.argv[1]) / "latency.json").read_text())
print(f"latency: {l['requests']} one-sentence requests, one at a time: request -> reply median "
      f"{l['reply_s']['median']:.3f} s, p95 {l['reply_s']['p95']:.3f} s; request -> job.done median "
      f"{l['done_s']['median']:.3f} s, p95 {l['done_s']['p95']:.3f} s")
PY
fi
