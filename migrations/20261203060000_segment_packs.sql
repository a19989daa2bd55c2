-- Segments whose audio shares one stored object with other segments (a pack, written
-- in one request) record where in it: the pack's key and the byte range of the
-- segment's WAV. NULL: the audio is under the segment's own key.
ALTER TABLE segments
    ADD COLUMN pack_key    text,
    ADD COLUMN pack_offset bigint,
    ADD COLUMN pack_len    bigint,
    ADD CONSTRAINT segments_pack_check CHECK (
        (pack_key IS NULL AND pack_offset IS NULL AND pack_len IS NULL)
        OR (pack_key IS NOT NULL AND pack_offset >= 0 AND pack_len > 0)
    );
