//! The read and control commands: `status`, `jobs`, `workers`, `cancel`, `retry`,
//! `migrate`.

use std::time::Duration;

use anyhow::{Context, bail};
use narrator_db::{JobState, JobStatus, RetryOutcome};

use crate::cli::{JobArgs, JobsAction, JobsArgs, MigrateArgs, PruneArgs, StatusArgs, WorkersArgs};
use crate::cluster::{self, PRESIGN_FOR};
use crate::progress::hms;

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.digits$}"))
}

/// Workers seen this recently count when asking which family a voice is.
const FAMILY_SEEN_WITHIN: Duration = Duration::from_secs(24 * 3600);

/// The model family of `voice` as the fleet loaded it: each worker's row says, per voice
/// it serves, its loaded voice's family. `None` when no worker seen in the last day
/// serves it (the status needs no voices folder, so the voice is not looked up here).
async fn family_served(
    pool: &narrator_db::PgPool,
    voice: &str,
) -> anyhow::Result<Option<narrator_engine::FamilyKind>> {
    let workers = narrator_db::list_workers(pool, FAMILY_SEEN_WITHIN).await?;
    Ok(workers
        .iter()
        .rev()
        .filter_map(|w| w.info.plan.as_array())
        .flatten()
        .filter(|p| p["voice"] == voice)
        .find_map(|p| serde_json::from_value(p["family"].clone()).ok()))
}

fn status_json(
    st: &JobStatus,
    family: Option<narrator_engine::FamilyKind>,
    outputs: &[(narrator_db::Output, Option<String>)],
) -> serde_json::Value {
    let mut v = serde_json::to_value(st).unwrap_or_default();
    v["family"] = serde_json::to_value(family).unwrap_or_default();
    v["outputs"] = outputs
        .iter()
        .map(|(o, url)| {
            serde_json::json!({
                "key": o.key, "kind": o.kind, "name": o.name, "seconds": o.seconds,
                "bytes": o.bytes, "url": url,
            })
        })
        .collect();
    v
}

fn print_status(
    st: &JobStatus,
    family: Option<narrator_engine::FamilyKind>,
    outputs: &[(narrator_db::Output, Option<String>)],
) {
    let s = &st.summary;
    let family = family.map_or_else(String::new, |f| format!(" ({f})"));
    println!(
        "job {}  {}  ({}{family}, {})",
        s.job_id, s.title, s.voice, s.format
    );
    println!(
        "state {}  segments {}/{} ({} failed)  audio {}  rtf {}  wall {} s  latency {} s",
        s.state.as_str(),
        s.segments_done,
        s.segments_total,
        s.segments_failed,
        hms(s.audio_seconds),
        opt(s.rtf, 3),
        opt(s.wall_seconds, 1),
        opt(s.latency_seconds, 1),
    );
    if let (Some(kind), Some(reason)) = (&s.failure_kind, &s.failure_reason) {
        println!("failure ({kind}): {reason}");
    }
    if let Some(w) = &st.waiting {
        println!("waiting: {w}");
    }
    if let Some(key) = &s.request_key {
        println!("request {key} (narrator.intake)");
    }
    if let Some(m) = &s.request_metadata {
        println!("metadata {m}");
    }
    for c in &st.chapters {
        println!(
            "  {:>3}  {:<40}  {:>5}/{:<5} {}",
            c.index + 1,
            c.title.chars().take(40).collect::<String>(),
            c.segments_done,
            c.segments_total,
            hms(c.audio_seconds)
        );
    }
    for (o, url) in outputs {
        println!(
            "  {:<8} {}  {:.1} s  {} bytes{}",
            o.kind,
            o.key,
            o.seconds,
            o.bytes,
            url.as_ref()
                .map(|u| format!("\n           {u}"))
                .unwrap_or_default()
        );
    }
}

/// `narrator status`.
pub(crate) async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let job = cluster::job_id(&args.job)?;
    let pool = cluster::database(&args.services).await?;
    let store = match cluster::store(&args.services).await {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!("warning: no presigned URLs: {}", crate::one_line(&e));
            None
        }
    };
    if args.wait {
        loop {
            let Some(state) = narrator_db::job_state(&pool, job).await? else {
                bail!("no job {job} in this database (see `narrator jobs`)");
            };
            if state.is_final() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    loop {
        let Some(st) = narrator_db::job_status(&pool, job).await? else {
            bail!("no job {job} in this database (see `narrator jobs`)");
        };
        let mut outputs = Vec::new();
        for o in narrator_db::job_outputs(&pool, job).await? {
            let url = match &store {
                Some(s) => s.presign_get(&o.key, PRESIGN_FOR).await.ok(),
                None => None,
            };
            outputs.push((o, url));
        }
        let family = family_served(&pool, &st.summary.voice).await?;
        if args.json {
            println!("{}", status_json(&st, family, &outputs));
        } else {
            print_status(&st, family, &outputs);
        }
        if args.wait && st.summary.state != narrator_db::JobState::Done {
            bail!("job {job} ended {}", st.summary.state.as_str());
        }
        if !args.watch || st.summary.state.is_final() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        if !args.json {
            println!();
        }
    }
}

/// `narrator jobs`.
pub(crate) async fn jobs(args: JobsArgs) -> anyhow::Result<()> {
    if let Some(JobsAction::Prune(p)) = args.action {
        return prune(p).await;
    }
    let pool = cluster::database(&args.services).await?;
    let list = narrator_db::list_jobs(&pool, args.limit).await?;
    if args.json {
        println!("{}", serde_json::to_value(&list)?);
        return Ok(());
    }
    if list.is_empty() {
        println!("no jobs yet (submit one with `narrator submit BOOK`)");
        return Ok(());
    }
    println!(
        "{:<36}  {:<10}  {:>11}  {:>9}  {:>6}  {:>3}  TITLE",
        "JOB", "STATE", "SEGMENTS", "AUDIO", "RTF", "PRI"
    );
    for j in list {
        println!(
            "{:<36}  {:<10}  {:>5}/{:<5}  {:>9}  {:>6}  {:>3}  {}{}",
            j.job_id,
            j.state.as_str(),
            j.segments_done,
            j.segments_total,
            hms(j.audio_seconds),
            opt(j.rtf, 3),
            j.priority,
            j.title,
            j.request_key
                .as_ref()
                .map(|k| format!("  [request {k}]"))
                .unwrap_or_default()
        );
    }
    Ok(())
}

/// Jobs pruned per database round trip.
const PRUNE_BATCH: u32 = 100;

/// `narrator jobs prune`: per job, a claim in the database first (from then on `narrator
/// retry` refuses it, so no retry revives a job whose audio is going), then its objects
/// (so a failure leaves the job listed and a second run finishes it), then its rows.
async fn prune(args: PruneArgs) -> anyhow::Result<()> {
    let pool = cluster::database(&args.services).await?;
    if args.dry_run {
        let jobs = narrator_db::prunable_jobs(&pool, args.older_than, u32::MAX).await?;
        let segments: u64 = jobs.iter().map(|j| u64::from(j.segments_total)).sum();
        if args.json {
            let v = serde_json::json!({"dry_run": true, "jobs": jobs, "segments": segments});
            println!("{v}");
            return Ok(());
        }
        for j in &jobs {
            println!(
                "{}  {:<9}  ended {}  {:>6} segments  {}",
                j.job_id,
                j.state.as_str(),
                j.finished_at.format("%Y-%m-%d %H:%M"),
                j.segments_total,
                j.title
            );
        }
        println!(
            "would prune {} job(s), {segments} segment row(s) (dry run: nothing changed)",
            jobs.len()
        );
        return Ok(());
    }
    let store = cluster::store(&args.services)
        .await
        .context("pruning deletes the jobs' segment audio from S3 (nothing was pruned)")?;
    let (mut pruned, mut segments, mut objects) = (Vec::new(), 0u64, 0usize);
    loop {
        let batch = narrator_db::prunable_jobs(&pool, args.older_than, PRUNE_BATCH).await?;
        if batch.is_empty() {
            break;
        }
        for j in batch {
            // `false`: retried meanwhile (running again), so kept, objects and all.
            if !narrator_db::claim_prune(&pool, j.job_id).await? {
                continue;
            }
            let id = j.job_id.to_string();
            let deleted = if args.delete_outputs {
                store.delete_job(&id).await
            } else {
                store.delete_intermediates(&id).await
            };
            let n = deleted.with_context(|| {
                format!(
                    "deleting job {id}'s objects from S3 ({} job(s) pruned before it); \
                     run the command again once S3 answers",
                    pruned.len()
                )
            })?;
            objects += n;
            // Claimed, so still ended: `false` only if another prune deleted it first.
            if narrator_db::delete_ended_job(&pool, j.job_id).await? {
                segments += u64::from(j.segments_total);
                pruned.push(j);
            }
        }
    }
    if args.json {
        let v = serde_json::json!({"dry_run": false, "jobs": pruned, "segments": segments,
            "objects_deleted": objects, "outputs_deleted": args.delete_outputs});
        println!("{v}");
    } else {
        println!(
            "pruned {} job(s): {segments} segment row(s), {objects} object(s) deleted from S3 ({})",
            pruned.len(),
            if args.delete_outputs {
                "outputs included"
            } else {
                "segment audio; outputs kept"
            }
        );
    }
    Ok(())
}

/// `narrator workers`.
pub(crate) async fn workers(args: WorkersArgs) -> anyhow::Result<()> {
    let pool = cluster::database(&args.services).await?;
    let list = narrator_db::list_workers(&pool, Duration::from_secs(60)).await?;
    if args.json {
        println!("{}", serde_json::to_value(&list)?);
        return Ok(());
    }
    if list.is_empty() {
        println!("no workers seen in the last minute (start one with `narrator worker`)");
        return Ok(());
    }
    println!(
        "{:<28}  {:<8}  {:>8}  {:>8}  {:>10}  PLAN",
        "WORKER", "DEVICE", "DONE", "RECENT", "MEDIAN RTF"
    );
    for w in list {
        println!(
            "{:<28}  {:<8}  {:>8}  {:>8}  {:>10}  {}",
            w.info.id,
            w.info.device,
            w.segments_done,
            w.recent_segments,
            opt(w.recent_median_rtf, 3),
            w.info.plan
        );
        // One plan per voice and device; a fallback to the CPU is said on its own line.
        let plans = w.info.plan.as_array().cloned().unwrap_or_default();
        let mut said = std::collections::BTreeSet::new();
        for why in plans.iter().filter_map(|p| p["device_fallback"].as_str()) {
            if said.insert(why.to_owned()) {
                println!("  on the CPU instead of a GPU: {why}");
            }
        }
    }
    Ok(())
}

/// `narrator cancel`.
pub(crate) async fn cancel(args: JobArgs) -> anyhow::Result<()> {
    let job = cluster::job_id(&args.job)?;
    let pool = cluster::database(&args.services).await?;
    if narrator_db::cancel_job(&pool, job).await? {
        println!("job {job} cancelled; workers drop its remaining segments");
        return Ok(());
    }
    let state = narrator_db::job_status(&pool, job)
        .await?
        .map_or(JobState::Cancelled, |s| s.summary.state);
    bail!(
        "job {job} has already ended ({}): nothing to cancel",
        state.as_str()
    )
}

/// `narrator retry`.
pub(crate) async fn retry(args: JobArgs) -> anyhow::Result<()> {
    let job = cluster::job_id(&args.job)?;
    let pool = cluster::database(&args.services).await?;
    let conn = cluster::broker(&args.services, "narrator-retry").await?;
    let (outcome, enqueued) = narrator_worker::retry_job(&pool, &conn, job).await?;
    let _ = conn.close(200, "done".into()).await;
    let segments = match outcome {
        RetryOutcome::Retried(s) => s,
        RetryOutcome::NotFailed(state) => bail!(
            "job {job} is {}, not failed: only failed jobs can be retried",
            state.as_str()
        ),
        RetryOutcome::Pruning => bail!(
            "job {job} is being pruned (`narrator jobs prune` claimed it; its audio may be \
             deleted already), so it cannot be retried: submit the book again"
        ),
    };
    println!(
        "job {job} is back to work: {} segments to redo, {enqueued} enqueued now{}",
        segments.len(),
        if segments.is_empty() {
            " (all were done; a worker assembles it)"
        } else if enqueued < segments.len() {
            " (the rest follow as its segments are recorded)"
        } else {
            ""
        }
    );
    Ok(())
}

/// `narrator migrate`.
pub(crate) async fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    let url = cluster::redact(&args.services.database_url);
    let pool = narrator_db::connect(&args.services.database_url)
        .await
        .with_context(|| format!("database {url}"))?;
    narrator_db::migrate(&pool)
        .await
        .with_context(|| format!("database {url}"))?;
    println!(
        "database {} is up to date",
        cluster::redact(&args.services.database_url)
    );
    // The producers' intake (docs/PRODUCERS.md), so requests published before any
    // worker starts wait in it. Workers declare it too: a broker away is only a warning.
    match declare_intake(&args.services).await {
        Ok(()) => println!("intake queue {} is declared", narrator_broker::INTAKE_QUEUE),
        Err(e) => eprintln!(
            "warning: the intake queue {} is not declared ({e:#}); workers declare it when they start",
            narrator_broker::INTAKE_QUEUE
        ),
    }
    Ok(())
}

async fn declare_intake(services: &crate::cli::ServiceArgs) -> anyhow::Result<()> {
    let conn = cluster::broker(services, "narrator-migrate").await?;
    let channel = conn.create_channel().await?;
    narrator_broker::declare_intake(&channel).await?;
    let _ = conn.close(200, "declared".into()).await;
    Ok(())
}
