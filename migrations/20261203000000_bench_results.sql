-- `narrator bench` results: one row per benchmark run, so a fleet's performance table is
-- one query (the view `bench_fleet`: the newest run per hardware and voice).
--   hardware               what the run was on, as the table prints it ("NVIDIA H200
--                          (141 GiB)", "Intel Xeon ... (2 cores)"): a worker type
--   device                 the device it ran on (cpu, cuda:0)
--   rtf_single             processing time / audio time, one 10-second request at a time
--   rtf_batched            the same at the plan's batch size (batched_at)
--   max_stable_concurrency clients whose p95 latency stayed within latency_target_seconds
--   report                 everything `narrator bench --json` printed (sweep, concurrency
--                          levels, plan, profile)
CREATE TABLE bench_results (
    id                     bigserial PRIMARY KEY,
    measured_at            timestamptz NOT NULL DEFAULT now(),
    host                   text NOT NULL,
    hardware               text NOT NULL,
    device                 text NOT NULL,
    voice                  text NOT NULL,
    rtf_single             double precision NOT NULL CHECK (rtf_single >= 0),
    rtf_batched            double precision NOT NULL CHECK (rtf_batched >= 0),
    batched_at             integer NOT NULL CHECK (batched_at >= 1),
    max_stable_concurrency integer NOT NULL CHECK (max_stable_concurrency >= 0),
    latency_target_seconds double precision NOT NULL CHECK (latency_target_seconds > 0),
    report                 jsonb NOT NULL
);

CREATE INDEX bench_results_latest_idx ON bench_results (hardware, voice, measured_at DESC);

-- The fleet's table: e.g. SELECT hardware, rtf_single, rtf_batched, max_stable_concurrency
-- FROM bench_fleet WHERE voice = 'en_US-joe-medium';
CREATE VIEW bench_fleet AS
SELECT DISTINCT ON (hardware, voice)
       id, measured_at, host, hardware, device, voice, rtf_single, rtf_batched, batched_at,
       max_stable_concurrency, latency_target_seconds, report
FROM bench_results
ORDER BY hardware, voice, measured_at DESC, id DESC;
