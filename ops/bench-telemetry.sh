#!/usr/bin/env bash
# Telemetry overhead: the comparison harness's distributed arm (submit -> one worker ->
# done, the real voice) with telemetry off and on, side by side in every round. "On" is
# `narrator worker --otlp --listen 127.0.0.1:PORT`: every span exported over OTLP
# (HTTP/protobuf) to a local sink (ops/bench/otlp_sink.py) and /metrics scraped every 5 s
# by Debian's Prometheus. The report's line "distributed (--otlp ...) / distributed" is the
# ratio (medians, and paired per round); the target is >= 0.98.
#
#   bash ops/bench-telemetry.sh [--rounds N] [other bench-cluster.sh options]
#
# Prints bench-cluster's Markdown report, then what the sink and Prometheus received.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
command -v prometheus >/dev/null || {
    echo "bench-telemetry: needs Debian's prometheus (apt-get install prometheus)" >&2
    exit 1
}
SINK_PORT="${NARRATOR_BENCH_SINK_PORT:-14318}"
METRICS_PORT="${NARRATOR_BENCH_METRICS_PORT:-19464}"
PROM_PORT="${NARRATOR_BENCH_PROM_PORT:-19090}"
WORK="$(mktemp -d)"
cleanup() {
    [[ -n "${SINK:-}" ]] && kill "$SINK" 2>/dev/null || true
    [[ -n "${PROM:-}" ]] && kill "$PROM" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
python3 ops/bench/otlp_sink.py --port "$SINK_PORT" --stats "$WORK/sink.json" &
SINK=$!
cat >"$WORK/prometheus.yml" <<YAML
global:
  scrape_interval: 5s
scrape_configs:
  - job_name: narrator
    static_configs:
      - targets: ['127.0.0.1:$METRICS_PORT']
YAML
prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/prom" \
    --web.listen-address="127.0.0.1:$PROM_PORT" >"$WORK/prometheus.log" 2>&1 &
PROM=$!
export OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$SINK_PORT"
export OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf
export OTEL_SERVICE_NAME=narrator-bench
bash ops/bench-cluster.sh --only e2e --no-piper \
    --e2e-worker "--otlp --listen 127.0.0.1:$METRICS_PORT" "$@"
scrapes=$(curl -fsS "http://127.0.0.1:$PROM_PORT/api/v1/query" \
    --data-urlencode 'query=sum(count_over_time(up{job="narrator"}[1d]))' |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else 0)')
segments=$(curl -fsS "http://127.0.0.1:$PROM_PORT/api/v1/query" \
    --data-urlencode 'query=max(max_over_time(narrator_segments_done_total[1d]))' |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else 0)')
kill "$SINK"; wait "$SINK" 2>/dev/null || true; SINK=""
echo
echo "Telemetry received: $(cat "$WORK/sink.json") (OTLP/HTTP requests and bytes at the sink);"
echo "Prometheus scrapes of the telemetry-on workers: $scrapes; most segments one worker counted: $segments."
