#!/usr/bin/env python3
"""Concurrent clients against a speech server, for ops/bench/serve.sh.

    serve_load.py URL BODY_JSON --clients C --requests N [--label NAME]

C threads share N POST requests of BODY_JSON to URL (each a new connection, as a simple
client makes them) and read each response to its end. Prints one JSON object: requests
per second over the run, time to the first body byte and to the last (median and p95,
seconds), bytes per response, and the failures (status and body).
"""
import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse


def one(url, body):
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    t0 = time.monotonic()
    conn.request("POST", u.path, body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    first = resp.read1(65536)
    t_first = time.monotonic() - t0
    n = len(first)
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        n += len(chunk)
    t_last = time.monotonic() - t0
    conn.close()
    return resp.status, t_first, t_last, n, (first[:200] if resp.status != 200 else b"")


def p95(xs):
    xs = sorted(xs)
    return xs[max(0, int(round(0.95 * len(xs))) - 1)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("body")
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    body = args.body.encode()
    left = [args.requests]
    lock = threading.Lock()
    results, failures = [], []

    def client():
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
            try:
                status, t_first, t_last, n, err = one(args.url, body)
            except Exception as e:  # a refused connection, a reset: counted, not fatal
                with lock:
                    failures.append(str(e))
                continue
            with lock:
                if status == 200:
                    results.append((t_first, t_last, n))
                else:
                    failures.append(f"{status} {err!r}")

    t0 = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    firsts = [r[0] for r in results]
    lasts = [r[1] for r in results]
    print(json.dumps({
        "label": args.label, "clients": args.clients, "requests": args.requests,
        "ok": len(results), "failures": failures[:5], "wall_s": round(wall, 3),
        "rps": round(len(results) / wall, 3) if wall > 0 else None,
        "first_byte_s": {"median": round(statistics.median(firsts), 3), "p95": round(p95(firsts), 3)} if firsts else None,
        "last_byte_s": {"median": round(statistics.median(lasts), 3), "p95": round(p95(lasts), 3)} if lasts else None,
        "bytes_median": int(statistics.median([r[2] for r in results])) if results else 0,
    }))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
