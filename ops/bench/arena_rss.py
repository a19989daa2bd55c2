#!/usr/bin/env python3
"""RSS of `narrator run` under each ONNX Runtime CPU arena mode, side by side.

The text is paragraphs of ../shared/corpus/alice29.txt (or --book) in ascending length,
so every few segments is the longest utterance so far: the worst case for an arena that
keeps its peak. Each round runs every mode once, in turn; the process's VmRSS is sampled
every 0.25 s. Prints per run: wall seconds, x realtime, and RSS at 25 %, 50 %, 75 % and
100 % of the run, its peak, and growth from the 25 % sample to the end.

    python3 ops/bench/arena_rss.py [--every 6] [--rounds 2] [--modes keep,shrink,off]
                                   [--order ascending|descending|shuffled]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rss_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--book", default=os.path.join(ROOT, "..", "shared", "corpus", "alice29.txt"))
    ap.add_argument("--every", type=int, default=6, help="take every Nth paragraph")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--modes", default="keep,shrink,off")
    ap.add_argument("--order", choices=["ascending", "descending", "shuffled"], default="ascending",
                    help="paragraph order: ascending grows to a new maximum every few segments; "
                         "descending puts the longest first (a perfect warm-up)")
    ap.add_argument("--narrator", default=os.path.join(ROOT, "target", "release", "narrator"))
    a = ap.parse_args()
    text = open(a.book, encoding="utf-8", errors="replace").read()
    paras = [" ".join(p.split()) for p in text.split("\n\n")]
    paras = [p for p in paras if len(p) > 20 and not p.isupper()]
    paras = sorted(paras[:: a.every], key=len)
    if a.order == "descending":
        paras.reverse()
    elif a.order == "shuffled":
        import random
        random.Random(29).shuffle(paras)
    work = tempfile.mkdtemp(prefix="narrator-arena-")
    src = os.path.join(work, f"{a.order}.md")
    with open(src, "w") as f:
        f.write(f"# {a.order.title()}\n\n" + "\n\n".join(paras) + "\n")
    print(f"text: {len(paras)} paragraphs of {a.book}, {a.order} by length ({src})")
    rows = []
    for rnd in range(1, a.rounds + 1):
        for mode in a.modes.split(","):
            out = os.path.join(work, f"out-{mode}-{rnd}")
            env = dict(os.environ, NARRATOR_CPU_ARENA=mode)
            t0 = time.monotonic()
            p = subprocess.Popen(
                [a.narrator, "run", src, "--out", out, "--format", "wav", "--json"],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            )
            samples = []
            while p.poll() is None:
                r = rss_mib(p.pid)
                if r is not None:
                    samples.append((time.monotonic() - t0, r))
                time.sleep(0.25)
            wall = time.monotonic() - t0
            summary = json.loads(p.stdout.read() or b"{}") if p.returncode == 0 else {}
            if p.returncode != 0 or not samples:
                print(f"round {rnd} {mode}: narrator exited {p.returncode}", file=sys.stderr)
                sys.exit(1)
            audio = summary.get("audio_seconds", 0.0)

            def at(frac):
                t = wall * frac
                return min(samples, key=lambda s: abs(s[0] - t))[1]

            peak = max(r for _, r in samples)
            row = dict(round=rnd, mode=mode, wall=wall, x=audio / wall if wall else 0,
                       q1=at(0.25), q2=at(0.5), q3=at(0.75), end=samples[-1][1], peak=peak)
            row["growth"] = row["end"] - row["q1"]
            rows.append(row)
            print(f"round {rnd} {mode:6} wall {wall:6.1f} s  {row['x']:5.1f}x  RSS MiB 25% {row['q1']:6.0f}"
                  f"  50% {row['q2']:6.0f}  75% {row['q3']:6.0f}  end {row['end']:6.0f}  peak {peak:6.0f}"
                  f"  growth after 25% {row['growth']:+5.0f}", flush=True)
    print("\nmedians per mode:")
    print("| mode | x realtime | ratio to keep | RSS at 25 % | RSS at end | peak | growth after 25 % |")
    print("|---|---|---|---|---|---|---|")
    med = {}
    for mode in a.modes.split(","):
        rs = [r for r in rows if r["mode"] == mode]
        med[mode] = {k: statistics.median(r[k] for r in rs) for k in ("x", "q1", "end", "peak", "growth")}
    base = med.get("keep", next(iter(med.values())))["x"]
    for mode, m in med.items():
        print(f"| {mode} | {m['x']:.2f} | {m['x'] / base:.3f} | {m['q1']:.0f} | {m['end']:.0f} | {m['peak']:.0f} | {m['growth']:+.0f} |")


if __name__ == "__main__":
    main()
