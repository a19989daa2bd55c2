//! Two loops that keep jobs from waiting for ever:
//! - the outbox reconciler publishes what fits each running job's window and no
//!   recording published: segments `submit` committed but the broker never confirmed (the
//!   producer died in between), windows grown with the fleet;
//! - the stuck-job watchdog: per voice, it compares the segments the database says are
//!   out (published, not finished) with the messages that can account for them (ready in
//!   the voice's lanes, held unacknowledged by live workers as their heartbeats say, and
//!   everything waiting in the shared retry tiers). When fewer are accounted for than
//!   are out, on two looks a few heartbeats apart, messages were lost (the broker
//!   dead-lettering one after its delivery limit, a dead letter that could not be
//!   recorded, a broker that lost its disk), and the rescue is aimed at them: in each
//!   lane messages leave first in, first out, so the lane's newest segments out, as many
//!   as it has ready and held, are accounted for; the older ones the lane's front passed
//!   (a segment published after them was delivered), in no live engine and not
//!   attempted lately (a retry tier), are the lost ones, published
//!   again, at most one per missing message. A busy voice or another voice's retries
//!   do not hide a loss; a job waiting behind a backlog has its segments ready and is
//!   never charged a rescue. A segment rescued [`MAX_RESCUES`] times is recorded
//!   failed, so a message that kills every worker ends visibly instead of looping.

use std::collections::BTreeMap;
use std::time::Duration;

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use narrator_broker::{LANES, Publisher, RETRY_TIERS, lane_queue, retry_queue};
use narrator_db::PgPool;
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
    /// Keeps the jobs' windows published.
    pub dispatcher: std::sync::Arc<crate::dispatcher::Dispatcher>,
    /// The voices this worker serves (the watchdog looks after their jobs).
    pub voices: Vec<String>,
    /// Outbox: top up jobs submitted this long ago.
    pub unpublished_after: Duration,
    /// Watchdog: a job without progress this long is rescued.
    pub lease: Duration,
    /// Between this worker's heartbeats; rows of peers that did not record their own
    /// staleness count as gone after 6 of these. A loss must be seen on two looks at
    /// least 2 of these apart (heartbeats report held deliveries that late).
    pub heartbeat: Duration,
    /// Per voice: a loss seen, not yet confirmed.
    pub suspected: BTreeMap<String, Suspicion>,
}

/// Messages of a voice seen missing, from `first` to `last`, at least `fewest` each time.
#[derive(Debug, Clone, Copy)]
pub struct Suspicion {
    first: std::time::Instant,
    last: std::time::Instant,
    fewest: u64,
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
    /// Tops up every running job with segments unpublished and room in its window for a
    /// run that was submitted more than `unpublished_after` ago: those whose producer
    /// died before publishing, and those whose window grew. One query for the jobs with
    /// room (the windows looked up at most once a second), then one claim each from
    /// its dispatch front: the tick's work follows the jobs that need a top-up, not the
    /// running books' lengths or how many have full windows.
    async fn outbox(&self) {
        let mut windows: Vec<(String, [u32; 2])> = Vec::with_capacity(self.voices.len());
        for v in &self.voices {
            windows.push((v.clone(), self.dispatcher.fresh_windows(v).await));
        }
        let jobs = match narrator_db::dispatch_candidates(
            &self.pool,
            &windows,
            self.unpublished_after,
            10_000,
        )
        .await
        {
            Ok(j) => j,
            Err(e) => {
                tracing::debug!(error = %e, "reconciler cannot read the outbox");
                return;
            }
        };
        for (job, voice) in jobs {
            // From the job's dispatch front (no rolled-back claim leaves a segment below it).
            let n = self.dispatcher.top_up(job, &voice, None).await;
            if n > 0 {
                tracing::debug!(%job, segments = n, "published segments into the job's window");
            }
        }
    }

    /// Per voice of this worker: how many of its published, unfinished segments no
    /// message accounts for (0 when all are, or when the broker did not answer), the
    /// longest heartbeat of the workers holding its deliveries, and per lane what the
    /// broker has ready plus what live workers hold. The broker is read before the
    /// database: a segment finished in between is then counted as held, never as
    /// missing.
    async fn missing_by_voice(&self) -> BTreeMap<String, Look> {
        let mut waiting = 0u64;
        for tier in RETRY_TIERS {
            match ready_messages(&self.channel, &retry_queue(tier)).await {
                Some(n) => waiting += u64::from(n),
                None => return BTreeMap::new(),
            }
        }
        let mut ready = BTreeMap::new();
        for voice in &self.voices {
            let mut lanes = [0u64; 2];
            for lane in 0..LANES {
                match ready_messages(&self.channel, &lane_queue(voice, lane)).await {
                    Some(r) => lanes[usize::from(lane.min(1))] += u64::from(r),
                    None => return BTreeMap::new(),
                }
            }
            ready.insert(voice.clone(), lanes);
        }
        let counts = match narrator_db::voice_outstanding(
            &self.pool,
            &self.voices,
            self.heartbeat * 6,
        )
        .await
        {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, "watchdog cannot count outstanding segments");
                return BTreeMap::new();
            }
        };
        counts
            .into_iter()
            .map(|c| {
                let lanes = ready.get(&c.voice).copied().unwrap_or([0, 0]);
                let accounted = lanes[0] + lanes[1] + c.held + waiting;
                let look = Look {
                    missing: c.outstanding.saturating_sub(accounted),
                    slowest: c.slowest_heartbeat,
                    by_lane: [lanes[0] + c.held_by_lane[0], lanes[1] + c.held_by_lane[1]],
                };
                (c.voice, look)
            })
            .collect()
    }

    /// The voices with messages missing on looks at least two heartbeats apart (of the
    /// slowest worker holding them, or this one's), how many (the fewest seen), and the
    /// latest look's per-lane accounting. A look that finds none in between does not
    /// clear the suspicion: a segment finished between the broker's and the database's
    /// reading hides one loss for a look. Looks that find none for two heartbeats do. A
    /// worker's held deliveries are reported up to a heartbeat late, so a worker taking
    /// its first deliveries looks like a loss for less than that, never on looks two
    /// heartbeats apart.
    fn confirmed(&mut self, missing: BTreeMap<String, Look>) -> Vec<(String, u64, [u64; 2])> {
        let now = std::time::Instant::now();
        let mut out = Vec::new();
        for (voice, look) in missing {
            let settle = self.heartbeat.max(look.slowest) * 2;
            if look.missing == 0 {
                if self
                    .suspected
                    .get(&voice)
                    .is_some_and(|s| now.duration_since(s.last) >= settle)
                {
                    self.suspected.remove(&voice);
                }
                continue;
            }
            let s = self.suspected.entry(voice.clone()).or_insert(Suspicion {
                first: now,
                last: now,
                fewest: look.missing,
            });
            s.last = now;
            s.fewest = s.fewest.min(look.missing);
            if s.last.duration_since(s.first) >= settle {
                out.push((voice, s.fewest, look.by_lane));
            }
        }
        out
    }

    async fn watchdog(&mut self) {
        let missing = self.missing_by_voice().await;
        for (voice, n, by_lane) in self.confirmed(missing) {
            self.rescue(&voice, n, by_lane).await;
        }
    }

    /// Publishes again the segments of `voice` judged lost: at most one per missing
    /// message (16 a look), of those the lanes' ready and held messages do not account
    /// for (see [`narrator_db::rescue_lost_segments`]).
    async fn rescue(&mut self, voice: &str, missing: u64, accounted: [u64; 2]) {
        let look = narrator_db::LossLook {
            accounted,
            missing: u32::try_from(missing.min(16)).unwrap_or(16),
            min_age: self.lease,
            retry_quiet: RETRY_TIERS[RETRY_TIERS.len() - 1] + self.lease,
            stale: self.heartbeat * 6,
        };
        let rescues =
            match narrator_db::rescue_lost_segments(&self.pool, voice, look, MAX_RESCUES).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(error = %e, "watchdog cannot look for lost segments");
                    return;
                }
            };
        if !rescues.is_empty() {
            // What was published again is accounted for from now on: look afresh.
            self.suspected.remove(voice);
        }
        for r in rescues {
            tracing::warn!(job = %r.job, segments = r.segments.len(), given_up = r.given_up,
                lease_s = self.lease.as_secs(), "segments of the job were lost; publishing them again");
            if r.given_up > 0
                && let Err(e) = narrator_db::fail_settled_jobs(&self.pool).await
            {
                tracing::debug!(error = %e, "cannot end jobs with failed segments");
            }
            if r.segments.is_empty() {
                continue;
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
                // Marked published a moment ago: judged again once a lease old.
                tracing::warn!(job = %r.job, error = %e, "watchdog publish failed; will try again");
            }
        }
    }
}

/// One look at a voice: messages missing, how late the holders' reports may be, and per
/// lane (normal, high) the messages ready in its queue plus those held by live workers.
#[derive(Debug, Clone, Copy)]
pub struct Look {
    missing: u64,
    slowest: Duration,
    by_lane: [u64; 2],
}

/// Runs the outbox reconciler and the watchdog until `stop`.
pub(crate) async fn reconciler(mut r: Reconciler, mut stop: watch::Receiver<bool>) {
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
