#!/usr/bin/env node
// Prints narrator's job events as they come, one JSON object per line.
//
//     node events.mjs AMQP_URL [--keys job.#] [--until-done JOB_ID|any] [--timeout S]
//
// Binds a queue of its own (exclusive: it goes with the connection) to the topic
// exchange narrator.events and prints each event: a CloudEvents 1.0 object whose "type"
// is narrator.job.queued, .progress, .done, .failed, .cancelled or .retried and whose "data" has the
// job id, the request's idempotency key and metadata, the state, the segment counts, the
// audio seconds, RTF and latency, the failure if any, and on job.done the outputs with a
// presigned URL each. Events come at least once: dedupe by "id". The first line printed,
// {"ready": true}, says the queue is bound. With --until-done it exits after the job.done
// (or job.failed) of that job (any: of any job). The same as ../events.py, with amqplib:
// `npm ci` in this folder. See docs/PRODUCERS.md.
import { parseArgs } from "node:util";

import amqp from "amqplib";

function fail(message) {
  console.error(`events.mjs: ${message}`);
  process.exit(2);
}

let args;
try {
  args = parseArgs({
    allowPositionals: true,
    options: {
      keys: { type: "string", default: "job.#" }, // routing keys to bind
      "until-done": { type: "string" }, // exit after this job ends (any: the first job)
      timeout: { type: "string", default: "300" }, // seconds
    },
  });
} catch (e) {
  fail(e.message);
}
if (args.positionals.length !== 1) {
  fail("usage: node events.mjs AMQP_URL [--keys job.#] [--until-done JOB_ID|any] [--timeout S]");
}
const [url] = args.positionals;
const untilDone = args.values["until-done"];
const timeout = Number(args.values.timeout);

try {
  const connection = await amqp.connect(url);
  const channel = await connection.createChannel();
  await channel.assertExchange("narrator.events", "topic", { durable: true });
  const { queue } = await channel.assertQueue("", { exclusive: true });
  await channel.bindQueue(queue, "narrator.events", args.values.keys);
  console.log(JSON.stringify({ ready: true }));
  const timer = setTimeout(() => fail(`no end of job ${untilDone} within ${timeout} s`), timeout * 1000);
  const seen = new Set();
  let ended = false;
  await channel.consume(queue, (message) => {
    if (ended) {
      return; // delivered before the connection closed; left to the exclusive queue
    }
    channel.ack(message);
    const event = JSON.parse(message.content.toString());
    if (seen.has(event.id)) {
      return; // at least once: the same event may come twice
    }
    seen.add(event.id);
    console.log(JSON.stringify(event));
    const end = event.type === "narrator.job.done" || event.type === "narrator.job.failed";
    if (end && (untilDone === "any" || untilDone === event.data.job_id)) {
      ended = true;
      clearTimeout(timer);
      connection.close().catch((e) => fail(e.message));
    }
  });
} catch (e) {
  fail(e.message);
}
