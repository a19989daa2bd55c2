#!/usr/bin/env bash
# Kokoro-82M side by side on this machine's CPU: narrator with one sentence per engine run
# (`--max-batch 1`), narrator packing sentences into runs (`--max-batch 16`, up to 510
# ids a run), and the reference implementation PyPI kokoro-onnx 0.6.1 given the same model
# file and voice file, on the same held-out text, interleaved round by round (the order
# rotates). Whole-machine throughput = audio seconds / wall seconds of the whole process
# (start-up and model loading included for both). Then the word error rate of PocketSphinx
# (PyPI, its wheel ships an English model; no other recogniser's model reaches this
# machine) on each output of the last round: compare the WERs, never read one alone.
#
#   bash ops/bench-kokoro.sh [--rounds N] [--words N] [--voice NAME]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=2
WORDS=400
VOICE=af_heart
while (($#)); do
    case "$1" in
        --rounds) ROUNDS="$2"; shift 2 ;;
        --words) WORDS="$2"; shift 2 ;;
        --voice) VOICE="$2"; shift 2 ;;
        *) echo "bench-kokoro: unknown option $1 (known: --rounds N, --words N, --voice NAME)" >&2; exit 2 ;;
    esac
done
bash ops/setup.sh --kokoro >/dev/null
VENV=.deps/kokoro-bench-venv
if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c 'import kokoro_onnx, pocketsphinx, jiwer' 2>/dev/null; then
    echo "bench-kokoro: making $VENV (kokoro-onnx 0.6.1, pocketsphinx 5.1.1, jiwer)"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check kokoro-onnx==0.6.1 pocketsphinx==5.1.1 jiwer==4.0.0
fi
cargo build --release --locked -p narrator --no-default-features --quiet
BIN=target/release/narrator
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
# The held-out text: the first WORDS words of chapter II of Alice (shared corpus), or of
# the sample if the corpus is not beside the checkout.
CORPUS=../shared/corpus/alice29.txt
python3 - "$CORPUS" "$WORDS" "$WORK/text.txt" <<'PY'
import os, re, sys
src, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if os.path.exists(src):
    t = open(src, encoding="latin-1").read()
    t = t[t.index("CHAPTER II."):]
    t = t[t.index("\n"):]
else:
    t = open("examples/sample.md", encoding="utf-8").read()
words = t.split()[:n]
text = " ".join(words)
cut = max(text.rfind("."), text.rfind("!"), text.rfind("?"))
open(out, "w", encoding="utf-8").write(text[: cut + 1] + "\n")
PY
echo "bench-kokoro: $(wc -w <"$WORK/text.txt") words, voice $VOICE, $ROUNDS rounds, $(nproc) cores"
MODEL=.deps/voices/kokoro/model.onnx
VOICE_BIN=.deps/voices/kokoro/voices/$VOICE.bin
results="$WORK/results.jsonl"
run_one() { # run_one NAME ROUND
    local name="$1" round="$2" out="$WORK/$1-$2" t0 t1 audio
    mkdir -p "$out"
    t0=$(date +%s.%N)
    case "$name" in
        narrator-single) "$BIN" run "$WORK/text.txt" --voice "$VOICE" --format wav --out "$out" \
            --cache-dir "$WORK/cache" --max-batch 1 --json >"$out/summary.json" 2>/dev/null ;;
        narrator-packed) "$BIN" run "$WORK/text.txt" --voice "$VOICE" --format wav --out "$out" \
            --cache-dir "$WORK/cache" --max-batch 16 --json >"$out/summary.json" 2>/dev/null ;;
        kokoro-onnx) "$VENV/bin/python" ops/bench/kokoro_ref.py synth "$MODEL" "$VOICE_BIN" \
            "$WORK/text.txt" "$out/book.wav" >"$out/summary.json" ;;
    esac
    t1=$(date +%s.%N)
    audio=$(python3 -c 'import sys, wave, glob; w = wave.open(glob.glob(sys.argv[1] + "/*.wav")[0]); print(w.getnframes() / w.getframerate())' "$out")
    echo "{\"name\": \"$name\", \"round\": $round, \"wall\": $(echo "$t1 - $t0" | bc), \"audio\": $audio}" >>"$results"
    echo "  round $round $name: $(echo "$t1 - $t0" | bc | cut -c1-6) s wall, $audio s audio"
}
NAMES=(narrator-single narrator-packed kokoro-onnx)
for r in $(seq 1 "$ROUNDS"); do
    for k in 0 1 2; do
        run_one "${NAMES[$(((k + r) % 3))]}" "$r"
    done
done
echo "bench-kokoro: word error rate of PocketSphinx on round $ROUNDS's outputs"
for name in "${NAMES[@]}"; do
    w=$("$VENV/bin/python" ops/bench/kokoro_ref.py wer "$WORK/text.txt" "$(ls "$WORK/$name-$ROUNDS"/*.wav | head -1)")
    echo "{\"name\": \"$name\", \"wer\": $(echo "$w" | python3 -c 'import json, sys; print(json.load(sys.stdin)["wer"])')}" >>"$results"
done
python3 - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
runs = [r for r in rows if "wall" in r]
wer = {r["name"]: r["wer"] for r in rows if "wer" in r}
names = ["narrator-single", "narrator-packed", "kokoro-onnx"]
x = {n: {r["round"]: r["audio"] / r["wall"] for r in runs if r["name"] == n} for n in names}
print(f"{'':18} {'x realtime (median)':>20} {'ratio to kokoro-onnx (median of rounds)':>40} {'WER':>6}")
for n in names:
    ratios = [x[n][k] / x["kokoro-onnx"][k] for k in x[n]]
    print(f"{n:18} {statistics.median(x[n].values()):20.3f} {statistics.median(ratios):40.3f} {wer.get(n, float('nan')):6.3f}")
PY
