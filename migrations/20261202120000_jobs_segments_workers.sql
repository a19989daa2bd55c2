-- narrator's state for the distributed mode: jobs, their segments (each row is also an
-- outbox entry and, once done, the segment's figures), and workers. Read it through the
-- views at the end; every duration is in seconds and RTF is processing time / audio time
-- (lower is faster).
--
-- Constraint names are part of the API: narrator-db maps them to domain errors.

-- One row per submission (a new id each time, even for the same book and voice).
CREATE TABLE jobs (
    id              uuid PRIMARY KEY,
    -- JobPlan.job_id: digest of the input and every setting that changes segment audio.
    content_id      text NOT NULL,
    title           text NOT NULL,
    source          text NOT NULL,
    voice           text NOT NULL,
    format          text NOT NULL,
    priority        integer NOT NULL DEFAULT 0,
    state           text NOT NULL DEFAULT 'queued'
        CONSTRAINT jobs_state_check
        CHECK (state IN ('queued', 'running', 'assembling', 'done', 'failed', 'cancelled')),
    segments_total  integer NOT NULL CONSTRAINT jobs_segments_total_check CHECK (segments_total > 0),
    segments_done   integer NOT NULL DEFAULT 0
        CONSTRAINT jobs_segments_done_check CHECK (segments_done BETWEEN 0 AND segments_total),
    -- Sum of the finished segments' audio; finish_job replaces it with the whole book's
    -- duration, pauses included (as in manifest.json).
    audio_seconds   double precision NOT NULL DEFAULT 0,
    -- Speech only, pauses excluded: the sum of the finished segments' audio.
    speech_seconds  double precision NOT NULL DEFAULT 0,
    failure_kind    text,
    failure_reason  text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- When the first recorded segment began synthesis (its record time minus its
    -- inference seconds).
    started_at      timestamptz,
    finished_at     timestamptz,
    -- The plan's chapters: [{title, first_segment, segment_count}, ...].
    chapters        jsonb NOT NULL DEFAULT '[]',
    warnings        jsonb NOT NULL DEFAULT '[]'
);

CREATE INDEX jobs_created_at_idx ON jobs (created_at DESC);
CREATE INDEX jobs_content_id_idx ON jobs (content_id);

-- One row per segment of a job. published_at is the outbox column: NULL until the
-- producer's publish was confirmed by the broker; a reconciler republishes the rest.
CREATE TABLE segments (
    job_id              uuid NOT NULL
        CONSTRAINT segments_job_id_fkey REFERENCES jobs (id) ON DELETE CASCADE,
    idx                 integer NOT NULL CONSTRAINT segments_idx_check CHECK (idx >= 0),
    chapter             integer NOT NULL,
    text                text NOT NULL,
    pause_after         text NOT NULL
        CONSTRAINT segments_pause_after_check
        CHECK (pause_after IN ('sentence', 'paragraph', 'chapter', 'none')),
    state               text NOT NULL DEFAULT 'pending'
        CONSTRAINT segments_state_check CHECK (state IN ('pending', 'done', 'failed')),
    published_at        timestamptz,
    attempts            integer NOT NULL DEFAULT 0,
    -- Figures, set when the segment is recorded done.
    samples             bigint,
    sample_rate         integer,
    audio_seconds       double precision,
    inference_seconds   double precision,
    queue_wait_seconds  double precision,
    batch_size          integer,
    phoneme_ids         integer,
    worker              text,
    done_at             timestamptz,
    failure_kind        text,
    failure_reason      text,
    CONSTRAINT segments_pkey PRIMARY KEY (job_id, idx)
);

-- The reconciler's scan touches only unpublished rows.
CREATE INDEX segments_unpublished_idx ON segments (job_id, idx) WHERE published_at IS NULL;
-- worker_recent: a worker's segments of the last minutes.
CREATE INDEX segments_worker_done_at_idx ON segments (worker, done_at) WHERE state = 'done';

-- One row per worker process, upserted by its heartbeat.
CREATE TABLE workers (
    id             text PRIMARY KEY,
    host           text NOT NULL,
    device         text NOT NULL,
    hardware       jsonb NOT NULL DEFAULT '{}',
    plan           jsonb NOT NULL DEFAULT '{}',
    segments_done  bigint NOT NULL DEFAULT 0,
    started_at     timestamptz NOT NULL DEFAULT now(),
    last_seen      timestamptz NOT NULL DEFAULT now()
);

-- job_status: one row per job, what `narrator status` and `narrator jobs` print.
--   segments_failed  segments recorded as failed
--   wall_seconds     started_at → finished_at (→ now while not finished); NULL before the
--                    first segment is recorded
--   rtf              wall_seconds / audio_seconds (NULL while no audio exists)
--   latency_seconds  created_at (submit) → finished_at; NULL until the job ends
CREATE VIEW job_status AS
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
    (SELECT count(*) FROM segments s WHERE s.job_id = j.id AND s.state = 'failed')
        AS segments_failed,
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

-- segment_figures: one row per segment with its figures.
--   rtf  inference_seconds / audio_seconds (NULL until done)
CREATE VIEW segment_figures AS
SELECT
    s.job_id,
    s.idx,
    s.chapter,
    s.state,
    s.attempts,
    s.worker,
    s.batch_size,
    s.phoneme_ids,
    s.samples,
    s.sample_rate,
    s.audio_seconds,
    s.inference_seconds,
    s.queue_wait_seconds,
    s.inference_seconds / NULLIF(s.audio_seconds, 0) AS rtf,
    s.published_at,
    s.done_at,
    s.failure_kind,
    s.failure_reason
FROM segments s;

-- worker_recent: one row per worker with what it did in the last 10 minutes.
--   recent_segments    segments it finished in the last 10 minutes
--   recent_median_rtf  median of those segments' RTF (NULL when none)
CREATE VIEW worker_recent AS
SELECT
    w.id,
    w.host,
    w.device,
    w.hardware,
    w.plan,
    w.segments_done,
    w.started_at,
    w.last_seen,
    r.recent_segments,
    r.recent_median_rtf
FROM workers w
CROSS JOIN LATERAL (
    SELECT
        count(*) AS recent_segments,
        percentile_cont(0.5) WITHIN GROUP (
            ORDER BY s.inference_seconds / NULLIF(s.audio_seconds, 0)
        ) AS recent_median_rtf
    FROM segments s
    WHERE s.worker = w.id
      AND s.state = 'done'
      AND s.done_at > now() - interval '10 minutes'
) r;
