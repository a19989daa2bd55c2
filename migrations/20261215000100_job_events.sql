-- Events (issue 44): every change of a job's state is written to an outbox in the same
-- transaction as the change, by a trigger, so no path (submit, the intake, a recording
-- that completes a job, the assembly, a cancel, a retry, a failure) can change a state
-- without its event, and none is lost when the broker is away at that moment. Workers
-- publish the outbox to the topic exchange `narrator.events` with confirms and mark each
-- published (at least once: consumers dedupe by the event's id).
--
-- kind: queued (a new job), done, failed, cancelled, retried (an ended job back to
-- work); the moves between queued, running and assembling are progress, not events here. The event's body is built when it is
-- published, from the job's row then (the outputs' presigned URLs are made then too);
-- `state` is the state the event is about.
CREATE TABLE job_events (
    id           uuid PRIMARY KEY,
    job_id       uuid NOT NULL,
    kind         text NOT NULL,
    state        text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    published_at timestamptz
);
-- The publishers' look: the unpublished ones, oldest first.
CREATE INDEX job_events_unpublished_idx ON job_events (created_at) WHERE published_at IS NULL;
-- Pruning: published events older than a while.
CREATE INDEX job_events_published_idx ON job_events (published_at) WHERE published_at IS NOT NULL;

CREATE FUNCTION narrator_job_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    kind text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        kind := 'queued';
    ELSIF OLD.state IN ('failed', 'cancelled', 'done') AND NEW.state IN ('queued', 'running', 'assembling') THEN
        kind := 'retried';
    ELSIF NEW.state IN ('done', 'failed', 'cancelled') THEN
        kind := NEW.state;
    ELSE
        -- queued -> running -> assembling: progress, not an event of the outbox.
        RETURN NULL;
    END IF;
    INSERT INTO job_events (id, job_id, kind, state)
    VALUES (gen_random_uuid(), NEW.id, kind, NEW.state);
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_event_on_insert AFTER INSERT ON jobs
    FOR EACH ROW EXECUTE FUNCTION narrator_job_event();
-- Recordings update a job's row all the time: the WHEN clause keeps them from calling
-- the function unless the state moved.
CREATE TRIGGER jobs_event_on_state AFTER UPDATE ON jobs
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION narrator_job_event();
