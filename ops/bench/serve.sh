#!/usr/bin/env bash
# `narrator serve` against Piper's own HTTP server (issue 45), side by side in one run:
# 1, 4 and 16 concurrent clients (ops/bench/serve_load.py, a new connection per request)
# each asking for the same paragraph as WAV, the same voice (en_US-joe-medium) and the
# same ONNX Runtime wheel on the same CPU. narrator: `POST /v1/audio/speech` (streamed
# sentence by sentence); Piper: `python -m piper.http_server` (PyPI piper-tts, Flask;
# `POST /synthesize`, the whole WAV at once).
#
#   bash ops/bench/serve.sh [--clients "1 4 16"] [--requests 24] [--rounds 2]
#   BIN=PATH measures another build.
#
# Prints, per concurrency and server: requests per second (median of the rounds, which
# alternate the servers' order), time to the first and to the last byte (the median of
# the rounds' medians, the largest of their p95s), and narrator's throughput against
# Piper's. Raw JSON lines in $OUT.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
CLIENTS="1 4 16" REQUESTS=24 ROUNDS=2
while (($#)); do
    case "$1" in
    --clients) CLIENTS="$2"; shift 2 ;;
    --requests) REQUESTS="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    *) echo "usage: $0 [--clients \"1 4 16\"] [--requests N] [--rounds N]" >&2; exit 2 ;;
    esac
done
BENCH=serve
source "$ROOT/ops/bench/lib.sh"
bash ops/setup.sh --with-piper >/dev/null
if [[ -z "${BIN:-}" ]]; then
    BIN="$ROOT/target/release/narrator"
    cargo build --release --locked -q -p narrator
fi
PIPER_PY="$ROOT/.deps/piper-venv/bin/python"
MODEL="$ROOT/.deps/voices/en_US-joe-medium.onnx"
OUT="${OUT:-$(mktemp -d /tmp/narrator-serve-bench.XXXXXX)}"
mkdir -p "$OUT"
N_PORT="${N_PORT:-18090}" P_PORT="${P_PORT:-18091}"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT
"$BIN" serve --listen "127.0.0.1:$N_PORT" 2>"$OUT/narrator.log" &
PIDS+=($!)
"$PIPER_PY" -m piper.http_server -m "$MODEL" --host 127.0.0.1 --port "$P_PORT" 2>"$OUT/piper.log" &
PIDS+=($!)
up() { for _ in $(seq 600); do curl -fs -o /dev/null "$1" && return; sleep 0.2; done; die "$2 did not come up: $(tail -n 3 "$OUT/$2.log")"; }
up "http://127.0.0.1:$N_PORT/healthz" narrator
up "http://127.0.0.1:$P_PORT/voices" piper
TEXT="The harbour was quiet before dawn. One by one the boats went out, their lanterns swinging in the dark. By noon the gulls had followed them past the point, and the town was left to the old men mending nets on the pier. Nobody spoke of the storm that had come the winter before."
N_BODY="$(python3 -c 'import json,sys; print(json.dumps({"model": "tts-1", "voice": "alloy", "input": sys.argv[1], "response_format": "wav"}))' "$TEXT")"
P_BODY="$(python3 -c 'import json,sys; print(json.dumps({"text": sys.argv[1]}))' "$TEXT")"
# One request each first: the engines warm, the paths checked.
python3 ops/bench/serve_load.py "http://127.0.0.1:$N_PORT/v1/audio/speech" "$N_BODY" --clients 1 --requests 2 >/dev/null \
    || die "narrator serve refused the paragraph: $(tail -n 3 "$OUT/narrator.log")"
python3 ops/bench/serve_load.py "http://127.0.0.1:$P_PORT/synthesize" "$P_BODY" --clients 1 --requests 2 >/dev/null \
    || die "Piper's server refused the paragraph: $(tail -n 3 "$OUT/piper.log")"
say "clients: $CLIENTS; $REQUESTS requests each, $ROUNDS rounds alternating; files in $OUT"
: >"$OUT/runs.jsonl"
for round in $(seq "$ROUNDS"); do
    for c in $CLIENTS; do
        order=(narrator piper)
        ((round % 2 == 0)) && order=(piper narrator)
        for server in "${order[@]}"; do
            if [[ $server == narrator ]]; then
                url="http://127.0.0.1:$N_PORT/v1/audio/speech" body="$N_BODY"
            else
                url="http://127.0.0.1:$P_PORT/synthesize" body="$P_BODY"
            fi
            python3 ops/bench/serve_load.py "$url" "$body" --clients "$c" --requests "$REQUESTS" \
                --label "$server" >>"$OUT/runs.jsonl" || true
        done
    done
done
python3 - "$OUT/runs.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in runs:
    by.setdefault((r["clients"], r["label"]), []).append(r)
print("clients  server     req/s (each round)        first byte median / p95   last byte median / p95   failed")
for c in sorted({k[0] for k in by}):
    rps = {}
    for server in ("narrator", "piper"):
        rs = by.get((c, server), [])
        if not rs:
            continue
        rps[server] = statistics.median([r["rps"] or 0 for r in rs])
        rounds = ", ".join("%.2f" % (r["rps"] or 0) for r in rs)
        fb = [r["first_byte_s"] for r in rs if r["first_byte_s"]]
        lb = [r["last_byte_s"] for r in rs if r["last_byte_s"]]
        failed = sum(r["requests"] - r["ok"] for r in rs)
        fbs = "%.3f / %.3f" % (statistics.median([x["median"] for x in fb]), max(x["p95"] for x in fb)) if fb else "-"
        lbs = "%.3f / %.3f" % (statistics.median([x["median"] for x in lb]), max(x["p95"] for x in lb)) if lb else "-"
        print("%7d  %-9s  %6.2f (%s)  %-24s  %-23s  %d" % (c, server, rps[server], rounds, fbs, lbs, failed))
    if rps.get("piper"):
        print("         narrator / piper throughput at %d clients: %.2f" % (c, rps.get("narrator", 0) / rps["piper"]))
PY
