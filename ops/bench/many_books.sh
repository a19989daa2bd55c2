#!/usr/bin/env bash
# Many books at once through several workers (issue 32): BOOKS books of SEGMENTS
# generated one-sentence segments each, submitted together (one `narrator submit DIR`),
# through WORKERS worker processes on this machine, on a private PostgreSQL with
# pg_stat_statements and the shared RabbitMQ (a fresh vhost) and S3 test server.
#
#   bash ops/bench/many_books.sh [--books 50] [--segments 1000] [--workers 4]
#                                [--engine null|voice]   (voice: the default Piper voice)
#   BIN=PATH measures another build (e.g. an older commit's) the same way.
#
# Prints: wall time, jobs per minute, segments per second; CPU-ms per segment of each
# service (Postgres: the postmaster and every backend, exited ones included; RabbitMQ's
# beam.smp, which the shared node also spends on other vhosts, so an upper bound; the S3
# server; the workers; submit); Postgres connections and RabbitMQ connections/channels
# held at most; when each book got its first and its last segment (the spread of finish
# times, and how many books were in progress at once); the workers' RabbitMQ operations
# and S3 requests and bytes per segment (their /metrics); and the statements that did the
# most Postgres work. Raw samples in $OUT (a new temporary folder unless set).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
BOOKS=50 SEGMENTS=1000 WORKERS=4 ENGINE=null
while (($#)); do
    case "$1" in
    --books) BOOKS="$2"; shift 2 ;;
    --segments) SEGMENTS="$2"; shift 2 ;;
    --workers) WORKERS="$2"; shift 2 ;;
    --engine) ENGINE="$2"; shift 2 ;;
    *) echo "usage: $0 [--books N] [--segments N] [--workers N] [--engine null|voice]" >&2; exit 2 ;;
    esac
done
BENCH=many-books
source "$ROOT/ops/bench/lib.sh"
bench_prepare
WORK="$(mktemp -d /tmp/narrator-mb.XXXXXX)"
OUT="${OUT:-$WORK}"
mkdir -p "$OUT"
PG_PORT="${PG_PORT:-5463}"
METRICS_PORT="${METRICS_PORT:-9480}"
VHOST="narrator-mb-$$"
PIDS=()
cleanup() {
    set +e
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    private_pg_stop "$WORK"
    rabbitmqctl -q delete_vhost "$VHOST" >/dev/null 2>&1
    [[ "$OUT" == "$WORK" ]] || rm -rf "$WORK"
}
trap cleanup EXIT
private_pg_start "$WORK" "$PG_PORT" || die "cannot start a private PostgreSQL"
PSQL=(psql -X -qtA -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres)
rabbitmqctl -q add_vhost "$VHOST" >/dev/null
rabbitmqctl -q set_permissions -p "$VHOST" guest '.*' '.*' '.*' >/dev/null
export NARRATOR_AMQP_URL="amqp://guest:guest@127.0.0.1:5672/$VHOST"
export NARRATOR_DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres"
"$BIN" migrate >/dev/null
mkdir -p "$WORK/books"
for b in $(seq "$BOOKS"); do
    python3 ops/bench/cluster_text.py "$SEGMENTS" "$WORK/books/book$(printf %03d "$b").md" \
        --first $(((b - 1) * SEGMENTS)) 2>/dev/null
done
engine=(--engine null)
[[ "$ENGINE" == voice ]] && engine=()
ready() {
    for _ in $(seq 900); do grep -qs "worker mb-$1 ready" "$WORK/worker$1.log" && return; sleep 0.2; done
    die "worker mb-$1 not ready: $(tail -n 3 "$WORK/worker$1.log")"
}
# The first worker declares the queues alone: several declaring the same new quorum
# queues at once have had the broker answer INTERNAL_ERROR to one's consume.
for w in $(seq "$WORKERS"); do
    "$BIN" --log info worker "${engine[@]}" --id "mb-$w" --listen "127.0.0.1:$((METRICS_PORT + w))" \
        2>"$WORK/worker$w.log" &
    PIDS+=($!)
    ((w == 1)) && ready 1
done
for w in $(seq 2 "$WORKERS"); do ready "$w"; done
say "$BOOKS books x $SEGMENTS segments, $WORKERS workers (engine $ENGINE), Postgres :$PG_PORT, vhost $VHOST; files in $OUT"

beam="$(pgrep -o beam.smp || echo 0)"
s3="$(pgrep -o -f 's3s-fs' || echo 0)"
cpu() {
    local w=0 p
    for p in "${PIDS[@]}"; do w=$((w + $(ticks "$p"))); done
    echo "$(pg_ticks "$WORK") $(ticks "$beam") $(ticks "$s3") $w"
}
"${PSQL[@]}" -c "SELECT pg_stat_statements_reset()" >/dev/null
cpu0="$(cpu)"
t0=$(date +%s.%N)
submit_t0=$(date +%s%N)
# `times` in the subshell: its children's (submit's) user and system CPU, second line.
(
    "$BIN" submit "$WORK/books" --format wav --json >"$WORK/submit.json"
    times >"$WORK/submit.times" # not in a pipeline: a forked `times` counts no children
    sed -n 2p "$WORK/submit.times" >"$WORK/submit.time"
)
submit_s=$(python3 -c "print(($(date +%s%N) - $submit_t0) / 1e9)")
: >"$OUT/samples.txt"
while :; do
    now=$(date +%s.%N)
    pgc="$("${PSQL[@]}" -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'")"
    amqp="$(rabbitmqctl -q list_connections vhost channels 2>/dev/null | awk -v v="$VHOST" '$1 == v {c++; ch += $2} END {print c + 0, ch + 0}')"
    left="$("${PSQL[@]}" -c "SELECT count(*) FROM jobs WHERE state NOT IN ('done', 'failed', 'cancelled')")"
    echo "$now $pgc $amqp $left" >>"$OUT/samples.txt"
    ((left == 0)) && break
    sleep 1
done
t1=$(date +%s.%N)
cpu1="$(cpu)"
# The workers' client-side counts of RabbitMQ operations and S3 requests (their /metrics).
for w in $(seq "$WORKERS"); do
    curl -fsS "http://127.0.0.1:$((METRICS_PORT + w))/metrics" || true
done >"$OUT/metrics.txt"
"${PSQL[@]}" -F ' ' -c "SELECT extract(epoch FROM started_at), extract(epoch FROM finished_at), \
    segments_total, state FROM jobs ORDER BY created_at" >"$OUT/jobs.txt"
"${PSQL[@]}" -F $'\t' -c "SELECT calls, rows, shared_blks_hit + shared_blks_read, \
    round((total_plan_time + total_exec_time)::numeric, 3), regexp_replace(query, '\s+', ' ', 'g') \
    FROM pg_stat_statements WHERE query !~* 'pg_stat_statements|pg_stat_activity|^(BEGIN|COMMIT|ROLLBACK)' \
      AND dbid = (SELECT oid FROM pg_database WHERE datname = 'postgres') \
    ORDER BY shared_blks_hit + shared_blks_read DESC" >"$OUT/statements.tsv"
# "0m1.234s 0m0.567s" -> seconds
# The books' audio leaves the S3 test server (gigabytes).
"$BIN" jobs prune --older-than 0s --delete-outputs >/dev/null
read -r su ss < <(awk '{for (i = 1; i <= 2; i++) {split($i, p, "m"); sub("s", "", p[2]); printf "%s ", p[1] * 60 + p[2]}; print ""}' "$WORK/submit.time")
python3 - "$OUT" "$BOOKS" "$SEGMENTS" "$WORKERS" "$ENGINE" "$t0" "$t1" "$cpu0" "$cpu1" "$su" "$ss" "$submit_s" "$(getconf CLK_TCK)" "$ROOT/ops/bench" <<'PY'
import statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
books, segs, workers, engine = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
t0, t1 = float(sys.argv[6]), float(sys.argv[7])
c0 = [int(x) for x in sys.argv[8].split()]
c1 = [int(x) for x in sys.argv[9].split()]
su, ss, submit_s, hz = float(sys.argv[10]), float(sys.argv[11]), float(sys.argv[12]), int(sys.argv[13])
n = books * segs
wall = t1 - t0
print(f"{books} books x {segs} segments = {n:,} segments, {workers} workers, engine {engine}")
print(f"wall {wall:.1f} s (submit {submit_s:.1f} s of it): {books / wall * 60:.1f} jobs/min, {n / wall:.0f} segments/s")
names = ["postgres", "rabbitmq (beam.smp, whole node)", "s3 server", "workers"]
cpu = [(b - a) * 1000 / hz for a, b in zip(c0, c1)]
cpu.append((su + ss) * 1000)
names.append("submit")
print("CPU-ms per segment: " + ", ".join(f"{k} {v / n:.3f}" for k, v in zip(names, cpu))
      + f"; all {sum(cpu) / n:.3f} (of {wall * 2000 / n:.3f} available on 2 cores)")
samples = [l.split() for l in (out / "samples.txt").read_text().splitlines()]
print(f"held at most: {max(int(s[1]) for s in samples)} Postgres connections, "
      f"{max(int(s[2]) for s in samples)} RabbitMQ connections with {max(int(s[3]) for s in samples)} channels")
jobs = [l.split() for l in (out / "jobs.txt").read_text().splitlines()]
starts = sorted(float(j[0]) - t0 for j in jobs if j[0])
ends = sorted(float(j[1]) - t0 for j in jobs if j[1])
states = {}
for j in jobs:
    states[j[3]] = states.get(j[3], 0) + 1
print(f"jobs: {states}")
print(f"first segment of each book: {starts[0]:.1f} s to {starts[-1]:.1f} s after submit began")
print(f"books finished: first {ends[0]:.1f} s, median {statistics.median(ends):.1f} s, last {ends[-1]:.1f} s")
spans = [(float(j[0]) - t0, float(j[1]) - t0) for j in jobs if j[0] and j[1]]
most = max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)
print(f"books in progress at once: at most {most}")
sys.path.insert(0, str(Path(sys.argv[14])))
from control_plane_report import round_trips
trips = {f"{m.removeprefix('narrator_').removesuffix('_total')} {v}": x
         for (m, v), x in round_trips(out / "metrics.txt").items()}
if trips:
    print("per segment, the workers' /metrics (submit's first windows not included): "
          + ", ".join(f"{k} {v / n:.3f}" for k, v in sorted(trips.items())))
rows = [l.split("\t", 4) for l in (out / "statements.tsv").read_text().splitlines()]
tot_pages = sum(int(r[2]) for r in rows) or 1
print("top statements by buffer pages (calls / rows / pages per segment):")
for r in rows[:8]:
    print(f"  {int(r[0]) / n:.3f} / {int(r[1]) / n:.2f} / {int(r[2]) / n:.2f}  {int(r[2]) * 100 // tot_pages}%  {r[4][:100]}")
PY
