-- Progress events (issue 44): `job.progress` tells a producer how far a book is, at most
-- once every few seconds per job. Not a change of state, so no trigger writes it: the
-- workers' event publishers look for jobs at work whose finished segments moved since
-- their last progress event and write one to the outbox (narrator_db::note_progress),
-- noting here when and at what count, so that a conditional update lets one publisher
-- of the fleet write each.
ALTER TABLE jobs
    ADD COLUMN progress_noted_done integer NOT NULL DEFAULT 0,
    ADD COLUMN progress_noted_at   timestamptz;
