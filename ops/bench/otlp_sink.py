#!/usr/bin/env python3
"""An OTLP/HTTP trace sink for the telemetry overhead benchmark (ops/bench-telemetry.sh).

Accepts `POST /v1/traces` (protobuf bodies, as `OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf`
sends them) and answers an empty ExportTraceServiceResponse (zero protobuf bytes), like a
collector that keeps up. It does not decode the spans (tests/observability.rs does that);
it counts requests and bytes and writes them as JSON to --stats on SIGTERM.

    python3 ops/bench/otlp_sink.py --port 14318 --stats /tmp/sink.json
"""
import argparse
import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STATS = {"requests": 0, "bytes": 0, "other_paths": 0}
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's naming)
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        with LOCK:
            if self.path == "/v1/traces":
                STATS["requests"] += 1
                STATS["bytes"] += len(body)
            else:
                STATS["other_paths"] += 1
        self.send_response(200 if self.path == "/v1/traces" else 404)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--stats", required=True)
    a = ap.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)

    def stop(*_):
        with LOCK, open(a.stats, "w") as f:
            json.dump(STATS, f)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    server.serve_forever()


if __name__ == "__main__":
    main()
