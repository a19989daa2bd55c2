-- `narrator jobs prune` claims a job before it deletes the job's objects from S3: this
-- records when, set in the statement that checks the job has ended. A claimed job cannot
-- be retried (`narrator retry` refuses it: its segment audio may already be gone), so no
-- retry between the objects' deletion and the rows' can revive a job whose done segments
-- point at deleted packs. A prune that dies in between leaves the job claimed; running it
-- again (with the same --older-than) finishes it. NULL: not being pruned.
ALTER TABLE jobs ADD COLUMN pruning_at timestamptz;
