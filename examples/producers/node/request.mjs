#!/usr/bin/env node
// Hands narrator one book with one message on RabbitMQ, and prints the reply.
//
//     node request.mjs AMQP_URL BOOK.md|s3://BUCKET/KEY [--message-id ID] [--set FIELD=JSON]... [--timeout S]
//
// The request is the JSON object of docs/schema/job-request.v1.json: here the book's text
// (or, for s3://…, its source: a book in a bucket the fleet reads) and any --set fields (e.g. --set format='"mp3"' --set metadata='{"isbn": "978..."}').
// It is published persistent, with publisher confirms, to the default exchange with the
// routing key narrator.intake; its reply comes on RabbitMQ's direct reply-to. The
// message_id names the request: publishing it again (after a lost confirm, say) makes no
// second job, and the reply says "duplicate": true. Exit status 0 when a job was made (or
// found), 1 when the request was refused (the reply's error says why), 2 without a reply.
// --raw BODY publishes BODY instead of a request (to see an error). The same as
// ../request.py, with amqplib: `npm ci` in this folder. See docs/PRODUCERS.md.
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";

import amqp from "amqplib";

function fail(message) {
  console.error(`request.mjs: ${message}`);
  process.exit(2);
}

let args;
try {
  args = parseArgs({
    allowPositionals: true,
    options: {
      "message-id": { type: "string" }, // names the request (default: a new UUID)
      set: { type: "string", multiple: true, default: [] }, // FIELD=JSON: another field
      raw: { type: "string" }, // publish this body instead of a request
      timeout: { type: "string", default: "120" }, // seconds to wait for the reply
    },
  });
} catch (e) {
  fail(e.message);
}
if (args.positionals.length !== 2) {
  fail("usage: node request.mjs AMQP_URL BOOK [--message-id ID] [--set FIELD=JSON]... [--raw BODY] [--timeout S]");
}
const [url, book] = args.positionals;
const timeout = Number(args.values.timeout);

const request = { version: 1 };
if (book.startsWith("s3://")) {
  // A book in a bucket the fleet reads (.txt, .md or .epub): sent by name.
  request.source = book;
} else {
  request.text = readFileSync(book, "utf8");
  if (book.endsWith(".txt")) {
    request.text_format = "txt";
  }
}
for (const field of args.values.set) {
  const [name, ...value] = field.split("=");
  request[name] = JSON.parse(value.join("="));
}
const body = Buffer.from(args.values.raw ?? JSON.stringify(request));

try {
  const connection = await amqp.connect(url);
  const channel = await connection.createConfirmChannel();
  channel.on("return", () => fail("unroutable: no queue narrator.intake (has a narrator worker run?)"));
  const correlationId = randomUUID();
  let answer;
  const replied = new Promise((resolve) => {
    answer = resolve;
  });
  // Direct reply-to: consume (without acks) before publishing, on the same channel.
  await channel.consume(
    "amq.rabbitmq.reply-to",
    (message) => {
      if (message.properties.correlationId === correlationId) {
        answer(JSON.parse(message.content.toString()));
      }
    },
    { noAck: true },
  );
  channel.publish("", "narrator.intake", body, {
    contentType: "application/json",
    persistent: true,
    messageId: args.values["message-id"] ?? randomUUID(),
    correlationId,
    replyTo: "amq.rabbitmq.reply-to",
    mandatory: true,
  });
  await channel.waitForConfirms();
  let timer;
  const waited = new Promise((resolve) => {
    timer = setTimeout(resolve, timeout * 1000, null);
  });
  const reply = await Promise.race([replied, waited]);
  clearTimeout(timer);
  await connection.close();
  if (reply === null) {
    fail(`no reply within ${timeout} s: is a narrator worker running?`);
  }
  console.log(JSON.stringify(reply));
  process.exitCode = "error" in reply ? 1 : 0;
} catch (e) {
  fail(e.message);
}
