#!/usr/bin/env python3
"""Wait for a job with `narrator status JOB --wait --json`; print one JSON line.

Usage: cluster_poll.py NARRATOR JOB [--timeout 3600]

One process (the services come from the environment) asks Postgres for the job's state
every 100 ms (one indexed row) until it ends, then prints the status once. Earlier
versions started `narrator status --json` five times a second, which cost ~4 CPU-s per
chapter on the machine under test. On `done` this prints {"t_done": epoch seconds right
after the status process exited, "t_done_before": 0.1 s earlier (the last poll that
did not see it), "polls": the status processes started (1), "poll_cpu_s": their user+sys
CPU, "status": the status JSON} and exits 0. On `failed` or `cancelled` it prints the
reason to stderr and exits 1; on timeout or a status error, exits 2.
"""
import json
import resource
import subprocess
import sys
import time


def main(argv):
    timeout = 3600.0
    args = []
    i = 0
    while i < len(argv):
        if argv[i] == "--timeout":
            timeout = float(argv[i + 1]); i += 2
        elif argv[i] == "--interval":  # accepted for old callers; the wait polls every 0.1 s
            i += 2
        else:
            args.append(argv[i]); i += 1
    if len(args) != 2:
        sys.exit(__doc__)
    narrator, job = args
    try:
        r = subprocess.run([narrator, "status", job, "--wait", "--json"], capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print("cluster_poll: timed out after %.0f s" % timeout, file=sys.stderr)
        return 2
    after = time.time()
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = r.stdout.strip().splitlines()
    if not lines:
        print("cluster_poll: status failed (%d): %s" % (r.returncode, r.stderr.strip()[-300:]), file=sys.stderr)
        return 2
    d = json.loads(lines[-1])
    state = d.get("state")
    if state == "done" and r.returncode == 0:
        print(json.dumps({"t_done": after, "t_done_before": after - 0.1, "polls": 1,
                          "poll_cpu_s": ru.ru_utime + ru.ru_stime, "status": d}))
        return 0
    print("cluster_poll: job %s %s: %s: %s" % (job, state, d.get("failure_kind"),
                                              d.get("failure_reason")), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
