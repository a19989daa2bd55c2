-- A cancelled job's objects (segment audio, packs, and outputs an assembly that finished
-- after the cancel stored) are deleted by a worker's sweep once in-flight work on it is
-- over; this records when, so each cancelled job is cleaned once. NULL: not yet (or not
-- cancelled).
ALTER TABLE jobs ADD COLUMN storage_released_at timestamptz;

CREATE INDEX jobs_cancelled_unreleased ON jobs (finished_at)
    WHERE state = 'cancelled' AND storage_released_at IS NULL;
