-- Issue 16: calibrations by GPU model, shared by the fleet. A worker on a GPU model, voice
-- and ONNX Runtime version found here plans from this row instead of calibrating (one
-- H200's calibration serves every H200 worker); a worker that calibrates stores its result.
--   calibration  narrator_hardware::Calibration as JSON (memory per padded token, the
--                throughput curve per batch size, sessions and threads measured)
--   measured_by  the worker id that measured it
CREATE TABLE gpu_calibrations (
    voice        text NOT NULL,
    device_model text NOT NULL,
    runtime      text NOT NULL,
    calibration  jsonb NOT NULL,
    measured_by  text NOT NULL,
    measured_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (voice, device_model, runtime)
);
