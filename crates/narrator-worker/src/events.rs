//! Publishes the jobs' events (docs/PRODUCERS.md): the outbox rows a trigger writes with
//! every change of a job's state ([`narrator_db::claim_events`]) go to the topic
//! exchange `narrator.events` as CloudEvents 1.0 structured JSON, with confirms, and are
//! marked published in the transaction that claimed them. A broker away leaves them for
//! the next look: at least once, never lost; consumers dedupe by the event's `id`. Every
//! worker runs this; claims skip what another worker is publishing. Every second it also
//! writes a `job.progress` to the outbox for each running job whose finished segments
//! moved, at most one per job every [`PROGRESS_EVERY`] ([`narrator_db::note_progress`]).

use std::time::Duration;

use lapin::BasicProperties;
use lapin::types::ShortString;
use narrator_broker::{EVENTS_EXCHANGE, Publisher};
use narrator_db::{PendingEvent, PgPool};
use narrator_s3::S3AudioStore;
use serde_json::json;
use tokio::sync::watch;

use crate::WorkerError;

/// Events published per transaction.
const EVENTS_PER_LOOK: u32 = 64;
/// How often the outbox is looked at when it was empty.
const EVENTS_IDLE: Duration = Duration::from_millis(250);
/// How long the outputs' URLs in `job.done` are valid.
const URLS_VALID_FOR: Duration = Duration::from_secs(24 * 3600);
/// At most one `job.progress` per job this often.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// How often a publisher looks for jobs whose progress is due.
const PROGRESS_LOOK: Duration = Duration::from_secs(1);
/// Published events are kept this long, then deleted.
const KEEP_PUBLISHED: Duration = Duration::from_secs(24 * 3600);

/// What publishes a worker's share of the events.
pub struct EventPublisher {
    pub pool: PgPool,
    pub publisher: Publisher,
    pub store: S3AudioStore,
    /// The cluster id: the events' `source` is `narrator/<cluster>`.
    pub cluster: String,
}

/// Publishes events until `stop`, backing off while the broker or the database is away.
pub async fn publish_events(p: EventPublisher, mut stop: watch::Receiver<bool>) {
    let mut pause = EVENTS_IDLE;
    let mut last_prune = std::time::Instant::now();
    let mut last_progress = std::time::Instant::now();
    loop {
        if *stop.borrow() {
            return;
        }
        if last_progress.elapsed() >= PROGRESS_LOOK {
            last_progress = std::time::Instant::now();
            if let Err(e) = narrator_db::note_progress(&p.pool, PROGRESS_EVERY).await {
                tracing::debug!(error = %e, "cannot note the jobs' progress");
            }
        }
        match p.publish_once().await {
            Ok(n) if n > 0 => {
                pause = EVENTS_IDLE;
                continue;
            }
            Ok(_) => pause = EVENTS_IDLE,
            Err(e) => {
                tracing::warn!(error = %e, "cannot publish the jobs' events; they wait in the outbox");
                pause = (pause * 2).clamp(Duration::from_secs(1), Duration::from_secs(30));
            }
        }
        if last_prune.elapsed() > Duration::from_secs(600) {
            last_prune = std::time::Instant::now();
            if let Err(e) = narrator_db::prune_published_events(&p.pool, KEEP_PUBLISHED).await {
                tracing::debug!(error = %e, "cannot prune published events");
            }
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(crate::jittered(pause)) => {}
        }
    }
}

impl EventPublisher {
    /// One look: the oldest unpublished events published and marked. Returns how many.
    pub async fn publish_once(&self) -> Result<usize, WorkerError> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(narrator_db::DbError::from)?;
        let events = narrator_db::claim_events(&mut tx, EVENTS_PER_LOOK).await?;
        if events.is_empty() {
            let _ = tx.rollback().await;
            return Ok(0);
        }
        let mut ids = Vec::with_capacity(events.len());
        for e in &events {
            if let Some(body) = self.cloud_event(e).await {
                let props = BasicProperties::default()
                    .with_content_type(ShortString::from("application/cloudevents+json"))
                    .with_message_id(ShortString::from(e.id.to_string()))
                    .with_type(ShortString::from(format!("narrator.job.{}", e.kind)));
                let key = format!("job.{}", e.kind);
                if let Err(err) = self
                    .publisher
                    .publish_optional(EVENTS_EXCHANGE, &key, &body, props)
                    .await
                {
                    let _ = tx.rollback().await;
                    return Err(err.into());
                }
            }
            ids.push(e.id);
        }
        narrator_db::mark_events_published(&mut tx, &ids).await?;
        tx.commit().await.map_err(narrator_db::DbError::from)?;
        Ok(ids.len())
    }

    /// The CloudEvents 1.0 structured message of `e`; `None` when its job is gone.
    async fn cloud_event(&self, e: &PendingEvent) -> Option<Vec<u8>> {
        let job = e.details.as_ref()?;
        let mut outputs = Vec::new();
        if e.kind == "done" {
            for o in &job.outputs {
                let url = self.store.presign_get(&o.key, URLS_VALID_FOR).await.ok();
                outputs.push(json!({
                    "kind": o.kind, "name": o.name, "key": o.key, "bytes": o.bytes,
                    "seconds": o.seconds, "url": url,
                }));
            }
        }
        let data = json!({
            "job_id": e.job,
            "idempotency_key": job.request_key,
            "metadata": job.request_metadata,
            "title": job.title,
            "voice": job.voice,
            "state": e.state,
            "segments_total": job.segments_total,
            "segments_done": job.segments_done,
            "segments_failed": job.segments_failed,
            "audio_seconds": job.audio_seconds,
            "rtf": job.rtf,
            "latency_seconds": job.latency_seconds,
            "failure_kind": job.failure_kind,
            "failure_reason": job.failure_reason,
            "outputs": outputs,
        });
        let event = json!({
            "specversion": "1.0",
            "id": e.id,
            "source": format!("narrator/{}", self.cluster),
            "type": format!("narrator.job.{}", e.kind),
            "subject": e.job,
            "time": e.at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "datacontenttype": "application/json",
            "data": data,
        });
        serde_json::to_vec(&event).ok()
    }
}
