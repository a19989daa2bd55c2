-- A source EPUB's stylesheets, images and fonts (issue 30), kept with a job that writes a
-- read-along EPUB so its assembler shows the book as it looked: one row per file, at its
-- path in the source archive. How each paragraph looked is in jobs.chapters.
CREATE TABLE job_resources (
    job_id uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    path text NOT NULL,
    mime text NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (job_id, path)
);
