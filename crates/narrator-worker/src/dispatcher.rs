//! Keeps each running job's window of segments published (fair share between books, see
//! `narrator_db`'s dispatch module): after every recording the worker publishes as many
//! more of that job as fit its window; the windows follow the fleet and the running jobs
//! (looked up at most once a second per voice). The reconciler tops up jobs no recording
//! moved (a producer that died, a window that grew).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use narrator_broker::Publisher;
use narrator_db::{ClaimLimits, DbError, MIN_DISPATCH_WINDOW, PgPool, Uuid};

/// How long a voice's window is used before it is looked up again.
const WINDOW_FRESH_FOR: Duration = Duration::from_secs(1);

/// Tries of a top-up while other claims of its job run (a claim lasts a publish with
/// confirms: milliseconds), [`BUSY_PAUSE`] (jittered) apart.
const BUSY_TRIES: u32 = 25;
const BUSY_PAUSE: Duration = Duration::from_millis(20);

/// Publishes jobs' next segments, one dispatch at a time per job.
pub struct Dispatcher {
    pool: PgPool,
    publisher: Publisher,
    cluster: String,
    /// Workers seen this recently count in the fleet.
    seen_within: Duration,
    /// Per voice: the windows its jobs keep published (normal lane, high lane), and
    /// when they were computed.
    windows: Mutex<HashMap<String, ([u32; 2], Instant)>>,
    /// Jobs with a dispatch under way in this worker, and, when another was asked for
    /// meanwhile, the index it starts from (it then runs once more instead of alongside).
    running: Mutex<HashMap<Uuid, Option<u32>>>,
}

impl Dispatcher {
    /// Dispatches into `pool` and through `publisher`, tied to `cluster`; workers seen
    /// within `seen_within` make the fleet.
    pub fn new(pool: PgPool, publisher: Publisher, cluster: String, seen_within: Duration) -> Self {
        Self {
            pool,
            publisher,
            cluster,
            seen_within,
            windows: Mutex::default(),
            running: Mutex::default(),
        }
    }

    /// The windows of `voice`'s jobs (normal lane, high lane): the last ones looked up,
    /// the smallest before that.
    pub fn windows(&self, voice: &str) -> [u32; 2] {
        lock(&self.windows)
            .get(voice)
            .map_or([MIN_DISPATCH_WINDOW; 2], |w| w.0)
    }

    /// Recomputes the window of `voice` from its running jobs and the prefetch of the
    /// live workers serving it.
    async fn refresh(&self, voice: &str) {
        let voices = [voice.to_string()];
        match narrator_db::fleet_shares(&self.pool, &voices, self.seen_within).await {
            Ok(shares) => {
                let mut windows = lock(&self.windows);
                for s in shares {
                    let w = [s.window(), s.high_window()];
                    windows.insert(s.voice.clone(), (w, Instant::now()));
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot read the fleet's share of jobs"),
        }
    }

    /// [`Dispatcher::windows`], looked up again first when older than a second (books
    /// come and go, workers too).
    pub async fn fresh_windows(&self, voice: &str) -> [u32; 2] {
        let stale = lock(&self.windows)
            .get(voice)
            .is_none_or(|w| w.1.elapsed() >= WINDOW_FRESH_FOR);
        if stale {
            self.refresh(voice).await;
        }
        self.windows(voice)
    }

    /// Publishes what fits `job`'s window now: after a recording of segments up to
    /// `recorded`, from there and in runs; without one (`None`, the reconciler's), in runs
    /// from where the job's claims have reached (its dispatch front: see
    /// `narrator_db::claim_dispatch`). Returns how many it published. The voice's window is looked
    /// up again first when it is older than a second (books come and go). A top-up after
    /// a recording does not wait in Postgres for another worker's claim of the job: it
    /// tries again after a short pause, [`BUSY_TRIES`] times, holding no connection
    /// meanwhile; then it leaves the job to its next recording or the reconciler.
    pub async fn top_up(&self, job: Uuid, voice: &str, recorded: Option<u32>) -> usize {
        for tries in 1.. {
            let [window, high] = self.fresh_windows(voice).await;
            let limits = recorded
                .map_or(ClaimLimits::resume(window), |r| {
                    ClaimLimits::after_recording(window, r)
                })
                .with_high_window(high);
            match crate::publish::dispatch(&self.pool, &self.publisher, &self.cluster, job, limits)
                .await
            {
                Ok(n) => return n,
                Err(crate::WorkerError::Db(DbError::ClaimBusy(_))) if tries < BUSY_TRIES => {
                    tokio::time::sleep(crate::jittered(BUSY_PAUSE)).await;
                }
                Err(crate::WorkerError::Db(DbError::ClaimBusy(_))) => {
                    tracing::debug!(%job, tries, "another claim of the job kept running; leaving the top-up to the next recording");
                    return 0;
                }
                Err(e) => {
                    // Left unpublished: the next recording of the job, or the reconciler,
                    // publishes them.
                    tracing::warn!(%job, error = %e, "cannot publish the job's next segments; will try again");
                    return 0;
                }
            }
        }
        0
    }

    /// Tops `job` up in the background after segments up to index `recorded` were
    /// recorded (its unpublished segments are past them, but for a rolled-back claim's,
    /// which the reconciler finds): one dispatch per job at a time, requests made while
    /// one runs folded into one more run after it.
    pub fn nudge(self: &Arc<Self>, job: Uuid, voice: &str, recorded: u32) {
        {
            let mut running = lock(&self.running);
            if let Some(again) = running.get_mut(&job) {
                *again = Some(again.map_or(recorded, |r| r.max(recorded)));
                return;
            }
            running.insert(job, None);
        }
        let this = self.clone();
        let voice = voice.to_string();
        tokio::spawn(async move {
            let mut from = recorded;
            loop {
                this.top_up(job, &voice, Some(from)).await;
                let mut running = lock(&this.running);
                match running.get_mut(&job) {
                    Some(again @ Some(_)) => from = again.take().unwrap_or(from),
                    _ => {
                        running.remove(&job);
                        return;
                    }
                }
            }
        });
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
