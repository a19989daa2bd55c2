//! Drives a job's pending segments through the synthesizer into the stores.
//!
//! Segments come from a [`SegmentQueue`] (here the in-process one; RabbitMQ in the
//! distributed mode). Tasks: one task pulls and phonemizes ahead on blocking threads
//! (bounded channel, so memory stays flat);
//! the batching loop feeds a [`Batcher`] (length buckets, the synthesizer's token budget,
//! `max_wait`) and takes a batch from it whenever an engine slot is free, after dropping
//! segments of jobs the queue reports abandoned;
//! up to `in_flight` batches are in synthesis at once (one more than the engine has
//! sessions, so the next batch is ready when a session frees up); a synthesized batch
//! frees its slot, then its audio is stored and its figures recorded, in that order, so
//! a recorded segment always has its audio.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use futures_util::{StreamExt, stream};
use narrator_core::{
    AudioStore, Delivery, JobPlan, Segment, SegmentQueue, SegmentRecord, StateStore,
};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tracing::{Instrument, info_span};

use crate::PipelineError;
use crate::batcher::{LaneBatcher, MAX_HOLD};
use crate::flush::{Storer, ToStore};
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
    /// Every segment is made: the output files are being written
    /// ([`crate::embedded::make_book`] says so; the runner does not).
    Assembling,
}

/// How the runner batches.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Name recorded with every segment.
    pub worker: String,
    /// Batches in synthesis at once (storing them does not count).
    pub in_flight: usize,
    /// `false` (embedded): the first failure requeues its batch and ends [`work`] with
    /// the error. `true` (distributed): a failure is handed to [`SegmentQueue::fail`]
    /// for the segments it concerns and work goes on; a failed batch of several segments
    /// is run again one segment at a time, so one bad segment never takes the others
    /// with it.
    pub isolate_failures: bool,
    /// When this turns `true`, no new batch starts: the batches in flight finish (stored,
    /// recorded, acknowledged) and [`work`] returns; deliveries not started stay
    /// unacknowledged for the queue to hand out again.
    pub stop: Option<tokio::sync::watch::Receiver<bool>>,
    /// A batch whose oldest segment was prepared longer ago than this asks the queue for
    /// abandoned jobs before it reaches the engine ([`SegmentQueue::abandoned_jobs`]);
    /// fresher batches were checked when delivered.
    pub recheck_after: std::time::Duration,
    /// Most segments of one job stored together (one pack object, one database
    /// statement); 1 stores and records each segment on its own.
    pub pack_max: usize,
    /// The voice, as a metric label (empty: none).
    pub voice: String,
    /// A segment waiting for the device this long goes ahead of younger ones of higher
    /// priority lanes ([`LaneBatcher::with_max_hold`]; default [`MAX_HOLD`]): a flood of
    /// high-priority work delays the normal lane by at most this, well within the
    /// broker's consumer timeout.
    pub max_hold: std::time::Duration,
}

/// Default for [`RunOptions::pack_max`].
pub const PACK_MAX: usize = 64;

impl RunOptions {
    /// Embedded defaults: stop at the first failure, no stop signal.
    pub fn embedded(worker: String, in_flight: usize) -> Self {
        Self {
            worker,
            in_flight,
            isolate_failures: false,
            stop: None,
            recheck_after: std::time::Duration::ZERO,
            pack_max: PACK_MAX,
            voice: String::new(),
            max_hold: MAX_HOLD,
        }
    }
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
        // A packed segment's record is written only after its pack is stored.
        if (r.index as usize) < plan.segments.len()
            && (r.packed.is_some() || store.has_segment(&plan.job_id, r.index).await?)
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

/// Phonemizing tasks at once.
const PREP_AHEAD: usize = 4;
/// Most deliveries phonemized by one task (those that arrived together).
const PREP_CHUNK: usize = 16;
/// Priority lanes the batcher keeps apart (a delivery's `lane`: 0 normal, 1 high).
const LANES: u8 = 2;

type Ready<T> = (Prepared, Delivery<T>);

/// A prepared item that could not be used.
enum Failed<T> {
    /// Stops the worker loop.
    Fatal(PipelineError),
    /// Concerns this delivery only (isolating mode).
    Segment(Box<Delivery<T>>, Box<PipelineError>),
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// [`Synthesizer::synthesize`] with a panic turned into [`PipelineError::Panicked`]: a
/// segment that makes the engine's glue panic fails like any other (alone, once the
/// batch is run again one segment at a time), and the worker goes on.
async fn synthesize_caught(
    synth: &Synthesizer,
    batch: Vec<Prepared>,
) -> Result<Vec<crate::synth::Synthesized>, PipelineError> {
    use futures_util::FutureExt;
    match std::panic::AssertUnwindSafe(synth.synthesize(batch))
        .catch_unwind()
        .await
    {
        Ok(r) => r,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            Err(PipelineError::Panicked(what))
        }
    }
}

/// The span of one delivered segment, in its job's trace (a consumer span, as the
/// OpenTelemetry messaging conventions say): open from delivery to acknowledgement. The
/// time it waited in the queue is recorded as a child span.
fn segment_span<T>(d: &Delivery<T>, voice: &str) -> tracing::Span {
    let span = info_span!(parent: None, "segment", otel.name = "process segment", otel.kind = "consumer",
        otel.status_code = tracing::field::Empty,
        messaging.system = "rabbitmq", messaging.operation.type = "process",
        messaging.destination.name = %format!("narrator.segments.{voice}"),
        narrator.job_id = %d.job_id, narrator.segment = d.segment.index,
        narrator.chapter = d.segment.chapter, narrator.attempt = d.attempt);
    if let Some(trace) = &d.trace {
        narrator_telemetry::propagate::set_parent(&span, trace);
        if let Some(at) = d.enqueued_at_ms {
            let enqueued = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(at);
            narrator_telemetry::propagate::record_interval(
                &span,
                "queue wait",
                (enqueued, SystemTime::now()),
            );
        }
    }
    span
}

/// Counts a segment done (by voice and model family): its audio, its queue wait and its
/// latency (enqueue to ack).
fn count_done(
    (voice, family): (&str, narrator_engine::FamilyKind),
    record: &SegmentRecord,
    enqueued_at_ms: Option<u64>,
) {
    use narrator_telemetry::metrics as m;
    // The model family too (the loaded voice's), so dashboards can split a mixed fleet's
    // work by family.
    let family = family.as_str();
    let voice = voice.to_string();
    metrics::counter!(m::SEGMENTS_DONE, "voice" => voice.clone(), "family" => family).increment(1);
    metrics::histogram!(m::SEGMENT_AUDIO_SECONDS, "voice" => voice.clone(), "family" => family)
        .record(record.audio_seconds);
    metrics::histogram!(m::QUEUE_WAIT_SECONDS, "voice" => voice.clone())
        .record(record.queue_wait_seconds);
    if let Some(at) = enqueued_at_ms {
        let latency = unix_ms().saturating_sub(at) as f64 / 1000.0;
        metrics::histogram!(m::SEGMENT_LATENCY_SECONDS, "voice" => voice).record(latency);
    }
}

/// Synthesizes one batch, stores and records each segment, then acknowledges it.
async fn run_batch<Q, A, S>(
    batch: Vec<Ready<Q::Ticket>>,
    engine_slot: tokio::sync::OwnedSemaphorePermit,
    stages: &Stages<A, S>,
    queue: &Q,
    storer: &Storer,
    (isolate, voice): (bool, &str),
) -> Result<Vec<SegmentRecord>, PipelineError>
where
    Q: SegmentQueue,
    A: AudioStore,
    S: StateStore,
{
    let started_ms = unix_ms();
    let (prepared, deliveries): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
    let batch_span = batch_span(&prepared);
    let segment_spans: Vec<tracing::Span> = prepared.iter().map(|p| p.span.clone()).collect();
    let keys: Vec<(String, u32)> = deliveries
        .iter()
        .map(|d| (d.job_id.clone(), d.segment.index))
        .collect();
    if let Err(e) = queue.before_engine(&keys).await {
        tracing::debug!(error = %e, "cannot mark the batch as in the engine; going on");
    }
    let done = match infer(&stages.synth, prepared, deliveries, isolate, &batch_span).await {
        Ok(done) => done,
        Err((e, deliveries)) => {
            for d in deliveries {
                let _ = queue.requeue(d.ticket).await;
            }
            return Err(e);
        }
    };
    if let Err(e) = queue.after_engine(&keys).await {
        tracing::debug!(error = %e, "cannot clear the batch's engine marks; going on");
    }
    // The engine is free for the next batch while this one is stored (the number of
    // batches being stored is bounded by the queue's prefetch).
    drop(engine_slot);
    settle_batch(
        done,
        (stages, queue, storer),
        (isolate, voice),
        (started_ms, &batch_span, segment_spans),
    )
    .await
}

/// Each segment's audio or error, with its delivery, in the batch's order.
type Synthesis<T> = Vec<(
    Result<crate::synth::Synthesized, PipelineError>,
    Delivery<T>,
)>;

/// A batch's span: a root (a batch holds segments of several jobs) that links to each
/// segment's, each of which records when its batch formed.
fn batch_span(prepared: &[Prepared]) -> tracing::Span {
    let span = info_span!(parent: None, "batch", otel.name = "synthesize batch",
        narrator.segments = prepared.len(),
        narrator.utterances = prepared.iter().map(|p| p.utterances.len()).sum::<usize>());
    let now = (Instant::now(), SystemTime::now());
    for p in prepared {
        narrator_telemetry::propagate::link(&span, &p.span);
        let formed_from = now.1 - now.0.saturating_duration_since(p.queued_at);
        narrator_telemetry::propagate::record_interval(
            &p.span,
            "batch formation",
            (formed_from, now.1),
        );
    }
    span
}

/// One batch through the engine: each segment's audio or error, with its delivery. A
/// failed batch in isolating mode runs again one segment at a time to find the one(s) at
/// fault; otherwise its error comes back with the deliveries (to be requeued).
async fn infer<T>(
    synth: &Synthesizer,
    prepared: Vec<Prepared>,
    deliveries: Vec<Delivery<T>>,
    isolate: bool,
    batch_span: &tracing::Span,
) -> Result<Synthesis<T>, (PipelineError, Vec<Delivery<T>>)> {
    let backup = (isolate && prepared.len() > 1).then(|| prepared.clone());
    let done = match synthesize_caught(synth, prepared)
        .instrument(batch_span.clone())
        .await
    {
        Ok(d) => d
            .into_iter()
            .zip(deliveries)
            .map(|(s, d)| (Ok(s), d))
            .collect(),
        Err(e) if !isolate => return Err((e, deliveries)),
        Err(e) => match backup {
            None => {
                // At most one delivery (a larger batch keeps a backup).
                let mut err = Some(e);
                deliveries
                    .into_iter()
                    .map(|d| {
                        let e = err
                            .take()
                            .unwrap_or(PipelineError::Internal("batch failed"));
                        (Err(e), d)
                    })
                    .collect()
            }
            Some(prepared) => {
                // Find the segment(s) at fault: each alone.
                let mut each = Vec::with_capacity(deliveries.len());
                for (p, d) in prepared.into_iter().zip(deliveries) {
                    let r = synthesize_caught(synth, vec![p])
                        .instrument(info_span!(parent: batch_span, "isolate"))
                        .await;
                    each.push((r.map(|mut v| v.remove(0)), d));
                }
                each
            }
        },
    };
    Ok(done)
}

/// The store stage writes the batch's segments with whatever else is waiting (one pack
/// and one database statement per job), then each delivery is settled in order: a
/// stored segment acknowledged and counted, a failed one failed (isolating mode) or
/// requeued with the error returned.
async fn settle_batch<Q, A, S>(
    done: Synthesis<Q::Ticket>,
    (stages, queue, storer): (&Stages<A, S>, &Q, &Storer),
    (isolate, voice): (bool, &str),
    (started_ms, batch_span, segment_spans): (u64, &tracing::Span, Vec<tracing::Span>),
) -> Result<Vec<SegmentRecord>, PipelineError>
where
    Q: SegmentQueue,
    A: AudioStore,
    S: StateStore,
{
    let mut to_store = Vec::new();
    let mut settle = Vec::with_capacity(done.len());
    for (result, d) in done {
        match result {
            Ok(synthesized) => {
                to_store.push(ToStore {
                    job: d.job_id.clone(),
                    synthesized,
                    attempt: d.attempt,
                    enqueued_at_ms: d.enqueued_at_ms,
                    started_ms,
                });
                settle.push((None, d));
            }
            Err(e) => settle.push((Some(e), d)),
        }
    }
    let mut stored = storer
        .store(to_store)
        .instrument(info_span!(parent: batch_span, "store and record"))
        .await
        .into_iter();
    let mut records = Vec::with_capacity(settle.len());
    let acks = info_span!(parent: batch_span, "ack", otel.kind = "consumer",
        messaging.system = "rabbitmq", messaging.operation.type = "settle");
    for ((failed, d), segment) in settle.into_iter().zip(segment_spans) {
        let outcome = match failed {
            Some(e) => Err(e),
            None => stored
                .next()
                .unwrap_or(Err(PipelineError::Internal("segment not written"))),
        };
        match outcome {
            Ok(record) => {
                let enqueued_at_ms = d.enqueued_at_ms;
                queue.ack(d.ticket).instrument(acks.clone()).await?;
                count_done((voice, stages.synth.family()), &record, enqueued_at_ms);
                (stages.on_event)(Event::SegmentDone {
                    record: record.clone(),
                });
                records.push(record);
            }
            Err(e) if isolate => {
                segment.record("otel.status_code", "ERROR");
                segment.in_scope(|| tracing::warn!(job = %d.job_id, segment = d.segment.index, attempt = d.attempt, error = %e, "segment failed"));
                queue
                    .fail(d.ticket, &e.failure())
                    .instrument(acks.clone())
                    .await?;
            }
            Err(e) => {
                let _ = queue.requeue(d.ticket).await;
                return Err(e);
            }
        }
    }
    Ok(records)
}

/// Takes one prepared item from the phonemizing task: into the batcher, or (a segment
/// that could not be prepared, isolating mode) to the queue's failure path.
async fn absorb<Q: SegmentQueue>(
    item: Result<Ready<Q::Ticket>, Failed<Q::Ticket>>,
    batcher: &mut LaneBatcher<Ready<Q::Ticket>>,
    queue: &Q,
) -> Result<(), PipelineError> {
    match item {
        Ok(r) => {
            let (len, n) = (r.0.max_len(), r.0.utterances.len());
            if r.1.alone {
                batcher.append_alone(r);
            } else {
                let lane = r.1.lane;
                batcher.append(lane, r, len, n, Instant::now());
            }
            Ok(())
        }
        Err(Failed::Fatal(e)) => Err(e),
        Err(Failed::Segment(d, e)) => Ok(queue.fail(d.ticket, &e.failure()).await?),
    }
}

/// What the phonemizing task hands the loop: a prepared delivery or why it is not one.
type Item<T> = Result<Ready<T>, Failed<T>>;

/// The worker loop: pulls segments from `queue` until it ends, phonemizing ahead on
/// blocking threads, batching what is ready, and acknowledging each segment only after
/// its audio is stored and its figures recorded. Returns the records it made.
///
/// Its steps: [`spawn_preparation`] phonemizes ahead; [`Intake::next_batch`] waits for
/// a free engine slot and the batcher's next batch; [`Intake::drop_abandoned`] leaves
/// out segments of jobs that ended while they waited; each batch then runs in its own
/// task ([`run_batch`]), reaped as the loop goes.
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
    let (tx, rx) = mpsc::channel::<Item<Q::Ticket>>(64);
    let prep = spawn_preparation(
        queue.clone(),
        stages.synth.clone(),
        (opts.voice.clone(), opts.isolate_failures),
        tx,
    );
    let slots = Arc::new(Semaphore::new(opts.in_flight.max(1)));
    let storer = Storer::spawn(stages.clone(), opts.worker.clone(), opts.pack_max);
    let mut tasks: JoinSet<Result<Vec<SegmentRecord>, PipelineError>> = JoinSet::new();
    let mut intake = Intake {
        rx,
        input_open: true,
        batcher: LaneBatcher::new(LANES).with_max_hold(opts.max_hold),
        stop: opts.stop.clone(),
    };
    let mut finished = Vec::new();
    let failure = loop {
        let (mut batch, mut permit) = match intake.next_batch(&*queue, &stages.synth, &slots).await
        {
            Ok(Some(next)) => next,
            Ok(None) => break None,
            Err(e) => break Some(e),
        };
        if let Err(e) = intake.drop_abandoned(&mut batch, &*queue, opts).await {
            break Some(e);
        }
        if batch.is_empty() {
            continue;
        }
        if batch.iter().any(|(_, d)| d.alone) && opts.in_flight > 1 {
            // A segment that was in the engine when a process died runs with nothing else
            // in flight: should it crash the process again, no other segment is charged.
            let rest = u32::try_from(opts.in_flight - 1).unwrap_or(u32::MAX);
            match slots.clone().acquire_many_owned(rest).await {
                Ok(others) => permit.merge(others),
                Err(_) => break Some(PipelineError::Internal("semaphore closed")),
            }
        }
        batch.sort_by_key(|(p, _)| p.max_len());
        warn_unknown_phonemes(&batch, &*stages.on_event);
        let (stages, queue, storer) = (stages.clone(), queue.clone(), storer.clone());
        let (isolate, voice) = (opts.isolate_failures, opts.voice.clone());
        tasks.spawn(async move {
            run_batch(batch, permit, &stages, &*queue, &storer, (isolate, &voice)).await
        });
        // Reap finished batches as we go so an error stops the job early.
        if let Err(e) = reap(&mut tasks, &mut finished) {
            break Some(e);
        }
    };
    drop(intake);
    let mut failure = failure;
    while let Some(done) = tasks.join_next().await {
        if let Err(e) = batch_result(done, &mut finished) {
            failure = failure.or(Some(e));
        }
    }
    prep.abort();
    match failure {
        Some(e) => Err(e),
        None => Ok(finished),
    }
}

/// The phonemizing task: pulls deliveries in order; what has arrived together (up to
/// PREP_CHUNK) is phonemized in one blocking task (espeak-ng runs one text at a time
/// anyway, so this saves a thread hop per segment), and up to PREP_AHEAD such tasks
/// overlap the queue's round trips. Stops after the first fatal item.
fn spawn_preparation<Q: SegmentQueue + 'static>(
    queue: Arc<Q>,
    synth: Arc<Synthesizer>,
    (voice, isolate): (String, bool),
    tx: mpsc::Sender<Item<Q::Ticket>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let deliveries = stream::unfold(queue, |q| async move {
            match q.next().await {
                Ok(Some(d)) => Some((Ok(d), q)),
                Ok(None) => None,
                Err(e) => Some((Err(e), q)),
            }
        });
        let prepared = deliveries
            .ready_chunks(PREP_CHUNK)
            .map(move |chunk| {
                let (synth, voice) = (synth.clone(), voice.clone());
                async move {
                    let n = chunk.len();
                    let prepare_all = move || prepare_chunk(chunk, &synth, &voice, isolate);
                    match tokio::task::spawn_blocking(prepare_all).await {
                        Ok(items) => items,
                        // The chunk's deliveries went down with the task: unacknowledged,
                        // the queue hands them out again.
                        Err(e) => {
                            tracing::error!(deliveries = n, error = %e, "phonemizing task failed");
                            vec![Err(Failed::Fatal(PipelineError::Task(e.to_string())))]
                        }
                    }
                }
            })
            .buffered(PREP_AHEAD)
            .flat_map(stream::iter);
        let mut prepared = std::pin::pin!(prepared);
        while let Some(item) = prepared.next().await {
            let stop = matches!(item, Err(Failed::Fatal(_)));
            if tx.send(item).await.is_err() || stop {
                break;
            }
        }
    })
}

/// Phonemizes a chunk of deliveries (on a blocking thread), each at the scales its job
/// recorded; a panic while phonemizing fails that segment only.
fn prepare_chunk<T, E: Into<PipelineError>>(
    chunk: Vec<Result<Delivery<T>, E>>,
    synth: &Synthesizer,
    voice: &str,
    isolate: bool,
) -> Vec<Item<T>> {
    chunk
        .into_iter()
        .map(|r| {
            let d = r.map_err(|e| Failed::Fatal(e.into()))?;
            let span = segment_span(&d, voice);
            let prepared = info_span!(parent: &span, "phonemize").in_scope(|| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    synth.prepare(d.segment.clone())
                }))
                .unwrap_or_else(|_| Err(PipelineError::Panicked("phonemizing the segment".into())))
            });
            match prepared {
                Ok(mut p) => {
                    p.span = span;
                    p.scales = d.scales;
                    Ok((p, d))
                }
                Err(e) if isolate => Err(Failed::Segment(Box::new(d), Box::new(e))),
                Err(e) => Err(Failed::Fatal(e)),
            }
        })
        .collect()
}

/// The loop's side of the phonemizing task: its channel, the batcher the prepared
/// deliveries wait in, and the stop signal.
struct Intake<T> {
    rx: mpsc::Receiver<Item<T>>,
    /// Until the phonemizing task has ended (the queue closed or a fatal item).
    input_open: bool,
    batcher: LaneBatcher<Ready<T>>,
    stop: Option<tokio::sync::watch::Receiver<bool>>,
}

impl<T: Send + 'static> Intake<T> {
    /// Waits for a free engine slot, then for the batcher's next batch (under load it
    /// fills with everything that arrived while the engine was busy). `None`: stopped,
    /// or the queue ended and every prepared delivery went.
    async fn next_batch<Q: SegmentQueue<Ticket = T>>(
        &mut self,
        queue: &Q,
        synth: &Synthesizer,
        slots: &Arc<Semaphore>,
    ) -> Result<Option<(Vec<Ready<T>>, tokio::sync::OwnedSemaphorePermit)>, PipelineError> {
        if self.stopped() {
            return Ok(None);
        }
        let permit = slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| PipelineError::Internal("semaphore closed"))?;
        loop {
            while self.input_open {
                match self.rx.try_recv() {
                    Ok(item) => absorb(item, &mut self.batcher, queue).await?,
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => self.input_open = false,
                }
            }
            let budget = synth.budget();
            // A worker busy with a priority book: its next deliveries come as those in
            // flight are acknowledged; the normal lane waits for them (not past the hold).
            self.batcher
                .hold_lowest(self.input_open && queue.holds_higher_lane());
            if let Some(b) = self
                .batcher
                .next_batch(&budget, Instant::now(), !self.input_open)
            {
                return Ok(Some((b, permit)));
            }
            if !self.input_open && self.batcher.is_empty() {
                return Ok(None);
            }
            let deadline = self.batcher.deadline(&budget);
            let stop = self.stop.clone();
            let stopped = async move {
                match stop {
                    Some(mut s) => {
                        let _ = s.wait_for(|v| *v).await;
                    }
                    None => std::future::pending().await,
                }
            };
            let timeout = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = stopped => return Ok(None),
                item = self.rx.recv(), if self.input_open => match item {
                    Some(item) => absorb(item, &mut self.batcher, queue).await?,
                    None => self.input_open = false,
                },
                _ = timeout => {}
            }
        }
    }

    fn stopped(&self) -> bool {
        self.stop.as_ref().is_some_and(|s| *s.borrow())
    }

    /// Segments of jobs cancelled or ended while they waited never reach the device:
    /// when a segment of `batch` waited past the recheck, the queue is asked which of its
    /// jobs ended, and their segments (in the batch and still in the batcher) are
    /// acknowledged and left out. A failed look goes on with the batch as it is.
    async fn drop_abandoned<Q: SegmentQueue<Ticket = T>>(
        &mut self,
        batch: &mut Vec<Ready<T>>,
        queue: &Q,
        opts: &RunOptions,
    ) -> Result<(), PipelineError> {
        let waited = batch
            .iter()
            .any(|(p, _)| p.queued_at.elapsed() >= opts.recheck_after);
        if !waited {
            return Ok(());
        }
        let mut jobs: Vec<String> = batch.iter().map(|(_, d)| d.job_id.clone()).collect();
        jobs.sort();
        jobs.dedup();
        let gone = match queue.abandoned_jobs(jobs).await {
            Ok(gone) if !gone.is_empty() => gone,
            Ok(_) => return Ok(()),
            Err(e) => {
                tracing::warn!(error = %e, "cannot check for cancelled jobs; going on");
                return Ok(());
            }
        };
        let is_gone = |r: &Ready<T>| gone.contains(&r.1.job_id);
        let mut dropped = self.batcher.drop_where(is_gone);
        let (drop_now, keep): (Vec<_>, Vec<_>) =
            std::mem::take(batch).into_iter().partition(is_gone);
        dropped.extend(drop_now);
        *batch = keep;
        tracing::info!(
            segments = dropped.len(),
            jobs = ?gone,
            "dropped segments of cancelled or ended jobs before inference"
        );
        for (_, d) in dropped {
            queue.ack(d.ticket).await?;
        }
        Ok(())
    }
}

/// Warns of phonemes the voice has no id for (they were skipped), one event a segment.
fn warn_unknown_phonemes<T>(batch: &[Ready<T>], on_event: &(dyn Fn(Event) + Send + Sync)) {
    for (p, _) in batch {
        if !p.unknown.is_empty() {
            on_event(Event::Warning(format!(
                "segment {}: skipped phonemes the voice has no id for: {}",
                p.segment.index,
                p.unknown.join(" ")
            )));
        }
    }
}

type BatchTask = Result<Result<Vec<SegmentRecord>, PipelineError>, tokio::task::JoinError>;

/// A finished batch task's records into `finished`, or its error.
fn batch_result(done: BatchTask, finished: &mut Vec<SegmentRecord>) -> Result<(), PipelineError> {
    match done {
        Ok(Ok(r)) => {
            finished.extend(r);
            Ok(())
        }
        Ok(Err(e)) => Err(e),
        Err(e) => Err(PipelineError::Task(e.to_string())),
    }
}

/// The batches that have finished (without waiting), until the first error.
fn reap(
    tasks: &mut JoinSet<Result<Vec<SegmentRecord>, PipelineError>>,
    finished: &mut Vec<SegmentRecord>,
) -> Result<(), PipelineError> {
    while let Some(done) = tasks.try_join_next() {
        batch_result(done, finished)?;
    }
    Ok(())
}
