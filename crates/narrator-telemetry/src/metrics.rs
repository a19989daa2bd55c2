//! The metrics narrator exports, named here once; recorded through the `metrics` facade
//! (a no-op until [`install`] sets the Prometheus recorder, so `narrator run` and tests
//! pay nothing). Labels are bounded: voice, device, batch-size class, outcome, GPU index
//! and name; never a job id.

#[cfg(feature = "serve")]
use std::sync::OnceLock;

#[cfg(feature = "serve")]
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

#[cfg(feature = "serve")]
use crate::TelemetryError;

/// HTTP requests `narrator serve` answered, by `route` (the path's template), `method`
/// and `status`.
pub const HTTP_REQUESTS: &str = "narrator_http_requests_total";
/// Seconds from an HTTP request to its response's head (a streamed body goes on), by
/// `route` and `method`.
pub const HTTP_REQUEST_SECONDS: &str = "narrator_http_request_seconds";
/// Speech requests being spoken now (`narrator serve`).
pub const SPEECH_ACTIVE: &str = "narrator_speech_active";

/// Segments stored, recorded and acknowledged, by `voice`.
pub const SEGMENTS_DONE: &str = "narrator_segments_done_total";
/// Audio seconds of each segment done, by `voice` (its `_sum` is the audio produced).
pub const SEGMENT_AUDIO_SECONDS: &str = "narrator_segment_audio_seconds";
/// Segment failures handed to the queue, by `voice` and retry `class`.
pub const SEGMENTS_FAILED: &str = "narrator_segments_failed_total";
/// Segments sent to a retry tier (an attempt charged), by `voice`.
pub const SEGMENTS_RETRIED: &str = "narrator_segments_retried_total";
/// Segments postponed uncharged (an outage), by `voice`.
pub const SEGMENTS_POSTPONED: &str = "narrator_segments_postponed_total";
/// Segments dead-lettered, by `voice`.
pub const SEGMENTS_DEAD_LETTERED: &str = "narrator_segments_dead_lettered_total";
/// Wall seconds of one engine run, by `device` and `batch` (size class); the rate of its
/// `_sum` is the device's busy fraction.
pub const ENGINE_RUN_SECONDS: &str = "narrator_engine_run_seconds";
/// Utterances per engine run, by `device`.
pub const BATCH_SIZE: &str = "narrator_batch_size";
/// Share of an engine run's padded tokens that are padding (0-1), by `device`.
pub const BATCH_PADDING: &str = "narrator_batch_padding_ratio";
/// Enqueue to the start of synthesis, seconds, by `voice`.
pub const QUEUE_WAIT_SECONDS: &str = "narrator_queue_wait_seconds";
/// Enqueue to acknowledgement of a segment, seconds, by `voice`.
pub const SEGMENT_LATENCY_SECONDS: &str = "narrator_segment_latency_seconds";
/// Storing one pack of segment audio in S3, seconds.
pub const STORE_SECONDS: &str = "narrator_store_seconds";
/// Recording one pack's figures in Postgres, seconds.
pub const RECORD_SECONDS: &str = "narrator_record_seconds";
/// Fraction of the last sampling interval the engine was busy, by `device`.
pub const DEVICE_BUSY_RATIO: &str = "narrator_device_busy_ratio";
/// The plan's padded-token budget per engine run, by `voice` and `device`.
pub const PLAN_BUDGET_TOKENS: &str = "narrator_plan_budget_tokens";
/// The plan's utterance budget per engine run, by `voice` and `device`.
pub const PLAN_BUDGET_REQUESTS: &str = "narrator_plan_budget_requests";
/// Unacknowledged messages the consumer may hold, by `voice`.
pub const PLAN_PREFETCH: &str = "narrator_plan_prefetch";
/// Out-of-memory failures of an engine run (each halves the budget), by `device`.
pub const OOM_EVENTS: &str = "narrator_oom_events_total";
/// Falls back from a GPU to the CPU, by `voice`.
pub const CPU_FALLBACKS: &str = "narrator_cpu_fallbacks_total";
/// 1 while the voice runs on the CPU after a GPU fallback, by `voice`.
pub const CPU_FALLBACK_ACTIVE: &str = "narrator_cpu_fallback_active";
/// Deliveries held by the worker (prefetched or in work), by `voice`.
pub const IN_FLIGHT: &str = "narrator_in_flight_deliveries";
/// Building a finished job's outputs, seconds, by `outcome` (done, postponed, failed).
pub const ASSEMBLY_SECONDS: &str = "narrator_assembly_seconds";
/// Messages ready in a voice's queue, by `voice` and `lane`.
pub const QUEUE_MESSAGES: &str = "narrator_queue_messages";
/// Age of the oldest unfinished job, seconds, by `voice` (0 when none).
pub const OLDEST_JOB_SECONDS: &str = "narrator_oldest_job_age_seconds";
/// Unfinished jobs without progress for longer than the lease, by `voice`.
pub const JOBS_STALLED: &str = "narrator_jobs_stalled";
/// Jobs by `state` (cluster-wide, from the database).
pub const JOBS: &str = "narrator_jobs";
/// Messages in the dead-letter queue.
pub const DEAD_LETTER_MESSAGES: &str = "narrator_dead_letter_messages";
/// 1 when the worker is ready (engines warm, broker consuming, database reachable).
pub const READY: &str = "narrator_ready";
/// GPU memory used, bytes, by `gpu` (index) and `name`.
pub const GPU_MEMORY_USED: &str = "narrator_gpu_memory_used_bytes";
/// GPU memory in all, bytes.
pub const GPU_MEMORY_TOTAL: &str = "narrator_gpu_memory_total_bytes";
/// GPU utilisation over NVML's last sample period (0-1).
pub const GPU_UTILIZATION: &str = "narrator_gpu_utilization_ratio";
/// GPU temperature, °C.
pub const GPU_TEMPERATURE: &str = "narrator_gpu_temperature_celsius";
/// Temperature at which the GPU slows down, °C.
pub const GPU_SLOWDOWN_TEMPERATURE: &str = "narrator_gpu_slowdown_temperature_celsius";
/// Power draw, watts.
pub const GPU_POWER: &str = "narrator_gpu_power_watts";
/// Enforced power limit, watts.
pub const GPU_POWER_LIMIT: &str = "narrator_gpu_power_limit_watts";
/// SM clock, MHz.
pub const GPU_SM_CLOCK: &str = "narrator_gpu_sm_clock_mhz";
/// Maximum SM clock, MHz.
pub const GPU_SM_CLOCK_MAX: &str = "narrator_gpu_sm_clock_max_mhz";
/// 1 for each active clock throttle reason, by `gpu` and `reason`.
pub const GPU_THROTTLE: &str = "narrator_gpu_throttle";
/// AMQP operations on segment messages, by `op`: `publish` (confirmed or not: every
/// message sent, republishes and dead letters included), `deliver`, `ack`, `nack`,
/// `reject`.
pub const BROKER_MESSAGES: &str = "narrator_broker_messages_total";
/// HTTP requests sent to S3 (every attempt, each part of a multipart upload), by `method`.
pub const S3_REQUESTS: &str = "narrator_s3_requests_total";
/// Bytes of S3 request and response bodies (their Content-Length), by `direction`
/// (`sent`, `received`).
pub const S3_BYTES: &str = "narrator_s3_bytes_total";

#[cfg(feature = "serve")]
const SECONDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 900.0, 3600.0,
];
#[cfg(feature = "serve")]
const SIZES: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];
#[cfg(feature = "serve")]
const RATIOS: &[f64] = &[0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];

#[cfg(feature = "serve")]
static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the Prometheus recorder (once per process) and describes every metric;
/// returns the handle that renders `/metrics`.
#[cfg(feature = "serve")]
pub fn install() -> Result<PrometheusHandle, TelemetryError> {
    if let Some(h) = HANDLE.get() {
        return Ok(h.clone());
    }
    let handle = PrometheusBuilder::new()
        .set_buckets(SECONDS)
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full(BATCH_SIZE.into()), SIZES))
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full(BATCH_PADDING.into()), RATIOS))
        .and_then(|b| b.install_recorder())
        .map_err(|e| TelemetryError::Metrics(e.to_string()))?;
    describe();
    Ok(HANDLE.get_or_init(|| handle).clone())
}

#[cfg(feature = "serve")]
fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(SEGMENTS_DONE, "Segments stored, recorded and acknowledged");
    describe_counter!(
        HTTP_REQUESTS,
        "HTTP requests answered, by route, method and status"
    );
    describe_histogram!(
        HTTP_REQUEST_SECONDS,
        Unit::Seconds,
        "HTTP request to its response's head"
    );
    describe_gauge!(SPEECH_ACTIVE, "Speech requests being spoken now");
    describe_histogram!(
        SEGMENT_AUDIO_SECONDS,
        Unit::Seconds,
        "Audio of each segment done"
    );
    describe_counter!(SEGMENTS_FAILED, "Segment failures, by retry class");
    describe_counter!(SEGMENTS_RETRIED, "Segments sent to a retry tier");
    describe_counter!(
        BROKER_MESSAGES,
        "AMQP operations on segment messages, by op"
    );
    describe_counter!(S3_REQUESTS, "HTTP requests sent to S3, by method");
    describe_counter!(S3_BYTES, Unit::Bytes, "S3 body bytes, by direction");
    describe_counter!(
        SEGMENTS_POSTPONED,
        "Segments postponed uncharged (an outage)"
    );
    describe_counter!(SEGMENTS_DEAD_LETTERED, "Segments dead-lettered");
    describe_histogram!(
        ENGINE_RUN_SECONDS,
        Unit::Seconds,
        "Wall time of one engine run"
    );
    describe_histogram!(BATCH_SIZE, "Utterances per engine run");
    describe_histogram!(BATCH_PADDING, "Padding share of an engine run's tokens");
    describe_histogram!(QUEUE_WAIT_SECONDS, Unit::Seconds, "Enqueue to synthesis");
    describe_histogram!(
        SEGMENT_LATENCY_SECONDS,
        Unit::Seconds,
        "Enqueue to acknowledgement"
    );
    describe_histogram!(STORE_SECONDS, Unit::Seconds, "Storing one pack in S3");
    describe_histogram!(
        RECORD_SECONDS,
        Unit::Seconds,
        "Recording one pack in Postgres"
    );
    describe_gauge!(
        DEVICE_BUSY_RATIO,
        "Engine busy fraction over the last sample"
    );
    describe_gauge!(PLAN_BUDGET_TOKENS, "Padded-token budget per engine run");
    describe_gauge!(PLAN_BUDGET_REQUESTS, "Utterance budget per engine run");
    describe_gauge!(PLAN_PREFETCH, "Consumer prefetch");
    describe_counter!(OOM_EVENTS, "Out-of-memory failures of engine runs");
    describe_counter!(CPU_FALLBACKS, "Falls back from GPU to CPU");
    describe_gauge!(
        CPU_FALLBACK_ACTIVE,
        "1 while running on CPU after a GPU fallback"
    );
    describe_gauge!(IN_FLIGHT, "Deliveries held by the worker");
    describe_histogram!(ASSEMBLY_SECONDS, Unit::Seconds, "Building a job's outputs");
    describe_gauge!(QUEUE_MESSAGES, "Messages ready in the voice's queue");
    describe_gauge!(
        OLDEST_JOB_SECONDS,
        Unit::Seconds,
        "Age of the oldest unfinished job"
    );
    describe_gauge!(JOBS_STALLED, "Unfinished jobs without progress for a lease");
    describe_gauge!(
        JOBS,
        "Jobs by state (done, failed, cancelled: those finished in the last hour)"
    );
    describe_gauge!(DEAD_LETTER_MESSAGES, "Messages in the dead-letter queue");
    describe_gauge!(READY, "1 when the worker is ready");
    describe_gauge!(GPU_MEMORY_USED, Unit::Bytes, "GPU memory used");
    describe_gauge!(GPU_MEMORY_TOTAL, Unit::Bytes, "GPU memory in all");
    describe_gauge!(GPU_UTILIZATION, "GPU utilisation (0-1)");
    describe_gauge!(GPU_TEMPERATURE, "GPU temperature (°C)");
    describe_gauge!(GPU_SLOWDOWN_TEMPERATURE, "GPU slowdown temperature (°C)");
    describe_gauge!(GPU_POWER, "GPU power draw (W)");
    describe_gauge!(GPU_POWER_LIMIT, "GPU enforced power limit (W)");
    describe_gauge!(GPU_SM_CLOCK, "GPU SM clock (MHz)");
    describe_gauge!(GPU_SM_CLOCK_MAX, "GPU maximum SM clock (MHz)");
    describe_gauge!(GPU_THROTTLE, "1 per active clock throttle reason");
}

/// A bounded label for a batch size: `1`, `2`, `3-4`, `5-8`, ... `129+`.
pub fn size_class(n: usize) -> &'static str {
    match n {
        0 | 1 => "1",
        2 => "2",
        3..=4 => "3-4",
        5..=8 => "5-8",
        9..=16 => "9-16",
        17..=32 => "17-32",
        33..=64 => "33-64",
        65..=128 => "65-128",
        _ => "129+",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_are_bounded_and_ordered() {
        let classes: Vec<_> = [1, 2, 3, 4, 5, 8, 9, 16, 17, 64, 65, 128, 129, 10_000]
            .into_iter()
            .map(size_class)
            .collect();
        assert_eq!(
            classes,
            [
                "1", "2", "3-4", "3-4", "5-8", "5-8", "9-16", "9-16", "17-32", "33-64", "65-128",
                "65-128", "129+", "129+"
            ]
        );
    }
}
