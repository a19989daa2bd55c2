-- Reliability (issue 13): the cluster id that ties messages to this database, worker
-- incarnations, progress and rescue bookkeeping for stuck jobs, and assembly retries.

-- One row, made by `narrator migrate`. Its id travels in every segment message; a worker
-- whose database has another id leaves the message in the queue and stops with an error
-- (it is pointed at the wrong database for its broker).
CREATE TABLE cluster (
    singleton   boolean PRIMARY KEY DEFAULT true CONSTRAINT cluster_singleton CHECK (singleton),
    id          uuid NOT NULL DEFAULT gen_random_uuid(),
    created_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO cluster DEFAULT VALUES;

-- A fresh id per worker process. An assembly claim names the claimer's instance, so a
-- worker restarted under the same --id (a container's hostname) does not keep the dead
-- process's claim alive.
ALTER TABLE workers ADD COLUMN instance uuid;

ALTER TABLE jobs
    -- The instance of the worker that claimed the assembly.
    ADD COLUMN assembler_instance uuid,
    -- When a segment of the job was last recorded done or failed (NULL: never).
    ADD COLUMN progress_at timestamptz,
    -- The stuck-job watchdog: when it last republished the job's missing segments, and
    -- how often it did.
    ADD COLUMN rescued_at timestamptz,
    ADD COLUMN rescues integer NOT NULL DEFAULT 0,
    -- Assembly tries that ended in a transient failure, and when the next may start.
    ADD COLUMN assembly_attempts integer NOT NULL DEFAULT 0,
    ADD COLUMN assembly_retry_at timestamptz,
    ADD COLUMN assembly_error text;

-- How often the watchdog republished a segment: one lost again and again (a message that
-- kills every worker it reaches, dead-lettered by the broker without a record) ends failed.
ALTER TABLE segments ADD COLUMN rescues integer NOT NULL DEFAULT 0;

-- The watchdog's scan covers queued jobs too.
DROP INDEX jobs_unfinished_idx;
CREATE INDEX jobs_unfinished_idx ON jobs (state) WHERE state IN ('queued', 'running', 'assembling');

-- A segment whose synthesis kills the worker process: the instance whose engine has the
-- segment now (set when its batch goes to the engine, cleared when it is recorded or
-- settled), how often a process died with it in its engine, and how often a dying
-- process returned it to the queue. Deliveries returned by a dying process are put back
-- uncharged; only the segment that was in the engine when the process died is counted,
-- runs alone from then on, and is given up on after a few crashes.
ALTER TABLE segments
    ADD COLUMN engine_by uuid,
    ADD COLUMN engine_crashes integer NOT NULL DEFAULT 0,
    ADD COLUMN returns integer NOT NULL DEFAULT 0;
