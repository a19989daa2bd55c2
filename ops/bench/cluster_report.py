#!/usr/bin/env python3
"""The tables of ops/bench-cluster.sh, from its work folder.

Usage: cluster_report.py WORK [--meta key=value ...]   the Markdown report (stdout)
       cluster_report.py --progress WORK KEY           one progress line per run of round
                                                       KEY (a number) or of KEY (null-pN)

Each run is a folder WORK/runs/<arm>-r<round> (or null-p<plan>) holding `meta`
(key=value lines written by the driver), `time` / `submit.time` (/usr/bin/time
"%e %M %U %S"), the tools' stdout/stderr, `poll.json` (ops/bench/cluster_poll.py),
`cpu0.json`/`cpu1.json` (ops/bench/cluster_cpu.py) and, for the null engine, `top.txt`.
"""
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def read_meta(path):
    meta = {}
    if os.path.exists(path):
        for line in open(path):
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                meta[k] = v
    return meta


def num(meta, key):
    v = meta.get(key, "")
    try:
        return float(v)
    except ValueError:
        return None


def read_time(path):
    """(wall s, peak RSS KiB, user s, sys s) from /usr/bin/time -f '%e %M %U %S'."""
    if not os.path.exists(path):
        return None
    last = [l for l in open(path).read().splitlines() if l.strip()][-1].split()
    return float(last[0]), int(last[1]), float(last[2]), float(last[3])


def last_json(path):
    with open(path) as f:
        return json.loads(f.read().strip().splitlines()[-1])


def engine_ready_at(stderr_path):
    """Epoch seconds of the "engine ready" log line, or None."""
    for line in open(stderr_path, errors="replace"):
        line = ANSI.sub("", line)
        if "engine ready" in line:
            m = re.match(r"\s*(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z", line)
            if m:
                ts = m.group(1)
                if "." in ts:
                    head, frac = ts.split(".")
                    ts = head + "." + frac[:6]
                    fmt = "%Y-%m-%dT%H:%M:%S.%f"
                else:
                    fmt = "%Y-%m-%dT%H:%M:%S"
                dt = datetime.datetime.strptime(ts, fmt).replace(tzinfo=datetime.timezone.utc)
                return dt.timestamp()
    return None


def load_run(d):
    meta = read_meta(os.path.join(d, "meta"))
    arm = meta.get("arm")
    r = {"dir": d, "arm": arm, "round": meta.get("round"), "meta": meta,
         "load": (meta.get("load_before", "?"), meta.get("load_after", "?"))}
    if arm == "piper CLI":
        t = read_time(os.path.join(d, "time"))
        if not t or num(meta, "audio_s") is None:
            return None
        r.update(wall=t[0], rss_kib=t[1], audio=num(meta, "audio_s"))
    elif arm == "raw ORT loop":
        t = read_time(os.path.join(d, "time"))
        if not t:
            return None
        j = last_json(os.path.join(d, "stdout"))
        r.update(wall=t[0], rss_kib=t[1], audio=j["audio_seconds"], loop=j.get("loop_seconds"),
                 load_s=j.get("load_seconds"), sentences=j.get("sentences"))
    elif arm == "embedded":
        t = read_time(os.path.join(d, "time"))
        if not t:
            return None
        j = last_json(os.path.join(d, "stdout"))
        r.update(wall=t[0], rss_kib=t[1], audio=j["audio_seconds"], speech=j.get("speech_seconds"),
                 segments=j.get("segments"), chapters=j.get("chapters"), json_wall=j.get("wall_seconds"))
        ready = engine_ready_at(os.path.join(d, "stderr"))
        t0 = num(meta, "t0")
        r["load_s"] = (ready - t0) if (ready and t0) else None
    elif arm == "null" or arm.startswith("distributed"):
        poll = os.path.join(d, "poll.json")
        if not os.path.exists(poll) or os.path.getsize(poll) == 0:
            return None
        p = last_json(poll)
        st = p["status"]
        t0 = num(meta, "t0")
        sub = read_time(os.path.join(d, "submit.time"))
        g = lambda k: num(meta, k)
        segs = st.get("segments_total") or 0
        r.update(
            wall=p["t_done"] - t0,
            wall_db=(g("db_finished_at") - t0) if g("db_finished_at") else None,
            audio=st.get("audio_seconds"), speech=st.get("speech_seconds"), segments=segs,
            segments_done=st.get("segments_done"), polls=p.get("polls"), poll_cpu=p.get("poll_cpu_s"),
            submit_wall=sub[0] if sub else None, submit_cpu=(sub[2] + sub[3]) if sub else None,
            submit_rss_kib=sub[1] if sub else None,
            submitted_rel=(g("t_submitted") - t0) if g("t_submitted") else None,
            created_rel=(g("db_created_at") - t0) if g("db_created_at") else None,
            records_publish=(g("db_last_published") - g("db_created_at"))
            if g("db_last_published") and g("db_created_at") else None,
            first_published_rel=(g("db_first_published") - t0) if g("db_first_published") else None,
            last_published_rel=(g("db_last_published") - t0) if g("db_last_published") else None,
            first_done_rel=(g("db_first_done") - t0) if g("db_first_done") else None,
            last_done_rel=(g("db_last_done") - t0) if g("db_last_done") else None,
            worker_span=(g("db_last_done") - g("db_first_done")) if g("db_last_done") else None,
            assembly=(g("db_finished_at") - g("db_last_done")) if g("db_finished_at") and g("db_last_done") else None,
            observe_lag=(p["t_done"] - g("db_finished_at")) if g("db_finished_at") else None,
            inference=g("db_inference_s"), median_batch=g("db_median_batch"),
            max_attempts=g("db_max_attempts"),
            worker_ready=g("worker_ready_s"), worker_rss_kib=g("worker_rss_kib"),
            worker_rc=meta.get("worker_rc"), worker_args=meta.get("worker_args", ""),
        )
        c0, c1 = os.path.join(d, "cpu0.json"), os.path.join(d, "cpu1.json")
        if os.path.exists(c0) and os.path.exists(c1):
            a, b = json.load(open(c0)), json.load(open(c1))
            span = b["t"] - a["t"]
            groups = {k: b["groups"].get(k, 0.0) - a["groups"].get(k, 0.0)
                      for k in set(a["groups"]) | set(b["groups"])}
            r["cpu"] = dict(span=span, busy=b["total_busy_s"] - a["total_busy_s"], groups=groups)
        top = os.path.join(d, "top.txt")
        if os.path.exists(top):
            r["top"] = parse_top(top)
    else:
        return None
    return r


def parse_top(path):
    """Frames of the filtered top output: [(t, {command: %CPU summed}, cpu line)]."""
    frames, cur = [], None
    for line in open(path, errors="replace"):
        line = line.rstrip("\n")
        if line.startswith("=== "):
            cur = [float(line[4:]), {}, ""]
            frames.append(cur)
        elif cur is None:
            continue
        elif line.startswith("%Cpu"):
            cur[2] = line
        else:
            f = line.split()
            if len(f) >= 12 and f[0].isdigit():
                try:
                    pct = float(f[8].replace(",", "."))
                except ValueError:
                    continue
                cmd = f[11]
                cur[1][cmd] = cur[1].get(cmd, 0.0) + pct
    return [fr for fr in frames if fr[1] or fr[2]]


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def f(x, digits=1):
    return "–" if x is None else f"{x:.{digits}f}"


def runs(work):
    out = []
    base = os.path.join(work, "runs")
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        r = load_run(os.path.join(base, name))
        if r:
            r["name"] = name
            out.append(r)
    return out


def xrt(r):
    return r["audio"] / r["wall"] if r.get("audio") and r.get("wall") else None


def progress(work, key):
    for r in runs(work):
        if r["name"].endswith("-r" + key) or r["name"] == key:
            if r["arm"] == "null":
                print("bench-cluster:   null %-28s %5d segments  end to end %6.2f s = %7.1f segments/s  "
                      "(submit %s s, worker first->last done %s s, assembly %s s)  load %s -> %s" % (
                          r["worker_args"], r["segments"], r["wall"], r["segments"] / r["wall"],
                          f(r["submit_wall"], 2), f(r["worker_span"], 2), f(r["assembly"], 2), *r["load"]))
            else:
                extra = ""
                if r["arm"] == "embedded":
                    extra = "model load %s s" % f(r.get("load_s"), 2)
                elif r["arm"].startswith("distributed"):
                    extra = "worker ready after %s s (excluded)" % f(r.get("worker_ready"), 2)
                print("bench-cluster:   round %s %-12s audio %6.1f s  wall %6.1f s  %6.2fx realtime  %s  load %s -> %s" % (
                    r["round"], r["arm"], r["audio"], r["wall"], xrt(r), extra, *r["load"]))


def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in subprocess.run(
        ["lscpu"], capture_output=True, text=True).stdout.splitlines() if l.startswith("Model name")),
        platform.processor())
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{cpu}, nproc {os.cpu_count()}, {mem:.0f} GiB RAM"


def report(work, meta):
    rs = runs(work)
    print("# Comparison harness (ops/bench-cluster.sh)")
    print()
    print(f"- Date: {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}; machine: {machine()}; narrator {meta.get('narrator', '?')}")
    print(f"- Uptime at start: `{meta.get('uptime_start', '').strip()}`; at end: `{meta.get('uptime_end', '').strip()}`")
    e2e = [r for r in rs if r["arm"] in ("raw ORT loop", "piper CLI", "embedded") or r["arm"].startswith("distributed")]
    if e2e:
        print(f"- Part 1 text: {meta.get('text', '?')}; {meta.get('rounds', '?')} interleaved round(s); pauses 0; format {meta.get('format', 'wav')}")
        print("- Throughput = audio seconds / wall seconds. Embedded and Piper: the whole process, model "
              "load included (the raw loop: Python start, session creation and Piper's phonemizer too). Distributed: submit start -> `narrator status` first says done (polled every "
              "0.2 s), with ONE worker started beforehand and waited for until ready: its model load is "
              "EXCLUDED (a worker is long-running). \"embedded minus load\" subtracts the time from the "
              "process start to its `engine ready` log line (reading, planning, runtime, model, phonemizer).")
        print()
        print("## Part 1: raw ONNX Runtime loop, Piper, embedded, distributed (one worker, real engine)")
        print()
        print("| round | arm | audio s | wall s | x realtime | notes | load before → after |")
        print("|---|---|---|---|---|---|---|")
        for r in sorted(e2e, key=lambda r: (int(r["round"]), r["arm"])):
            if r["arm"] == "embedded":
                note = (f"start → engine ready {f(r.get('load_s'), 2)} s; minus that {f(r['audio'] / (r['wall'] - r['load_s']) if r.get('load_s') else None, 2)}x; "
                        f"{r.get('segments')} segments; peak RSS {r['rss_kib'] // 1024} MiB")
            elif r["arm"].startswith("distributed"):
                note = (f"worker ready after {f(r.get('worker_ready'), 2)} s (excluded); submit {f(r.get('submit_wall'), 2)} s; "
                        f"first segment done at +{f(r.get('first_done_rel'), 2)} s, last +{f(r.get('last_done_rel'), 2)} s, "
                        f"assembled +{f(r.get('wall_db'), 2)} s, seen done +{f(r['wall'], 2)} s; "
                        f"worker peak RSS {int(r.get('worker_rss_kib') or 0) // 1024} MiB; exit {r.get('worker_rc')}")
            elif r["arm"] == "raw ORT loop":
                note = (f"{r.get('sentences')} sentences; session load {f(r.get('load_s'), 2)} s; "
                        f"inference loop alone {f(r['audio'] / r['loop'] if r.get('loop') else None, 2)}x; "
                        f"peak RSS {r['rss_kib'] // 1024} MiB")
            else:
                note = f"peak RSS {r['rss_kib'] // 1024} MiB"
            print(f"| {r['round']} | {r['arm']} | {f(r['audio'])} | {f(r['wall'], 2)} | {f(xrt(r), 2)} | {note} | {r['load'][0]} → {r['load'][1]} |")
        print()
        print("| arm | runs | median audio s | median wall s | median x realtime | min | max | ratio to raw loop (medians) | median peak RSS MiB |")
        print("|---|---|---|---|---|---|---|---|---|")
        by = {}
        for r in e2e:
            by.setdefault(r["arm"], []).append(r)
        emb = by.get("embedded", [])
        if emb and all(r.get("load_s") for r in emb):
            by["embedded minus model load"] = [dict(r, wall=r["wall"] - r["load_s"]) for r in emb]
        raw = by.get("raw ORT loop", [])
        if raw and all(r.get("loop") for r in raw):
            by["raw ORT loop, inference only"] = [dict(r, wall=r["loop"]) for r in raw]
        order = ["raw ORT loop", "raw ORT loop, inference only", "piper CLI", "embedded",
                 "embedded minus model load", "distributed"]
        order += sorted(a for a in by if a.startswith("distributed (")) 
        raw_x = med(xrt(r) for r in raw) if raw else None

        def rss(r):
            k = r.get("rss_kib") or r.get("worker_rss_kib")
            return int(k) / 1024 if k else None

        for arm in [a for a in order if a in by]:
            xs = [xrt(r) for r in by[arm]]
            mem = [m for m in (rss(r) for r in by[arm]) if m]
            to_raw = f"{med(xs) / raw_x:.3f}" if raw_x else "–"
            print(f"| {arm} | {len(xs)} | {f(med(r['audio'] for r in by[arm]))} | {f(med(r['wall'] for r in by[arm]), 2)} | "
                  f"**{f(med(xs), 2)}** | {f(min(xs), 2)} | {f(max(xs), 2)} | {to_raw} | {f(med(mem), 0) if mem else '–'} |")
        print()

        def ratio(a, b, target=None):
            if a not in by or b not in by:
                return
            ra, rb = med(xrt(r) for r in by[a]), med(xrt(r) for r in by[b])
            pa = {r["round"]: xrt(r) for r in by[a]}
            pb = {r["round"]: xrt(r) for r in by[b]}
            paired = [pa[k] / pb[k] for k in sorted(pa, key=int) if k in pb]
            verdict = ("met" if med(paired) >= target and ra / rb >= target else "NOT met") if target else "–"
            print(f"| {a} / {b} | {ra / rb:.3f} | {med(paired):.3f} ({', '.join(f'{p:.3f}' for p in paired)}) | "
                  f"{'≥ %.2f' % target if target else '–'} | {verdict} |")

        print("| throughput ratio | medians | paired per round: median (each round) | target | verdict |")
        print("|---|---|---|---|---|")
        ratio("embedded", "raw ORT loop", 0.95)
        ratio("distributed", "raw ORT loop", 0.90)
        ratio("embedded", "piper CLI", 1.0)
        ratio("distributed", "embedded", 0.90)
        ratio("distributed", "embedded minus model load")
        ratio("distributed", "piper CLI")
        for a in sorted(a for a in by if a.startswith("distributed (")):
            ratio(a, "raw ORT loop", 0.90)
            ratio(a, "distributed")
        print()
        dists = [r for r in e2e if r["arm"].startswith("distributed") and r.get("cpu")]
        if dists:
            groups = ["narrator worker", "narrator (other)", "beam.smp", "postgres", "s3s-fs", "other"]
            print("CPU seconds of the distributed runs (t0 → done, /proc utime+stime): what the services "
                  "sharing this machine's cores with inference cost:")
            print()
            print("| round | arm | span s | " + " | ".join(groups) + " | all |")
            print("|---|---|---|" + "---|" * len(groups) + "---|")
            for r in sorted(dists, key=lambda r: (int(r["round"]), r["arm"])):
                c = r["cpu"]
                cells = [f"{c['groups'].get(g, 0.0):.1f}" for g in groups]
                print(f"| {r['round']} | {r['arm']} | {c['span']:.1f} | " + " | ".join(cells) + f" | {c['busy']:.1f} |")
            print()
    nulls = [r for r in rs if r["arm"] == "null"]
    if nulls:
        print("## Part 2: control plane, `narrator worker --engine null`")
        print()
        print(f"- Text: {meta.get('null_segments', '?')} distinct short sentences (one segment each) in 10 "
              "`# Chapter k` chapters (ops/bench/cluster_text.py); format wav; one worker. The null engine "
              "phonemizes for real and returns silence of the right length at once; S3 puts, Postgres "
              "records, RabbitMQ deliveries/acks and the assembly are all real.")
        print("- Times are relative to the start of `narrator submit` (t0). Postgres timestamps: jobs.created_at "
              "(records committed), segments.published_at (broker confirmed), segment_figures.done_at, "
              "jobs.finished_at (assembled).")
        print()
        print("| worker flags | segments | end to end s | **segments/s** | target | submit process s | records committed | last published | first done | last done | worker first→last done s (segments/s) | assembly s | status saw done | median batch |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in nulls:
            sps = r["segments"] / r["wall"]
            wsps = (r["segments"] - 1) / r["worker_span"] if r.get("worker_span") else None
            print(f"| `{r['worker_args']}` | {r['segments']} | {f(r['wall'], 2)} | **{f(sps, 0)}** | ≥ 1000: {'met' if sps >= 1000 else 'NOT met'} | "
                  f"{f(r.get('submit_wall'), 2)} | +{f(r.get('created_rel'), 2)} | +{f(r.get('last_published_rel'), 2)} | "
                  f"+{f(r.get('first_done_rel'), 2)} | +{f(r.get('last_done_rel'), 2)} | {f(r.get('worker_span'), 2)} ({f(wsps, 0)}) | "
                  f"{f(r.get('assembly'), 2)} | +{f(r['wall'], 2)} | {f(r.get('median_batch'), 0)} |")
        print()
        print("CPU seconds used during the job (t0 → done; /proc utime+stime, reaped children included; "
              "beam.smp and postgres are shared with other users of this machine):")
        print()
        groups = ["narrator worker", "narrator (other)", "beam.smp", "postgres", "s3s-fs", "other"]
        print("| worker flags | span s | " + " | ".join(groups) + " | all cores busy | of which submit | of which status polls |")
        print("|---|---|" + "---|" * len(groups) + "---|---|---|")
        for r in nulls:
            c = r.get("cpu")
            if not c:
                continue
            cells = [f"{c['groups'].get(g, 0.0):.2f} ({100 * c['groups'].get(g, 0.0) / c['span']:.0f} %)" for g in groups]
            print(f"| `{r['worker_args']}` | {c['span']:.2f} | " + " | ".join(cells) +
                  f" | {c['busy']:.2f} ({100 * c['busy'] / c['span']:.0f} % of one core) | {f(r.get('submit_cpu'), 2)} | {f(r.get('poll_cpu'), 2)} |")
        print()
        print("(\"narrator (other)\" = submit, the status polls and any other narrator process on the machine; "
              "\"other\" includes other users' builds. Percentages are of one core; the machine has "
              f"{os.cpu_count()}.)")
        for r in nulls:
            frames = r.get("top") or []
            if not frames:
                continue
            print()
            print(f"`top` during the run (`{r['worker_args']}`; %CPU of one core per command, summed over its "
                  "processes; second frame of `top -b -n 2 -d 0.5` every ~1 s):")
            print()
            print("```text")
            t0 = num(r["meta"], "t0") or frames[0][0]
            for t, cmds, cpul in frames:
                parts = ", ".join(f"{k} {v:.0f}" for k, v in sorted(cmds.items(), key=lambda kv: -kv[1]))
                print(f"+{t - t0:5.1f} s  {parts}   [{cpul.strip()}]")
            print("```")
    if not rs:
        print("(no finished runs)")


def main(argv):
    if argv and argv[0] == "--progress":
        progress(argv[1], argv[2])
        return
    if not argv:
        sys.exit(__doc__)
    work = argv[0]
    meta = {}
    if "--meta" in argv:
        for kv in argv[argv.index("--meta") + 1:]:
            if "=" in kv:
                k, v = kv.split("=", 1)
                meta[k] = v
    report(work, meta)


if __name__ == "__main__":
    main(sys.argv[1:])
