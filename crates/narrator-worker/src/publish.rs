//! Publishing a job's segments with confirms, marking each confirmed chunk published (the
//! outbox column): [`dispatch`] publishes the next segments that fit a job's window (used
//! by `submit`, `retry`, the reconciler and the worker after each recording);
//! [`publish_segments`] publishes given ones (the watchdog's rescues).

use narrator_broker::{Publisher, SegmentMessage};
use narrator_core::{Segment, TraceContext};
use narrator_db::{ClaimLimits, FleetShare, PgPool, Uuid};

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
    for chunk in segments.chunks(PUBLISH_CHUNK) {
        publisher
            .publish_batch(&messages(cluster, trace, job, (voice, priority), chunk))
            .await?;
        let indices: Vec<u32> = chunk.iter().map(|s| s.index).collect();
        narrator_db::mark_published(pool, job, &indices).await?;
    }
    Ok(())
}

fn messages(
    cluster: &str,
    trace: Option<&TraceContext>,
    job: Uuid,
    (voice, priority): (&str, i32),
    segments: &[Segment],
) -> Vec<SegmentMessage> {
    let lane = narrator_broker::lane_of(priority);
    segments
        .iter()
        .map(|s| {
            SegmentMessage::new(job.to_string(), voice, s.clone())
                .in_cluster(cluster)
                .in_lane(lane)
                .traced(trace)
        })
        .collect()
}

/// The limits of a first claim for a job of `voice` in the lane of `priority`: its
/// windows from the voice's running jobs (`coming` more of that lane about to be
/// submitted) and the prefetch of the live workers (each judged by its own heartbeat;
/// rows that do not say, by the last minute), from its first segment.
pub async fn first_window(
    pool: &PgPool,
    voice: &str,
    priority: i32,
    coming: u64,
) -> Result<ClaimLimits, narrator_db::DbError> {
    let share = fleet_share(pool, voice).await?;
    Ok(window_of(share.as_ref(), priority, coming))
}

/// The fleet's share of `voice` now (`None`: no worker serves it).
pub async fn fleet_share(
    pool: &PgPool,
    voice: &str,
) -> Result<Option<FleetShare>, narrator_db::DbError> {
    let voices = [voice.to_string()];
    let shares = narrator_db::fleet_shares(pool, &voices, FLEET_SEEN_WITHIN).await?;
    Ok(shares.into_iter().next())
}

/// The first window of a job in `share`, with `coming` more jobs counted as running.
pub fn window_of(share: Option<&FleetShare>, priority: i32, coming: u64) -> ClaimLimits {
    let floor = narrator_db::MIN_DISPATCH_WINDOW;
    share.map_or(ClaimLimits::fill(floor), |s| {
        let s = if narrator_broker::lane_of(priority) > 0 {
            FleetShare {
                active_high: s.active_high + coming,
                ..s.clone()
            }
        } else {
            FleetShare {
                active_jobs: s.active_jobs + coming,
                ..s.clone()
            }
        };
        ClaimLimits::fill(s.window()).with_high_window(s.high_window())
    })
}

/// Workers seen this recently count in the fleet a first window is cut for.
const FLEET_SEEN_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

/// Publishes the next unpublished segments of `job` that fit its window, within `limits`
/// ([`narrator_db::claim_dispatch`]): claimed, published with confirms and marked
/// published in one transaction, so two dispatchers never take the same ones and one
/// that fails leaves them for the next. Returns how many it published (0 when the window
/// is full, the job has none left unpublished or is not running).
pub async fn dispatch(
    pool: &PgPool,
    publisher: &Publisher,
    cluster: &str,
    job: Uuid,
    limits: ClaimLimits,
) -> Result<usize, WorkerError> {
    let mut tx = pool.begin().await.map_err(narrator_db::DbError::from)?;
    // Every way out ends the transaction here: a dropped one would keep its row locks
    // until its connection is next used.
    match claim_and_publish(&mut tx, publisher, cluster, job, limits).await {
        Ok(n) => {
            tx.commit().await.map_err(narrator_db::DbError::from)?;
            Ok(n)
        }
        Err(e) => {
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

/// [`dispatch`]'s work inside its transaction.
async fn claim_and_publish(
    tx: &mut narrator_db::PgConnection,
    publisher: &Publisher,
    cluster: &str,
    job: Uuid,
    limits: ClaimLimits,
) -> Result<usize, WorkerError> {
    let Some(claimed) = narrator_db::claim_dispatch(tx, job, limits).await? else {
        return Ok(0);
    };
    let route = (claimed.voice.as_str(), claimed.priority);
    for chunk in claimed.segments.chunks(PUBLISH_CHUNK) {
        publisher
            .publish_batch(&messages(
                cluster,
                claimed.trace.as_ref(),
                job,
                route,
                chunk,
            ))
            .await?;
    }
    let indices: Vec<u32> = claimed.segments.iter().map(|s| s.index).collect();
    if !indices.is_empty() {
        narrator_db::mark_published(&mut *tx, job, &indices).await?;
    }
    Ok(indices.len())
}
