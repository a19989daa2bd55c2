#!/usr/bin/env bash
# Kokoro-82M side by side on this machine's CPU: narrator with one sentence per engine run
# (`--max-batch 1`, the CPU default), narrator packing sentences into runs (`--max-batch
# 16`, up to 510 ids a run), the reference implementation PyPI kokoro-onnx 0.6.1 given the
# same model file and voice file, and narrator with the Piper voice (what each family
# costs) and, when installed, with the fp32 graph (its quality), on the same held-out text, interleaved round by round (the order rotates). Each
# is one process under /usr/bin/time (start-up and model loading included).
#
# Two throughputs, because the tools make different amounts of audio from the same text
# (a single Kokoro run keeps the pauses of its two boundary tokens; packed runs and
# kokoro-onnx's 510-phoneme runs have fewer of them): "same text" = the reference's wall
# time / the tool's (how much faster the same book is read, the fair one), and "x
# realtime" = audio seconds / wall seconds. Then the word error rate of PocketSphinx
# (PyPI, its wheel ships an English model; no other recogniser's model reaches this
# machine) on each output of the last round: compare the WERs, never read one alone.
# narrator adds no pauses of its own here (all three pause flags 0), so both tools' audio
# is the model's speech alone.
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
    t = t[t.index("CHAPTER II\n"):]
    t = t[t.index("\n") + 1:]
    t = t[t.index("\n\n"):]  # past the chapter title
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
NOPAUSE=(--sentence-pause-ms 0 --paragraph-pause-ms 0 --chapter-pause-ms 0)
run_one() { # run_one NAME ROUND
    local name="$1" round="$2" out="$WORK/$1-$2" t0 t1 audio
    mkdir -p "$out"
    local TIME=(/usr/bin/time -o "$out/time.txt" -f '%e %M')
    case "$name" in
        narrator-piper) "${TIME[@]}" "$BIN" run "$WORK/text.txt" --voice en_US-joe-medium --format wav --out "$out" \
            --cache-dir "$WORK/cache" "${NOPAUSE[@]}" --json >"$out/summary.json" 2>/dev/null ;;
        narrator-single) "${TIME[@]}" "$BIN" run "$WORK/text.txt" --voice "$VOICE" --format wav --out "$out" \
            --cache-dir "$WORK/cache" --max-batch 1 "${NOPAUSE[@]}" --json >"$out/summary.json" 2>/dev/null ;;
        narrator-fp32) NARRATOR_KOKORO_GRAPH=fp32 "${TIME[@]}" "$BIN" run "$WORK/text.txt" --voice "$VOICE" --format wav --out "$out" \
            --cache-dir "$WORK/cache" --max-batch 1 "${NOPAUSE[@]}" --json >"$out/summary.json" 2>/dev/null ;;
        narrator-packed) "${TIME[@]}" "$BIN" run "$WORK/text.txt" --voice "$VOICE" --format wav --out "$out" \
            --cache-dir "$WORK/cache" --max-batch 16 "${NOPAUSE[@]}" --json >"$out/summary.json" 2>/dev/null ;;
        kokoro-onnx) "${TIME[@]}" "$VENV/bin/python" ops/bench/kokoro_ref.py synth "$MODEL" "$VOICE_BIN" \
            "$WORK/text.txt" "$out/book.wav" >"$out/summary.json" ;;
    esac
    read -r wall rss <"$out/time.txt"
    audio=$(python3 -c 'import sys, wave, glob; w = wave.open(glob.glob(sys.argv[1] + "/*.wav")[0]); print(w.getnframes() / w.getframerate())' "$out")
    echo "{\"name\": \"$name\", \"round\": $round, \"wall\": $wall, \"audio\": $audio, \"rss_kb\": $rss}" >>"$results"
    echo "  round $round $name: $wall s wall, $audio s audio, peak RSS $((rss / 1024)) MiB"
}
NAMES=(narrator-single narrator-packed kokoro-onnx narrator-piper)
# The fp32 graph (made by `ops/setup.sh --kokoro --gpu`), when installed: its quality on
# the CPU against the int8 graph's.
[[ -f .deps/voices/kokoro/model.fp32.onnx ]] && NAMES+=(narrator-fp32)
for r in $(seq 1 "$ROUNDS"); do
    for k in $(seq 0 $((${#NAMES[@]} - 1))); do
        run_one "${NAMES[$(((k + r) % ${#NAMES[@]}))]}" "$r"
    done
done
echo "bench-kokoro: word error rate of PocketSphinx on round $ROUNDS's outputs (the Piper voice's too)"
for name in "${NAMES[@]}"; do
    w=$("$VENV/bin/python" ops/bench/kokoro_ref.py wer "$WORK/text.txt" "$(ls "$WORK/$name-$ROUNDS"/*.wav | head -1)")
    echo "{\"name\": \"$name\", \"wer\": $(echo "$w" | python3 -c 'import json, sys; print(json.load(sys.stdin)["wer"])')}" >>"$results"
done
python3 - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
runs = [r for r in rows if "wall" in r]
wer = {r["name"]: r["wer"] for r in rows if "wer" in r}
names = [n for n in ["narrator-single", "narrator-packed", "kokoro-onnx", "narrator-piper", "narrator-fp32"]
         if any(r["name"] == n for r in runs)]
med = statistics.median
by = {n: {r["round"]: r for r in runs if r["name"] == n} for n in names}
ref = by["kokoro-onnx"]
print("medians over rounds; ratios paired per round (same minute), then the median")
print(f"{'':16} {'wall s':>7} {'audio s':>8} {'x realtime':>11} {'same text vs ref':>17} {'x realtime vs ref':>18} {'peak RSS MiB':>13} {'WER':>6}")
for n in names:
    rs = by[n]
    same = med([ref[k]["wall"] / rs[k]["wall"] for k in rs])
    xr = med([(rs[k]["audio"] / rs[k]["wall"]) / (ref[k]["audio"] / ref[k]["wall"]) for k in rs])
    print(f"{n:16} {med([r['wall'] for r in rs.values()]):7.1f} {med([r['audio'] for r in rs.values()]):8.1f} "
          f"{med([r['audio'] / r['wall'] for r in rs.values()]):11.2f} {same:17.3f} {xr:18.3f} "
          f"{med([r['rss_kb'] for r in rs.values()]) / 1024:13.0f} {wer.get(n, float('nan')):6.3f}")
PY
