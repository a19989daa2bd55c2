-- Issue 42: the reconciler's cost does not grow with the books.
--
-- A job's dispatch front: where its claims have reached (every segment below it is
-- published or finished), so the reconciler's claim starts there instead of stepping
-- over the outbox index's entries of every segment published since the last vacuum (see
-- narrator-db's dispatch.rs, claim_dispatch). Moved by a claim in the claim's own
-- transaction (a claim rolled back takes its move back), set back to 0 by a retry (its
-- failed segments become unpublished again). Its own table rather than a column of
-- `jobs`: a claim holds the row it writes until its segments are published, and
-- recordings update the job's row, so they would wait for the broker's confirms. No row:
-- 0.
CREATE TABLE job_dispatch (
    job_id        uuid PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    dispatch_from integer NOT NULL DEFAULT 0 CHECK (dispatch_from >= 0)
);

-- Workers' rows are deleted a day after their last heartbeat (any worker does it every
-- few minutes); the live-worker filters (`last_seen` within a few heartbeats: the fleet's
-- prefetch, the voices served, the held deliveries) and that delete read the rows by
-- this index instead of every row a day of restarts left.
CREATE INDEX workers_last_seen_idx ON workers (last_seen);
