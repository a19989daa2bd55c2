#!/usr/bin/env python3
"""Hands narrator one book with one message on RabbitMQ, and prints the reply.

    python3 request.py AMQP_URL BOOK.md|s3://BUCKET/KEY [--message-id ID] [--set FIELD=JSON]...

The request is the JSON object of docs/schema/job-request.v1.json: here the book's text
(or, for s3://…, its source: a book in a bucket the fleet reads) and any --set fields (e.g. --set format='"mp3"' --set metadata='{"isbn": "978..."}').
It is published persistent, with publisher confirms, to the default exchange with the
routing key narrator.intake; its reply comes on RabbitMQ's direct reply-to. The
message_id names the request: publishing it again (after a lost confirm, say) makes no
second job, and the reply says "duplicate": true. Exit status 0 when a job was made (or
found), 1 when the request was refused (the reply's error says why), 2 without a reply.
Needs `pip install pika`. See docs/PRODUCERS.md.
"""
import argparse
import json
import sys
import time
import uuid

import pika


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url", help="amqp://user:pass@host:5672/vhost")
    ap.add_argument("book", help="a .md or .txt file, sent as the request's text; or "
                    "s3://bucket/key of a .txt, .md or .epub the fleet can read, sent as its source")
    ap.add_argument("--message-id", help="names the request (default: a new UUID)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=JSON",
                    help="another field of the request, its value as JSON")
    ap.add_argument("--raw", help="publish this body instead of a request (to see an error)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the reply")
    args = ap.parse_args()

    request = {"version": 1}
    if args.book.startswith("s3://"):
        # A book in a bucket the fleet reads (.txt, .md or .epub): sent by name.
        request["source"] = args.book
    else:
        with open(args.book, encoding="utf-8") as f:
            request["text"] = f.read()
        if args.book.endswith(".txt"):
            request["text_format"] = "txt"
    for field in args.set:
        name, _, value = field.partition("=")
        request[name] = json.loads(value)
    body = args.raw.encode() if args.raw is not None else json.dumps(request).encode()

    connection = pika.BlockingConnection(pika.URLParameters(args.url))
    channel = connection.channel()
    replies = []
    # Direct reply-to: consume (without acks) before publishing, on the same channel.
    channel.basic_consume("amq.rabbitmq.reply-to",
                          lambda ch, method, props, reply: replies.append((props, reply)),
                          auto_ack=True)
    channel.confirm_delivery()
    correlation_id = str(uuid.uuid4())
    channel.basic_publish(
        exchange="",
        routing_key="narrator.intake",
        body=body,
        properties=pika.BasicProperties(
            content_type="application/json",
            delivery_mode=pika.DeliveryMode.Persistent,
            message_id=args.message_id or str(uuid.uuid4()),
            correlation_id=correlation_id,
            reply_to="amq.rabbitmq.reply-to",
        ),
        mandatory=True,
    )
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.2)
        answered = [r for p, r in replies if p.correlation_id == correlation_id]
        if answered:
            reply = json.loads(answered[0])
            print(json.dumps(reply))
            connection.close()
            return 1 if "error" in reply else 0
    connection.close()
    print(f"no reply within {args.timeout:.0f} s: is a narrator worker running?", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
