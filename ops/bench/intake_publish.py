#!/usr/bin/env python3
"""The producer's side of ops/bench/intake.sh, with pika (a client no one here wrote).

    intake_publish.py flood AMQP_URL --requests N --segments S [--producers P]
    intake_publish.py latency AMQP_URL --requests N

flood: N requests, each a book of S one-sentence segments (distinct texts), published at
once by P producer processes (persistent, with confirms, each its own message_id,
replies on direct reply-to); then waits for every reply. Prints one JSON object: when
the last confirm and the last reply came (seconds from the common start), how many were
accepted and refused, and the requests accepted per second over the whole run.

latency: N one-sentence requests, one after the other: each published, then its job.done
awaited on a queue bound to narrator.events; prints each request -> reply and request ->
job.done time, and their median and p95.
"""
import argparse
import json
import statistics
import sys
import time
import uuid

import pika

WORDS = ("harbour tide boat gull lantern rope dawn dusk sail mast keel anchor net salt "
         "shell wave pier crane fog bell").split()


def sentence(n: int) -> str:
    """A distinct plain sentence for request/segment number n."""
    a, b, c = WORDS[n % 20], WORDS[(n // 20) % 20], WORDS[(n // 400) % 20]
    return f"The {a} and the {b} met the {c} at number {n}."


def connect(url):
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    return connection, channel


def properties(key, correlation):
    return pika.BasicProperties(
        content_type="application/json",
        delivery_mode=pika.DeliveryMode.Persistent,
        message_id=key,
        correlation_id=correlation,
        reply_to="amq.rabbitmq.reply-to",
    )


def flood_part(args, part: int, count: int, start: float, results) -> None:
    """One producer of the flood: `count` requests from number part * count, published
    from `start` (wall clock) on, then every reply awaited."""
    connection, channel = connect(args.url)
    replies = {}
    channel.basic_consume("amq.rabbitmq.reply-to",
                          lambda ch, m, p, body: replies.setdefault(p.correlation_id, (time.time(), body)),
                          auto_ack=True)
    channel.confirm_delivery()
    run = uuid.uuid4().hex[:8]
    bodies = []
    for r in range(part * count, (part + 1) * count):
        text = " ".join(sentence(r * args.segments + s) for s in range(args.segments))
        bodies.append(json.dumps({"version": 1, "text": text, "text_format": "txt",
                                  "format": "wav", "title": f"Request {r}"}).encode())
    time.sleep(max(0.0, start - time.time()))
    for r, body in enumerate(bodies):
        # BlockingChannel with confirms: each publish returns once the broker confirmed it.
        channel.basic_publish("", "narrator.intake", body,
                              properties(f"bench-{run}-{r}", str(r)), mandatory=True)
    confirmed = time.time()
    deadline = time.monotonic() + args.timeout
    while len(replies) < count and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.2)
    connection.close()
    got = [json.loads(b) for _, b in replies.values()]
    results.put({"confirmed": confirmed, "last_reply": max((t for t, _ in replies.values()), default=start),
                 "accepted": sum(1 for g in got if "job_id" in g),
                 "refused": sum(1 for g in got if "error" in g), "unanswered": count - len(got),
                 "errors": sorted({g["error"]["code"] for g in got if "error" in g})})


def flood(args) -> dict:
    """The flood from `--producers` processes at once (one pika publisher waits for each
    confirm, which would make the producer the limit)."""
    import multiprocessing
    results = multiprocessing.Queue()
    per = args.requests // args.producers
    start = time.time() + 2.0  # every producer connected and its bodies built by then
    procs = [multiprocessing.Process(target=flood_part, args=(args, p, per, start, results))
             for p in range(args.producers)]
    for p in procs:
        p.start()
    parts = [results.get(timeout=args.timeout + 60) for _ in procs]
    for p in procs:
        p.join()
    n = per * args.producers
    last = max(p["last_reply"] for p in parts) - start
    accepted = sum(p["accepted"] for p in parts)
    return {"requests": n, "segments_each": args.segments, "producers": args.producers,
            "confirmed_s": round(max(p["confirmed"] for p in parts) - start, 3),
            "last_reply_s": round(last, 3), "accepted": accepted,
            "refused": sum(p["refused"] for p in parts),
            "unanswered": sum(p["unanswered"] for p in parts),
            "accepted_per_s": round(accepted / last, 1) if last > 0 else None,
            "errors": sorted({e for p in parts for e in p["errors"]})}


def latency(args) -> dict:
    connection, channel = connect(args.url)
    events = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(events, "narrator.events", routing_key="job.done")
    replies = {}
    channel.basic_consume("amq.rabbitmq.reply-to",
                          lambda ch, m, p, body: replies.setdefault(p.correlation_id, time.monotonic()),
                          auto_ack=True)
    done = {}

    def on_event(ch, m, p, body):
        e = json.loads(body)
        done.setdefault(e["data"]["job_id"], time.monotonic())

    channel.basic_consume(events, on_event, auto_ack=True)
    channel.confirm_delivery()
    run = uuid.uuid4().hex[:8]
    to_reply, to_done = [], []
    for r in range(args.requests):
        body = json.dumps({"version": 1, "text": sentence(r), "text_format": "txt", "format": "wav"})
        correlation = f"{run}-{r}"
        t0 = time.monotonic()
        channel.basic_publish("", "narrator.intake", body.encode(),
                              properties(f"lat-{correlation}", correlation), mandatory=True)
        replied = False
        deadline = t0 + args.timeout
        while time.monotonic() < deadline:
            connection.process_data_events(time_limit=0.05)
            if not replied and correlation in replies:
                to_reply.append(replies[correlation] - t0)
                replied = True
            # One request in flight at a time: the job.done that comes is this one's.
            if done:
                (_, t), = done.items()
                to_done.append(t - t0)
                done.clear()
                break
        else:
            sys.exit(f"request {r}: no job.done within {args.timeout} s")
    connection.close()

    def p95(xs):
        return sorted(xs)[max(0, int(round(0.95 * len(xs))) - 1)]

    return {"requests": args.requests,
            "reply_s": {"median": round(statistics.median(to_reply), 3), "p95": round(p95(to_reply), 3)},
            "done_s": {"median": round(statistics.median(to_done), 3), "p95": round(p95(to_done), 3),
                       "all": [round(x, 3) for x in to_done]}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["flood", "latency"])
    ap.add_argument("url")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--segments", type=int, default=20)
    ap.add_argument("--producers", type=int, default=4, help="flood: publishing processes")
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    print(json.dumps(flood(args) if args.mode == "flood" else latency(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
