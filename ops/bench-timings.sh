#!/usr/bin/env bash
# Timing accuracy against an independent ear (issue 30): narrator reads a held-out text
# (the first WORDS words of chapter III of Alice, shared corpus; no timing choice was
# tuned on it) with `--subtitles srt`, then PocketSphinx (PyPI; the one recogniser whose
# model reaches this machine) hears the book file, and every sentence whose first word it
# heard is compared with timings.json, and so is every word (timings.json's words, from
# the model's durations): median and 95th percentile of |heard start - timings start|. Goal: median < 0.1 s, p95 < 0.3 s. PocketSphinx's own word starts are
# only as good as its 10 ms frames and its acoustic model: read the spread, not one value.
#
#   bash ops/bench-timings.sh [--words N] [--voice NAME]...   (default: en_US-joe-medium)
set -euo pipefail
cd "$(dirname "$0")/.."
WORDS=600
VOICES=()
while (($#)); do
    case "$1" in
        --words) WORDS="$2"; shift 2 ;;
        --voice) VOICES+=("$2"); shift 2 ;;
        *) echo "bench-timings: unknown option $1 (known: --words N, --voice NAME)" >&2; exit 2 ;;
    esac
done
((${#VOICES[@]})) || VOICES=(en_US-joe-medium)
bash ops/setup.sh >/dev/null
command -v ffmpeg >/dev/null || { echo "bench-timings: needs ffmpeg (bash ops/setup.sh --test)" >&2; exit 1; }
VENV=.deps/asr-venv
if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c 'import pocketsphinx' 2>/dev/null; then
    echo "bench-timings: making $VENV (pocketsphinx 5.1.1)"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check pocketsphinx==5.1.1
fi
cargo build --locked -p narrator --quiet  # the debug binary the tests use: no second build
BIN=target/debug/narrator
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
python3 - ../shared/corpus/alice29.txt "$WORDS" "$WORK/text.txt" <<'PY'
import os, sys
src, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if os.path.exists(src):
    t = open(src, encoding="latin-1").read()
    t = t[t.index("CHAPTER III\n"):]
    t = t[t.index("\n") + 1:]
    t = t[t.index("\n\n"):]
else:
    t = open("examples/sample.md", encoding="utf-8").read()
text = " ".join(t.split()[:n])
cut = max(text.rfind("."), text.rfind("!"), text.rfind("?"))
open(out, "w", encoding="utf-8").write(text[: cut + 1] + "\n")
PY
for voice in "${VOICES[@]}"; do
    out="$WORK/$voice"
    "$BIN" run "$WORK/text.txt" --voice "$voice" --format wav --subtitles srt --out "$out" >/dev/null
    book="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["book"]["file"])' "$out/manifest.json")"
    printf '%s\t' "$voice"
    "$VENV/bin/python" ops/bench/timings_asr.py "$out/timings.json" "$out/$book"
done
