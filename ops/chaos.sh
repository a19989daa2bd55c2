#!/usr/bin/env bash
# The chaos run (not in CI): books through several workers while infrastructure faults
# are injected at random times, then a table of what happened. Everything runs on this
# machine, on private services of its own (the shared Postgres/RabbitMQ/S3 are untouched):
# a Postgres cluster (initdb), a RabbitMQ node and an s3s-fs server, each on its own port.
#
#   bash ops/chaos.sh [--minutes 10] [--books 10] [--workers 3] [--engine onnx|null]
#                     [--priority] [--seed N] [--drain-minutes 20] [--out DIR]
#
# Books: alice29.txt split into --books parts by chapter (by paragraph runs of about equal
# length when there are more books than chapters). --priority holds the last part back and
# submits it 60 s later with --priority 1, into the running backlog; the table then says
# when it finished against the others. BIN=PATH runs another build (e.g. a commit's, built
# in a worktree) instead of this tree's release build. Workers run under a restart
# loop (as a supervisor would restart them), with ids chaos:1..N that are reused after
# every restart. Faults, one at a time, every 20-50 s:
#   broker_restart  rabbitmqctl stop_app, 5-15 s, start_app
#   db_restart      pg_ctl stop -m fast, 3-10 s, start
#   s3_outage       the object store killed, 10-40 s, started again
#   worker_kill     SIGKILL of a random worker (restarted under the same id)
# After --minutes the faults stop and the books get up to --drain-minutes to finish.
# Then, per job: state, segments done/total, every segment once and in order in the
# manifest, intermediates left; and the table: faults by kind, jobs done, segments lost,
# duplicated, stuck, and the longest recovery (a fault's end to the next segment done).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MINUTES=10 BOOKS=10 WORKERS=3 ENGINE=onnx SEED=$RANDOM DRAIN=20 OUT="" PRIORITY=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --minutes) MINUTES="$2"; shift 2 ;;
        --books) BOOKS="$2"; shift 2 ;;
        --workers) WORKERS="$2"; shift 2 ;;
        --engine) ENGINE="$2"; shift 2 ;;
        --priority) PRIORITY=1; shift ;;
        --seed) SEED="$2"; shift 2 ;;
        --drain-minutes) DRAIN="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        -h | --help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "chaos: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
RANDOM=$SEED
say() { printf '[chaos %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf 'chaos: ERROR: %s\n' "$*" >&2; exit 1; }

CORPUS=""
for c in "$ROOT/../shared/corpus/alice29.txt" /work/shared/corpus/alice29.txt; do
    [[ -f "$c" ]] && CORPUS="$c" && break
done
[[ -n "$CORPUS" ]] || die "alice29.txt not found in ../shared/corpus"
bash "$ROOT/ops/setup.sh" --with-s3 >/dev/null
if [[ -z "${BIN:-}" ]]; then
    (cd "$ROOT" && cargo build --release -q -p narrator)
    BIN="$ROOT/target/release/narrator"
fi
S3BIN="$ROOT/.deps/s3/s3s-fs/bin/s3s-fs"

WORK="$(mktemp -d /tmp/narrator-chaos.XXXXXX)"
chmod 755 "$WORK" # the postgres and rabbitmq users reach their folders inside
OUT="${OUT:-$WORK}"
mkdir -p "$OUT"
PG_PORT=5452 AMQP_PORT=5692 S3_PORT=9030
NODE="narrator-chaos@localhost"
PIDS=()
cleanup() {
    set +e
    touch "$WORK/stop"
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
    pkill -f "narrator-chaos-worker" 2>/dev/null
    pkill -KILL -f "$BIN .*worker --id chaos:" 2>/dev/null
    [[ -f "$WORK/s3.pid" ]] && kill "$(cat "$WORK/s3.pid")" 2>/dev/null
    rabbitmqctl -q -n "$NODE" stop >/dev/null 2>&1
    runuser -u postgres -- pg_ctl -D "$WORK/pg/data" -m immediate stop >/dev/null 2>&1
    [[ "$OUT" == "$WORK" ]] || rm -rf "$WORK"
}
trap cleanup EXIT

# ---- private services -------------------------------------------------------------------
say "services in $WORK (Postgres :$PG_PORT, RabbitMQ :$AMQP_PORT, s3s-fs :$S3_PORT)"
mkdir -p "$WORK/pg" "$WORK/rabbit" "$WORK/s3/narrator"
chown -R postgres:postgres "$WORK/pg"
chown -R rabbitmq:rabbitmq "$WORK/rabbit"
runuser -u postgres -- initdb -A trust -U postgres --no-sync -D "$WORK/pg/data" >/dev/null
pg_up() {
    runuser -u postgres -- pg_ctl -w -D "$WORK/pg/data" -l "$WORK/pg/log" \
        -o "-p $PG_PORT -k $WORK/pg -c listen_addresses=127.0.0.1" start >/dev/null
}
pg_down() { runuser -u postgres -- pg_ctl -w -D "$WORK/pg/data" -m fast stop >/dev/null; }
pg_up
echo '[].' >"$WORK/rabbit/enabled_plugins"
chown rabbitmq:rabbitmq "$WORK/rabbit/enabled_plugins"
RABBITMQ_NODENAME=$NODE RABBITMQ_NODE_PORT=$AMQP_PORT RABBITMQ_DIST_PORT=$((AMQP_PORT + 20000)) \
    RABBITMQ_MNESIA_BASE="$WORK/rabbit/mnesia" RABBITMQ_LOG_BASE="$WORK/rabbit/log" \
    RABBITMQ_PID_FILE="$WORK/rabbit/pid" RABBITMQ_ENABLED_PLUGINS_FILE="$WORK/rabbit/enabled_plugins" \
    RABBITMQ_CONFIG_FILE="$WORK/rabbit/none" RABBITMQ_ADVANCED_CONFIG_FILE="$WORK/rabbit/none.config" \
    rabbitmq-server -detached </dev/null
for _ in $(seq 120); do
    rabbitmqctl -q -n "$NODE" await_startup --timeout 60 >/dev/null 2>&1 && break
    sleep 0.5
done
s3_up() {
    setsid "$S3BIN" --host 127.0.0.1 --port $S3_PORT --access-key narrator \
        --secret-key narrator-secret "$WORK/s3" >>"$WORK/s3.log" 2>&1 </dev/null &
    echo $! >"$WORK/s3.pid"
    for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$S3_PORT) 2>/dev/null && break; sleep 0.1; done
}
s3_down() { kill -9 "$(cat "$WORK/s3.pid")" 2>/dev/null; sleep 0.2; }
s3_up

export NARRATOR_DATA_DIR="$ROOT/.deps"
export NARRATOR_DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres"
export NARRATOR_AMQP_URL="amqp://guest:guest@127.0.0.1:$AMQP_PORT/%2f"
export NARRATOR_S3_ENDPOINT="http://127.0.0.1:$S3_PORT" NARRATOR_S3_BUCKET=narrator
export AWS_ACCESS_KEY_ID=narrator AWS_SECRET_ACCESS_KEY=narrator-secret AWS_REGION=us-east-1
sql() { psql -X -At -h 127.0.0.1 -p $PG_PORT -U postgres -d postgres -c "$1"; }
"$BIN" migrate >/dev/null

# ---- books ------------------------------------------------------------------------------
mkdir -p "$WORK/books"
python3 - "$CORPUS" "$WORK/books" "$BOOKS" <<'EOF'
import re, sys, pathlib
text = open(sys.argv[1], encoding="utf-8", errors="replace").read()
parts = re.split(r"(?m)^\s*(?=CHAPTER [IVXL]+\s*$)", text)
chapters = [p for p in parts if p.lstrip().startswith("CHAPTER")]
n = int(sys.argv[3])
if len(chapters) >= n:
    books = [[] for _ in range(n)]
    for i, c in enumerate(chapters):
        books[min(i, n - 1)].append(c)
else:
    # More books than chapters: contiguous runs of paragraphs of about equal length.
    paras = [p for c in chapters for p in re.split(r"\n\s*\n", c) if p.strip()]
    share = sum(map(len, paras)) / n
    books, size = [[]], 0
    for p in paras:
        if size >= share and len(books) < n:
            books.append([])
            size = 0
        books[-1].append(p)
        size += len(p)
for i, b in enumerate(books):
    if b:
        pathlib.Path(sys.argv[2], f"alice-{i + 1:02d}.txt").write_text("\n\n".join(b), encoding="utf-8")
EOF
if (( PRIORITY )); then
    mkdir -p "$WORK/priority"
    last=$(ls "$WORK/books" | sort | tail -n 1)
    mv "$WORK/books/$last" "$WORK/priority/"
fi

# ---- workers under a restart loop ----------------------------------------------------------
for n in $(seq "$WORKERS"); do
    (
        exec -a narrator-chaos-worker bash -c '
            while [[ ! -f "$0/stop" ]]; do
                "$1" --log warn worker --id "chaos:$2" --engine "$3" --heartbeat 2 --lease 60 \
                    --broker-timeout 60 --reconcile-after 10 --intra-threads 1 --sessions 1 \
                    >>"$0/worker-$2.log" 2>&1
                echo "exit $? at $(date +%s)" >>"$0/worker-$2.exits"
                sleep 1
            done' "$WORK" "$BIN" "$n" "$ENGINE"
    ) &
    PIDS+=($!)
done
sleep 5
START=$(date +%s)
"$BIN" submit "$WORK/books" --format opus --json >"$WORK/jobs.jsonl"
say "submitted $(wc -l <"$WORK/jobs.jsonl") books ($(jq -s 'map(.segments) | add' "$WORK/jobs.jsonl") segments), $WORKERS workers, engine $ENGINE, seed $SEED"
PRIORITY_JOB="" PRIORITY_PID=""
if (( PRIORITY )); then
    (
        sleep 60
        "$BIN" submit "$WORK/priority" --format opus --priority 1 --json >"$WORK/priority.jsonl"
    ) &
    PRIORITY_PID=$!
fi

# ---- faults -----------------------------------------------------------------------------
: >"$WORK/faults.tsv"
fault() { # kind start end
    printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$WORK/faults.tsv"
    say "fault $1: $(( $3 - $2 )) s"
}
END=$(( START + MINUTES * 60 ))
while (( $(date +%s) < END )); do
    sleep $(( 20 + RANDOM % 31 ))
    (( $(date +%s) < END )) || break
    t0=$(date +%s)
    case $(( RANDOM % 4 )) in
        0) rabbitmqctl -q -n "$NODE" stop_app >/dev/null; sleep $(( 5 + RANDOM % 11 ))
           rabbitmqctl -q -n "$NODE" start_app >/dev/null; fault broker_restart "$t0" "$(date +%s)" ;;
        1) pg_down; sleep $(( 3 + RANDOM % 8 )); pg_up; fault db_restart "$t0" "$(date +%s)" ;;
        2) s3_down; sleep $(( 10 + RANDOM % 31 )); s3_up; fault s3_outage "$t0" "$(date +%s)" ;;
        3) victim=$(( 1 + RANDOM % WORKERS ))
           pkill -KILL -f "$BIN --log warn worker --id chaos:$victim " || true
           fault worker_kill "$t0" "$(date +%s)" ;;
    esac
done
say "faults over; draining (up to $DRAIN min)"
DEADLINE=$(( $(date +%s) + DRAIN * 60 ))
while (( $(date +%s) < DEADLINE )); do
    open=$(sql "SELECT count(*) FROM jobs WHERE state NOT IN ('done', 'failed', 'cancelled')")
    [[ "$open" == 0 ]] && break
    sleep 5
done
FINISH=$(date +%s)
if [[ -n "$PRIORITY_PID" ]]; then
    wait "$PRIORITY_PID" || say "the priority book's submit failed"
    cat "$WORK/priority.jsonl" >>"$WORK/jobs.jsonl"
    PRIORITY_JOB=$(jq -r .job_id "$WORK/priority.jsonl")
fi

# ---- checks and the table -------------------------------------------------------------------
jobs_total=0 jobs_done=0 lost=0 duplicated=0 stuck=0 left=0
# Segments dead-lettered or given up: every segment of these books is healthy, so any is a
# failure the faults caused.
failed_segments=$(sql "SELECT count(*) FROM segments WHERE state = 'failed'")
while read -r line; do
    job=$(jq -r .job_id <<<"$line")
    jobs_total=$((jobs_total + 1))
    state=$(sql "SELECT state FROM jobs WHERE id = '$job'")
    total=$(sql "SELECT segments_total FROM jobs WHERE id = '$job'")
    done_=$(sql "SELECT count(*) FROM segments WHERE job_id = '$job' AND state = 'done'")
    lost=$(( lost + total - done_ ))
    case "$state" in
        done) jobs_done=$((jobs_done + 1))
              url=$("$BIN" status "$job" --json | jq -r '.outputs[] | select(.kind == "manifest") | .url')
              curl -fsS "$url" -o "$WORK/manifest-$job.json"
              dups=$(jq '[.segments[].index] | length - (unique | length)' "$WORK/manifest-$job.json")
              inorder=$(jq "[.segments[].index] == [range(0; $total)]" "$WORK/manifest-$job.json")
              duplicated=$(( duplicated + dups ))
              [[ "$inorder" == true ]] || { say "job $job: manifest segments not 0..$total in order"; duplicated=$((duplicated + 1)); }
              n=$(find "$WORK/s3/narrator/jobs/$job" \( -path '*/segments/*' -o -path '*/packs/*' \) -type f 2>/dev/null | wc -l)
              left=$(( left + n )) ;;
        failed|cancelled) say "job $job ended $state: $(sql "SELECT failure_reason FROM jobs WHERE id = '$job'")" ;;
        *) stuck=$((stuck + 1)) ;;
    esac
done <"$WORK/jobs.jsonl"

longest=0
while IFS=$'\t' read -r kind t0 t1; do
    next=$(sql "SELECT coalesce(extract(epoch FROM min(done_at))::bigint, 0) FROM segments WHERE done_at > to_timestamp($t1)")
    if (( next > 0 )); then
        rec=$(( next - t1 ))
        (( rec > longest )) && longest=$rec
    fi
done <"$WORK/faults.tsv"
restarts=$(cat "$WORK"/worker-*.exits 2>/dev/null | wc -l)
priority_line=""
if [[ -n "$PRIORITY_JOB" ]]; then
    priority_line=$(sql "WITH f AS (SELECT id, extract(epoch FROM finished_at - to_timestamp($START))::int AS t FROM jobs)
        SELECT format('The priority book (submitted at 60 s, %s segments) finished at %s s; the other books from %s s to %s s (median %s s), %s of them after it.',
            (SELECT segments_total FROM jobs WHERE id = '$PRIORITY_JOB'),
            (SELECT t FROM f WHERE id = '$PRIORITY_JOB'),
            min(t), max(t), percentile_disc(0.5) WITHIN GROUP (ORDER BY t),
            count(*) FILTER (WHERE t > (SELECT t FROM f WHERE id = '$PRIORITY_JOB')))
        FROM f WHERE id <> '$PRIORITY_JOB'")
fi

{
    echo "## Chaos run $(date -u +%Y-%m-%dT%H:%MZ): $MINUTES min of faults, $BOOKS books, $WORKERS workers, engine $ENGINE, seed $SEED"
    echo
    echo "| fault | injected |"
    echo "|---|---|"
    for k in broker_restart db_restart s3_outage worker_kill; do
        echo "| $k | $(grep -c "^$k" "$WORK/faults.tsv" || true) |"
    done
    echo
    echo "| jobs | done | segments lost | duplicated | stuck | segments failed | intermediates left | longest recovery | worker restarts | wall |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    echo "| $jobs_total | $jobs_done | $lost | $duplicated | $stuck | $failed_segments | $left | ${longest} s | $restarts | $(( FINISH - START )) s |"
    [[ -z "$priority_line" ]] || { echo; echo "$priority_line"; }
} | tee "$OUT/chaos-table.md"
cp "$WORK/faults.tsv" "$OUT/faults.tsv" 2>/dev/null || true
(( lost == 0 && duplicated == 0 && stuck == 0 && failed_segments == 0 && jobs_done == jobs_total ))
