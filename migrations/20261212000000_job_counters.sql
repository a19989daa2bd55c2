-- Issue 32: a job's progress kept on its own row, so that reading it (`narrator status`,
-- `narrator jobs`, the job_status view), ending a job whose segments failed, and the
-- watchdog's accounting cost the same for a book of 100 segments or 20,000, and the same
-- whether the database holds ten finished books or a million finished segments.
--   segments_failed  segments recorded failed, kept by the trigger below (every path that
--                    fails a segment or puts a failed one back to work moves it)
--   chapter_done     per chapter (position i+1 holds chapter i), segments recorded done;
--                    kept by record_segments in the statement that records them. Shorter
--                    than the chapter list until the later chapters have progress
--                    (missing positions are 0)
--   chapter_audio    per chapter, the audio seconds of those segments
--   segments_unpublished  pending segments never published (the outbox's rows), kept by
--                    the statement triggers below (so also for segments inserted or
--                    changed by a binary older than this migration); the watchdog's count
--                    of what should be in the broker is then the job's counters alone
ALTER TABLE jobs
    ADD COLUMN segments_unpublished integer NOT NULL DEFAULT 0
        CONSTRAINT jobs_segments_unpublished_check CHECK (segments_unpublished >= 0),
    ADD COLUMN segments_failed integer NOT NULL DEFAULT 0
        CONSTRAINT jobs_segments_failed_check CHECK (segments_failed >= 0),
    ADD COLUMN chapter_done integer[] NOT NULL DEFAULT '{}',
    ADD COLUMN chapter_audio double precision[] NOT NULL DEFAULT '{}';

UPDATE jobs j SET segments_failed = f.n
FROM (SELECT job_id, count(*) AS n FROM segments WHERE state = 'failed' GROUP BY job_id) f
WHERE f.job_id = j.id;

UPDATE jobs j SET chapter_done = c.done, chapter_audio = c.audio
FROM (
    SELECT p.job_id,
           array_agg(coalesce(d.n, 0) ORDER BY p.i) AS done,
           array_agg(coalesce(d.audio, 0) ORDER BY p.i) AS audio
    FROM (SELECT job_id, generate_series(0, max(chapter)) AS i FROM segments GROUP BY job_id) p
    LEFT JOIN (SELECT job_id, chapter, count(*) AS n, sum(audio_seconds) AS audio
               FROM segments WHERE state = 'done' GROUP BY job_id, chapter) d
      ON d.job_id = p.job_id AND d.chapter = p.i
    GROUP BY p.job_id
) c
WHERE c.job_id = j.id;

UPDATE jobs j SET segments_unpublished = u.n
FROM (SELECT job_id, count(*) AS n FROM segments
      WHERE published_at IS NULL AND state = 'pending' GROUP BY job_id) u
WHERE u.job_id = j.id;

-- Any statement that publishes segments, records unpublished ones, rescues or retries
-- moves its jobs' unpublished counts by the difference, once per job per statement (a
-- statement trigger: the rows it changed, before and after). Statements that change
-- neither column (most) move nothing. Inserted segments are counted the same way.
CREATE FUNCTION segments_count_unpublished() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE jobs j SET segments_unpublished = j.segments_unpublished + d.delta
    FROM (
        SELECT n.job_id,
               sum((n.published_at IS NULL AND n.state = 'pending')::integer
                   - (o.published_at IS NULL AND o.state = 'pending')::integer) AS delta
        FROM changed_new n JOIN changed_old o ON o.job_id = n.job_id AND o.idx = n.idx
        GROUP BY n.job_id
    ) d
    WHERE j.id = d.job_id AND d.delta <> 0;
    RETURN NULL;
END
$$;

CREATE TRIGGER segments_count_unpublished
    AFTER UPDATE ON segments
    REFERENCING OLD TABLE AS changed_old NEW TABLE AS changed_new
    FOR EACH STATEMENT
    EXECUTE FUNCTION segments_count_unpublished();

CREATE FUNCTION segments_count_inserted_unpublished() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE jobs j SET segments_unpublished = j.segments_unpublished + d.n
    FROM (SELECT job_id, count(*) AS n FROM inserted
          WHERE published_at IS NULL AND state = 'pending' GROUP BY job_id) d
    WHERE j.id = d.job_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER segments_count_inserted_unpublished
    AFTER INSERT ON segments
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT
    EXECUTE FUNCTION segments_count_inserted_unpublished();

-- A segment entering or leaving `failed` moves its job's count. Failures are rare, so the
-- row trigger fires rarely: recording done segments from `pending` does not fire it.
CREATE FUNCTION segments_count_failed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE jobs
    SET segments_failed = segments_failed
        + (NEW.state = 'failed')::integer - (OLD.state = 'failed')::integer
    WHERE id = NEW.job_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER segments_count_failed
    AFTER UPDATE OF state ON segments
    FOR EACH ROW
    WHEN ((OLD.state = 'failed') IS DISTINCT FROM (NEW.state = 'failed'))
    EXECUTE FUNCTION segments_count_failed();

-- A failed job's reason names its first failed segment: found through this index, not by
-- reading the job's segments.
CREATE INDEX segments_failed_idx ON segments (job_id, idx) WHERE state = 'failed';

-- The view reads the counter instead of counting the job's segments on each read.
CREATE OR REPLACE VIEW job_status AS
SELECT
    j.id,
    j.content_id,
    j.title,
    j.source,
    j.voice,
    j.format,
    j.priority,
    j.state,
    j.segments_total,
    j.segments_done,
    j.segments_failed::bigint AS segments_failed,
    j.audio_seconds,
    j.speech_seconds,
    EXTRACT(EPOCH FROM (coalesce(j.finished_at, now()) - j.started_at))::double precision
        AS wall_seconds,
    EXTRACT(EPOCH FROM (coalesce(j.finished_at, now()) - j.started_at))::double precision
        / NULLIF(j.audio_seconds, 0) AS rtf,
    EXTRACT(EPOCH FROM (j.finished_at - j.created_at))::double precision AS latency_seconds,
    j.failure_kind,
    j.failure_reason,
    j.created_at,
    j.started_at,
    j.finished_at
FROM jobs j;

-- `narrator jobs prune --older-than` finds the ended jobs by when they ended.
CREATE INDEX jobs_finished_at_idx ON jobs (finished_at) WHERE state IN ('done', 'failed', 'cancelled');

-- The outbox's index holds only what the reconciler and the watchdog look for (pending
-- segments never published), so that counting a job's is a look at its own entries.
DROP INDEX segments_unpublished_idx;
CREATE INDEX segments_unpublished_idx ON segments (job_id, idx)
    WHERE published_at IS NULL AND state = 'pending';
