#!/usr/bin/env bash
# What one segment costs each service of the control plane, counted rather than timed
# (counts do not depend on how busy the machine is): one `narrator worker --engine null`
# (real phonemizer, S3 packs, Postgres records, RabbitMQ deliveries and acks, real
# assembly; the engine returns silence at once) on N generated one-sentence segments.
#   Postgres: transactions and rows written/read in the job's own database (pg_stat_database)
#   RabbitMQ: socket writes/reads and bytes each way on the worker's connection (rabbitmqctl
#             recv_cnt/send_cnt count packets, not AMQP frames)
#   S3:       objects and bytes written (the s3s-fs data folder), i.e. PUTs; the
#             assembly GETs each pack once
#
#   bash ops/bench/control_plane_counts.sh [N]      (default 2000; release build)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
N="${1:-2000}"
BIN="$ROOT/target/release/narrator"
[[ -x "$BIN" ]] || cargo build --release --locked -p narrator
eval "$(bash ops/s3-server.sh env)"
bash ops/s3-server.sh start >/dev/null
TAG="counts_$$"
TMP="$(mktemp -d)"
PSQL=(psql -h 127.0.0.1 -U postgres -qtAX)
"${PSQL[@]}" -c "CREATE DATABASE $TAG" >/dev/null
rabbitmqctl -q add_vhost "$TAG" >/dev/null
rabbitmqctl -q set_permissions -p "$TAG" guest '.*' '.*' '.*' >/dev/null
export NARRATOR_DATABASE_URL="postgres://postgres@127.0.0.1:5432/$TAG"
export NARRATOR_AMQP_URL="amqp://guest:guest@127.0.0.1:5672/$TAG"
worker=""
cleanup() {
    [[ -n "$worker" ]] && kill "$worker" 2>/dev/null && wait "$worker" 2>/dev/null || true
    "${PSQL[@]}" -c "DROP DATABASE IF EXISTS $TAG WITH (FORCE)" >/dev/null || true
    rabbitmqctl -q delete_vhost "$TAG" >/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT
"$BIN" migrate >/dev/null
python3 ops/bench/cluster_text.py "$N" "$TMP/book.md"
"$BIN" --log info worker --engine null --keep-intermediates --id counts 2>"$TMP/worker.log" &
worker=$!
for _ in $(seq 600); do grep -q " ready" "$TMP/worker.log" && break; sleep 0.2; done
pg() {
    "${PSQL[@]}" -d "$TAG" -c "SELECT xact_commit + xact_rollback, tup_inserted, tup_updated, tup_deleted, tup_returned, tup_fetched FROM pg_stat_database WHERE datname = '$TAG'"
}
before="$(pg)"
job="$("$BIN" submit "$TMP/book.md" --format wav --json | python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["job_id"])')"
"$BIN" status "$job" --wait --json >/dev/null
sleep 1 # the stats collector
after="$(pg)"
amqp="$(rabbitmqctl -q list_connections vhost recv_oct send_oct recv_cnt send_cnt | awk -v v="$TAG" '$1 == v {print $2, $3, $4, $5}' | head -n1)"
segments="$("${PSQL[@]}" -d "$TAG" -c "SELECT segments_total FROM jobs WHERE id = '$job'")"
scans="$("${PSQL[@]}" -d "$TAG" -F ' ' -c "SELECT relname, seq_scan, seq_tup_read FROM pg_stat_user_tables WHERE seq_tup_read > 0 ORDER BY seq_tup_read DESC LIMIT 4")"
jobdir="$ROOT/.deps/s3/data/${NARRATOR_S3_BUCKET:-narrator}/jobs/$job"
packs="$(find "$jobdir" -path '*packs*' -type f | wc -l)"
pack_bytes="$(find "$jobdir" -path '*packs*' -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')"
outputs="$(find "$jobdir/out" -type f | wc -l)"
out_bytes="$(find "$jobdir/out" -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')"
python3 - "$segments" "$before" "$after" "$amqp" "$packs" "$pack_bytes" "$outputs" "$out_bytes" <<'PY'
import sys
n = int(sys.argv[1])
b = [int(x) for x in sys.argv[2].split("|")]
a = [int(x) for x in sys.argv[3].split("|")]
d = [y - x for x, y in zip(b, a)]
recv_oct, send_oct, recv_cnt, send_cnt = (int(x) for x in sys.argv[4].split())
packs, pack_bytes, outputs, out_bytes = (int(x) for x in sys.argv[5:9])
print(f"segments: {n}")
print(f"postgres: {d[0] / n:.3f} transactions, {d[1] / n:.2f} rows inserted, {d[2] / n:.2f} updated, "
      f"{d[3] / n:.2f} deleted, {d[4] / n:.1f} returned, {d[5] / n:.1f} fetched per segment "
      f"(job's database, submit + worker + status)")
print(f"rabbitmq (worker connection): {send_cnt / n:.2f} socket writes / {send_oct / n:.0f} bytes to the worker, "
      f"{recv_cnt / n:.2f} reads / {recv_oct / n:.0f} bytes from it, per segment")
print(f"s3: {packs} packs = {n / max(packs, 1):.1f} segments per PUT (and per assembly GET), "
      f"{pack_bytes / n:.0f} bytes per segment; {outputs} outputs, {out_bytes} bytes")
PY
echo "postgres sequential scans (table, scans, rows read): $(echo "$scans" | paste -sd ';' -)"
