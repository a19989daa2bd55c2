#!/usr/bin/env bash
# Soak benchmark (not in CI): a whole book through the distributed path with two workers,
# watching each worker's memory and open files for growth, then checking the outputs
# against the embedded run of the same book.
#
#   bash ops/soak.sh [--book PATH] [--every SECONDS] [--workers N] [--keep DIR]
#
#   --book PATH     default: the 12-chapter ../shared/corpus/alice29.txt
#   --every S       sampling interval of RSS and open file descriptors (default 5)
#   --workers N     workers on the one queue (default 2)
#   --keep DIR      keep the work folder (samples.tsv, logs, embedded output) in DIR
#   --reference DIR reuse the embedded run of an earlier `--keep DIR` (same book)
#
# Steps: 1. `narrator run BOOK` (embedded, opus) for the reference audio length. 2. a fresh
# database and RabbitMQ vhost (narrator_soak, dropped at the end), N workers started and
# waited for until ready, the book submitted, every worker's VmRSS and /proc/PID/fd count
# sampled every S seconds until `narrator status` says done. 3. Checks, each printed with
# its verdict: every chapter file and the book file are among the job's outputs; total
# audio within 2 % of the embedded run's; per worker, after warm-up (the first quarter of
# the samples), the median RSS of the last third is within 5 % + 16 MiB of the median of
# the first third, and open descriptors, sampled 120 s more after the job with the workers
# idle, end within 8 of where they were after warm-up. Exit status 1 if a check fails.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BOOK=""
EVERY=5
WORKERS=2
IDLE=120
KEEP=""
REFERENCE=""
while (($#)); do
    case "$1" in
        --book) BOOK="${2:?--book needs PATH}"; shift 2 ;;
        --every) EVERY="${2:?--every needs SECONDS}"; shift 2 ;;
        --workers) WORKERS="${2:?--workers needs N}"; shift 2 ;;
        --keep) KEEP="${2:?--keep needs DIR}"; shift 2 ;;
        --reference) REFERENCE="${2:?--reference needs DIR}"; shift 2 ;;
        -h | --help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "soak: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[[ "$EVERY" =~ ^[1-9][0-9]*$ ]] || { echo "soak: --every must be a positive integer" >&2; exit 2; }
[[ "$WORKERS" =~ ^[1-9][0-9]*$ ]] || { echo "soak: --workers must be a positive integer" >&2; exit 2; }
log() { printf 'soak: %s\n' "$*" >&2; }
die() { printf 'soak: ERROR: %s\n' "$*" >&2; exit 1; }
for tool in psql createdb dropdb rabbitmqctl python3; do command -v "$tool" >/dev/null || die "needs $tool"; done
cd "$ROOT"
if [[ -z "$BOOK" ]]; then
    for c in /work/shared/corpus/alice29.txt "$ROOT/../shared/corpus/alice29.txt"; do
        [[ -f "$c" ]] && { BOOK="$c"; break; }
    done
    [[ -n "$BOOK" ]] || die "alice29.txt not found in /work/shared/corpus or ../shared/corpus (use --book)"
fi
[[ -f "$BOOK" ]] || die "--book $BOOK: no such file"

log "building the release binary"
cargo build --release -p narrator --locked >&2
NARRATOR="${CARGO_TARGET_DIR:-$ROOT/target}/release/narrator"
if [[ -n "$KEEP" ]]; then mkdir -p "$KEEP"; WORK="$(cd "$KEEP" && pwd)"; else WORK="$(mktemp -d "${TMPDIR:-/tmp}/narrator-soak.XXXXXX")"; fi

NAME="${NARRATOR_SOAK_NAME:-narrator_soak}"
PG=(-h 127.0.0.1 -p 5432 -U postgres)
export NARRATOR_DATABASE_URL="postgres://postgres@127.0.0.1:5432/$NAME"
export NARRATOR_AMQP_URL="amqp://guest:guest@127.0.0.1:5672/$NAME"
S3_STARTED=0
bash ops/s3-server.sh status >/dev/null 2>&1 || S3_STARTED=1
bash ops/s3-server.sh start >&2
eval "$(bash ops/s3-server.sh env)"
PIDS=()
cleanup() {
    local rc=$?
    set +e
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
    dropdb "${PG[@]}" --if-exists "$NAME" >/dev/null 2>&1
    rabbitmqctl delete_vhost "$NAME" >/dev/null 2>&1
    ((S3_STARTED)) && bash ops/s3-server.sh stop >/dev/null 2>&1
    [[ -z "$KEEP" ]] && rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- 1. the embedded reference --------------------------------------------------------
if [[ -n "$REFERENCE" ]]; then
    [[ -s "$REFERENCE/embedded.json" && -f "$REFERENCE/embedded/manifest.json" ]] ||
        die "--reference $REFERENCE: no embedded.json and embedded/manifest.json there (from --keep)"
    mkdir -p "$WORK/embedded"
    cp "$REFERENCE/embedded.json" "$WORK/embedded.json"
    cp "$REFERENCE/embedded/manifest.json" "$WORK/embedded/manifest.json"
    log "embedded reference reused from $REFERENCE"
else
    log "embedded run of $(basename "$BOOK") (the reference)"
    t0=$(date +%s)
    "$NARRATOR" run "$BOOK" --out "$WORK/embedded" --format opus --json >"$WORK/embedded.json" 2>"$WORK/embedded.stderr" ||
        { tail -5 "$WORK/embedded.stderr" >&2; die "narrator run failed"; }
    log "embedded: $(( $(date +%s) - t0 )) s"
fi

# ---- 2. the distributed run -----------------------------------------------------------
dropdb "${PG[@]}" --if-exists "$NAME" >/dev/null
createdb "${PG[@]}" "$NAME"
"$NARRATOR" migrate >/dev/null
rabbitmqctl delete_vhost "$NAME" >/dev/null 2>&1 || true
rabbitmqctl add_vhost "$NAME" >/dev/null
rabbitmqctl set_permissions -p "$NAME" guest '.*' '.*' '.*' >/dev/null
for ((i = 1; i <= WORKERS; i++)); do
    "$NARRATOR" worker --id "soak-$i" >"$WORK/worker-$i.stdout" 2>"$WORK/worker-$i.stderr" &
    PIDS+=($!)
done
for ((i = 1; i <= WORKERS; i++)); do
    t0=$(date +%s)
    until grep -qE '^worker .* ready$' "$WORK/worker-$i.stderr"; do
        kill -0 "${PIDS[$((i - 1))]}" 2>/dev/null || { tail -5 "$WORK/worker-$i.stderr" >&2; die "worker $i exited before it was ready"; }
        (($(date +%s) - t0 < 300)) || die "worker $i was not ready after 300 s"
        sleep 0.2
    done
done
log "$WORKERS workers ready; submitting"
START=$(date +%s)
"$NARRATOR" submit "$BOOK" --format opus --chapter-files --json >"$WORK/submit.json" 2>"$WORK/submit.stderr" ||
    { tail -5 "$WORK/submit.stderr" >&2; die "narrator submit failed"; }
JOB=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])["job_id"])' "$WORK/submit.json")
printf 't_s\tworker\trss_kib\tfds\tphase\n' >"$WORK/samples.tsv"
while :; do
    now=$(($(date +%s) - START))
    for ((i = 1; i <= WORKERS; i++)); do
        p=${PIDS[$((i - 1))]}
        kill -0 "$p" 2>/dev/null || die "worker $i died during the soak (log: $WORK/worker-$i.stderr)"
        rss=$(awk '/^VmRSS:/{print $2}' "/proc/$p/status")
        fds=$(find "/proc/$p/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
        printf '%s\t%s\t%s\t%s\tjob\n' "$now" "$i" "$rss" "$fds" >>"$WORK/samples.tsv"
    done
    "$NARRATOR" status "$JOB" --json >"$WORK/status.json" 2>/dev/null || true
    state=$(python3 -c 'import json,sys
try: print(json.load(open(sys.argv[1]))["state"])
except Exception: print("?")' "$WORK/status.json")
    case "$state" in
        done) break ;;
        failed | cancelled) die "job $JOB ended $state (see $WORK/status.json)" ;;
    esac
    ((now < 4 * 3600)) || die "job $JOB not done after 4 h"
    sleep "$EVERY"
done
END=$(date +%s)
log "distributed: done in $((END - START)) s; sampling $IDLE s more with the workers idle"
# Idle connections (S3 client pools after the assembly's downloads) close after ~90 s.
for ((k = 0; k * EVERY < IDLE; k++)); do
    sleep "$EVERY"
    for ((i = 1; i <= WORKERS; i++)); do
        p=${PIDS[$((i - 1))]}
        rss=$(awk '/^VmRSS:/{print $2}' "/proc/$p/status")
        fds=$(find "/proc/$p/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
        printf '%s\t%s\t%s\t%s\tidle\n' "$(($(date +%s) - START))" "$i" "$rss" "$fds" >>"$WORK/samples.tsv"
    done
done
for p in "${PIDS[@]}"; do kill -TERM "$p"; done
for i in "${!PIDS[@]}"; do wait "${PIDS[$i]}" || die "worker $((i + 1)) exited non-zero after SIGTERM"; done
PIDS=()

# ---- 3. checks and report ---------------------------------------------------------------
python3 - "$WORK" "$BOOK" "$((END - START))" "$WORKERS" <<'EOF'
import json, statistics, sys
work, book, wall, workers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
emb = json.loads(open(f"{work}/embedded.json").read().strip().splitlines()[-1])
man = json.load(open(f"{work}/embedded/manifest.json"))
st = json.load(open(f"{work}/status.json"))
outs = st.get("outputs", [])
kinds = {}
for o in outs:
    kinds.setdefault(o.get("kind"), []).append(o)
chapters = len(man["chapters"])
ok = True
def check(name, good, detail):
    global ok
    ok &= bool(good)
    print(f"| {name} | {detail} | {'ok' if good else 'FAILED'} |")
print(f"# Soak: {book.split('/')[-1]} through the distributed path, {workers} workers\n")
print(f"- embedded: {emb['audio_seconds']:.1f} s of audio in {emb['wall_seconds']:.1f} s; distributed: {st.get('audio_seconds', 0):.1f} s in {wall} s (submit -> done)\n")
print("| check | measured | verdict |\n|---|---|---|")
check("every chapter file", len(kinds.get("chapter", [])) == chapters,
      f"{len(kinds.get('chapter', []))} chapter outputs for {chapters} chapters; book {len(kinds.get('book', []))}, manifest {len(kinds.get('manifest', []))}")
check("the book file", len(kinds.get("book", [])) == 1, f"{len(kinds.get('book', []))}")
d, e = float(st.get("audio_seconds") or 0), float(emb["audio_seconds"])
check("total audio within 2 %", e > 0 and abs(d - e) / e <= 0.02, f"{d:.1f} s vs {e:.1f} s embedded ({(d - e) / e * 100:+.2f} %)")
rows = [l.split("\t") for l in open(f"{work}/samples.tsv").read().splitlines()[1:]]
for w in range(1, workers + 1):
    s = [(int(t), int(r), int(f)) for t, ww, r, f, ph in rows if int(ww) == w and ph == "job"]
    idle = [int(f) for t, ww, r, f, ph in rows if int(ww) == w and ph == "idle"]
    after = s[len(s) // 4:]
    if len(after) < 6:
        check(f"worker {w} flat", False, f"only {len(s)} samples: the run was too short to judge")
        continue
    third = len(after) // 3
    first = statistics.median(r for _, r, _ in after[:third])
    last = statistics.median(r for _, r, _ in after[-third:])
    fds = [f for _, _, f in after]
    check(f"worker {w} RSS flat after warm-up", last <= first * 1.05 + 16 * 1024,
          f"median {first / 1024:.0f} MiB (first third) -> {last / 1024:.0f} MiB (last third); peak {max(r for _, r, _ in s) / 1024:.0f} MiB; {len(s)} samples")
    check(f"worker {w} open files back to the start after the job", bool(idle) and idle[-1] - fds[0] <= 8,
          f"{fds[0]} after warm-up, max {max(fds)} during the job (assembly downloads), "
          f"{idle[-1] if idle else '?'} after {len(idle)} idle samples")
sys.exit(0 if ok else 1)
EOF
