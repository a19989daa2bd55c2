-- Each worker says after how long without a heartbeat it counts as gone (6 of its own
-- heartbeats). Peers judge it by that, not by their own `--heartbeat`: a worker beating
-- every 10 s is not "gone" to one that beats every second. NULL (rows written before
-- this column): the observer's own interval, as before.
ALTER TABLE workers ADD COLUMN stale_after_s double precision
    CHECK (stale_after_s IS NULL OR stale_after_s > 0);

CREATE OR REPLACE VIEW worker_recent AS
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
    r.recent_median_rtf,
    w.stale_after_s
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
