#!/usr/bin/env python3
"""CPU seconds used so far, per process group, from /proc (for before/after deltas).

Usage: cluster_cpu.py [WORKER_PID]   prints one JSON object:
  {"t": epoch, "total_busy_s": all cores' non-idle seconds since boot (/proc/stat),
   "groups": {"narrator worker": s, "narrator (other)": s, "beam.smp": s, "postgres": s,
              "s3s-fs": s, "other": s}}
A group's figure is utime+stime of its live processes plus cutime+cstime (children
they reaped: e.g. the postmaster holds its finished backends'), so exited Postgres
backends still count. Processes of other users of the shared services (other tests'
Postgres sessions, queues) are in the same groups: read the deltas with that in mind.
"""
import json
import os
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def group(comm, pid, worker):
    if worker and pid == worker:
        return "narrator worker"
    if comm.startswith("narrator"):
        return "narrator (other)"
    if comm in ("beam.smp", "erl_child_setup", "inet_gethost", "epmd"):
        return "beam.smp"
    if comm.startswith("postgres") or comm == "postmaster":
        return "postgres"
    if comm.startswith("s3s-fs"):
        return "s3s-fs"
    return "other"


def main(argv):
    worker = int(argv[0]) if argv else 0
    groups = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                s = f.read()
        except OSError:
            continue
        comm = s[s.index("(") + 1 : s.rindex(")")]
        rest = s[s.rindex(")") + 2 :].split()
        # fields after comm: state(0) ... utime(11) stime(12) cutime(13) cstime(14)
        secs = sum(int(x) for x in rest[11:15]) / TICK
        g = group(comm, int(d), worker)
        groups[g] = groups.get(g, 0.0) + secs
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    idle = cpu[3] + (cpu[4] if len(cpu) > 4 else 0)
    busy = (sum(cpu[:8]) - idle) / TICK
    print(json.dumps({"t": time.time(), "total_busy_s": busy, "groups": groups}))


if __name__ == "__main__":
    main(sys.argv[1:])
