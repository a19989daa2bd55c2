//! Drives a job's pending segments through the synthesizer into the stores.
//!
//! Segments come from a [`SegmentQueue`] (here the in-process one; RabbitMQ in the
//! distributed mode). Tasks: one task pulls and phonemizes ahead on blocking threads
//! (bounded channel, so memory stays flat);
//! the batching loop takes what is ready, up to `max_batch` segments, sorted by length;
//! up to `in_flight` batches run at once (one more than the engine has sessions, so the
//! next batch is ready when a session frees up); each batch's audio is stored, then its
//! figures recorded, in that order, so a recorded segment always has its audio.

use std::collections::BTreeSet;
use std::sync::Arc;

use narrator_core::{
    AudioStore, Delivery, JobPlan, Segment, SegmentQueue, SegmentRecord, StateStore,
};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;

use crate::PipelineError;
use crate::queue::InProcessQueue;
use crate::synth::{Prepared, Synthesizer};

/// What the runner reports as it goes (the CLI draws its progress bar from these).
#[derive(Debug, Clone)]
pub enum Event {
    /// Synthesis starts: how many segments exist and how many were already done.
    Started {
        /// Segments in the job.
        total: usize,
        /// Already finished (resumed).
        done: usize,
        /// Audio seconds already made.
        done_audio_seconds: f64,
    },
    /// A segment is stored and recorded.
    SegmentDone {
        /// Its figures.
        record: SegmentRecord,
    },
    /// Something the user should know (e.g. unknown phonemes skipped).
    Warning(String),
}

/// How the runner batches.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Name recorded with every segment.
    pub worker: String,
    /// Utterances per engine run; a batch of segments fills up to this many.
    pub max_batch: usize,
    /// Batches in flight at once.
    pub in_flight: usize,
}

/// Segments of `plan` not yet finished according to both stores.
pub async fn pending_segments<A: AudioStore, S: StateStore>(
    plan: &JobPlan,
    store: &A,
    state: &S,
) -> Result<(Vec<Segment>, Vec<SegmentRecord>), PipelineError> {
    let mut finished = Vec::new();
    let mut done = BTreeSet::new();
    for r in state.finished_segments(&plan.job_id).await? {
        if (r.index as usize) < plan.segments.len()
            && store.has_segment(&plan.job_id, r.index).await?
        {
            done.insert(r.index);
            finished.push(r);
        }
    }
    let pending = plan
        .segments
        .iter()
        .filter(|s| !done.contains(&s.index))
        .cloned()
        .collect();
    Ok((pending, finished))
}

/// What a worker runs on: the synthesizer, the two stores, and where events go.
pub struct Stages<A, S> {
    /// Phonemizer + engine.
    pub synth: Arc<Synthesizer>,
    /// Where segment audio goes.
    pub store: Arc<A>,
    /// Where figures go.
    pub state: Arc<S>,
    /// Progress events.
    pub on_event: Arc<dyn Fn(Event) + Send + Sync>,
}

impl<A, S> Clone for Stages<A, S> {
    fn clone(&self) -> Self {
        Self {
            synth: self.synth.clone(),
            store: self.store.clone(),
            state: self.state.clone(),
            on_event: self.on_event.clone(),
        }
    }
}

/// Synthesizes every pending segment of `plan` through an in-process queue; returns all
/// finished records, in order.
pub async fn synthesize_job<A, S>(
    plan: &JobPlan,
    stages: &Stages<A, S>,
    opts: &RunOptions,
) -> Result<Vec<SegmentRecord>, PipelineError>
where
    A: AudioStore + 'static,
    S: StateStore + 'static,
{
    let on_event = &stages.on_event;
    let (pending, mut finished) = pending_segments(plan, &*stages.store, &*stages.state).await?;
    on_event(Event::Started {
        total: plan.segments.len(),
        done: finished.len(),
        done_audio_seconds: finished.iter().map(|r| r.audio_seconds).sum(),
    });
    let queue = Arc::new(InProcessQueue::new());
    queue.publish(&plan.job_id, pending)?;
    queue.close();
    finished.extend(work(queue, stages, opts).await?);
    finished.sort_by_key(|r| r.index);
    finished.dedup_by_key(|r| r.index);
    if finished.len() != plan.segments.len() {
        return Err(PipelineError::Incomplete {
            done: finished.len(),
            total: plan.segments.len(),
        });
    }
    Ok(finished)
}

type Ready<T> = (Prepared, Delivery<T>);

/// The worker loop: pulls segments from `queue` until it ends, phonemizing ahead on
/// blocking threads, batching what is ready, and acknowledging each segment only after
/// its audio is stored and its figures recorded. Returns the records it made.
pub async fn work<Q, A, S>(
    queue: Arc<Q>,
    stages: &Stages<A, S>,
    opts: &RunOptions,
) -> Result<Vec<SegmentRecord>, PipelineError>
where
    Q: SegmentQueue + 'static,
    A: AudioStore + 'static,
    S: StateStore + 'static,
{
    let (synth, on_event) = (&stages.synth, &stages.on_event);
    let (tx, mut rx) = mpsc::channel::<Result<Ready<Q::Ticket>, PipelineError>>(64);
    let (pq, ps) = (queue.clone(), synth.clone());
    let prep = tokio::spawn(async move {
        loop {
            let item = match pq.next().await {
                Ok(Some(d)) => {
                    let (s, seg) = (ps.clone(), d.segment.clone());
                    match tokio::task::spawn_blocking(move || s.prepare(seg)).await {
                        Ok(Ok(p)) => Ok((p, d)),
                        Ok(Err(e)) => Err(e),
                        Err(e) => Err(PipelineError::Task(e.to_string())),
                    }
                }
                Ok(None) => break,
                Err(e) => Err(e.into()),
            };
            let stop = item.is_err();
            if tx.send(item).await.is_err() || stop {
                break;
            }
        }
    });

    let slots = Arc::new(Semaphore::new(opts.in_flight.max(1)));
    let mut tasks: JoinSet<Result<Vec<SegmentRecord>, PipelineError>> = JoinSet::new();
    let max_batch = opts.max_batch.max(1);
    let mut finished = Vec::new();
    let mut failure = None;
    'outer: loop {
        // Wait for a free slot first, then take whatever is ready: under load the batch
        // fills with everything that arrived while the engine was busy.
        let permit = slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| PipelineError::Internal("semaphore closed"))?;
        let Some(first) = rx.recv().await else { break };
        let mut batch: Vec<Ready<Q::Ticket>> = Vec::with_capacity(max_batch);
        let mut next = Some(first);
        while let Some(item) = next.take() {
            match item {
                Ok(r) => batch.push(r),
                Err(e) => {
                    failure = Some(e);
                    break 'outer;
                }
            }
            let utterances: usize = batch.iter().map(|(p, _)| p.utterances.len()).sum();
            if utterances < max_batch {
                next = rx.try_recv().ok();
            }
        }
        batch.sort_by_key(|(p, _)| p.max_len());
        for (p, _) in &batch {
            if !p.unknown.is_empty() {
                on_event(Event::Warning(format!(
                    "segment {}: skipped phonemes the voice has no id for: {}",
                    p.segment.index,
                    p.unknown.join(" ")
                )));
            }
        }
        let Stages {
            synth,
            store,
            state,
            on_event,
        } = stages.clone();
        let queue = queue.clone();
        let worker = opts.worker.clone();
        tasks.spawn(async move {
            let _permit = permit;
            let (prepared, deliveries): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
            let done = match synth.synthesize(prepared, max_batch).await {
                Ok(d) => d,
                Err(e) => {
                    for d in deliveries {
                        let _ = queue.requeue(d.ticket).await;
                    }
                    return Err(e);
                }
            };
            let mut records = Vec::with_capacity(done.len());
            for (s, d) in done.into_iter().zip(deliveries) {
                let index = s.prepared.segment.index;
                store.put_segment(&d.job_id, index, &s.audio).await?;
                let record = SegmentRecord {
                    index,
                    samples: s.audio.samples.len() as u64,
                    sample_rate: s.audio.sample_rate,
                    audio_seconds: s.audio.seconds(),
                    inference_seconds: s.inference_seconds,
                    queue_wait_seconds: s.queue_wait_seconds,
                    batch_size: s.batch_size,
                    attempts: d.attempt,
                    worker: worker.clone(),
                    phoneme_ids: s.prepared.total_ids() as u32,
                };
                state.record_segment(&d.job_id, &record).await?;
                queue.ack(d.ticket).await?;
                on_event(Event::SegmentDone {
                    record: record.clone(),
                });
                records.push(record);
            }
            Ok(records)
        });
        // Reap finished batches as we go so an error stops the job early.
        while let Some(done) = tasks.try_join_next() {
            match done {
                Ok(Ok(r)) => finished.extend(r),
                Ok(Err(e)) => {
                    failure = Some(e);
                    break 'outer;
                }
                Err(e) => {
                    failure = Some(PipelineError::Task(e.to_string()));
                    break 'outer;
                }
            }
        }
    }
    drop(rx);
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(Ok(r)) => finished.extend(r),
            Ok(Err(e)) => failure = failure.or(Some(e)),
            Err(e) => failure = failure.or(Some(PipelineError::Task(e.to_string()))),
        }
    }
    prep.abort();
    match failure {
        Some(e) => Err(e),
        None => Ok(finished),
    }
}
