//! The store stage: synthesized segments are stored and recorded in groups.
//!
//! Batches hand their synthesized segments to one task, which takes everything waiting
//! (up to [`RunOptions::pack_max`](crate::RunOptions) segments per job and store call)
//! and stores each job's share with one [`AudioStore::put_segments`] (a networked store
//! writes one pack object) and records it with one [`StateStore::record_segments`] (one
//! statement). While a group is being written the next one fills, so groups grow with the
//! store's latency and the load, and stay at one segment when work trickles in. Each
//! batch gets back one result per segment, in its order, and settles its deliveries.

use std::collections::BTreeMap;
use std::sync::Arc;

use narrator_core::{AudioStore, SeamError, SegmentRecord, StateStore};
use narrator_telemetry::metrics as m;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinSet;
use tracing::{Instrument, info_span};

use crate::PipelineError;
use crate::runner::Stages;
use crate::synth::Synthesized;

/// Groups being written at once.
const FLUSHES: usize = 4;

/// One synthesized segment to store, with what its record needs.
pub(crate) struct ToStore {
    pub(crate) job: String,
    pub(crate) synthesized: Synthesized,
    pub(crate) attempt: u32,
    pub(crate) enqueued_at_ms: Option<u64>,
    pub(crate) started_ms: u64,
}

type Reply = oneshot::Sender<Vec<Result<SegmentRecord, PipelineError>>>;

/// The handle batches send their segments through.
#[derive(Clone)]
pub(crate) struct Storer {
    tx: mpsc::UnboundedSender<(Vec<ToStore>, Reply)>,
}

impl Storer {
    /// Starts the stage; it ends when every handle is dropped and its groups are written.
    pub(crate) fn spawn<A, S>(stages: Stages<A, S>, worker: String, pack_max: usize) -> Self
    where
        A: AudioStore + 'static,
        S: StateStore + 'static,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(rx, Arc::new((stages, worker)), pack_max.max(1)));
        Self { tx }
    }

    /// Stores and records `items`; one result per item, in order.
    pub(crate) async fn store(
        &self,
        items: Vec<ToStore>,
    ) -> Vec<Result<SegmentRecord, PipelineError>> {
        let n = items.len();
        let (reply, answer) = oneshot::channel();
        let gone = || {
            (0..n)
                .map(|_| Err(PipelineError::Internal("the store stage has stopped")))
                .collect()
        };
        if self.tx.send((items, reply)).is_err() {
            return gone();
        }
        answer.await.unwrap_or_else(|_| gone())
    }
}

async fn run<A, S>(
    mut rx: mpsc::UnboundedReceiver<(Vec<ToStore>, Reply)>,
    ctx: Arc<(Stages<A, S>, String)>,
    pack_max: usize,
) where
    A: AudioStore + 'static,
    S: StateStore + 'static,
{
    let slots = Arc::new(Semaphore::new(FLUSHES));
    let mut writing = JoinSet::new();
    loop {
        // A free slot first: what arrives while all are busy joins the next group.
        let Ok(permit) = slots.clone().acquire_owned().await else {
            break;
        };
        let Some(first) = rx.recv().await else {
            break;
        };
        let mut requests = vec![first];
        let mut segments = requests[0].0.len();
        while segments < pack_max * FLUSHES {
            match rx.try_recv() {
                Ok(r) => {
                    segments += r.0.len();
                    requests.push(r);
                }
                Err(_) => break,
            }
        }
        let ctx = ctx.clone();
        writing.spawn(async move {
            flush(requests, &ctx.0, &ctx.1, pack_max).await;
            drop(permit);
        });
        while writing.try_join_next().is_some() {}
    }
    while writing.join_next().await.is_some() {}
}

/// Writes the segments of `requests` (grouped by job, at most `pack_max` per store call)
/// and answers each request.
async fn flush<A: AudioStore, S: StateStore>(
    requests: Vec<(Vec<ToStore>, Reply)>,
    stages: &Stages<A, S>,
    worker: &str,
    pack_max: usize,
) {
    // (request, position) of every segment, grouped by job in arrival order.
    let mut by_job: BTreeMap<&str, Vec<(usize, usize)>> = BTreeMap::new();
    for (r, (items, _)) in requests.iter().enumerate() {
        for (i, item) in items.iter().enumerate() {
            by_job.entry(item.job.as_str()).or_default().push((r, i));
        }
    }
    let groups: Vec<(&str, &[(usize, usize)])> = by_job
        .iter()
        .flat_map(|(job, places)| places.chunks(pack_max).map(move |c| (*job, c)))
        .collect();
    let written = futures_util::future::join_all(groups.iter().map(|(job, places)| {
        let items: Vec<&ToStore> = places.iter().map(|&(r, i)| &requests[r].0[i]).collect();
        write_group(job, items, stages, worker)
    }))
    .await;
    let mut results: Vec<Vec<Option<Result<SegmentRecord, PipelineError>>>> = requests
        .iter()
        .map(|(items, _)| items.iter().map(|_| None).collect())
        .collect();
    for ((_, places), outcome) in groups.iter().zip(written) {
        match outcome {
            Ok(records) => {
                for (&(r, i), record) in places.iter().zip(records) {
                    results[r][i] = Some(Ok(record));
                }
            }
            Err(e) => {
                for &(r, i) in *places {
                    results[r][i] = Some(Err(
                        SeamError::msg(e.kind, e.class, e.message.clone()).into()
                    ));
                }
            }
        }
    }
    for ((_, reply), answers) in requests.into_iter().zip(results) {
        let answers = answers
            .into_iter()
            .map(|a| a.unwrap_or(Err(PipelineError::Internal("segment not written"))))
            .collect();
        let _ = reply.send(answers);
    }
}

/// Stores one job's group in one call, then records it in one call.
async fn write_group<A: AudioStore, S: StateStore>(
    job: &str,
    items: Vec<&ToStore>,
    stages: &Stages<A, S>,
    worker: &str,
) -> Result<Vec<SegmentRecord>, SeamError> {
    let audio: Vec<(u32, &narrator_core::SegmentAudio)> = items
        .iter()
        .map(|t| (t.synthesized.prepared.segment.index, &t.synthesized.audio))
        .collect();
    // The group belongs to one job: its spans join that job's trace (under the first
    // segment's span).
    let parent = items
        .first()
        .map_or_else(tracing::Span::none, |t| t.synthesized.prepared.span.clone());
    let started = std::time::Instant::now();
    let places = stages
        .store
        .put_segments(job, &audio)
        .instrument(
            info_span!(parent: &parent, "store", otel.name = "PUT segment pack",
            otel.kind = "client", narrator.segments = audio.len()),
        )
        .await?;
    metrics::histogram!(m::STORE_SECONDS).record(started.elapsed().as_secs_f64());
    let records: Vec<SegmentRecord> = items
        .iter()
        .zip(places)
        .map(|(t, packed)| {
            let s = &t.synthesized;
            let queue_wait_seconds = match t.enqueued_at_ms {
                Some(at) => t.started_ms.saturating_sub(at) as f64 / 1000.0,
                None => s.queue_wait_seconds,
            };
            SegmentRecord {
                index: s.prepared.segment.index,
                samples: s.audio.samples.len() as u64,
                sample_rate: s.audio.sample_rate,
                audio_seconds: s.audio.seconds(),
                inference_seconds: s.inference_seconds,
                queue_wait_seconds,
                batch_size: s.batch_size,
                attempts: t.attempt,
                worker: worker.to_string(),
                phoneme_ids: s.prepared.total_ids() as u32,
                packed,
                words: s.words.clone(),
            }
        })
        .collect();
    let started = std::time::Instant::now();
    let recorded = stages
        .state
        .record_segments(job, &records)
        .instrument(
            info_span!(parent: &parent, "record", otel.name = "INSERT segment figures",
            otel.kind = "client", db.system.name = "postgresql", db.operation.name = "INSERT",
            narrator.segments = records.len()),
        )
        .await?;
    metrics::histogram!(m::RECORD_SECONDS).record(started.elapsed().as_secs_f64());
    // Objects this call stored that no record points at: every segment in them was
    // recorded first by another copy (a duplicate delivery), or the job has ended (a
    // cancel: its storage may be released already) and nothing was recorded. Delete them;
    // the records point at the winner's audio, so stored audio and figures always agree.
    let mut unused: Vec<String> = Vec::new();
    for r in &records {
        if let Some(p) = &r.packed
            && !unused.contains(&p.key)
            && !records.iter().any(|o| {
                o.packed.as_ref().is_some_and(|q| q.key == p.key) && recorded.contains(&o.index)
            })
        {
            unused.push(p.key.clone());
        }
    }
    if !unused.is_empty() {
        tracing::info!(
            job,
            objects = unused.len(),
            "no record points at this copy's audio (another copy was recorded first, \
             or the job ended); deleting it"
        );
        if let Err(e) = stages.store.discard(job, &unused).await {
            // Left behind, it is removed with the job's other intermediates once done.
            tracing::warn!(job, error = %e, "cannot delete a duplicate's audio");
        }
    }
    Ok(records)
}
