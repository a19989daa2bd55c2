#!/usr/bin/env python3
"""Summarizes ops/bench-cpu.sh's runs.tsv into one Markdown table (readable as text too).

Usage: summarize.py RUNS.tsv META.json
runs.tsv columns (tab-separated, header line): round tool wall_s rss_kib audio_s
speech_s loop_s load_before load_after note
"""
import csv
import json
import statistics
import sys


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main(runs_path, meta_path):
    with open(meta_path) as f:
        meta = json.load(f)
    with open(runs_path) as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    tools = []
    for r in rows:
        if r["tool"] not in tools:
            tools.append(r["tool"])
    by = {t: [r for r in rows if r["tool"] == t and float(r["wall_s"]) > 0] for t in tools}

    stats = {}
    for t, rs in by.items():
        thr = [float(r["audio_s"]) / float(r["wall_s"]) for r in rs]
        rss = [int(r["rss_kib"]) / 1024 for r in rs]
        loops = [float(r["audio_s"]) / float(r["loop_s"]) for r in rs if r["loop_s"] not in ("", "0")]
        stats[t] = dict(
            n=len(rs), thr=med(thr), lo=min(thr, default=float("nan")), hi=max(thr, default=float("nan")),
            rss=med(rss), audio=med([float(r["audio_s"]) for r in rs]),
            wall=med([float(r["wall_s"]) for r in rs]), loop=med(loops) if loops else None,
        )

    out = []
    p = print
    p(f"## CPU benchmark, {meta['date']}")
    p()
    p(f"- Machine: {meta['cpu']}, nproc {meta['nproc']}, {meta['mem']}; {meta['os']}")
    p(f"- Text: {meta['text']} ({meta['words']} words); {meta['rounds']} interleaved rounds; "
      f"narrator {meta['narrator']}, piper-tts {meta['piper']}, onnxruntime {meta['ort']}")
    p(f"- Load average (1 min) before/after each run: min {meta['load_min']:.2f}, "
      f"median {meta['load_med']:.2f}, max {meta['load_max']:.2f} "
      f"(uptime at start: `{meta['uptime_start']}`; at end: `{meta['uptime_end']}`)")
    p(f"- Throughput = audio seconds / wall seconds of the whole process (model load included).")
    p()
    p("| tool | runs | audio s | median wall s | median x realtime | min | max | median peak RSS MiB |")
    p("|---|---|---|---|---|---|---|---|")
    for t in tools:
        s = stats[t]
        p(f"| {t} | {s['n']} | {s['audio']:.1f} | {s['wall']:.1f} | **{s['thr']:.2f}** | {s['lo']:.2f} | "
          f"{s['hi']:.2f} | {s['rss']:.0f} |")
    raw = stats.get("raw ORT loop")
    if raw and raw["loop"]:
        p(f"| raw ORT loop, inference only | {raw['n']} | {raw['audio']:.1f} | – | **{raw['loop']:.2f}** | – | – | – |")
    p()
    pi, na = stats.get("piper CLI"), stats.get("narrator")
    if pi and na:
        tr = na["thr"] / pi["thr"]
        rr = na["rss"] / pi["rss"]
        p("| ratio | measured | target | verdict |")
        p("|---|---|---|---|")
        p(f"| narrator / Piper throughput (medians) | {tr:.3f} | ≥ 0.95 | {'met' if tr >= 0.95 else 'NOT met'} |")
        p(f"| narrator / Piper peak RSS (medians) | {rr:.3f} | ≤ 1.2 | {'met' if rr <= 1.2 else 'NOT met'} |")
        # Paired per round (same load minute): more robust than a ratio of medians on a
        # machine whose load drifts between rounds.
        paired = []
        for rd in sorted({r["round"] for r in rows}, key=int):
            a = [r for r in by["narrator"] if r["round"] == rd]
            b = [r for r in by["piper CLI"] if r["round"] == rd]
            if a and b:
                paired.append((float(a[0]["audio_s"]) / float(a[0]["wall_s"]))
                              / (float(b[0]["audio_s"]) / float(b[0]["wall_s"])))
        if paired:
            p(f"| narrator / Piper throughput, paired per round (median; min–max) | {med(paired):.3f} "
              f"({min(paired):.2f}–{max(paired):.2f}) | ≥ 0.95 | {'met' if med(paired) >= 0.95 else 'NOT met'} |")
        if raw:
            p(f"| narrator / raw ORT loop throughput | {na['thr'] / raw['thr']:.3f} | – | – |")
            p(f"| Piper / raw ORT loop throughput | {pi['thr'] / raw['thr']:.3f} | – | – |")
        p()
    p("<details><summary>every run</summary>")
    p()
    p("| round | tool | wall s | peak RSS MiB | audio s | x realtime | load before → after | note |")
    p("|---|---|---|---|---|---|---|---|")
    for r in rows:
        w = float(r["wall_s"])
        thr = float(r["audio_s"]) / w if w > 0 else 0.0
        p(f"| {r['round']} | {r['tool']} | {w:.1f} | {int(r['rss_kib']) / 1024:.0f} | {float(r['audio_s']):.1f} | "
          f"{thr:.2f} | {r['load_before']} → {r['load_after']} | {r['note']} |")
    p()
    p("</details>")


if __name__ == "__main__":
    main(*sys.argv[1:])
