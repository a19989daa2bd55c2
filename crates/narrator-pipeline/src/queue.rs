//! The embedded segment queue: an in-process, at-least-once queue with the same contract
//! as the RabbitMQ one (deliver, ack, requeue), so the worker loop is the same code.
//!
//! State is a `VecDeque` of waiting segments plus a count of unacknowledged deliveries,
//! under a mutex; waiters sleep on a `Notify`. `next` returns `None` only when the queue
//! is closed, empty, and nothing is in flight (a requeue could still bring work back).

use std::collections::VecDeque;
use std::sync::Mutex;

use narrator_core::{Delivery, SeamError, Segment, SegmentQueue};
use tokio::sync::Notify;

#[derive(Debug)]
struct Item {
    job_id: String,
    segment: Segment,
    attempt: u32,
}

#[derive(Debug, Default)]
struct State {
    waiting: VecDeque<Item>,
    in_flight: usize,
    closed: bool,
}

/// Ticket of the in-process queue: the delivered item, kept for a requeue.
#[derive(Debug)]
pub struct Ticket(Item);

/// In-process at-least-once queue.
#[derive(Debug, Default)]
pub struct InProcessQueue {
    state: Mutex<State>,
    wake: Notify,
}

fn poisoned() -> SeamError {
    SeamError::msg(
        "queue",
        narrator_core::RetryClass::Permanent,
        "the in-process queue's lock was poisoned by a panic",
    )
}

impl InProcessQueue {
    /// An empty, open queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds segments of `job_id`.
    pub fn publish(
        &self,
        job_id: &str,
        segments: impl IntoIterator<Item = Segment>,
    ) -> Result<(), SeamError> {
        let mut s = self.state.lock().map_err(|_| poisoned())?;
        if s.closed {
            return Err(SeamError::msg(
                "queue",
                narrator_core::RetryClass::Permanent,
                "publish after close",
            ));
        }
        s.waiting.extend(segments.into_iter().map(|segment| Item {
            job_id: job_id.to_string(),
            segment,
            attempt: 1,
        }));
        drop(s);
        self.wake.notify_waiters();
        Ok(())
    }

    /// No more publishes: `next` returns `None` once everything is acknowledged.
    pub fn close(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.closed = true;
        }
        self.wake.notify_waiters();
    }

    /// Segments waiting plus in flight.
    pub fn len(&self) -> usize {
        self.state
            .lock()
            .map(|s| s.waiting.len() + s.in_flight)
            .unwrap_or(0)
    }

    /// Whether nothing is waiting or in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl SegmentQueue for InProcessQueue {
    type Ticket = Ticket;

    async fn next(&self) -> Result<Option<Delivery<Ticket>>, SeamError> {
        loop {
            let notified = self.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.state.lock().map_err(|_| poisoned())?;
                if let Some(item) = s.waiting.pop_front() {
                    s.in_flight += 1;
                    return Ok(Some(Delivery {
                        job_id: item.job_id.clone(),
                        segment: item.segment.clone(),
                        // The embedded run's synthesizer was loaded with its job's scales.
                        scales: None,
                        attempt: item.attempt,
                        enqueued_at_ms: None,
                        lane: 0,
                        alone: false,
                        trace: None,
                        ticket: Ticket(item),
                    }));
                }
                if s.closed && s.in_flight == 0 {
                    return Ok(None);
                }
            }
            notified.await;
        }
    }

    async fn ack(&self, _ticket: Ticket) -> Result<(), SeamError> {
        let mut s = self.state.lock().map_err(|_| poisoned())?;
        s.in_flight = s.in_flight.saturating_sub(1);
        drop(s);
        self.wake.notify_waiters();
        Ok(())
    }

    async fn requeue(&self, ticket: Ticket) -> Result<(), SeamError> {
        let mut item = ticket.0;
        item.attempt += 1;
        let mut s = self.state.lock().map_err(|_| poisoned())?;
        s.in_flight = s.in_flight.saturating_sub(1);
        s.waiting.push_front(item);
        drop(s);
        self.wake.notify_waiters();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use narrator_core::PauseAfter;
    use std::sync::Arc;

    fn seg(index: u32) -> Segment {
        Segment {
            index,
            chapter: 0,
            text: format!("s{index}"),
            pause_after: PauseAfter::Sentence,
            speaker: 0,
            speed: None,
            timed: false,
        }
    }

    #[tokio::test]
    async fn delivers_in_order_and_ends_after_close_and_acks() {
        let q = InProcessQueue::new();
        q.publish("j", (0..3).map(seg)).expect("publish");
        q.close();
        let mut got = Vec::new();
        while let Some(d) = q.next().await.expect("next") {
            got.push(d.segment.index);
            q.ack(d.ticket).await.expect("ack");
        }
        assert_eq!(got, [0, 1, 2]);
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn a_requeued_segment_comes_back_with_the_next_attempt() {
        let q = InProcessQueue::new();
        q.publish("j", [seg(7)]).expect("publish");
        q.close();
        let d = q.next().await.expect("next").expect("some");
        assert_eq!(d.attempt, 1);
        q.requeue(d.ticket).await.expect("requeue");
        let d = q.next().await.expect("next").expect("redelivered");
        assert_eq!((d.segment.index, d.attempt), (7, 2));
        q.ack(d.ticket).await.expect("ack");
        assert!(q.next().await.expect("next").is_none());
    }

    #[tokio::test]
    async fn a_waiting_consumer_is_woken_by_a_requeue_after_close() {
        let q = Arc::new(InProcessQueue::new());
        q.publish("j", [seg(1)]).expect("publish");
        q.close();
        let d = q.next().await.expect("next").expect("some");
        // Closed and empty, but one in flight: a second consumer must wait, not end.
        let q2 = q.clone();
        let waiter =
            tokio::spawn(async move { q2.next().await.expect("next").map(|d| d.segment.index) });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        q.requeue(d.ticket).await.expect("requeue");
        assert_eq!(waiter.await.expect("join"), Some(1));
    }

    #[tokio::test]
    async fn publishing_after_close_is_refused() {
        let q = InProcessQueue::new();
        q.close();
        assert!(q.publish("j", [seg(0)]).is_err());
    }
}
