//! The consumer behind a check: deliveries that need no work are settled before any
//! work, in groups (one database query for everything the broker has handed over).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use narrator_broker::{Consumer, Decision, MAX_ATTEMPTS, failure_decision};
use narrator_core::{Delivery, Failure, RetryClass, SeamError, SegmentQueue};
use narrator_db::{PgPool, SegmentCheck, Uuid};
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
}

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
    ) -> Self {
        Self {
            inner,
            pool,
            stop,
            worker,
            ready: Mutex::default(),
            outages,
        }
    }

    /// Closes the consumer: deliveries prefetched but not started go back to the queue.
    pub async fn close(&self) -> Result<(), narrator_broker::BrokerError> {
        self.inner.close().await
    }

    async fn next_inner(&self) -> Result<Option<Delivery<GuardTicket>>, SeamError> {
        let mut ready = self.ready.lock().await;
        loop {
            if let Some(d) = ready.pop_front() {
                return Ok(Some(d));
            }
            // During an outage, wait out its pause before taking more work: the
            // deliveries would only be postponed again. Checked every second, so work
            // resumes as soon as a segment in flight gets through.
            loop {
                let pause = self.outages.pause();
                if pause.is_zero() {
                    break;
                }
                tracing::debug!(
                    seconds = pause.as_secs_f64(),
                    "outage: pausing before the next deliveries"
                );
                tokio::time::sleep(pause.min(Duration::from_secs(1))).await;
            }
            let group = self.inner.next_deliveries(CHECK_GROUP).await?;
            if group.is_empty() {
                return Ok(None);
            }
            let mut parsed = Vec::with_capacity(group.len());
            for d in group {
                match Uuid::parse_str(&d.job_id) {
                    Ok(job) => parsed.push((job, d)),
                    Err(_) => {
                        let decision = Decision::DeadLetter {
                            reason: format!("job id '{}' is not a UUID", d.job_id),
                        };
                        self.inner.settle(d.ticket, decision).await?;
                    }
                }
            }
            let keys: Vec<(Uuid, u32)> = parsed
                .iter()
                .map(|(job, d)| (*job, d.segment.index))
                .collect();
            let checks = match narrator_db::check_segments(&self.pool, &keys).await {
                // One check per delivery, in their order (see check_segments).
                Ok(c) => c,
                Err(e) => {
                    // The database is away: the messages come back later, not charged
                    // an attempt when the cause is an outage.
                    tracing::debug!(error = %e, deliveries = parsed.len(), "cannot check deliveries; retrying them later");
                    let failure = Failure {
                        kind: e.kind(),
                        class: e.retry_class(),
                        reason: e.to_string(),
                    };
                    for (_, d) in parsed {
                        let decision = failure_decision(&failure, d.attempt);
                        self.inner.settle(d.ticket, decision).await?;
                    }
                    if failure.class == RetryClass::Infrastructure {
                        self.outages.failed(failure.kind, &failure.reason);
                    } else {
                        tokio::time::sleep(crate::jittered(Duration::from_millis(500))).await;
                    }
                    continue;
                }
            };
            for ((job, d), check) in parsed.into_iter().zip(checks) {
                let index = d.segment.index;
                let ticket = GuardTicket {
                    job,
                    index,
                    attempt: d.attempt,
                    inner: d.ticket,
                };
                match check {
                    SegmentCheck::Work if d.attempt > MAX_ATTEMPTS => {
                        // The broker's delivery limit dead-letters the next return on its
                        // own, without a reason or a record: give up here, with both.
                        let failure = Failure {
                            kind: "delivery_limit",
                            class: RetryClass::Permanent,
                            reason: format!(
                                "delivered {} times without being finished (workers stopped or died holding it)",
                                d.attempt
                            ),
                        };
                        self.fail(ticket, &failure).await?;
                    }
                    SegmentCheck::Work => ready.push_back(Delivery {
                        job_id: d.job_id,
                        segment: d.segment,
                        attempt: d.attempt,
                        enqueued_at_ms: d.enqueued_at_ms,
                        lane: d.lane,
                        ticket,
                    }),
                    other => {
                        tracing::debug!(%job, index, ?other, worker = %self.worker, "skipping a delivery that needs no work");
                        self.inner.settle(ticket.inner, Decision::Ack).await?;
                    }
                }
            }
        }
    }
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

    async fn abandoned_jobs(&self, jobs: Vec<String>) -> Result<Vec<String>, SeamError> {
        let ids: Vec<Uuid> = jobs
            .iter()
            .filter_map(|j| Uuid::parse_str(j).ok())
            .collect();
        let gone = narrator_db::abandoned_jobs(&self.pool, &ids)
            .await
            .map_err(|e| SeamError::new(e.kind(), e.retry_class(), e.to_string(), e))?;
        Ok(gone.iter().map(Uuid::to_string).collect())
    }

    async fn fail(&self, ticket: GuardTicket, failure: &Failure) -> Result<(), SeamError> {
        let decision = failure_decision(failure, ticket.attempt);
        if let Decision::DeadLetter { reason: why } = &decision {
            let (job, index) = (ticket.job, ticket.index);
            let recorded = async {
                narrator_db::fail_segment(
                    &self.pool,
                    job,
                    index,
                    ticket.attempt,
                    failure.kind,
                    why,
                )
                .await?;
                narrator_db::fail_settled_jobs(&self.pool).await
            };
            if let Err(e) = recorded.await {
                // The stuck-job watchdog publishes it again once the job has made no
                // progress for a lease; the dead letter keeps the reason meanwhile.
                tracing::warn!(%job, index, error = %e, "cannot record a dead-lettered segment");
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
