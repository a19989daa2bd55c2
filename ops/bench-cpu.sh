#!/usr/bin/env bash
# CPU benchmark: narrator vs Piper's CLI vs a raw ONNX Runtime loop, same text, same voice.
#
#   bash ops/bench-cpu.sh [--rounds N] [--text FILE] [--sweep] [--keep DIR]
#
#   --rounds N   interleaved rounds (default 3): piper, narrator, raw, piper, narrator, raw...
#   --text FILE  another text (hard-wrapped lines are joined per paragraph); default:
#                Chapter I of /work/shared/corpus/alice29.txt
#   --sweep      also narrator CPU plans in the same rounds: --intra-threads 1,
#                --sessions 2 (1 thread each), --max-batch 4 (the default plan is
#                intra-threads = all cores, sessions 1, max-batch 1)
#   --keep DIR   keep the work folder (texts, runs.tsv, logs, per-run outputs) in DIR
#
# Every run is a separate process timed by /usr/bin/time -f '%e %M' (wall seconds, peak
# RSS KiB). Throughput = audio seconds / wall seconds of the whole process (model load
# included). Audio seconds: Piper = its WAV's length; narrator = speech_seconds from its
# JSON (pauses set to 0 anyway); raw loop = samples out of the model. The 1-minute load
# average is recorded before and after each run: on a shared machine, read it first.
# Output: progress on stderr, the Markdown report on stdout.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROUNDS=3
TEXT_SRC=""
SWEEP=0
KEEP=""
while (($#)); do
    case "$1" in
        --rounds) ROUNDS="${2:?--rounds needs N}"; shift 2 ;;
        --text) TEXT_SRC="${2:?--text needs FILE}"; shift 2 ;;
        --sweep) SWEEP=1; shift ;;
        --keep) KEEP="${2:?--keep needs DIR}"; shift 2 ;;
        -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench-cpu: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "bench-cpu: --rounds must be a positive integer" >&2; exit 2; }
[[ -x /usr/bin/time ]] || { echo "bench-cpu: needs GNU time at /usr/bin/time (apt-get install time)" >&2; exit 1; }

log() { printf 'bench-cpu: %s\n' "$*" >&2; }
load1() { cut -d' ' -f1 /proc/loadavg; }
cd "$ROOT"

# ---- 1. build and dependencies ---------------------------------------------------------
log "building the release binary (shared target/, never cleaned)"
cargo build --release -p narrator >&2
NARRATOR="${CARGO_TARGET_DIR:-$ROOT/target}/release/narrator"
bash ops/setup.sh --with-piper >&2
VOICE="$ROOT/.deps/voices/en_US-joe-medium.onnx"
PIPER="$ROOT/.deps/piper-venv/bin/piper"
PY="$ROOT/.deps/piper-venv/bin/python"
for f in "$NARRATOR" "$VOICE" "$PIPER" "$PY"; do
    [[ -e "$f" ]] || { echo "bench-cpu: missing $f" >&2; exit 1; }
done

if [[ -n "$KEEP" ]]; then
    mkdir -p "$KEEP"
    WORK="$(cd "$KEEP" && pwd)"
else
    WORK="$(mktemp -d "${TMPDIR:-/tmp}/narrator-bench.XXXXXX")"
    trap 'rm -rf "$WORK"' EXIT
fi

# ---- 2. the text, prepared once --------------------------------------------------------
TEXT="$WORK/text.txt"
if [[ -z "$TEXT_SRC" ]]; then
    python3 ops/bench/prepare_text.py /work/shared/corpus/alice29.txt "$TEXT"
    TEXT_DESC="alice29.txt Chapter I, one line per paragraph"
else
    python3 ops/bench/prepare_text.py --as-is "$TEXT_SRC" "$TEXT"
    TEXT_DESC="$(basename "$TEXT_SRC"), one line per paragraph"
fi
WORDS=$(wc -w <"$TEXT")

# ---- 3. interleaved runs ---------------------------------------------------------------
RUNS="$WORK/runs.tsv"
printf 'round\ttool\twall_s\trss_kib\taudio_s\tspeech_s\tloop_s\tload_before\tload_after\tnote\n' >"$RUNS"

# run_one ROUND TOOL NARRATOR-EXTRA-ARGS...
run_one() {
    local round="$1" tool="$2"
    shift 2
    local slug="r${round}-$(echo "$tool" | tr -c 'a-zA-Z0-9\n' '_')"
    local out="$WORK/$slug" tfile="$WORK/$slug.time" lb la wall rss audio="" speech="" loop="" note=""
    rm -rf "$out"
    lb=$(load1)
    case "$tool" in
        "piper CLI")
            mkdir -p "$out"
            /usr/bin/time -f '%e %M' -o "$tfile" \
                "$PIPER" -m "$VOICE" -i "$TEXT" -f "$out/piper.wav" >"$out.stdout" 2>"$out.stderr" || {
                log "piper failed, see $out.stderr"; tail -5 "$out.stderr" >&2; return 1; }
            ;;
        "raw ORT loop")
            /usr/bin/time -f '%e %M' -o "$tfile" \
                "$PY" ops/bench/raw_ort.py -m "$VOICE" -i "$TEXT" --per-sentence "$out.sentences.tsv" \
                >"$out.stdout" 2>"$out.stderr" || {
                log "raw loop failed, see $out.stderr"; tail -5 "$out.stderr" >&2; return 1; }
            ;;
        narrator*)
            # --keep-work leaves OUT/.narrator/journal.jsonl (per-segment inference seconds)
            # for the diagnosis; it only skips the final removal of the work folder.
            /usr/bin/time -f '%e %M' -o "$tfile" \
                "$NARRATOR" run "$TEXT" --out "$out" --format wav --json --keep-work \
                --sentence-pause-ms 0 --paragraph-pause-ms 0 --chapter-pause-ms 0 "$@" \
                >"$out.stdout" 2>"$out.stderr" || {
                log "narrator failed, see $out.stderr"; tail -5 "$out.stderr" >&2; return 1; }
            ;;
    esac
    la=$(load1)
    read -r wall rss < <(tail -1 "$tfile")
    case "$tool" in
        "piper CLI")
            audio=$(python3 -c 'import sys,wave; w=wave.open(sys.argv[1]); print(w.getnframes()/w.getframerate())' "$out/piper.wav")
            note="$(du -k "$out/piper.wav" | cut -f1) KiB wav"
            rm -f "$out/piper.wav"
            ;;
        "raw ORT loop")
            read -r audio loop note < <(python3 -c '
import json,sys; d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(d["audio_seconds"], d["loop_seconds"], "%d sentences, %d ids, load %.2f s, loop %.2f s = %.2fx" % (
    d["sentences"], d["phoneme_ids"], d["load_seconds"], d["loop_seconds"], d["loop_x_realtime"]))' "$out.stdout")
            ;;
        narrator*)
            read -r audio speech note < <(python3 -c '
import json,sys
d=json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
recs=[json.loads(l) for l in open(sys.argv[2]+"/.narrator/journal.jsonl") if l.strip()]
recs=[r.get("record", r) for r in recs]
inf=sum(r.get("inference_seconds",0) for r in recs); ids=sum(r.get("phoneme_ids",0) for r in recs)
print(d["speech_seconds"], d["audio_seconds"], "%d chapter(s), %d segments, %d ids, audio_seconds %.1f, engine %.1f s of %.1f s" % (
    d["chapters"], d["segments"], ids, d["audio_seconds"], inf, d["wall_seconds"]))' "$out.stdout" "$out")
            rm -rf "$out"/*.wav "$out/.narrator/segments"
            ;;
    esac
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$tool" "$wall" "$rss" "$audio" "$speech" "$loop" "$lb" "$la" "$note" >>"$RUNS"
    log "$(printf 'round %s  %-28s wall %7.1f s  RSS %5d MiB  audio %6.1f s  %6.2fx  load %s -> %s  %s' \
        "$round" "$tool" "$wall" $((rss / 1024)) "$audio" "$(python3 -c "print($audio/$wall)")" "$lb" "$la" "$note")"
}

UPTIME_START="$(uptime)"
log "text: $TEXT_DESC, $WORDS words; $ROUNDS rounds; sweep=$SWEEP; work folder $WORK"
log "uptime: $UPTIME_START"
for ((r = 1; r <= ROUNDS; r++)); do
    run_one "$r" "piper CLI"
    run_one "$r" "narrator"
    run_one "$r" "raw ORT loop"
    if ((SWEEP)); then
        run_one "$r" "narrator --intra-threads 1" --intra-threads 1
        run_one "$r" "narrator --sessions 2" --sessions 2
        run_one "$r" "narrator --max-batch 4" --max-batch 4
    fi
done
UPTIME_END="$(uptime)"
log "uptime: $UPTIME_END"

# ---- 4. the report ---------------------------------------------------------------------
python3 - "$WORK/meta.json" "$RUNS" "$ROUNDS" "$TEXT_DESC" "$WORDS" "$UPTIME_START" "$UPTIME_END" \
    "$("$NARRATOR" --version 2>/dev/null | awk '{print $2}')" \
    "$("$PY" -c 'import importlib.metadata as m; print(m.version("piper-tts"), m.version("onnxruntime"))')" <<'PYEOF'
import csv, json, os, platform, statistics, subprocess, sys, datetime
meta_path, runs, rounds, text, words, up0, up1, nver, pyvers = sys.argv[1:]
loads = [float(x) for r in csv.DictReader(open(runs), delimiter="\t") for x in (r["load_before"], r["load_after"])]
cpu = next((l.split(":", 1)[1].strip() for l in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
            if l.startswith("Model name")), platform.processor())
mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
osr = next((l.split("=", 1)[1].strip('"\n') for l in open("/etc/os-release") if l.startswith("PRETTY_NAME")), platform.system())
piper, ort = pyvers.split()
json.dump(dict(date=datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"), cpu=cpu,
               nproc=os.cpu_count(), mem=f"{mem:.0f} GiB RAM", os=osr, text=text, words=int(words),
               rounds=int(rounds), narrator=nver, piper=piper, ort=ort,
               load_min=min(loads), load_med=statistics.median(loads), load_max=max(loads),
               uptime_start=up0.strip(), uptime_end=up1.strip()), open(meta_path, "w"))
PYEOF
python3 ops/bench/summarize.py "$RUNS" "$WORK/meta.json"
echo
echo "### Where narrator's inference time goes (ops/bench/per_sentence.py)"
echo
python3 ops/bench/per_sentence.py "$WORK"
