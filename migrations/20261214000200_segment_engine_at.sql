-- A rescue aimed at the loss (issue 42): when the watchdog finds messages of a voice
-- missing, it republishes only the segments that are lost, not a stalled job's whole
-- window. `engine_at` is when the segment last entered an engine (set with
-- `engine_by`): a segment that reached an engine since it was last published was
-- delivered, and may be waiting in a retry tier, so it is the last to be judged lost.
ALTER TABLE segments ADD COLUMN engine_at timestamptz;
