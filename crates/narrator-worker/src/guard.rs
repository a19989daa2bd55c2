//! The consumer behind a check: deliveries that need no work are settled before any
//! work, in groups (one database query for everything the broker has handed over).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use narrator_broker::{Consumer, Decision, MAX_ATTEMPTS};
use narrator_core::{Delivery, Failure, RetryClass, SeamError, Segment, SegmentQueue};
use narrator_db::{DeliveryKey, PgPool, SegmentCheck, Uuid};
use tokio::sync::{Mutex, watch};

use crate::outage::Outages;

/// Most deliveries checked with one database query: everything the broker has already
/// sent, up to this many, is checked at once.
const CHECK_GROUP: usize = 64;

/// A [`Consumer`] whose deliveries are checked in Postgres first: a segment already done
/// is acknowledged, one of an ended or unknown job dropped, one delivered more often
/// than [`MAX_ATTEMPTS`] given up on with a recorded reason.
pub struct GuardedQueue {
    inner: Consumer,
    pool: PgPool,
    stop: watch::Receiver<bool>,
    worker: String,
    /// Checked deliveries that need work, in delivery order.
    ready: Mutex<VecDeque<Delivery<GuardTicket>>>,
    /// The outage in progress: new work waits out its pause.
    outages: Arc<Outages>,
    /// This process (engine marks name it).
    instance: Uuid,
    /// A worker row older than this is a process that is gone.
    stale: Duration,
    /// Publishes a job's next segments when one of its segments fails for good (a
    /// failure frees room in the job's window as a recording does), and the voice.
    dispatcher: Option<(Arc<crate::dispatcher::Dispatcher>, String)>,
}

/// Worker processes that may die with a segment in their engine before it is given up
/// on (it crashes the engine).
pub const MAX_ENGINE_CRASHES: u32 = 3;

/// Times a segment may be returned by consumers that went away before it is given up on
/// (it takes down its process before reaching the engine, e.g. while phonemizing).
pub const MAX_RETURNS: u32 = 10;

/// A delivery's ticket with what the failure path needs.
pub struct GuardTicket {
    job: Uuid,
    index: u32,
    attempt: u32,
    inner: narrator_broker::Ticket,
}

impl GuardedQueue {
    /// Guards `inner` with checks in `pool`; `next` ends once `stop` turns true.
    pub fn new(
        inner: Consumer,
        pool: PgPool,
        stop: watch::Receiver<bool>,
        worker: String,
        outages: Arc<Outages>,
        (instance, stale): (Uuid, Duration),
    ) -> Self {
        Self {
            inner,
            pool,
            stop,
            worker,
            ready: Mutex::default(),
            outages,
            instance,
            stale,
            dispatcher: None,
        }
    }

    /// Tops a job's window up through `dispatcher` after its segments of `voice` fail for
    /// good, as after recordings: a book whose segments all fail then ends at the pace
    /// its failures are recorded, not one window per reconciler tick.
    pub fn with_dispatcher(
        mut self,
        dispatcher: Arc<crate::dispatcher::Dispatcher>,
        voice: String,
    ) -> Self {
        self.dispatcher = Some((dispatcher, voice));
        self
    }

    /// Closes the consumer: deliveries prefetched but not started go back to the queue.
    pub async fn close(&self) -> Result<(), narrator_broker::BrokerError> {
        self.inner.close().await
    }

    /// The next delivery that needs work: from those checked already, else from the
    /// next group the consumer hands out ([`Self::check_group`]), after any outage's
    /// pause ([`Self::wait_out_outage`]). `None`: the consumer has ended.
    async fn next_inner(&self) -> Result<Option<Delivery<GuardTicket>>, SeamError> {
        let mut ready = self.ready.lock().await;
        loop {
            if let Some(d) = ready.pop_front() {
                return Ok(Some(d));
            }
            self.wait_out_outage().await;
            let group = self.inner.next_deliveries(CHECK_GROUP).await?;
            if group.is_empty() {
                return Ok(None);
            }
            self.check_group(group, &mut ready).await?;
        }
    }

    /// During an outage, waits out its pause before taking more work: the deliveries
    /// would only be postponed again. Checked every second, so work resumes as soon as a
    /// segment in flight gets through.
    async fn wait_out_outage(&self) {
        loop {
            let pause = self.outages.pause();
            if pause.is_zero() {
                return;
            }
            tracing::debug!(
                seconds = pause.as_secs_f64(),
                "outage: pausing before the next deliveries"
            );
            tokio::time::sleep(pause.min(Duration::from_secs(1))).await;
        }
    }

    /// Checks a group of deliveries against the database in one statement: those that
    /// need work go to `ready`, the rest are settled ([`Self::admit`]). A message that no
    /// segment can match is dead-lettered with its reason first, alone; the database
    /// away settles the whole group for later, not charged an attempt when the cause is
    /// an outage.
    async fn check_group(
        &self,
        group: Vec<Delivery<narrator_broker::Ticket>>,
        ready: &mut VecDeque<Delivery<GuardTicket>>,
    ) -> Result<(), SeamError> {
        let mut parsed = Vec::with_capacity(group.len());
        for d in group {
            match addressable(&d.job_id, d.segment.index) {
                Ok(job) => parsed.push((job, d)),
                Err(reason) => {
                    tracing::warn!(job = %d.job_id, index = d.segment.index, %reason, "dead-lettering a message that names no segment");
                    let decision = Decision::DeadLetter { reason };
                    self.inner.settle(d.ticket, decision).await?;
                }
            }
        }
        let keys: Vec<DeliveryKey> = parsed
            .iter()
            .map(|(job, d)| DeliveryKey {
                job: *job,
                index: d.segment.index,
                returned: d.ticket.returned(),
                // What is synthesized must be what was submitted: the database's.
                content: Some((d.segment.text.clone(), d.segment.speaker)),
            })
            .collect();
        let checks = match narrator_db::check_deliveries(
            &self.pool,
            &keys,
            self.instance,
            self.stale,
        )
        .await
        {
            // One check per delivery, in their order (see check_segments).
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(error = %e, deliveries = parsed.len(), "cannot check deliveries; retrying them later");
                let failure = Failure {
                    kind: e.kind(),
                    class: e.retry_class(),
                    reason: e.to_string(),
                };
                for (_, d) in parsed {
                    let decision = self.inner.decision_for(&d.ticket, &failure);
                    self.inner.settle(d.ticket, decision).await?;
                }
                if failure.class == RetryClass::Infrastructure {
                    self.outages.failed(failure.kind, &failure.reason);
                } else {
                    tokio::time::sleep(crate::jittered(Duration::from_millis(500))).await;
                }
                return Ok(());
            }
        };
        for ((job, d), history) in parsed.into_iter().zip(checks) {
            self.admit(job, d, history, ready).await?;
        }
        Ok(())
    }

    /// One checked delivery: to `ready` when it needs work (at the settings its job
    /// recorded), else settled: a forged message dead-lettered, a segment past its crash,
    /// return or attempt limits failed for good, one returned by a consumer that went away
    /// released uncharged, one that needs no work acknowledged.
    async fn admit(
        &self,
        job: Uuid,
        d: Delivery<narrator_broker::Ticket>,
        history: narrator_db::DeliveryHistory,
        ready: &mut VecDeque<Delivery<GuardTicket>>,
    ) -> Result<(), SeamError> {
        let index = d.segment.index;
        let returned = d.ticket.returned();
        let ticket = GuardTicket {
            job,
            index,
            attempt: d.attempt,
            inner: d.ticket,
        };
        let given_up = |kind: &'static str, reason: String| Failure {
            kind,
            class: RetryClass::Permanent,
            reason,
        };
        match history.check {
            SegmentCheck::Mismatch => {
                let reason = format!(
                    "the message's text or speaker for segment {index} of job {job} is not \
                     the one recorded in the database (forged or corrupted); refused"
                );
                tracing::warn!(%job, index, "{reason}");
                self.inner
                    .settle(ticket.inner, Decision::DeadLetter { reason })
                    .await?;
            }
            SegmentCheck::Work if history.engine_crashes >= MAX_ENGINE_CRASHES => {
                let failure = given_up(
                    "engine_crash",
                    format!(
                        "a worker process died {} times while synthesizing this segment (it crashes the engine)",
                        history.engine_crashes
                    ),
                );
                self.fail(ticket, &failure).await?;
            }
            SegmentCheck::Work if history.returns > MAX_RETURNS => {
                let failure = given_up(
                    "returned",
                    format!(
                        "delivered to {} workers that went away before finishing it",
                        history.returns
                    ),
                );
                self.fail(ticket, &failure).await?;
            }
            SegmentCheck::Work if d.attempt > MAX_ATTEMPTS && !returned => {
                let failure = given_up(
                    "delivery_limit",
                    format!(
                        "delivered {} times without being finished (workers stopped or died holding it)",
                        d.attempt
                    ),
                );
                self.fail(ticket, &failure).await?;
            }
            SegmentCheck::Work if returned => {
                // A consumer went away holding it (a process died, a connection
                // dropped): not this segment's fault. Back to the queue with the
                // attempts charged before, so the broker's delivery limit never
                // takes the neighbours of a segment that kills its process.
                tracing::debug!(%job, index, crashes = history.engine_crashes, "returned by a consumer that went away; released uncharged");
                self.inner.settle(ticket.inner, Decision::Release).await?;
            }
            SegmentCheck::Work => ready.push_back(Delivery {
                // Canonical from here on: store keys, records and clean-up name a
                // job one way (`{…}`, `urn:uuid:` or upper-case forms parse too).
                job_id: job.to_string(),
                // At the job's rate, timed if the job wants words, as recorded
                // (a message's own settings are ignored).
                segment: Segment {
                    speed: history.speed,
                    timed: history.timed,
                    ..d.segment
                },
                // The scales its job's identity was hashed with, as the job
                // recorded them (none for older jobs: the worker's own at the
                // job's rate).
                scales: history.scales,
                attempt: d.attempt,
                enqueued_at_ms: d.enqueued_at_ms,
                lane: d.lane,
                // In the engine when a process died: alone from now on, so it
                // cannot take others down with it.
                alone: history.engine_crashes > 0,
                trace: d.trace,
                ticket,
            }),
            other => {
                tracing::debug!(%job, index, ?other, worker = %self.worker, "skipping a delivery that needs no work");
                self.inner.settle(ticket.inner, Decision::Ack).await?;
            }
        }
        Ok(())
    }
}

/// The job of a message that can name a segment, or why it cannot: its job id is not a
/// UUID, or its index is past the largest a segment can have (the database's `int4`).
fn addressable(job_id: &str, index: u32) -> Result<Uuid, String> {
    let job = Uuid::parse_str(job_id).map_err(|_| format!("job id '{job_id}' is not a UUID"))?;
    if i32::try_from(index).is_err() {
        return Err(format!(
            "segment index {index} is out of range (at most {})",
            i32::MAX
        ));
    }
    Ok(job)
}

/// (job, index) pairs of a batch, with job ids parsed (the guard let only UUIDs through).
fn keys_of(batch: &[(String, u32)]) -> Vec<(Uuid, u32)> {
    batch
        .iter()
        .filter_map(|(job, index)| Uuid::parse_str(job).ok().map(|j| (j, *index)))
        .collect()
}

fn seam(e: narrator_db::DbError) -> SeamError {
    SeamError::new(e.kind(), e.retry_class(), e.to_string(), e)
}

impl SegmentQueue for GuardedQueue {
    type Ticket = GuardTicket;

    async fn next(&self) -> Result<Option<Delivery<GuardTicket>>, SeamError> {
        let mut stop = self.stop.clone();
        tokio::select! {
            biased;
            _ = stop.wait_for(|v| *v) => Ok(None),
            d = self.next_inner() => d,
        }
    }

    async fn ack(&self, ticket: GuardTicket) -> Result<(), SeamError> {
        // A segment went all the way through: whatever was away is back.
        self.outages.succeeded();
        self.inner.ack(ticket.inner).await
    }

    async fn requeue(&self, ticket: GuardTicket) -> Result<(), SeamError> {
        self.inner.requeue(ticket.inner).await
    }

    fn holds_higher_lane(&self) -> bool {
        self.inner.holds_high()
    }

    async fn abandoned_jobs(&self, jobs: Vec<String>) -> Result<Vec<String>, SeamError> {
        let ids: Vec<Uuid> = jobs
            .iter()
            .filter_map(|j| Uuid::parse_str(j).ok())
            .collect();
        let gone = narrator_db::abandoned_jobs(&self.pool, &ids)
            .await
            .map_err(seam)?;
        Ok(gone.iter().map(Uuid::to_string).collect())
    }

    async fn before_engine(&self, batch: &[(String, u32)]) -> Result<(), SeamError> {
        narrator_db::mark_in_engine(&self.pool, self.instance, &keys_of(batch), true)
            .await
            .map_err(seam)
    }

    async fn after_engine(&self, batch: &[(String, u32)]) -> Result<(), SeamError> {
        narrator_db::mark_in_engine(&self.pool, self.instance, &keys_of(batch), false)
            .await
            .map_err(seam)
    }

    async fn fail(&self, ticket: GuardTicket, failure: &Failure) -> Result<(), SeamError> {
        let decision = self.inner.decision_for(&ticket.inner, failure);
        if let Decision::DeadLetter { reason: why } = &decision {
            let (job, index) = (ticket.job, ticket.index);
            let recorded = async {
                let changed = narrator_db::fail_segment(
                    &self.pool,
                    job,
                    index,
                    ticket.attempt,
                    failure.kind,
                    why,
                )
                .await?;
                let ended = narrator_db::fail_settled_jobs(&self.pool).await?;
                Ok::<_, narrator_db::DbError>(changed && !ended.contains(&job))
            };
            match recorded.await {
                Ok(true) => {
                    if let Some((dispatcher, voice)) = &self.dispatcher {
                        dispatcher.nudge(job, voice, index);
                    }
                }
                Ok(false) => {}
                Err(e) => {
                    // The stuck-job watchdog publishes it again once the job has made no
                    // progress for a lease; the dead letter keeps the reason meanwhile.
                    tracing::warn!(%job, index, error = %e, "cannot record a dead-lettered segment");
                }
            }
        }
        if let Decision::Postpone { .. } = decision {
            tracing::debug!(job = %ticket.job, index = ticket.index, kind = failure.kind,
                "postponed without being charged an attempt");
            self.outages.failed(failure.kind, &failure.reason);
        }
        Ok(self.inner.settle(ticket.inner, decision).await?)
    }
}
