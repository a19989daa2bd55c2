#!/usr/bin/env python3
"""Prints narrator's job events as they come, one JSON object per line.

    python3 events.py AMQP_URL [--keys job.#] [--until-done JOB_ID|any] [--timeout S]

Binds a queue of its own (exclusive: it goes with the connection) to the topic
exchange narrator.events and prints each event: a CloudEvents 1.0 object whose "type"
is narrator.job.queued, .progress, .done, .failed, .cancelled or .retried and whose "data" has the
job id, the request's idempotency key and metadata, the state, the segment counts, the
audio seconds, RTF and latency, the failure if any, and on job.done the outputs with a
presigned URL each. Events come at least once: dedupe by "id". The first line printed,
{"ready": true}, says the queue is bound. With --until-done it exits after the job.done
(or job.failed) of that job (any: of any job). Needs `pip install pika`. See
docs/PRODUCERS.md.
"""
import argparse
import json
import sys
import time

import pika


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url", help="amqp://user:pass@host:5672/vhost")
    ap.add_argument("--keys", default="job.#", help="routing keys to bind (default job.#)")
    ap.add_argument("--until-done", metavar="JOB_ID", help="exit after this job ends (any: the first job)")
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args()

    connection = pika.BlockingConnection(pika.URLParameters(args.url))
    channel = connection.channel()
    channel.exchange_declare("narrator.events", exchange_type="topic", durable=True)
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(queue, "narrator.events", routing_key=args.keys)
    print(json.dumps({"ready": True}), flush=True)
    seen = set()
    deadline = time.monotonic() + args.timeout
    for method, _props, body in channel.consume(queue, inactivity_timeout=0.5):
        if time.monotonic() > deadline:
            print(f"no end of job {args.until_done} within {args.timeout:.0f} s", file=sys.stderr)
            return 2
        if method is None:
            continue
        channel.basic_ack(method.delivery_tag)
        event = json.loads(body)
        if event["id"] in seen:  # at least once: the same event may come twice
            continue
        seen.add(event["id"])
        print(json.dumps(event), flush=True)
        ended = event["type"] in ("narrator.job.done", "narrator.job.failed")
        if ended and args.until_done in ("any", event["data"]["job_id"]):
            connection.close()
            return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
