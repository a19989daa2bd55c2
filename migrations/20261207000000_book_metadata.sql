-- What a book says about itself, carried into every output's tags and the manifest:
--   metadata    {author, language, date, publisher} (each optional), from the input or flags
--   cover       the cover image (JPEG or PNG, at most 10 MiB), embedded by the assembler
--   cover_type  its MIME type
ALTER TABLE jobs
    ADD COLUMN metadata   jsonb NOT NULL DEFAULT '{}',
    ADD COLUMN cover      bytea,
    ADD COLUMN cover_type text;
