-- The distributed worker's needs beyond the first schema:
--   settings             what the producer chose that the assembler applies (pauses, in ms)
--   outputs              what the assembler published: [{key, kind, name, seconds, bytes}]
--                        (kind: book | chapter | manifest), set when the job is done
--   assembler            the worker that claimed assembly; another worker takes over a job
--   assembly_started_at  left assembling by a worker whose heartbeat stopped
ALTER TABLE jobs
    ADD COLUMN settings            jsonb NOT NULL DEFAULT '{}',
    ADD COLUMN outputs             jsonb NOT NULL DEFAULT '[]',
    ADD COLUMN assembler           text,
    ADD COLUMN assembly_started_at timestamptz;

-- The worker's sweep looks for jobs stuck before or during assembly.
CREATE INDEX jobs_unfinished_idx ON jobs (state) WHERE state IN ('running', 'assembling');
