#!/usr/bin/env bash
# The comparison harness: on the same sentences and voice, back to back in each round, a raw
# ONNX Runtime loop (no narrator code: the physical limit here), Piper's CLI, `narrator run`
# (embedded) and the distributed path (submit -> one worker -> done); each one's throughput,
# its ratio to the raw loop and its peak RSS. Then the control plane alone with the null
# engine (segments per second end to end, and where the CPU time goes). Everything real on this
# machine: RabbitMQ 127.0.0.1:5672 (guest/guest), Postgres 127.0.0.1:5432 (user postgres,
# trust), S3 = s3s-fs via ops/s3-server.sh.
#
#   bash ops/bench-cluster.sh [--rounds N] [--null-segments N] [--book PATH]
#                             [--e2e-worker "ARGS"]... [--null-worker "ARGS"]... [--no-piper] [--only e2e|null] [--keep DIR]
#                             [--format wav|opus|mp3|m4b]
#
#   --rounds N          interleaved rounds of part 1 (default 3): raw, piper, embedded, distributed, ...
#   --null-segments N   segments of the generated text of part 2 (default 5000)
#   --book PATH         part 1's text (default: Chapter I of alice29.txt, as ops/bench-cpu.sh);
#                       a .txt is prepared like bench-cpu's --text; .md/.epub go to narrator
#                       as they are (no Piper arm then)
#   --e2e-worker ARGS   one more distributed arm per round, its worker started with these
#                       flags (repeatable), e.g. --e2e-worker "--no-spin"
#   --null-worker ARGS  worker flags for part 2 (repeatable: one measured run each).
#                       Default: two runs with the null engine's own plan (max-batch 32,
#                       prefetch 65): "" (silence of this voice's length: the audio bytes
#                       through S3 count) and "--null-samples-per-id 8" (1/48 of the
#                       audio: the control plane's own cost, requests and round trips)
#   --no-piper          no Piper and no raw arm (otherwise `ops/setup.sh --with-piper` is run
#                       first: both use its venv)
#   --only e2e|null     run one part only
#   --keep DIR          keep the work folder (texts, logs, per-run figures) in DIR
#   --format F          part 1's output format for the embedded and distributed arms
#                       (default wav, as Piper writes; `opus` puts the default format's
#                       encoding, and the distributed assembly's, into their figures)
#
# Part 1, per round: embedded = `narrator run BOOK --out TMP --format F --json` (process
# wall, model load included; the model-load share is read from its "engine ready" log
# line); distributed = fresh database + migrate, purged queue, ONE `narrator worker`
# started and waited for until "ready" (model load excluded: a worker is long-running),
# then submit start -> `narrator status JOB --wait` (one query per 0.1 s) says done; the worker is
# stopped with SIGTERM and must exit 0. Audio seconds from each tool's JSON (pauses 0).
# Part 2: the same with `narrator worker --engine null` (real phonemizer, S3, Postgres,
# RabbitMQ; silence instead of inference) on N short distinct sentences in 10 chapters.
# Isolation: a dedicated database and RabbitMQ vhost (both named narrator_bench, or
# $NARRATOR_BENCH_NAME), recreated here and dropped at the end, so other workers on the
# shared broker never see these messages. Nothing is written into the repository (work
# folder from mktemp; setup.sh fills .deps as usual). Report: Markdown on stdout.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROUNDS=3
NULL_SEGMENTS=5000
BOOK=""
NULL_WORKERS=()
E2E_WORKERS=()
NO_PIPER=0
ONLY=""
KEEP=""
FORMAT=wav
while (($#)); do
    case "$1" in
        --rounds) ROUNDS="${2:?--rounds needs N}"; shift 2 ;;
        --null-segments) NULL_SEGMENTS="${2:?--null-segments needs N}"; shift 2 ;;
        --book) BOOK="${2:?--book needs PATH}"; shift 2 ;;
        --null-worker) NULL_WORKERS+=("${2?--null-worker needs ARGS}"); shift 2 ;;
        --e2e-worker) E2E_WORKERS+=("${2?--e2e-worker needs ARGS}"); shift 2 ;;
        --no-piper) NO_PIPER=1; shift ;;
        --only) ONLY="${2:?--only needs e2e or null}"; shift 2 ;;
        --keep) KEEP="${2:?--keep needs DIR}"; shift 2 ;;
        --format) FORMAT="${2:?--format needs wav, opus, mp3 or m4b}"; shift 2 ;;
        -h | --help) sed -n '2,45p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench-cluster: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "bench-cluster: --rounds must be a positive integer" >&2; exit 2; }
[[ "$NULL_SEGMENTS" =~ ^[1-9][0-9]*$ ]] || { echo "bench-cluster: --null-segments must be a positive integer" >&2; exit 2; }
[[ -z "$ONLY" || "$ONLY" == e2e || "$ONLY" == null ]] || { echo "bench-cluster: --only takes e2e or null" >&2; exit 2; }
((${#NULL_WORKERS[@]})) || NULL_WORKERS=("" "--null-samples-per-id 8")

log() { printf 'bench-cluster: %s\n' "$*" >&2; }
die() { printf 'bench-cluster: ERROR: %s\n' "$*" >&2; exit 1; }
now() { date +%s.%N; }
load1() { cut -d' ' -f1 /proc/loadavg; }
for tool in psql createdb dropdb rabbitmqctl top python3 /usr/bin/time; do
    command -v "$tool" >/dev/null || die "needs $tool"
done
cd "$ROOT"

NAME="${NARRATOR_BENCH_NAME:-narrator_bench}"
[[ "$NAME" =~ ^[a-z_][a-z0-9_]*$ ]] || die "NARRATOR_BENCH_NAME must be a plain lower-case identifier"
VOICE="${NARRATOR_VOICE:-en_US-joe-medium}"
QUEUE="narrator.segments.$VOICE"
PG=(-h 127.0.0.1 -p 5432 -U postgres)
PAUSES=(--sentence-pause-ms 0 --paragraph-pause-ms 0 --chapter-pause-ms 0)

# ---- 1. build, dependencies, work folder ---------------------------------------------
log "building the release binary (shared target/, never cleaned)"
cargo build --release -p narrator --locked >&2
NARRATOR="${CARGO_TARGET_DIR:-$ROOT/target}/release/narrator"
[[ -x "$NARRATOR" ]] || die "missing $NARRATOR"
"$NARRATOR" voices >/dev/null || die "no voices: run bash ops/setup.sh"
PIPER="$ROOT/.deps/piper-venv/bin/piper"
PIPER_MODEL="$ROOT/.deps/voices/$VOICE.onnx"
RAW_PY="$ROOT/.deps/piper-venv/bin/python"
PIPER_ON=0
if ((!NO_PIPER)) && [[ "$ONLY" != null ]]; then
    if bash ops/setup.sh --with-piper >&2 && [[ -x "$PIPER" && -f "$PIPER_MODEL" ]]; then
        PIPER_ON=1
    else
        log "WARNING: no Piper arm (ops/setup.sh --with-piper failed or $PIPER is missing)"
    fi
fi

if [[ -n "$KEEP" ]]; then
    mkdir -p "$KEEP"
    WORK="$(cd "$KEEP" && pwd)"
else
    WORK="$(mktemp -d "${TMPDIR:-/tmp}/narrator-bench-cluster.XXXXXX")"
fi
mkdir -p "$WORK/runs"

# ---- 2. services: database, vhost, S3 -------------------------------------------------
psql "${PG[@]}" -d postgres -Atqc 'SELECT 1' >/dev/null || die "Postgres does not answer on 127.0.0.1:5432 as postgres"
(exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null || die "RabbitMQ does not answer on 127.0.0.1:5672"
export NARRATOR_DATABASE_URL="postgres://postgres@127.0.0.1:5432/$NAME"
export NARRATOR_AMQP_URL="amqp://guest:guest@127.0.0.1:5672/$NAME"
S3_STARTED=0
bash ops/s3-server.sh status >/dev/null 2>&1 || S3_STARTED=1
bash ops/s3-server.sh start >&2
eval "$(bash ops/s3-server.sh env)"
S3_DATA="$ROOT/.deps/s3/data/${NARRATOR_S3_BUCKET:-narrator}"

WORKER_PID=""
TOP_PID=""
JOBS_MADE=()
cleanup() {
    local rc=$?
    set +e
    [[ -n "$TOP_PID" ]] && { kill "$TOP_PID" 2>/dev/null; wait "$TOP_PID" 2>/dev/null; }
    [[ -n "$WORKER_PID" ]] && { kill -TERM "$WORKER_PID" 2>/dev/null; wait "$WORKER_PID" 2>/dev/null; }
    dropdb "${PG[@]}" --if-exists "$NAME" >/dev/null 2>&1
    rabbitmqctl delete_vhost "$NAME" >/dev/null 2>&1
    for j in "${JOBS_MADE[@]}"; do [[ -d "$S3_DATA/jobs/$j" ]] && rm -rf "${S3_DATA:?}/jobs/$j"; done
    ((S3_STARTED)) && bash ops/s3-server.sh stop >/dev/null 2>&1
    [[ -z "$KEEP" ]] && rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "RabbitMQ vhost $NAME (fresh), Postgres database $NAME (fresh per run), S3 ${NARRATOR_S3_ENDPOINT:-?}"
rabbitmqctl delete_vhost "$NAME" >/dev/null 2>&1 || true
rabbitmqctl add_vhost "$NAME" >/dev/null
rabbitmqctl set_permissions -p "$NAME" guest '.*' '.*' '.*' >/dev/null

fresh_db() {
    dropdb "${PG[@]}" --if-exists "$NAME" >/dev/null
    createdb "${PG[@]}" "$NAME"
    "$NARRATOR" migrate >/dev/null
}
purge_queue() { # tolerates a queue that does not exist yet
    rabbitmqctl -p "$NAME" purge_queue "$QUEUE" >/dev/null 2>&1 || true
}

# start_worker DIR ARGS...: starts a worker, waits for "ready"; sets WORKER_PID.
start_worker() {
    local dir="$1"
    shift
    local t0 t1
    t0=$(now)
    "$NARRATOR" worker --id "bench-cluster:$$" "$@" >"$dir/worker.stdout" 2>"$dir/worker.stderr" &
    WORKER_PID=$!
    until grep -qE '^worker .* ready$' "$dir/worker.stderr"; do
        if ! kill -0 "$WORKER_PID" 2>/dev/null; then
            wait "$WORKER_PID" || true
            WORKER_PID=""
            tail -5 "$dir/worker.stderr" >&2
            die "the worker exited before it was ready (log above)"
        fi
        if (($(date +%s) - ${t0%.*} > 300)); then die "the worker was not ready after 300 s"; fi
        sleep 0.05
    done
    t1=$(now)
    echo "worker_args=$*" >>"$dir/meta"
    echo "worker_ready_s=$(python3 -c "print(round($t1-$t0,3))")" >>"$dir/meta"
}
# stop_worker DIR: SIGTERM, wait, require exit status 0; records peak RSS.
stop_worker() {
    local dir="$1" rc=0 hwm
    hwm=$(awk '/^VmHWM:/{print $2}' "/proc/$WORKER_PID/status" 2>/dev/null || echo 0)
    kill -TERM "$WORKER_PID"
    wait "$WORKER_PID" || rc=$?
    WORKER_PID=""
    echo "worker_rss_kib=$hwm" >>"$dir/meta"
    echo "worker_rc=$rc" >>"$dir/meta"
    ((rc == 0)) || { tail -5 "$dir/worker.stderr" >&2; die "the worker exited $rc after SIGTERM (expected 0)"; }
}
# db_figures JOB > FILE: the job's timestamps (epoch s) and sums, key=value.
db_figures() {
    psql "${PG[@]}" -d "$NAME" -AtF= -c "
        WITH s AS (SELECT * FROM segment_figures WHERE job_id = '$1'),
             j AS (SELECT * FROM jobs WHERE id = '$1')
        SELECT k, v FROM (VALUES
          ('db_created_at',    (SELECT extract(epoch FROM created_at)  FROM j)::text),
          ('db_started_at',    (SELECT extract(epoch FROM started_at)  FROM j)::text),
          ('db_finished_at',   (SELECT extract(epoch FROM finished_at) FROM j)::text),
          ('db_first_published', (SELECT extract(epoch FROM min(published_at)) FROM s)::text),
          ('db_last_published',  (SELECT extract(epoch FROM max(published_at)) FROM s)::text),
          ('db_first_done',    (SELECT extract(epoch FROM min(done_at)) FROM s)::text),
          ('db_last_done',     (SELECT extract(epoch FROM max(done_at)) FROM s)::text),
          ('db_segments_done', (SELECT count(*) FROM s WHERE state = 'done')::text),
          ('db_segments',      (SELECT count(*) FROM s)::text),
          ('db_inference_s',   (SELECT sum(inference_seconds) FROM s)::text),
          ('db_median_batch',  (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY batch_size) FROM s)::text),
          ('db_max_attempts',  (SELECT max(attempts) FROM s)::text)
        ) AS t(k, v)"
}
forget_job_audio() { # the segment and output objects of JOB, when s3s-fs keeps them here
    [[ -d "$S3_DATA/jobs/$1" ]] && rm -rf "${S3_DATA:?}/jobs/$1"
    return 0
}
top_sampler() { # one filtered top frame (the second: the first has no interval) every ~1 s
    while :; do
        echo "=== $(now)"
        top -b -n 2 -d 0.5 -w 512 | awk '/^top -/{n++} n==2' |
            grep -E '^top -|^%Cpu|^ *PID|narrator|beam\.smp|postgres|s3s-fs' || true
        sleep 0.5
    done
}

# ---- 3. the texts ----------------------------------------------------------------------
TEXT="$WORK/book.txt"
if [[ -z "$BOOK" ]]; then
    CORPUS=""
    for c in /work/shared/corpus/alice29.txt "$ROOT/../shared/corpus/alice29.txt"; do
        [[ -f "$c" ]] && { CORPUS="$c"; break; }
    done
    [[ -n "$CORPUS" ]] || die "alice29.txt not found in /work/shared/corpus or ../shared/corpus (use --book)"
    python3 ops/bench/prepare_text.py "$CORPUS" "$TEXT"
    TEXT_DESC="alice29.txt Chapter I, one line per paragraph (ops/bench/prepare_text.py)"
else
    [[ -f "$BOOK" ]] || die "--book $BOOK: no such file"
    case "${BOOK,,}" in
        *.txt | *.text)
            python3 ops/bench/prepare_text.py --as-is "$BOOK" "$TEXT"
            TEXT_DESC="$(basename "$BOOK"), one line per paragraph" ;;
        *)
            TEXT="$(cd "$(dirname "$BOOK")" && pwd)/$(basename "$BOOK")"
            TEXT_DESC="$(basename "$BOOK") as given"
            PIPER_ON=0 ;;
    esac
fi
NULL_TEXT="$WORK/null-book.md"
python3 ops/bench/cluster_text.py "$NULL_SEGMENTS" "$NULL_TEXT"

# ---- 4. part 1: piper / embedded / distributed, interleaved ------------------------------
run_piper() {
    local dir="$WORK/runs/piper-r$1"
    mkdir -p "$dir"
    echo "arm=piper CLI" >"$dir/meta"; echo "round=$1" >>"$dir/meta"; echo "load_before=$(load1)" >>"$dir/meta"
    /usr/bin/time -f '%e %M %U %S' -o "$dir/time" \
        "$PIPER" -m "$PIPER_MODEL" -i "$TEXT" -f "$dir/piper.wav" >"$dir/stdout" 2>"$dir/stderr" ||
        { tail -5 "$dir/stderr" >&2; die "piper failed"; }
    echo "load_after=$(load1)" >>"$dir/meta"
    echo "audio_s=$(python3 -c 'import sys,wave; w=wave.open(sys.argv[1]); print(w.getnframes()/w.getframerate())' "$dir/piper.wav")" >>"$dir/meta"
    rm -f "$dir/piper.wav"
}
# The physical limit: a plain ONNX Runtime loop (Python onnxruntime, same version, same
# voice, Piper's own sentences and ids, batch 1), no narrator code; whole process timed.
run_raw() {
    local dir="$WORK/runs/raw-r$1"
    mkdir -p "$dir"
    echo "arm=raw ORT loop" >"$dir/meta"; echo "round=$1" >>"$dir/meta"; echo "load_before=$(load1)" >>"$dir/meta"
    /usr/bin/time -f '%e %M %U %S' -o "$dir/time" \
        "$RAW_PY" ops/bench/raw_ort.py -m "$PIPER_MODEL" -i "$TEXT" >"$dir/stdout" 2>"$dir/stderr" ||
        { tail -5 "$dir/stderr" >&2; die "the raw ONNX Runtime loop failed"; }
    echo "load_after=$(load1)" >>"$dir/meta"
}
run_embedded() {
    local dir="$WORK/runs/embedded-r$1"
    mkdir -p "$dir"
    echo "arm=embedded" >"$dir/meta"; echo "round=$1" >>"$dir/meta"; echo "load_before=$(load1)" >>"$dir/meta"
    echo "t0=$(now)" >>"$dir/meta"
    # --log narrator=info only adds the timestamped "engine ready" line (model loaded).
    /usr/bin/time -f '%e %M %U %S' -o "$dir/time" \
        "$NARRATOR" --log narrator=info run "$TEXT" --out "$dir/out" --format "$FORMAT" --json "${PAUSES[@]}" \
        >"$dir/stdout" 2>"$dir/stderr" || { tail -5 "$dir/stderr" >&2; die "narrator run failed"; }
    echo "t1=$(now)" >>"$dir/meta"
    echo "load_after=$(load1)" >>"$dir/meta"
    rm -rf "$dir/out"
}
# run_cluster DIR TEXT WORKER-ARGS...: one job through one fresh worker.
run_cluster() {
    local dir="$1" text="$2" job t0
    shift 2
    fresh_db
    purge_queue
    start_worker "$dir" "$@"
    echo "load_before=$(load1)" >>"$dir/meta"
    python3 ops/bench/cluster_cpu.py "$WORKER_PID" >"$dir/cpu0.json"
    if [[ "$(basename "$dir")" == null-* ]]; then
        top_sampler >"$dir/top.txt" 2>/dev/null &
        TOP_PID=$!
    fi
    t0=$(now)
    echo "t0=$t0" >>"$dir/meta"
    /usr/bin/time -f '%e %M %U %S' -o "$dir/submit.time" \
        "$NARRATOR" submit "$text" --format "$FORMAT" --json "${PAUSES[@]}" >"$dir/submit.json" 2>"$dir/submit.stderr" ||
        { tail -5 "$dir/submit.stderr" >&2; die "narrator submit failed"; }
    echo "t_submitted=$(now)" >>"$dir/meta"
    job=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["job_id"])' "$dir/submit.json")
    JOBS_MADE+=("$job")
    echo "job=$job" >>"$dir/meta"
    python3 ops/bench/cluster_poll.py "$NARRATOR" "$job" --timeout 7200 >"$dir/poll.json" ||
        die "job $job did not finish (reason above; worker log: $dir/worker.stderr)"
    python3 ops/bench/cluster_cpu.py "$WORKER_PID" >"$dir/cpu1.json"
    if [[ -n "$TOP_PID" ]]; then kill "$TOP_PID"; wait "$TOP_PID" 2>/dev/null || true; TOP_PID=""; fi
    echo "load_after=$(load1)" >>"$dir/meta"
    db_figures "$job" >>"$dir/meta"
    stop_worker "$dir"
    forget_job_audio "$job"
}
# run_distributed ROUND [TAG WORKER-ARGS...]: the distributed arm (tagged: another arm).
run_distributed() {
    local round="$1" tag="${2:-}" dir
    shift; (($#)) && shift
    dir="$WORK/runs/distributed${tag:+-$tag}-r$round"
    mkdir -p "$dir"
    echo "arm=distributed${tag:+ ($*)}" >"$dir/meta"; echo "round=$round" >>"$dir/meta"
    run_cluster "$dir" "$TEXT" "$@"
}

UPTIME_START="$(uptime)"
log "uptime: $UPTIME_START"
if [[ "$ONLY" != null ]]; then
    log "part 1: $TEXT_DESC; $ROUNDS round(s); piper arm: $PIPER_ON"
    for ((r = 1; r <= ROUNDS; r++)); do
        if ((PIPER_ON)); then
            log "round $r: raw ONNX Runtime loop"; run_raw "$r"
            log "round $r: piper CLI"; run_piper "$r"
        fi
        log "round $r: embedded (narrator run)"; run_embedded "$r"
        log "round $r: distributed (submit -> 1 worker -> done)"; run_distributed "$r"
        for i in "${!E2E_WORKERS[@]}"; do
            log "round $r: distributed, worker ${E2E_WORKERS[$i]}"
            # shellcheck disable=SC2086 # the flags are words on purpose
            run_distributed "$r" "w$((i + 1))" ${E2E_WORKERS[$i]}
        done
        python3 ops/bench/cluster_report.py --progress "$WORK" "$r" >&2
    done
fi

# ---- 5. part 2: control plane, null engine ------------------------------------------------
if [[ "$ONLY" != e2e ]]; then
    for i in "${!NULL_WORKERS[@]}"; do
        dir="$WORK/runs/null-p$((i + 1))"
        mkdir -p "$dir"
        echo "arm=null" >"$dir/meta"; echo "round=$((i + 1))" >>"$dir/meta"
        log "part 2: $NULL_SEGMENTS segments, worker --engine null ${NULL_WORKERS[$i]}"
        # shellcheck disable=SC2086 # the plan's flags are words on purpose
        run_cluster "$dir" "$NULL_TEXT" --engine null ${NULL_WORKERS[$i]}
        python3 ops/bench/cluster_report.py --progress "$WORK" "null-p$((i + 1))" >&2
    done
fi
UPTIME_END="$(uptime)"
log "uptime: $UPTIME_END"

# ---- 6. the report ----------------------------------------------------------------------
python3 ops/bench/cluster_report.py "$WORK" \
    --meta text="$TEXT_DESC" null_segments="$NULL_SEGMENTS" rounds="$ROUNDS" format="$FORMAT" \
    uptime_start="$UPTIME_START" uptime_end="$UPTIME_END" \
    narrator="$("$NARRATOR" --version | awk '{print $2}')"
