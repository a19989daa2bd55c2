-- What a book says about itself, carried into every output's tags and the manifest:
--   metadata    {author, language, date, publisher} (each optional), from the input or flags
--   cover       the cover image (JPEG or PNG, at most 10 MiB), embedded by the assembler
--   cover_type  its MIME type
ALTER TABLE jobs
    ADD COLUMN metadata   jsonb NOT NULL DEFAULT '{}',
    ADD COLUMN cover      bytea,
    ADD COLUMN cover_type text;

-- The pronunciation lexicon applied to the job's segments (its source text, for the
-- record: the replacements are already in segments.text, so every worker says the same).
ALTER TABLE jobs ADD COLUMN lexicon text;

-- The voice's speaker id of each segment (multi-speaker voices; 0 otherwise): it goes
-- into every message published for the segment, including the reconciler's and retry's.
ALTER TABLE segments ADD COLUMN speaker int NOT NULL DEFAULT 0;
