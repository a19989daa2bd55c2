//! The workers' cluster-wide gauges of jobs: by voice and state, the oldest unfinished
//! job's age and the jobs without progress ([`voice_gauges`]).

use sqlx::PgExecutor;

use crate::error::DbError;
use crate::jobs::JobState;

/// Cluster-wide job figures of one voice, for the workers' gauges.
#[derive(Debug, Clone, PartialEq)]
pub struct VoiceGauges {
    /// The voice.
    pub voice: String,
    /// Jobs by state, every state (0 included): the unfinished states (queued, running,
    /// assembling) count every such job; the finished ones (done, failed, cancelled) only
    /// the jobs finished within [`GAUGE_FINISHED_WITHIN`], so that the gauge never reads
    /// every job the database has kept.
    pub by_state: Vec<(String, i64)>,
    /// Age of the oldest unfinished job (queued, running, assembling), seconds; 0 when none.
    pub oldest_unfinished_seconds: f64,
    /// Unfinished jobs without progress for longer than the lease.
    pub stalled: i64,
}

impl VoiceGauges {
    /// A voice's figures with no job in any state: what a voice that drops out of
    /// [`voice_gauges`] reads (a state that emptied reads 0, not its last count).
    pub fn empty(voice: String) -> Self {
        const STATES: [JobState; 6] = [
            JobState::Queued,
            JobState::Running,
            JobState::Assembling,
            JobState::Done,
            JobState::Failed,
            JobState::Cancelled,
        ];
        Self {
            voice,
            by_state: STATES.iter().map(|s| (s.as_str().to_string(), 0)).collect(),
            oldest_unfinished_seconds: 0.0,
            stalled: 0,
        }
    }
}

/// How far back [`voice_gauges`] counts finished jobs (by `finished_at`).
pub const GAUGE_FINISHED_WITHIN: std::time::Duration = std::time::Duration::from_secs(3600);

/// Jobs by voice and state (finished ones: those of the last
/// [`GAUGE_FINISHED_WITHIN`]), the oldest unfinished job's age and the jobs without
/// progress for `lease`. One statement that reads the unfinished jobs through their
/// partial index (`jobs_unfinished_idx`) and the recently finished ones through theirs
/// (`jobs_finished_at_idx`): its work does not grow with the finished jobs kept. A voice
/// with neither is not returned (the caller zeroes what it reported of it before).
pub async fn voice_gauges(
    exec: impl PgExecutor<'_>,
    lease: std::time::Duration,
) -> Result<Vec<VoiceGauges>, DbError> {
    let rows: Vec<(String, String, i64, Option<f64>, i64)> = sqlx::query_as(
        "SELECT voice, state, count(*), \
         max(extract(epoch FROM now() - created_at)::float8) \
           FILTER (WHERE state IN ('queued', 'running', 'assembling')), \
         count(*) FILTER (WHERE state IN ('queued', 'running') \
           AND coalesce(progress_at, created_at) < now() - make_interval(secs => $1)) \
         FROM ( \
           SELECT voice, state, created_at, progress_at FROM jobs \
             WHERE state IN ('queued', 'running', 'assembling') \
           UNION ALL \
           SELECT voice, state, created_at, progress_at FROM jobs \
             WHERE state IN ('done', 'failed', 'cancelled') \
               AND finished_at >= now() - make_interval(secs => $2) \
         ) j GROUP BY voice, state ORDER BY voice, state",
    )
    .bind(lease.as_secs_f64())
    .bind(GAUGE_FINISHED_WITHIN.as_secs_f64())
    .fetch_all(exec)
    .await?;
    let mut out: Vec<VoiceGauges> = Vec::new();
    for (voice, state, n, oldest, stalled) in rows {
        if out.last().is_none_or(|g| g.voice != voice) {
            // Every state, so a state that emptied reads 0 rather than its last count.
            out.push(VoiceGauges::empty(voice));
        }
        if let Some(g) = out.last_mut() {
            match g.by_state.iter_mut().find(|(s, _)| *s == state) {
                Some(slot) => slot.1 = n,
                None => g.by_state.push((state, n)),
            }
            g.oldest_unfinished_seconds = g.oldest_unfinished_seconds.max(oldest.unwrap_or(0.0));
            g.stalled += stalled;
        }
    }
    Ok(out)
}
