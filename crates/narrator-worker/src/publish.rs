//! Publishing a job's segments with confirms, marking each confirmed chunk published (the
//! outbox column): used by `submit`, `retry`, the reconciler and the watchdog.

use narrator_broker::{Publisher, SegmentMessage};
use narrator_core::{Segment, TraceContext};
use narrator_db::{PgPool, Uuid};

use crate::WorkerError;

/// Messages per publish round trip (and per `mark_published` update).
pub const PUBLISH_CHUNK: usize = 1000;

/// Publishes `segments` of `job` to `voice`'s queue of the job's `priority` lane, tied
/// to `cluster` and carrying the job's `trace` (its headers), in chunks; each chunk the
/// broker confirmed is marked published.
pub async fn publish_segments(
    pool: &PgPool,
    publisher: &Publisher,
    (cluster, trace): (&str, Option<&TraceContext>),
    job: Uuid,
    (voice, priority): (&str, i32),
    segments: &[Segment],
) -> Result<(), WorkerError> {
    let lane = narrator_broker::lane_of(priority);
    for chunk in segments.chunks(PUBLISH_CHUNK) {
        let messages: Vec<SegmentMessage> = chunk
            .iter()
            .map(|s| {
                SegmentMessage::new(job.to_string(), voice, s.clone())
                    .in_cluster(cluster)
                    .in_lane(lane)
                    .traced(trace)
            })
            .collect();
        publisher.publish_batch(&messages).await?;
        let indices: Vec<u32> = chunk.iter().map(|s| s.index).collect();
        narrator_db::mark_published(pool, job, &indices).await?;
    }
    Ok(())
}
