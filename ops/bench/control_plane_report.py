#!/usr/bin/env python3
"""Report of ops/bench/control_plane_statements.sh: OUT/totals.txt and OUT/statements_N.tsv.

Per book size: pg_stat_database's transactions and rows per segment, and the ratio of each
to the smallest book's (flat work per segment: about 1.0); then per statement (matched
across sizes by its normalized text) calls, rows and buffer pages per segment, largest
first at the largest size; then the worker's RabbitMQ operations and S3 requests and
bytes per segment (OUT/metrics_N.txt, its /metrics at the end).

Usage: control_plane_report.py OUT
"""
import sys
from pathlib import Path


def totals(out):
    rows = []
    for line in (out / "totals.txt").read_text().splitlines():
        parts = line.split("|")
        n = int(parts[0])
        b = [int(x) for x in parts[1:7]]
        a = [int(x) for x in parts[7:13]]
        polls, t0, t1 = int(parts[13]), float(parts[14]), float(parts[15])
        rows.append((n, [y - x for x, y in zip(b, a)], polls, t1 - t0))
    return rows


def statements(out, n):
    stats = {}
    for line in (out / f"statements_{n}.tsv").read_text().splitlines():
        calls, rows, blocks, ms, query = line.split("\t", 4)
        key = query[:90]
        c = stats.setdefault(key, [0, 0, 0, 0.0])
        c[0] += int(calls)
        c[1] += int(rows)
        c[2] += int(blocks)
        c[3] += float(ms)
    return stats


ROUND_TRIPS = [
    ("narrator_broker_messages_total", "op"),
    ("narrator_s3_requests_total", "method"),
    ("narrator_s3_bytes_total", "direction"),
]


def round_trips(path):
    """{(metric, label value): total} from a Prometheus text scrape (several workers'
    concatenated), summed over the other labels; empty when the file is missing."""
    found = {}
    if not path.exists():
        return found
    for line in path.read_text().splitlines():
        for metric, label in ROUND_TRIPS:
            if not line.startswith(metric + "{"):
                continue
            labels, value = line[len(metric) + 1:].rsplit("} ", 1)
            for pair in labels.split(","):
                k, _, v = pair.partition("=")
                if k == label:
                    key = (metric, v.strip('"'))
                    found[key] = found.get(key, 0.0) + float(value)
    return found


def main(argv):
    if len(argv) != 1:
        sys.exit(__doc__)
    out = Path(argv[0])
    tot = totals(out)
    names = ["transactions", "inserted", "updated", "deleted", "returned", "fetched"]
    sizes = [n for n, _, _, _ in tot]
    per_size = {n: statements(out, n) for n in sizes}
    print("| segments | seconds | status polls | " + " | ".join(names)
          + " | returned+fetched | vs smallest | pages (pg_stat_statements) | vs smallest |")
    print("|---" * (len(names) + 7) + "|")
    base = base_pages = None
    for n, d, polls, secs in tot:
        per = [x / n for x in d]
        rf = per[4] + per[5]
        pages = sum(c[2] for c in per_size[n].values()) / n
        base = base or rf
        base_pages = base_pages or pages
        cells = " | ".join(f"{x:.2f}" for x in per)
        print(f"| {n:,} | {secs:.1f} | {polls} | {cells} | {rf:.1f} | {rf / base:.2f}x "
              f"| {pages:.1f} | {pages / base_pages:.2f}x |")
    print()
    keys = set()
    for s in per_size.values():
        keys |= set(s)
    big = per_size[sizes[-1]]
    order = sorted(keys, key=lambda k: -(big.get(k, [0, 0, 0, 0])[2]))
    head = " | ".join(f"{n:,}: calls / rows / pages" for n in sizes)
    print(f"| statement (start) | {head} |")
    print("|---" * (len(sizes) + 1) + "|")
    for k in order:
        cells = []
        for n in sizes:
            c = per_size[n].get(k)
            cells.append("-" if c is None else f"{c[0] / n:.3f} / {c[1] / n:.2f} / {c[2] / n:.2f}")
        label = k.replace("|", "\\|")
        print(f"| `{label}` | " + " | ".join(cells) + " |")
    trips = {n: round_trips(out / f"metrics_{n}.txt") for n in sizes}
    keys = sorted(set().union(*[set(t) for t in trips.values()]))
    if keys:
        print()
        print("| per segment (the worker's /metrics) | " + " | ".join(f"{n:,}" for n in sizes) + " |")
        print("|---" * (len(sizes) + 1) + "|")
        for metric, value in keys:
            what = metric.removeprefix("narrator_").removesuffix("_total")
            cells = [f"{trips[n].get((metric, value), 0.0) / n:.3f}" for n in sizes]
            print(f"| {what} {value} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
