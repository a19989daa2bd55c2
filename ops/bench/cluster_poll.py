#!/usr/bin/env python3
"""Poll `narrator status JOB --json` until the job ends; print one JSON line.

Usage: cluster_poll.py NARRATOR JOB [--interval 0.2] [--timeout 3600]

Runs `NARRATOR status JOB --json` every INTERVAL seconds (a new process each time, as a
user would; the services come from the environment). On `done` it prints
{"t_done": epoch seconds right after the poll that saw it, "t_done_before": right before
that poll started, "polls": n, "poll_cpu_s": user+sys CPU of all the status processes,
"status": the status JSON} and exits 0. On `failed` or `cancelled` it prints the reason
to stderr and exits 1; on timeout, or 10 status errors in a row, exits 2.
"""
import json
import resource
import subprocess
import sys
import time


def main(argv):
    interval, timeout = 0.2, 3600.0
    args = []
    i = 0
    while i < len(argv):
        if argv[i] == "--interval":
            interval = float(argv[i + 1]); i += 2
        elif argv[i] == "--timeout":
            timeout = float(argv[i + 1]); i += 2
        else:
            args.append(argv[i]); i += 1
    if len(args) != 2:
        sys.exit(__doc__)
    narrator, job = args
    start = time.time()
    polls = errors = 0
    last_note = 0.0
    while True:
        before = time.time()
        r = subprocess.run([narrator, "status", job, "--json"], capture_output=True, text=True)
        after = time.time()
        polls += 1
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = ru.ru_utime + ru.ru_stime
        if r.returncode != 0:
            errors += 1
            print("cluster_poll: status failed (%d): %s" % (r.returncode, r.stderr.strip()[-300:]), file=sys.stderr)
            if errors >= 10:
                return 2
        else:
            errors = 0
            d = json.loads(r.stdout.strip().splitlines()[-1])
            state = d.get("state")
            if state == "done":
                print(json.dumps({"t_done": after, "t_done_before": before, "polls": polls,
                                  "poll_cpu_s": cpu, "status": d}))
                return 0
            if state in ("failed", "cancelled"):
                print("cluster_poll: job %s %s: %s: %s" % (job, state, d.get("failure_kind"),
                                                          d.get("failure_reason")), file=sys.stderr)
                return 1
            if after - last_note >= 10:
                last_note = after
                print("cluster_poll: %s %s/%s segments after %.0f s" % (
                    state, d.get("segments_done"), d.get("segments_total"), after - start), file=sys.stderr)
        if after - start > timeout:
            print("cluster_poll: timed out after %.0f s" % (after - start), file=sys.stderr)
            return 2
        time.sleep(max(0.0, interval - (time.time() - before)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
