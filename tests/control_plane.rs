//! The control plane at scale (issue 32): its Postgres work per segment does not grow with
//! the book, books submitted together share the workers (fair share), and ended jobs can
//! be pruned from the database.
//!
//! Work is counted, not timed: Postgres' own counters of each world's database
//! (pg_stat_database: transactions, rows written, rows read by scans and index fetches),
//! which do not depend on how busy the machine is.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use narrator_db::{JobState, Uuid};
use narrator_test_support::{DbCounts, VOICE, World, book_text};

/// A whole job as a user runs it on a null-engine worker: submit, `status --wait`, then
/// one `status --json` per 100 segments (a user watching it), the worker stopped. Returns
/// the book's segments and everything its database counted, from `narrator migrate` on.
fn job_counts(chapters: usize, per_chapter: usize) -> (i64, DbCounts) {
    let mut w = World::new();
    // The world's own connection takes no part: closed, so it publishes its counts now.
    w.rt.block_on(w.pool.close());
    let book = w.book("book.md", &book_text(chapters, per_chapter, None));
    let worker = w.worker("counts", &["--engine", "null"], &[]);
    let job = w.submit(&book, &["--format", "wav"]);
    let waited = w
        .cmd()
        .args(["status", &job.to_string(), "--wait", "--json"])
        .output();
    assert!(
        waited.is_ok_and(|o| o.status.success()),
        "job did not finish: {}",
        w.logs()
    );
    let segments = (chapters * per_chapter) as i64;
    for _ in 0..segments / 100 {
        assert_eq!(w.status(job)["state"], "done");
    }
    assert!(w.stop(worker, 15).success(), "worker exit: {}", w.logs());
    (segments, w.settled_db_counts())
}

fn per_segment(total: i64, base: i64, segments: i64, base_segments: i64) -> f64 {
    (total - base) as f64 / (segments - base_segments) as f64
}

/// The fixed costs (migrations, each process's connections, the worker's start and stop)
/// are what a 20-segment book counts; what a longer book counts beyond it, per segment,
/// must be the same for 400 and 2,400 segments within 30 %. Before the counters on the
/// job (status counted the job's segments on every poll, the sweeps and the watchdog read
/// them every few seconds), the longer book read several times more rows per segment.
#[test]
fn postgres_work_per_segment_stays_flat_from_a_short_book_to_a_long_one() {
    let (n0, base) = job_counts(10, 2);
    let (n1, short) = job_counts(10, 40);
    let (n2, long) = job_counts(10, 240);
    let rows = |c: &DbCounts| c.returned + c.fetched;
    let figures = [
        ("rows read", rows(&short), rows(&long), rows(&base)),
        ("rows updated", short.updated, long.updated, base.updated),
        (
            "transactions",
            short.transactions,
            long.transactions,
            base.transactions,
        ),
    ];
    let mut report = String::new();
    for (what, s, l, b) in figures {
        let (s, l) = (per_segment(s, b, n1, n0), per_segment(l, b, n2, n0));
        report.push_str(&format!(
            "{what} per segment: {s:.2} at {n1} segments, {l:.2} at {n2} ({:.2}x)\n",
            l / s
        ));
    }
    eprintln!("{report}base ({n0} segments): {base:?}");
    for (what, s, l, b) in figures {
        let (s, l) = (per_segment(s, b, n1, n0), per_segment(l, b, n2, n0));
        assert!(s > 0.0, "{what}: nothing counted per segment?\n{report}");
        assert!(
            l <= s * 1.3,
            "{what} per segment grew with the book:\n{report}"
        );
    }
}

/// Fair share: four books submitted to a running worker are worked on side by side, not
/// one after the other. Each keeps only a window of segments published (queued or held
/// by the worker), topped up as they are recorded: sampled every 100 ms while they run,
/// no book ever has more published and unfinished segments than its window, and every
/// book has its first segment done before any book is finished (queued whole, in
/// submission order, the fourth book would start only once the first three were done).
/// The window counts stay right through it.
///
/// It is also the system-level check that concurrent top-ups of one job (recordings and
/// the reconciler, `claim_dispatch`) never take a window past its size.
#[test]
fn books_submitted_together_advance_together() {
    const PREFETCH: u64 = 32;
    const BOOKS: usize = 4;
    let mut w = World::new();
    // The window (narrator_db::FleetShare::window): twice the live workers' prefetch
    // (2 × 32 = 64) shared by the voice's running jobs, at least MIN_DISPATCH_WINDOW (64).
    // With this one worker that is 64 whether 1, 2, 3 or 4 books are running (64, 32,
    // 22, 16 raised to 64), and 64 before its first heartbeat (no prefetch: the
    // minimum): every book's window is 64 throughout, the exact bound checked below.
    let window = (0..=BOOKS as u64)
        .flat_map(|active_jobs| {
            [0, PREFETCH].map(|fleet_prefetch| {
                narrator_db::FleetShare {
                    voice: VOICE.into(),
                    active_jobs,
                    active_high: 0,
                    fleet_prefetch,
                }
                .window()
            })
        })
        .max()
        .map(i64::from)
        .expect("windows");
    assert_eq!(window, 64, "the window this test was written for");
    // Engine runs of 30 ms with at most 8 segments each: the 1,600 segments take at least
    // 200 runs, 6 s, so the books run side by side for many samples.
    let prefetch = PREFETCH.to_string();
    let worker = w.worker(
        "fair",
        &[
            "--engine",
            "null",
            "--prefetch",
            &prefetch,
            "--max-batch",
            "8",
        ],
        &[("NARRATOR_TEST_RUN_MS", "30")],
    );
    // Sampled from before the first submission to the last book's end.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (pool, stop) = (w.pool.clone(), stop.clone());
        w.rt.spawn(async move {
            let mut most: HashMap<Uuid, i64> = HashMap::new();
            let (mut most_total, mut samples) = (0_i64, 0_u32);
            while !stop.load(Ordering::Relaxed) {
                let rows: Vec<(Uuid, i64)> = sqlx::query_as(
                    "SELECT job_id, count(*) FROM segments \
                     WHERE published_at IS NOT NULL AND state = 'pending' GROUP BY job_id",
                )
                .fetch_all(&pool)
                .await
                .expect("sample");
                for &(job, n) in &rows {
                    let m = most.entry(job).or_default();
                    *m = (*m).max(n);
                }
                most_total = most_total.max(rows.iter().map(|r| r.1).sum());
                samples += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (most, most_total, samples)
        })
    };
    let book = w.book("book.md", &book_text(4, 100, None));
    let jobs: Vec<Uuid> = (0..BOOKS)
        .map(|_| w.submit(&book, &["--format", "wav"]))
        .collect();
    for &job in &jobs {
        w.wait_state(job, JobState::Done, Duration::from_secs(300));
    }
    stop.store(true, Ordering::Relaxed);
    let (most, most_total, samples) = w.rt.block_on(sampler).expect("sampler");
    assert!(w.stop(worker, 15).success(), "worker exit: {}", w.logs());
    eprintln!(
        "window {window}: most published and unfinished per book {:?}, {most_total} in all, \
         over {samples} samples",
        jobs.iter()
            .map(|j| most.get(j).copied().unwrap_or(0))
            .collect::<Vec<_>>()
    );
    for (i, job) in jobs.iter().enumerate() {
        let seen = most.get(job).copied().unwrap_or(0);
        assert!(seen > 0, "book {i} was never seen with segments published");
        assert!(
            seen <= window,
            "book {i} had {seen} segments published and unfinished, past its window of \
             {window} ({samples} samples)"
        );
    }
    assert!(
        most_total <= BOOKS as i64 * window,
        "{most_total} segments published and unfinished at once, past {BOOKS} windows of {window}"
    );
    let (first_done, first_finished): (f64, f64) =
        w.rt.block_on(
            sqlx::query_as(
                "SELECT (SELECT extract(epoch FROM max(f)) FROM ( \
                   SELECT min(done_at) AS f FROM segments WHERE job_id = ANY($1) \
                   GROUP BY job_id) firsts)::float8, \
                 (SELECT extract(epoch FROM min(finished_at)) FROM jobs \
                   WHERE id = ANY($1))::float8",
            )
            .bind(&jobs)
            .fetch_one(&w.pool),
        )
        .expect("times");
    assert!(
        first_done < first_finished,
        "a book started only {:.2} s after the first book was finished",
        first_done - first_finished
    );
    let unpublished: i64 =
        w.rt.block_on(
            sqlx::query_scalar("SELECT coalesce(sum(segments_unpublished), 0)::bigint FROM jobs")
                .fetch_one(&w.pool),
        )
        .expect("counter");
    assert_eq!(unpublished, 0);
}

/// `narrator jobs prune`: only ended jobs older than the age go; their rows go, their
/// segment audio goes, their outputs stay unless `--delete-outputs`; `--dry-run` lists
/// without changing anything; a job still at work stays whatever its age.
#[test]
fn jobs_prune_deletes_ended_jobs_rows_and_the_objects_asked_for() {
    let mut w = World::new();
    let book = w.book("book.md", &book_text(2, 3, None));
    let worker = w.worker("pruner", &["--engine", "null", "--keep-intermediates"], &[]);
    let first = w.submit(&book, &["--format", "wav"]);
    w.wait_state(first, JobState::Done, Duration::from_secs(120));
    assert!(
        objects(&w, first, "packs/") > 0,
        "intermediates kept for the test"
    );
    assert!(objects(&w, first, "out/") > 0);
    assert_eq!(rows(&w, first), 7, "the job and its 6 segments");

    // Not old enough: nothing.
    assert!(listed(&prune(&w, &["--older-than", "1h"])).is_empty());
    // A dry run lists it and changes nothing.
    let v = prune(&w, &["--older-than", "0s", "--dry-run"]);
    assert_eq!(listed(&v), [first.to_string()], "{v}");
    assert_eq!(v["segments"], 6, "{v}");
    assert_eq!(rows(&w, first), 7);
    // Pruned: rows and segment audio gone, outputs kept.
    let v = prune(&w, &["--older-than", "0s"]);
    assert_eq!(listed(&v), [first.to_string()], "{v}");
    assert_eq!(rows(&w, first), 0);
    assert_eq!(objects(&w, first, "packs/"), 0);
    assert!(
        objects(&w, first, "out/") > 0,
        "outputs kept without --delete-outputs"
    );
    let gone = w.err(&["status", &first.to_string()]);
    assert!(gone.contains("no job"), "{gone}");

    // --delete-outputs: everything of the job goes.
    let second = w.submit(&book, &["--format", "wav"]);
    w.wait_state(second, JobState::Done, Duration::from_secs(120));
    let v = prune(&w, &["--older-than", "0s", "--delete-outputs"]);
    assert_eq!(listed(&v), [second.to_string()], "{v}");
    assert_eq!(
        objects(&w, second, "out/") + objects(&w, second, "packs/"),
        0
    );

    // A job still at work (no worker left to take it) stays.
    assert!(w.stop(worker, 15).success());
    let waiting = w.submit(&book, &["--format", "wav"]);
    assert!(listed(&prune(&w, &["--older-than", "0s"])).is_empty());
    assert_eq!(rows(&w, waiting), 7);

    // A bad age: clap's usage error, which says what to give.
    let bad = w
        .cmd()
        .args(["jobs", "prune", "--older-than", "soon"])
        .output()
        .expect("spawn");
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && err.contains("30days"), "{err}");
}

/// Objects of `job` under `jobs/JOB/UNDER`.
fn objects(w: &World, job: Uuid, under: &str) -> usize {
    w.rt.block_on(w.store().list(&format!("jobs/{job}/{under}")))
        .expect("list")
        .len()
}

/// The job's rows: its own and its segments'.
fn rows(w: &World, job: Uuid) -> i64 {
    w.rt.block_on(
        sqlx::query_scalar::<_, i64>(
            "SELECT (SELECT count(*) FROM segments WHERE job_id = $1) \
               + (SELECT count(*) FROM jobs WHERE id = $1)",
        )
        .bind(job)
        .fetch_one(&w.pool),
    )
    .expect("count")
}

/// `narrator jobs prune --json ARGS`.
fn prune(w: &World, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["jobs", "prune", "--json"];
    all.extend_from_slice(args);
    serde_json::from_slice(&w.ok(&all).stdout).expect("prune JSON")
}

/// The job ids a prune listed.
fn listed(v: &serde_json::Value) -> Vec<String> {
    v["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| j["job_id"].as_str().unwrap_or_default().to_string())
        .collect()
}
