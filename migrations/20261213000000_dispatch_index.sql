-- Fair share (issue 32): a job's segments are published a window at a time, each claim
-- taking the job's next unpublished, pending segments from an index on (see
-- narrator-db's dispatch.rs). The outbox index is rebuilt on the expression `idx + 0`
-- instead of `idx`, which the claim orders and bounds by: on (job_id, idx) the planner
-- may serve a claim from the primary key instead and read every published row between
-- the index it starts from and the book's unpublished front (the window, hundreds of
-- rows per claim). On the expression only this index can.
DROP INDEX segments_unpublished_idx;
CREATE INDEX segments_unpublished_idx ON segments (job_id, (idx + 0))
    WHERE published_at IS NULL AND state = 'pending';
