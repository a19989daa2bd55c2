-- Where each word of a finished segment is spoken in its audio (issue 30): a JSON array
-- of {"text": [byte start, byte end], "samples": [first, after last]}, from the model's
-- durations, written with the segment's other figures; the assembler makes subtitles
-- and timings.json from it. NULL: the engine gave no durations (or an older worker).
ALTER TABLE segments ADD COLUMN words jsonb;
