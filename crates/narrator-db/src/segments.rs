//! Segments: recording finished ones exactly once, failed ones, reading the finished
//! records back, the outbox (which segments the broker has confirmed), and a plan's
//! segment rebuilt from its row (`segment_row`, for the dispatch, the rescue, the retry
//! and the assembler's plan).
//!
//! [`record_segment`] is one statement: a data-modifying CTE updates the segment only if
//! it is not done yet and its job has not ended and, only when it did, adds it to the
//! job's counters. Under concurrent redelivery the second caller waits on the segment's
//! row lock, re-checks `state <> 'done'` against the committed row, and changes nothing.

use narrator_core::{Segment, SegmentRecord};
use sqlx::postgres::PgRow;
use sqlx::{PgExecutor, PgPool, Row};
use uuid::Uuid;

use crate::error::{DbError, int4, int8, unsigned};
use crate::jobs::parse_pause;

/// What recording a segment did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordOutcome {
    /// This call marked the segment done (`false`: it already was; nothing changed).
    pub newly_done: bool,
    /// Every segment of the job is done. Also `true` for a redelivered last segment, so a
    /// worker that died between recording and assembling is replaced; [`crate::claim_assembly`]
    /// decides who assembles.
    pub job_complete: bool,
}

/// What recording several segments of a job did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordsOutcome {
    /// How many this call marked done (the others already were; they did not change).
    pub newly_done: u64,
    /// Their indices, ascending: the records that now point at this caller's audio. A
    /// caller whose stored object none of them points at deletes it (another copy won, or
    /// the job has ended).
    pub recorded: Vec<u32>,
    /// Every segment of the job is done (also when nothing changed), as in
    /// [`RecordOutcome::job_complete`]; `false` once the job has ended.
    pub job_complete: bool,
    /// The job has ended (cancelled, failed or done): nothing was recorded and its
    /// counters did not move (`recorded` is empty), whatever the segments' states.
    pub job_ended: bool,
}

/// Records a finished segment's figures. Idempotent: a second record of the same segment
/// changes nothing and returns `newly_done: false`. The first record of a job moves it
/// from `queued` to `running`. Nothing is recorded into a job that has ended, as
/// [`record_segments`].
pub async fn record_segment(
    pool: &PgPool,
    job: Uuid,
    r: &SegmentRecord,
) -> Result<RecordOutcome, DbError> {
    let out = record_segments(pool, job, std::slice::from_ref(r)).await?;
    Ok(RecordOutcome {
        newly_done: out.newly_done > 0,
        job_complete: out.job_complete,
    })
}

/// Postgres' "deadlock detected": two statements locked the same segments in opposite
/// orders (overlapping redeliveries); one is rolled back and is simply run again.
const DEADLOCK: &str = "40P01";

/// Records several finished segments of one job in one statement: the segments not yet
/// done are updated and the job's counters (its totals and its chapters' progress) move
/// by their sum, so a batch costs one round
/// trip and one lock of the job's row instead of one per segment. Idempotent per segment,
/// as [`record_segment`]. A segment index the job does not have is refused, and nothing
/// is recorded. Nothing is recorded into a job that has ended (cancelled, failed or done:
/// [`RecordsOutcome::job_ended`]): after a cancel a batch may still store its audio,
/// even after the job's storage was released, and no record may point at it (its caller
/// deletes what it stored). The state is the one the statement starts with: a cancel
/// committed while it runs does not stop it, and what it records was stored before the
/// job's storage is released (a lease after the cancel), which deletes it.
pub async fn record_segments(
    pool: &PgPool,
    job: Uuid,
    records: &[SegmentRecord],
) -> Result<RecordsOutcome, DbError> {
    let mut records: Vec<&SegmentRecord> = records.iter().collect();
    // Rows are locked in index order, which keeps concurrent batches from deadlocking in
    // the common case.
    records.sort_by_key(|r| r.index);
    records.dedup_by_key(|r| r.index);
    let columns = RecordColumns::of(&records)?;
    let row = run_record(pool, job, &columns).await?;
    let idx = &columns.idx;
    let known: i64 = row.try_get("known")?;
    if known < idx.len() as i64 {
        // The statement changed nothing (it updates only when every index exists).
        let mut missing = idx.clone();
        let present: Vec<i32> =
            sqlx::query_scalar("SELECT idx FROM segments WHERE job_id = $1 AND idx = ANY($2)")
                .bind(job)
                .bind(idx)
                .fetch_all(pool)
                .await?;
        missing.retain(|i| !present.contains(i));
        return Err(DbError::SegmentNotFound {
            job,
            index: missing.first().map_or(0, |&i| i as u32),
        });
    }
    let newly: i64 = row.try_get("newly")?;
    let recorded: Vec<i32> = row.try_get("recorded")?;
    let complete_now: Option<bool> = row.try_get("complete_now")?;
    let complete_before: Option<bool> = row.try_get("complete_before")?;
    let job_ended = row.try_get::<Option<bool>, _>("ended")?.unwrap_or(false);
    Ok(RecordsOutcome {
        newly_done: newly.max(0) as u64,
        recorded: recorded.into_iter().map(|i| i.max(0) as u32).collect(),
        job_complete: !job_ended && complete_now.or(complete_before).unwrap_or(false),
        job_ended,
    })
}

/// A batch of records as the columns [`run_record`] binds: one element per record, in
/// the batch's order.
struct RecordColumns<'a> {
    idx: Vec<i32>,
    samples: Vec<i64>,
    rate: Vec<i32>,
    audio: Vec<f64>,
    inference: Vec<f64>,
    wait: Vec<f64>,
    batch: Vec<i32>,
    attempts: Vec<i32>,
    worker: Vec<&'a str>,
    ids: Vec<i32>,
    pack_key: Vec<Option<&'a str>>,
    pack_offset: Vec<Option<i64>>,
    pack_len: Vec<Option<i64>>,
    words: Vec<Option<String>>,
}

impl<'a> RecordColumns<'a> {
    /// The columns of `records`; a figure out of its column's range is refused.
    fn of(records: &[&'a SegmentRecord]) -> Result<Self, DbError> {
        let col = |f: &dyn Fn(&SegmentRecord) -> Result<i32, DbError>| {
            records
                .iter()
                .map(|r| f(r))
                .collect::<Result<Vec<i32>, DbError>>()
        };
        let idx = col(&|r| int4("segment index", r.index))?;
        let rate = col(&|r| int4("sample rate", r.sample_rate))?;
        let batch = col(&|r| int4("batch size", r.batch_size))?;
        let attempts = col(&|r| int4("attempts", r.attempts))?;
        let ids = col(&|r| int4("phoneme ids", r.phoneme_ids))?;
        let samples = records
            .iter()
            .map(|r| int8("samples", r.samples))
            .collect::<Result<Vec<i64>, DbError>>()?;
        let f64s =
            |f: fn(&SegmentRecord) -> f64| records.iter().map(|r| f(r)).collect::<Vec<f64>>();
        let worker: Vec<&str> = records.iter().map(|r| r.worker.as_str()).collect();
        let pack_key: Vec<Option<&str>> = records
            .iter()
            .map(|r| r.packed.as_ref().map(|p| p.key.as_str()))
            .collect();
        let pack_pos = |f: fn(&narrator_core::PackedAt) -> u64, what| {
            records
                .iter()
                .map(|r| r.packed.as_ref().map(|p| int8(what, f(p))).transpose())
                .collect::<Result<Vec<Option<i64>>, DbError>>()
        };
        // Word timings as JSON text (a jsonb column; `NULL` where the engine gave none).
        let words: Vec<Option<String>> = records
            .iter()
            .map(|r| {
                (!r.words.is_empty())
                    .then(|| serde_json::to_string(&r.words).ok())
                    .flatten()
            })
            .collect();
        let pack_offset = pack_pos(|p| p.offset, "pack offset")?;
        let pack_len = pack_pos(|p| p.len, "pack length")?;
        let (audio, inference, wait) = (
            f64s(|r| r.audio_seconds),
            f64s(|r| r.inference_seconds),
            f64s(|r| r.queue_wait_seconds),
        );
        Ok(Self {
            idx,
            samples,
            rate,
            audio,
            inference,
            wait,
            batch,
            attempts,
            worker,
            ids,
            pack_key,
            pack_offset,
            pack_len,
            words,
        })
    }
}

/// [`record_segments`]' statement, run again should Postgres roll it back on a deadlock
/// (at most 3 times): one row with what it recorded, whether the job is complete or has
/// ended, and how many of the indices the job has.
async fn run_record(pool: &PgPool, job: Uuid, c: &RecordColumns<'_>) -> Result<PgRow, DbError> {
    // The segments are found by joining the input, materialized with the job id as one of
    // its columns, on the primary key: the planner then probes (job_id, idx) per record.
    // Given `job_id = $1` to see, it may instead read all of the job's segments and
    // filter, when its statistics do not know the job (a new job always is): a batch would
    // cost the length of the book.
    let mut tries = 0;
    let row = loop {
        let q = sqlx::query(
            "WITH input AS MATERIALIZED ( \
               SELECT $1::uuid AS job_id, t.* FROM unnest($2::int4[], $3::int8[], $4::int4[], $5::float8[], \
                 $6::float8[], $7::float8[], $8::int4[], $9::int4[], $10::text[], $11::int4[], \
                 $12::text[], $13::int8[], $14::int8[], $15::text[]) \
               AS t(idx, samples, sample_rate, audio_seconds, inference_seconds, \
                 queue_wait_seconds, batch_size, attempts, worker, phoneme_ids, \
                 pack_key, pack_offset, pack_len, words)), \
             known AS (SELECT count(*) AS n FROM input i \
               JOIN segments k ON k.job_id = i.job_id AND k.idx = i.idx), \
             ended AS (SELECT state IN ('cancelled', 'failed', 'done') AS yes \
               FROM jobs WHERE id = $1), \
             seg AS ( \
               UPDATE segments s SET state = 'done', samples = i.samples, \
                 sample_rate = i.sample_rate, audio_seconds = i.audio_seconds, \
                 inference_seconds = i.inference_seconds, \
                 queue_wait_seconds = i.queue_wait_seconds, batch_size = i.batch_size, \
                 attempts = i.attempts, worker = i.worker, phoneme_ids = i.phoneme_ids, \
                 pack_key = i.pack_key, pack_offset = i.pack_offset, pack_len = i.pack_len, \
                 words = i.words::jsonb, done_at = now(), failure_kind = NULL, failure_reason = NULL, engine_by = NULL \
               FROM input i WHERE s.job_id = i.job_id AND s.idx = i.idx \
                 AND s.state <> 'done' AND (SELECT n FROM known) = cardinality($2) \
                 AND NOT coalesce((SELECT yes FROM ended), false) \
               RETURNING s.idx, s.chapter, s.audio_seconds, s.inference_seconds), \
             agg AS (SELECT count(*) AS n, coalesce(sum(audio_seconds), 0) AS audio, \
               coalesce(max(inference_seconds), 0) AS inference, \
               coalesce(max(chapter) + 1, 0) AS chapters FROM seg), \
             per_chapter AS (SELECT chapter, count(*) AS n, sum(audio_seconds) AS audio \
               FROM seg GROUP BY chapter), \
             job AS ( \
               UPDATE jobs j SET segments_done = j.segments_done + agg.n, \
                 audio_seconds = j.audio_seconds + agg.audio, \
                 speech_seconds = j.speech_seconds + agg.audio, \
                 chapter_done = (SELECT array_agg(coalesce(j.chapter_done[g.i], 0) \
                     + coalesce(c.n, 0)::int4 ORDER BY g.i) \
                   FROM generate_series(1, greatest(cardinality(j.chapter_done), agg.chapters)) g(i) \
                   LEFT JOIN per_chapter c ON c.chapter + 1 = g.i), \
                 chapter_audio = (SELECT array_agg(coalesce(j.chapter_audio[g.i], 0) \
                     + coalesce(c.audio, 0) ORDER BY g.i) \
                   FROM generate_series(1, greatest(cardinality(j.chapter_audio), agg.chapters)) g(i) \
                   LEFT JOIN per_chapter c ON c.chapter + 1 = g.i), \
                 state = CASE WHEN j.state = 'queued' THEN 'running' ELSE j.state END, \
                 progress_at = now(), \
                 started_at = coalesce(j.started_at, \
                   now() - make_interval(secs => agg.inference)) \
               FROM agg WHERE j.id = $1 AND agg.n > 0 \
               RETURNING j.segments_done = j.segments_total AS complete) \
             SELECT (SELECT n FROM agg) AS newly, \
               (SELECT coalesce(array_agg(idx ORDER BY idx), '{}') FROM seg) AS recorded, \
               (SELECT complete FROM job) AS complete_now, \
               (SELECT segments_done = segments_total FROM jobs WHERE id = $1) AS complete_before, \
               (SELECT n FROM known) AS known, (SELECT yes FROM ended) AS ended",
        )
        .bind(job)
        .bind(&c.idx)
        .bind(&c.samples)
        .bind(&c.rate)
        .bind(&c.audio)
        .bind(&c.inference)
        .bind(&c.wait)
        .bind(&c.batch)
        .bind(&c.attempts)
        .bind(&c.worker)
        .bind(&c.ids)
        .bind(&c.pack_key)
        .bind(&c.pack_offset)
        .bind(&c.pack_len)
        .bind(&c.words);
        match q.fetch_one(pool).await {
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(DEADLOCK) && tries < 3 => {
                tries += 1;
            }
            r => break r.map_err(|e| DbError::on_job(job, e))?,
        }
    };
    Ok(row)
}

/// Records that a segment failed for good (dead-lettered); a segment already done stays
/// done. Returns whether it changed.
pub async fn fail_segment(
    exec: impl PgExecutor<'_>,
    job: Uuid,
    index: u32,
    attempts: u32,
    kind: &str,
    reason: &str,
) -> Result<bool, DbError> {
    let n = sqlx::query(
        "WITH seg AS (UPDATE segments SET state = 'failed', attempts = $3, failure_kind = $4, \
         failure_reason = $5, engine_by = NULL WHERE job_id = $1 AND idx = $2 AND state <> 'done' RETURNING job_id), \
         job AS (UPDATE jobs SET progress_at = now() WHERE id IN (SELECT job_id FROM seg)) \
         SELECT 1 FROM seg",
    )
    .bind(job)
    .bind(int4("segment index", index)?)
    .bind(int4("attempts", attempts)?)
    .bind(kind)
    .bind(reason)
    .fetch_all(exec)
    .await
    .map_err(|e| DbError::on_job(job, e))?
    .len();
    Ok(n > 0)
}

fn record(row: &PgRow) -> Result<SegmentRecord, DbError> {
    let u32_of = |col: &'static str| -> Result<u32, DbError> {
        unsigned(col, i64::from(row.try_get::<i32, _>(col)?))
    };
    Ok(SegmentRecord {
        index: u32_of("idx")?,
        samples: unsigned("samples", row.try_get("samples")?)?,
        sample_rate: u32_of("sample_rate")?,
        audio_seconds: row.try_get("audio_seconds")?,
        inference_seconds: row.try_get("inference_seconds")?,
        queue_wait_seconds: row.try_get("queue_wait_seconds")?,
        batch_size: u32_of("batch_size")?,
        attempts: u32_of("attempts")?,
        worker: row.try_get("worker")?,
        phoneme_ids: u32_of("phoneme_ids")?,
        packed: match row.try_get::<Option<String>, _>("pack_key")? {
            None => None,
            Some(key) => Some(narrator_core::PackedAt {
                key,
                offset: unsigned("pack_offset", row.try_get("pack_offset")?)?,
                len: unsigned("pack_len", row.try_get("pack_len")?)?,
            }),
        },
        words: match row.try_get::<Option<String>, _>("words")? {
            None => Vec::new(),
            Some(json) => serde_json::from_str(&json).map_err(|_| DbError::Corrupt {
                column: "words",
                value: json.chars().take(80).collect(),
            })?,
        },
    })
}

/// A segment from a row with `idx, chapter, text, pause_after, speaker`.
pub(crate) fn segment_row(r: &PgRow) -> Result<Segment, DbError> {
    let pause: String = r.try_get("pause_after")?;
    Ok(Segment {
        index: unsigned("idx", i64::from(r.try_get::<i32, _>("idx")?))?,
        chapter: unsigned("chapter", i64::from(r.try_get::<i32, _>("chapter")?))?,
        text: r.try_get("text")?,
        pause_after: parse_pause(&pause)?,
        speaker: unsigned("speaker", i64::from(r.try_get::<i32, _>("speaker")?))?,
        speed: None,
        timed: false,
    })
}

/// The job's finished segments' records, by index.
pub async fn finished_segments(
    exec: impl PgExecutor<'_>,
    job: Uuid,
) -> Result<Vec<SegmentRecord>, DbError> {
    sqlx::query(
        "SELECT idx, samples, sample_rate, audio_seconds, inference_seconds, \
         queue_wait_seconds, batch_size, attempts, worker, phoneme_ids, \
         pack_key, pack_offset, pack_len, words::text AS words \
         FROM segments WHERE job_id = $1 AND state = 'done' ORDER BY idx",
    )
    .bind(job)
    .fetch_all(exec)
    .await?
    .iter()
    .map(record)
    .collect()
}

/// Marks segments as confirmed by the broker; returns how many were unpublished before.
/// The time is the statement's (after the publish), not the transaction's start: the
/// watchdog orders a lane's messages by it (and by index within one statement).
pub async fn mark_published(
    exec: impl PgExecutor<'_>,
    job: Uuid,
    indices: &[u32],
) -> Result<u64, DbError> {
    let idx = indices
        .iter()
        .map(|&i| int4("segment index", i))
        .collect::<Result<Vec<_>, _>>()?;
    // Joined on the primary key, as in record_segments (not `job_id = $1`, which may read
    // the whole job).
    Ok(sqlx::query(
        "WITH k AS MATERIALIZED (SELECT $1::uuid AS job_id, unnest($2::int4[]) AS idx) \
         UPDATE segments s SET published_at = statement_timestamp() FROM k \
         WHERE s.job_id = k.job_id AND s.idx = k.idx AND s.published_at IS NULL",
    )
    .bind(job)
    .bind(&idx)
    .execute(exec)
    .await?
    .rows_affected())
}
