#!/usr/bin/env python3
"""Runs a command and samples its resident memory, to see WHEN the peak happens.

Usage: rss_trace.py [--journal FILE] [--every S] -- COMMAND...

Every S seconds (default 0.05) records VmRSS, thread count, and, with --journal, the
number of lines in that file (narrator's OUT/.narrator/journal.jsonl gets one line per
finished segment, so the line count says which segment was running). Prints the samples
where RSS grew by 20 MiB or more, then the peak.
"""
import subprocess
import sys
import time


def main(argv):
    journal, every = None, 0.05
    while argv and argv[0] != "--":
        if argv[0] == "--journal":
            journal, argv = argv[1], argv[2:]
        elif argv[0] == "--every":
            every, argv = float(argv[1]), argv[2:]
        else:
            sys.exit(__doc__)
    cmd = argv[1:]
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    last, peak = 0, (0, 0.0, 0)
    while p.poll() is None:
        try:
            st = open(f"/proc/{p.pid}/status").read()
        except OSError:
            break
        kv = dict(l.split(":", 1) for l in st.splitlines() if ":" in l)
        rss = int(kv.get("VmRSS", "0 kB").split()[0]) // 1024
        thr = int(kv.get("Threads", "0"))
        done = 0
        if journal:
            try:
                done = sum(1 for _ in open(journal))
            except OSError:
                pass
        t = time.time() - t0
        if rss >= last + 20:
            print(f"t={t:6.2f}s  RSS {rss:5d} MiB  threads {thr:3d}  segments done {done}")
            last = rss
        if rss > peak[0]:
            peak = (rss, t, done)
        time.sleep(every)
    print(f"peak {peak[0]} MiB at t={peak[1]:.2f}s with {peak[2]} segments done; exit {p.wait()}")


if __name__ == "__main__":
    main(sys.argv[1:])
