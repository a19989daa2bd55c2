//! Two loops that keep jobs from waiting for ever:
//! - the outbox reconciler publishes segments that `submit` committed but the broker
//!   never confirmed (the producer died in between);
//! - the stuck-job watchdog: a job of this worker's voices whose segments are not all
//!   done and that has made no progress for a lease gets its pending segments published
//!   again, whatever lost them (the broker dead-lettering a message after its delivery
//!   limit, a dead letter that could not be recorded, a broker that lost its disk). It
//!   rescues only when the voice's work queue and the retry tiers hold no ready message:
//!   a job waiting behind a backlog is not stuck. A segment rescued
//!   [`MAX_RESCUES`] times is recorded failed, so a message that kills every worker
//!   ends visibly instead of looping.

use std::collections::BTreeMap;
use std::time::Duration;

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use narrator_broker::{LANES, Publisher, RETRY_TIERS, lane_queue, retry_queue};
use narrator_db::{PgPool, Uuid};
use tokio::sync::watch;

/// Rescues of one segment before it is recorded failed.
pub const MAX_RESCUES: u32 = 3;

/// What the reconciler works with.
pub struct Reconciler {
    /// The database.
    pub pool: PgPool,
    /// Confirmed publishes.
    pub publisher: Publisher,
    /// A channel for passive queue declarations (queue depths).
    pub channel: lapin::Channel,
    /// The cluster id the messages carry.
    pub cluster: String,
    /// The voices this worker serves (the watchdog looks after their jobs).
    pub voices: Vec<String>,
    /// Outbox: republish segments unpublished this long after submission.
    pub unpublished_after: Duration,
    /// Watchdog: a job without progress this long is rescued.
    pub lease: Duration,
}

/// Ready messages in `queue` (a passive declare); `None` if the broker did not answer.
pub(crate) async fn ready_messages(channel: &lapin::Channel, queue: &str) -> Option<u32> {
    let opts = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(queue.into(), opts, FieldTable::default())
        .await
        .ok()
        .map(|q| q.message_count())
}

impl Reconciler {
    async fn outbox(&self) {
        let missing =
            match narrator_db::unpublished(&self.pool, self.unpublished_after, 10_000).await {
                Ok(m) => m,
                Err(e) => {
                    tracing::debug!(error = %e, "reconciler cannot read the outbox");
                    return;
                }
            };
        let mut by_job: BTreeMap<Uuid, Vec<narrator_core::Segment>> = BTreeMap::new();
        for (job, seg) in missing {
            by_job.entry(job).or_default().push(seg);
        }
        for (job, segments) in by_job {
            let route = match narrator_db::job_route(&self.pool, job).await {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!(%job, error = %e, "reconciler cannot load a job");
                    continue;
                }
            };
            tracing::info!(%job, segments = segments.len(), "republishing unpublished segments");
            let trace = narrator_db::job_trace(&self.pool, job).await.ok().flatten();
            let published = crate::publish_segments(
                &self.pool,
                &self.publisher,
                (&self.cluster, trace.as_ref()),
                job,
                (&route.0, route.1),
                &segments,
            )
            .await;
            if let Err(e) = published {
                tracing::warn!(%job, error = %e, "reconciler publish failed; will try again");
            }
        }
    }

    /// The voices whose queues hold nothing ready (and no retry waits): only their jobs
    /// can be stuck rather than waiting their turn.
    async fn idle_voices(&self) -> Vec<String> {
        for tier in RETRY_TIERS {
            match ready_messages(&self.channel, &retry_queue(tier)).await {
                Some(0) => {}
                _ => return Vec::new(),
            }
        }
        let mut idle = Vec::new();
        for voice in &self.voices {
            let mut empty = true;
            for lane in 0..LANES {
                empty &= ready_messages(&self.channel, &lane_queue(voice, lane)).await == Some(0);
            }
            if empty {
                idle.push(voice.clone());
            }
        }
        idle
    }

    async fn watchdog(&self) {
        let voices = self.idle_voices().await;
        if voices.is_empty() {
            return;
        }
        let rescues =
            match narrator_db::rescue_stuck_jobs(&self.pool, &voices, self.lease, MAX_RESCUES, 16)
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(error = %e, "watchdog cannot scan for stuck jobs");
                    return;
                }
            };
        for r in rescues {
            tracing::warn!(job = %r.job, segments = r.segments.len(), given_up = r.given_up,
                lease_s = self.lease.as_secs(), "job made no progress for a lease; publishing its missing segments again");
            if r.given_up > 0
                && let Err(e) = narrator_db::fail_settled_jobs(&self.pool).await
            {
                tracing::debug!(error = %e, "cannot end jobs with failed segments");
            }
            let trace = narrator_db::job_trace(&self.pool, r.job)
                .await
                .ok()
                .flatten();
            let published = crate::publish_segments(
                &self.pool,
                &self.publisher,
                (&self.cluster, trace.as_ref()),
                r.job,
                (&r.voice, r.priority),
                &r.segments,
            )
            .await;
            if let Err(e) = published {
                // The job stays claimed for one lease; the next scan tries again.
                tracing::warn!(job = %r.job, error = %e, "watchdog publish failed; will try again");
            }
        }
    }
}

/// Runs the outbox reconciler and the watchdog until `stop`.
pub(crate) async fn reconciler(r: Reconciler, mut stop: watch::Receiver<bool>) {
    let every = r
        .unpublished_after
        .min(r.lease / 4)
        .clamp(Duration::from_secs(1), Duration::from_secs(10));
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            biased;
            _ = stop.wait_for(|v| *v) => return,
            _ = tick.tick() => {}
        }
        r.outbox().await;
        r.watchdog().await;
    }
}
