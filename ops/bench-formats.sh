#!/usr/bin/env bash
# The output formats side by side: `narrator run` of one text in every format, interleaved
# per round (wav, opus, mp3, m4b, wav, ...), each a fresh process under /usr/bin/time, and a
# Markdown table of medians: wall seconds, ratio to WAV in the same round, peak RSS, the
# size of the output folder. Every run synthesizes from scratch (a fresh --out).
# `piper` in --formats adds Piper's own CLI (WAV, `ops/setup.sh --with-piper`) to the rounds,
# so narrator's wall time and peak RSS can be read against Piper's, side by side.
#
#   bash ops/bench-formats.sh [--rounds N] [--text FILE] [--formats "wav opus mp3 m4b"]
#   bash ops/bench-formats.sh --formats "piper wav opus mp3" --rounds 3
#
# An entry FORMAT+ARGS runs that format with extra flags, commas for spaces, and is
# reported under its own name: `wav+--sessions,1` `wav+--cpu-arena,keep` compare layouts.
#
# Default text: Chapter I of the shared corpus (alice29.txt), as ops/bench-cpu.sh cuts it.
# Needs target/release/narrator (cargo build --release -p narrator) and ops/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=3
TEXT=""
FORMATS="wav opus mp3 m4b"
while (($#)); do
    case $1 in
        --rounds) ROUNDS=$2; shift 2 ;;
        --text) TEXT=$2; shift 2 ;;
        --formats) FORMATS=$2; shift 2 ;;
        *) echo "bench-formats: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
    esac
done
BIN=target/release/narrator
PIPER=.deps/piper-venv/bin/piper
[[ -x $BIN ]] || { echo "bench-formats: $BIN is missing: cargo build --release -p narrator" >&2; exit 1; }
[[ -x /usr/bin/time ]] || { echo "bench-formats: /usr/bin/time is missing: apt-get install time" >&2; exit 1; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
if [[ -z $TEXT ]]; then
    CORPUS=""
    for c in ../shared/corpus/alice29.txt /work/shared/corpus/alice29.txt; do
        [[ -f $c ]] && { CORPUS=$c; break; }
    done
    [[ -n $CORPUS ]] || { echo "bench-formats: no corpus; pass --text FILE" >&2; exit 1; }
    TEXT=$WORK/chapter1.txt
    python3 ops/bench/prepare_text.py "$CORPUS" "$TEXT"
fi

RESULTS=$WORK/results.tsv
for round in $(seq "$ROUNDS"); do
    for entry in $FORMATS; do
        fmt=${entry%%+*}
        extra=()
        [[ $entry == *+* ]] && IFS=, read -r -a extra <<<"${entry#*+}"
        out=$WORK/out-$round
        echo "round $round: $entry" >&2
        if [[ $fmt == piper ]]; then
            [[ -x $PIPER ]] || { echo "bench-formats: $PIPER is missing: bash ops/setup.sh --with-piper" >&2; exit 1; }
            mkdir -p "$out"
            /usr/bin/time -f '%e %M' -o "$WORK/time" \
                "$PIPER" -m .deps/voices/en_US-joe-medium.onnx -i "$TEXT" -f "$out/piper.wav" \
                >/dev/null 2>"$WORK/err" || { cat "$WORK/err" >&2; exit 1; }
            audio=$(python3 -c 'import sys,wave; w=wave.open(sys.argv[1]); print(w.getnframes()/w.getframerate())' "$out/piper.wav")
        else
            /usr/bin/time -f '%e %M' -o "$WORK/time" \
                "$BIN" run "$TEXT" --out "$out" --format "$fmt" "${extra[@]}" --json >"$WORK/json" 2>"$WORK/err" \
                || { cat "$WORK/err" >&2; exit 1; }
            audio=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["audio_seconds"])' "$WORK/json")
            python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["plan"]; print("layout: %sx%s batch %s (%s)" % (p["sessions"], p["intra_threads"], p["max_batch_requests"], p["source"]))' "$WORK/json" >&2
        fi
        read -r wall rss <"$WORK/time"
        bytes=$(du -sb --exclude=.narrator "$out" | cut -f1)
        rm -rf "$out"
        printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$entry" "$wall" "$rss" "$bytes" "$audio" >>"$RESULTS"
    done
done

python3 - "$RESULTS" "$ROUNDS" "$TEXT" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
rounds, text = sys.argv[2], sys.argv[3]
by = {}
for r, fmt, wall, rss, size, audio in rows:
    by.setdefault(fmt, []).append((int(r), float(wall), int(rss), int(size), float(audio)))
wav = {r: w for r, w, *_ in by.get("wav", [])}
print(f"{rounds} rounds, interleaved; text {text}; medians\n")
piper = {r: (w, rss) for r, w, rss, *_ in by.get("piper", [])}
print("| format | wall s | × WAV (paired per round) | × realtime | peak RSS MiB | RSS × Piper (paired) | output MiB |")
print("|---|---|---|---|---|---|---|")
for fmt, runs in by.items():
    walls = [w for _, w, *_ in runs]
    paired = [w / wav[r] for r, w, *_ in runs if r in wav]
    audio = statistics.median(a for *_, a in runs)
    print(f"| {fmt} | {statistics.median(walls):.2f} | "
          f"{statistics.median(paired) if paired else float('nan'):.3f} | "
          f"{audio / statistics.median(walls):.1f} | "
          f"{statistics.median(r for _, _, r, _, _ in runs) / 1024:.0f} | "
          f"{statistics.median([rss / piper[r][1] for r, _, rss, *_ in runs if r in piper] or [float('nan')]):.2f} | "
          f"{statistics.median(s for _, _, _, s, _ in runs) / 2**20:.1f} |")
PY
