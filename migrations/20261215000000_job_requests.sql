-- Producers on RabbitMQ (issue 44): a job made from a request on `narrator.intake`
-- keeps the request's name and the producer's metadata.
--
-- `request_key`: the AMQP message_id, or the request's `idempotency_key`. The same
-- request delivered twice (a redelivery, a producer retrying after a lost confirm, a
-- worker killed between recording the job and acknowledging) finds the job the first
-- delivery made instead of making another: the unique index decides, in the inserting
-- transaction (a second insert of the same key waits for the first to commit, then
-- finds it). NULL for jobs without a key (`narrator submit`, requests without one).
-- `request_metadata`: the producer's JSON object (at most 16 KiB), returned in replies
-- and events.
ALTER TABLE jobs
    ADD COLUMN request_key      text,
    ADD COLUMN request_metadata jsonb;
CREATE UNIQUE INDEX jobs_request_key_idx ON jobs (request_key) WHERE request_key IS NOT NULL;
