//! Engine threads behind an async handle.
//!
//! `Session::run` blocks for tens to hundreds of milliseconds, so sessions never run on the
//! async runtime's threads. The pool owns N OS threads, each with its own session (created
//! on that thread); batches arrive through one channel, so an idle thread takes the next
//! batch, and each reply goes back through a `oneshot`. Dropping the pool closes the
//! channel and the threads finish their current batch and exit.

use std::path::PathBuf;
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use std::sync::Arc;

use crate::Backend;
use crate::family::Family;
use crate::session::SessionOptions;
use crate::{BatchOutput, Device, EngineError, Scales, runtime::Runtime};

struct Job {
    items: Vec<Vec<i64>>,
    /// One speaker id per item.
    speakers: Vec<i64>,
    scales: Scales,
    reply: oneshot::Sender<Result<BatchOutput, EngineError>>,
    span: tracing::Span,
}

/// How many sessions with how many threads each.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    /// Sessions (one OS thread each).
    pub sessions: usize,
    /// Options of each session.
    pub session: SessionOptions,
}

/// N engine threads, one session each, fed through a shared queue.
pub struct EnginePool {
    tx: Option<crossbeam_channel::Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
    device: Device,
    batching: bool,
}

impl std::fmt::Debug for EnginePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnginePool")
            .field("threads", &self.threads.len())
            .field("device", &self.device)
            .finish()
    }
}

impl EnginePool {
    /// Starts the threads and opens one session of the voice's family on each; returns
    /// once all are ready or the first one failed.
    pub fn start(
        rt: &'static Runtime,
        family: Arc<dyn Family>,
        opts: PoolOptions,
    ) -> Result<Self, EngineError> {
        let sopts = opts.session.clone();
        Self::start_with(opts.sessions, move |_| family.open(rt, &sopts))
    }

    /// Starts `sessions` threads, each running the backend `make(i)` builds on it.
    pub fn start_with<F>(sessions: usize, make: F) -> Result<Self, EngineError>
    where
        F: Fn(usize) -> Result<Box<dyn Backend>, EngineError> + Send + Sync + 'static,
    {
        let make = Arc::new(make);
        let (tx, rx) = crossbeam_channel::bounded::<Job>(sessions.max(1) * 2);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let mut threads = Vec::new();
        for i in 0..sessions.max(1) {
            let rx = rx.clone();
            let ready = ready_tx.clone();
            let make = make.clone();
            let handle = std::thread::Builder::new()
                .name(format!("narrator-engine-{i}"))
                .spawn(move || {
                    let mut engine = match make(i) {
                        Ok(e) => e,
                        Err(e) => {
                            let _ = ready.send(Err(e));
                            return;
                        }
                    };
                    drop(make);
                    let _ = ready.send(Ok((engine.device(), engine.supports_batching())));
                    drop(ready);
                    while let Ok(job) = rx.recv() {
                        let _enter = job.span.enter();
                        let refs: Vec<&[i64]> = job.items.iter().map(Vec::as_slice).collect();
                        let out = engine.synthesize_speakers(&refs, &job.speakers, job.scales);
                        let _ = job.reply.send(out);
                    }
                })
                .map_err(|source| EngineError::Io {
                    path: PathBuf::from("<engine thread>"),
                    source,
                })?;
            threads.push(handle);
        }
        drop(ready_tx);
        let mut device = Device::Cpu;
        let mut batching = true;
        for _ in 0..threads.len() {
            match ready_rx.recv() {
                Ok(Ok((d, b))) => {
                    device = d;
                    batching &= b;
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(EngineError::Stopped),
            }
        }
        Ok(Self {
            tx: Some(tx),
            threads,
            device,
            batching,
        })
    }

    /// The device the sessions run on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Whether batches of several items are trimmed exactly.
    pub fn supports_batching(&self) -> bool {
        self.batching
    }

    /// Number of sessions.
    pub fn sessions(&self) -> usize {
        self.threads.len()
    }

    /// Synthesizes one batch on the next free session.
    pub async fn synthesize(
        &self,
        items: Vec<Vec<i64>>,
        scales: Scales,
    ) -> Result<BatchOutput, EngineError> {
        let speakers = vec![0; items.len()];
        self.synthesize_as(items, speakers, scales).await
    }

    /// Synthesizes one batch on the next free session, each item as its speaker
    /// (multi-speaker voices; one id per item).
    pub async fn synthesize_as(
        &self,
        items: Vec<Vec<i64>>,
        speakers: Vec<i64>,
        scales: Scales,
    ) -> Result<BatchOutput, EngineError> {
        let rx = self.submit(items, speakers, scales)?;
        rx.await.map_err(|_| EngineError::Stopped)?
    }

    /// Synthesizes one batch, blocking the calling (non-async) thread.
    pub fn synthesize_blocking(
        &self,
        items: Vec<Vec<i64>>,
        scales: Scales,
    ) -> Result<BatchOutput, EngineError> {
        let speakers = vec![0; items.len()];
        let rx = self.submit(items, speakers, scales)?;
        rx.blocking_recv().map_err(|_| EngineError::Stopped)?
    }

    fn submit(
        &self,
        items: Vec<Vec<i64>>,
        speakers: Vec<i64>,
        scales: Scales,
    ) -> Result<oneshot::Receiver<Result<BatchOutput, EngineError>>, EngineError> {
        let (reply, rx) = oneshot::channel();
        let job = Job {
            items,
            speakers,
            scales,
            reply,
            span: tracing::Span::current(),
        };
        let tx = self.tx.as_ref().ok_or(EngineError::Stopped)?;
        tx.send(job).map_err(|_| EngineError::Stopped)?;
        Ok(rx)
    }
}

impl Drop for EnginePool {
    fn drop(&mut self) {
        self.tx.take();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
