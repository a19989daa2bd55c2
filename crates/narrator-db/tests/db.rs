//! narrator-db against a real Postgres: each test gets a fresh database with the
//! migrations applied (`TestDb`, dropped after the test). Needs DATABASE_URL (`bash ops/test.sh` sets it and starts
//! Postgres); without it these tests fail, they do not skip.

use std::sync::Arc;
use std::time::{Duration, Instant};

use narrator_core::{
    ChapterPlan, JobPlan, PackedAt, PauseAfter, Segment, SegmentRecord, StateStore,
};
use narrator_db::{
    ClaimLimits, DbError, JobState, PgStateStore, RecordOutcome, WorkerInfo, cancel_job,
    claim_assembly, claim_dispatch, create_job, dispatch_candidates, fail_job, finish_job,
    finished_segments, heartbeat, job_status, list_jobs, list_workers, mark_published,
    record_segment, record_segments,
};
use narrator_test_support::TestDb;
use sqlx::PgPool;

#[test]
fn database_url_is_set() {
    assert!(
        std::env::var_os("DATABASE_URL").is_some(),
        "DATABASE_URL is not set: run the tests with `bash ops/test.sh`, which starts \
         Postgres and sets DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres"
    );
}

/// A plan with `chapters` chapters of `per` segments each.
fn plan(chapters: u32, per: u32) -> JobPlan {
    let mut segments = Vec::new();
    let mut chs = Vec::new();
    for c in 0..chapters {
        chs.push(ChapterPlan {
            title: format!("Chapter {}", c + 1),
            first_segment: c * per,
            segment_count: per,
            blocks: vec![
                narrator_core::SourceBlock {
                    tag: "p".into(),
                    class: Some("first".into()),
                    images: vec![narrator_core::SourceImage {
                        src: "OEBPS/Images/tea party.png".into(),
                        alt: "The tea party".into(),
                    }],
                };
                per as usize
            ],
            stylesheets: vec!["OEBPS/Styles/book.css".into()],
            images_after: Vec::new(),
        });
        for i in 0..per {
            segments.push(Segment {
                index: c * per + i,
                chapter: c,
                text: format!("Sentence {i} of chapter {c}, with 'quotes' and ünïcode."),
                pause_after: if i + 1 == per {
                    PauseAfter::Chapter
                } else {
                    PauseAfter::Sentence
                },
                // Stored and read back per segment (multi-speaker voices).
                speaker: c % 2,
                speed: None,
                timed: false,
            });
        }
    }
    JobPlan {
        job_id: "digest-abc".into(),
        title: "Alice".into(),
        source: "alice.txt".into(),
        voice: "en_US-joe-medium".into(),
        chapters: chs,
        segments,
        warnings: vec!["skipped 1 emoji".into()],
        meta: narrator_core::BookMeta {
            author: Some("Lewis Carroll".into()),
            language: Some("en-GB".into()),
            date: Some("1865".into()),
            publisher: None,
            cover: Some(narrator_core::Cover {
                mime: "image/jpeg".into(),
                data: std::sync::Arc::new(vec![0xFF, 0xD8, 0xFF, 0xE0, 1, 2, 3]),
            }),
            // A source EPUB's looks, for a read-along EPUB (kept beside the job).
            resources: vec![
                narrator_core::SourceFile {
                    path: "OEBPS/Images/tea party.png".into(),
                    mime: "image/png".into(),
                    data: std::sync::Arc::new(b"\x89PNG\r\n\x1a\n...".to_vec()),
                },
                narrator_core::SourceFile {
                    path: "OEBPS/Styles/book.css".into(),
                    mime: "text/css".into(),
                    data: std::sync::Arc::new(b"p.first { text-indent: 0 }".to_vec()),
                },
            ],
        },
        lexicon: Some("Cheshire = Chesh-er\n".into()),
    }
}

fn rec(index: u32, worker: &str) -> SegmentRecord {
    SegmentRecord {
        index,
        samples: 22050,
        sample_rate: 22050,
        audio_seconds: 1.0,
        inference_seconds: 0.25,
        queue_wait_seconds: 0.5,
        batch_size: 4,
        attempts: 1,
        worker: worker.into(),
        phoneme_ids: 42,
        packed: None,
        words: Vec::new(),
    }
}

async fn counters(pool: &PgPool, job: narrator_db::Uuid) -> (JobState, u32, f64) {
    let s = job_status(pool, job)
        .await
        .expect("status")
        .expect("exists");
    (
        s.summary.state,
        s.summary.segments_done,
        s.summary.audio_seconds,
    )
}

#[tokio::test]
async fn a_job_is_recorded_with_its_segments_and_completes_on_the_last() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let p = plan(2, 3);
    let job = create_job(&pool, &p, "opus", 5).await.expect("create");
    let s = job_status(&pool, job)
        .await
        .expect("status")
        .expect("exists");
    assert_eq!(s.summary.state, JobState::Queued);
    assert_eq!((s.summary.segments_total, s.summary.segments_done), (6, 0));
    assert_eq!(s.summary.content_id, "digest-abc");
    assert_eq!((s.summary.format.as_str(), s.summary.priority), ("opus", 5));
    assert_eq!(s.warnings, ["skipped 1 emoji"]);
    let titles: Vec<_> = s.chapters.iter().map(|c| c.title.as_str()).collect();
    assert_eq!(titles, ["Chapter 1", "Chapter 2"]);
    assert!(s.summary.latency_seconds.is_none() && s.summary.rtf.is_none());
    // The book's metadata and cover come back for the assembler.
    let stored = narrator_db::load_job(&pool, job).await.expect("load");
    assert_eq!(stored.plan.meta, p.meta, "source files included");
    assert_eq!(
        stored.plan.chapters, p.chapters,
        "how paragraphs looked included"
    );
    assert_eq!(stored.plan.lexicon, p.lexicon);
    assert_eq!(stored.plan.segments, p.segments, "speakers included");
    assert_eq!(stored.plan.title, "Alice");

    // A second submission of the same plan is a new job.
    let again = create_job(&pool, &p, "opus", 5).await.expect("create");
    assert_ne!(again, job);

    for i in 0..6 {
        let out = record_segment(&pool, job, &rec(i, "w1"))
            .await
            .expect("record");
        assert_eq!(
            out,
            RecordOutcome {
                newly_done: true,
                job_complete: i == 5
            },
            "segment {i}"
        );
        if i == 0 {
            assert_eq!(counters(&pool, job).await.0, JobState::Running);
        }
        if i == 3 {
            let s = job_status(&pool, job)
                .await
                .expect("status")
                .expect("exists");
            let done: Vec<_> = s.chapters.iter().map(|c| c.segments_done).collect();
            assert_eq!(done, [3, 1], "per-chapter progress");
        }
    }
    assert_eq!(counters(&pool, job).await, (JobState::Running, 6, 6.0));
    let back = finished_segments(&pool, job).await.expect("finished");
    assert_eq!(back, (0..6).map(|i| rec(i, "w1")).collect::<Vec<_>>());
    // The other submission is untouched.
    assert_eq!(counters(&pool, again).await, (JobState::Queued, 0, 0.0));

    assert!(claim_assembly(&pool, job).await.expect("claim"));
    assert!(!claim_assembly(&pool, job).await.expect("claim again"));
    assert!(finish_job(&pool, job, 7.5).await.expect("finish"));
    let s = job_status(&pool, job)
        .await
        .expect("status")
        .expect("exists");
    assert_eq!(s.summary.state, JobState::Done);
    assert_eq!(
        (s.summary.audio_seconds, s.summary.speech_seconds),
        (7.5, 6.0)
    );
    assert!(s.summary.latency_seconds.is_some_and(|l| l >= 0.0));
    let listed: Vec<_> = list_jobs(&pool, 10)
        .await
        .expect("list")
        .iter()
        .map(|j| j.job_id)
        .collect();
    assert_eq!(listed.len(), 2);
    assert!(listed.contains(&job) && listed.contains(&again));
}

#[tokio::test]
async fn a_duplicate_record_changes_nothing() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let job = create_job(&pool, &plan(1, 2), "wav", 0)
        .await
        .expect("create");
    let first = record_segment(&pool, job, &rec(1, "w1"))
        .await
        .expect("record");
    assert!(first.newly_done && !first.job_complete);
    let mut other = rec(1, "w2");
    other.audio_seconds = 9.0;
    let dup = record_segment(&pool, job, &other)
        .await
        .expect("record again");
    assert_eq!(
        dup,
        RecordOutcome {
            newly_done: false,
            job_complete: false
        }
    );
    assert_eq!(counters(&pool, job).await, (JobState::Running, 1, 1.0));
    assert_eq!(
        finished_segments(&pool, job).await.expect("finished"),
        [rec(1, "w1")],
        "the first record's figures stay"
    );
    // A redelivered last segment still reports the job complete (so assembly is retried).
    record_segment(&pool, job, &rec(0, "w1"))
        .await
        .expect("record");
    let again = record_segment(&pool, job, &rec(0, "w1"))
        .await
        .expect("record");
    assert_eq!(
        again,
        RecordOutcome {
            newly_done: false,
            job_complete: true
        }
    );
    let missing = record_segment(&pool, job, &rec(7, "w1")).await;
    assert!(matches!(
        missing,
        Err(DbError::SegmentNotFound { index: 7, .. })
    ));
}

fn packed(index: u32, key: &str, offset: u64) -> SegmentRecord {
    SegmentRecord {
        packed: Some(PackedAt {
            key: key.into(),
            offset,
            len: 44_144,
        }),
        ..rec(index, "w1")
    }
}

#[tokio::test]
async fn a_group_of_records_is_one_statement_with_the_same_rules() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let job = create_job(&pool, &plan(1, 5), "wav", 0)
        .await
        .expect("create");
    // Segment 2 has its words timed: they come back as recorded (the jsonb column).
    let timed = SegmentRecord {
        words: vec![
            narrator_core::WordTiming {
                text: [0, 5],
                samples: [1_536, 9_984],
            },
            narrator_core::WordTiming {
                text: [6, 11],
                samples: [10_240, 22_050],
            },
        ],
        ..rec(2, "w1")
    };
    let group = [packed(3, "p/a", 0), packed(1, "p/a", 44_144), timed];
    let out = record_segments(&pool, job, &group).await.expect("record");
    assert_eq!((out.newly_done, out.job_complete), (3, false));
    assert_eq!(counters(&pool, job).await, (JobState::Running, 3, 3.0));
    let finished = finished_segments(&pool, job).await.expect("finished");
    assert_eq!(
        finished,
        [group[1].clone(), group[2].clone(), group[0].clone()]
    );

    // Overlapping a recorded group: only the new ones count; the first pack stays.
    let again = [packed(1, "p/b", 0), packed(4, "p/b", 44_144)];
    let out = record_segments(&pool, job, &again).await.expect("again");
    assert_eq!((out.newly_done, out.job_complete), (1, false));
    assert_eq!(out.recorded, [4], "only segment 4 points at p/b");
    let finished = finished_segments(&pool, job).await.expect("finished");
    assert_eq!(
        finished[0].packed.as_ref().map(|p| p.key.as_str()),
        Some("p/a")
    );
    assert_eq!(
        finished[3].packed.as_ref().map(|p| p.key.as_str()),
        Some("p/b")
    );

    // An index the job lacks refuses the whole group: segment 0 stays pending.
    let bad = record_segments(&pool, job, &[rec(0, "w1"), rec(9, "w1")]).await;
    assert!(
        matches!(bad, Err(DbError::SegmentNotFound { index: 9, .. })),
        "{bad:?}"
    );
    assert_eq!(counters(&pool, job).await, (JobState::Running, 4, 4.0));

    // The last one completes the job, and a redelivered group still says so.
    let out = record_segments(&pool, job, &[rec(0, "w1"), rec(2, "w2")])
        .await
        .expect("last");
    assert_eq!((out.newly_done, out.job_complete), (1, true));
    let out = record_segments(&pool, job, &[rec(0, "w1")])
        .await
        .expect("redelivered");
    assert_eq!((out.newly_done, out.job_complete), (0, true));
    assert_eq!(counters(&pool, job).await.1, 5);

    // A pack place the schema cannot hold is refused.
    let job2 = create_job(&pool, &plan(1, 1), "wav", 0)
        .await
        .expect("create");
    let mut empty = packed(0, "p/c", 0);
    empty.packed.as_mut().expect("packed").len = 0;
    assert!(record_segments(&pool, job2, &[empty]).await.is_err());
}

#[tokio::test]
async fn overlapping_groups_recorded_at_once_count_each_segment_once() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let job = create_job(&pool, &plan(1, 40), "wav", 0)
        .await
        .expect("create");
    // Eight workers record overlapping windows, some in reverse order.
    let tasks: Vec<_> = (0..8u32)
        .map(|w| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut group: Vec<_> = (w * 4..w * 4 + 10)
                    .map(|i| rec(i, &format!("w{w}")))
                    .collect();
                if w % 2 == 1 {
                    group.reverse();
                }
                record_segments(&pool, job, &group)
                    .await
                    .expect("record")
                    .newly_done
            })
        })
        .collect();
    let mut newly = 0;
    for t in tasks {
        newly += t.await.expect("join");
    }
    assert_eq!(newly, 38, "segments 0..38 once each");
    assert_eq!(counters(&pool, job).await, (JobState::Running, 38, 38.0));
}

#[tokio::test]
async fn concurrent_records_of_one_segment_count_once() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let job = create_job(&pool, &plan(1, 3), "wav", 0)
        .await
        .expect("create");
    let tasks: Vec<_> = (0..8)
        .map(|w| {
            let pool = pool.clone();
            tokio::spawn(async move {
                record_segment(&pool, job, &rec(2, &format!("w{w}")))
                    .await
                    .expect("record")
            })
        })
        .collect();
    let mut newly = 0;
    for t in tasks {
        newly += usize::from(t.await.expect("join").newly_done);
    }
    assert_eq!(newly, 1);
    assert_eq!(counters(&pool, job).await, (JobState::Running, 1, 1.0));
}

#[tokio::test]
async fn exactly_one_concurrent_claim_wins() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let job = create_job(&pool, &plan(1, 2), "wav", 0)
        .await
        .expect("create");
    assert!(!claim_assembly(&pool, job).await.expect("claim"), "queued");
    record_segment(&pool, job, &rec(0, "w"))
        .await
        .expect("record");
    assert!(
        !claim_assembly(&pool, job).await.expect("claim"),
        "not all done"
    );
    record_segment(&pool, job, &rec(1, "w"))
        .await
        .expect("record");
    let pool = Arc::new(pool);
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { claim_assembly(&*pool, job).await.expect("claim") })
        })
        .collect();
    let mut wins = 0;
    for t in tasks {
        wins += usize::from(t.await.expect("join"));
    }
    assert_eq!(wins, 1);
    assert_eq!(counters(&pool, job).await.0, JobState::Assembling);
}

fn indices(c: &narrator_db::Claimed) -> Vec<u32> {
    c.segments.iter().map(|s| s.index).collect()
}

/// Fair share: a job keeps a window of segments published; claims in flight at once
/// take different segments, a claim that dies leaves its segments for the next, and
/// recording makes room for as many more.
#[tokio::test]
async fn a_job_keeps_its_window_published_and_concurrent_claims_never_overlap() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let voices = vec![("en_US-joe-medium".to_string(), [4, 4])];
    let job = create_job(&pool, &plan(2, 5), "wav", 2)
        .await
        .expect("create");
    // Too recent for the reconciler (its producer publishes the first window).
    let recent = dispatch_candidates(&pool, &voices, Duration::from_secs(60), 10)
        .await
        .expect("scan");
    assert!(recent.is_empty());
    let due = dispatch_candidates(&pool, &voices, Duration::ZERO, 10)
        .await
        .expect("scan");
    assert_eq!(due, [(job, voices[0].0.clone())]);
    let mut a = pool.begin().await.expect("tx");
    let first = claim_dispatch(&mut a, job, ClaimLimits::fill(4))
        .await
        .expect("claim")
        .expect("running");
    assert_eq!(indices(&first), [0, 1, 2, 3]);
    assert_eq!(
        (first.voice.as_str(), first.priority),
        ("en_US-joe-medium", 2)
    );
    assert_eq!(
        first.segments[2],
        plan(2, 5).segments[2],
        "comes back whole"
    );
    mark_published(&mut *a, job, &[0, 1, 2, 3])
        .await
        .expect("mark");
    a.commit().await.expect("commit");
    let claim = |limits: ClaimLimits| {
        let pool = pool.clone();
        async move {
            let mut tx = pool.begin().await.expect("tx");
            let c = claim_dispatch(&mut tx, job, limits).await.expect("claim");
            (tx, c.map(|c| indices(&c)))
        }
    };
    let (tx, full) = claim(ClaimLimits::fill(4)).await;
    tx.rollback().await.expect("rollback");
    assert_eq!(full, Some(vec![]), "the window is full");
    record_segments(&pool, job, &[rec(0, "w"), rec(1, "w")])
        .await
        .expect("record");
    let (tx, room) = claim(ClaimLimits::fill(4)).await;
    tx.rollback().await.expect("rollback"); // not published: left for the next claim
    assert_eq!(room, Some(vec![4, 5]), "two recorded, two more, in order");
    // Told where to start, a claim starts there (4 and 5 are for a claim from 0).
    let from_six = ClaimLimits {
        from: Some(6),
        ..ClaimLimits::fill(4)
    };
    let (tx, past) = claim(from_six).await;
    tx.rollback().await.expect("rollback");
    assert_eq!(past, Some(vec![6, 7]));
    // Asked for runs of 3, a worker's top-up waits while there is room for 2.
    let run_of_three = ClaimLimits {
        at_least: 3,
        ..ClaimLimits::fill(4)
    };
    let (tx, waits) = claim(run_of_three).await;
    tx.rollback().await.expect("rollback");
    assert_eq!(waits, Some(vec![]));
    // A window grown with the fleet: 2 of 8 are out.
    let (mut tx, grown) = claim(ClaimLimits::fill(8)).await;
    assert_eq!(grown, Some(vec![4, 5, 6, 7, 8, 9]));
    mark_published(&mut *tx, job, &[4, 5, 6, 7, 8, 9])
        .await
        .expect("mark");
    tx.commit().await.expect("commit");
    assert_counters_agree(&pool, job, "dispatched").await;
    let due = dispatch_candidates(&pool, &voices, Duration::ZERO, 10)
        .await
        .expect("scan");
    assert!(due.is_empty(), "nothing left unpublished");
    // A cancelled job is not dispatched.
    let other = create_job(&pool, &plan(1, 2), "wav", 0)
        .await
        .expect("create");
    assert!(cancel_job(&pool, other).await.expect("cancel"));
    let mut tx = pool.begin().await.expect("tx");
    assert_eq!(
        claim_dispatch(&mut tx, other, ClaimLimits::fill(4))
            .await
            .expect("claim"),
        None
    );
    let due = dispatch_candidates(&pool, &voices, Duration::ZERO, 10)
        .await
        .expect("scan");
    assert!(due.is_empty());
}

/// Claims of one job made at the same time by many workers, each committing what it
/// published: the job never has more published and unfinished than its window (each
/// claim reads the room once the one before it has committed). Without the claim lock,
/// each of the eight reads a room of 16 before any commits and takes 16 different
/// segments: 128 out against a window of 16.
#[tokio::test]
async fn concurrent_claims_that_all_commit_keep_the_window() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let job = create_job(&pool, &plan(2, 100), "wav", 0)
        .await
        .expect("create");
    let window = 16;
    let claimers: Vec<_> = (0..8)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut tx = pool.begin().await.expect("tx");
                let claimed = claim_dispatch(&mut tx, job, ClaimLimits::fill(window))
                    .await
                    .expect("claim")
                    .expect("running");
                // Publishing takes a while; the others claim meanwhile.
                tokio::time::sleep(Duration::from_millis(100)).await;
                let idx = indices(&claimed);
                mark_published(&mut *tx, job, &idx).await.expect("mark");
                tx.commit().await.expect("commit");
                idx.len()
            })
        })
        .collect();
    let mut taken = 0;
    for c in claimers {
        taken += c.await.expect("claimer");
    }
    let out: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM segments WHERE job_id = $1 AND published_at IS NOT NULL \
         AND state = 'pending'",
    )
    .bind(job)
    .fetch_one(&pool)
    .await
    .expect("count");
    assert_eq!(taken, 16, "the claims together took one window");
    assert_eq!(
        out,
        i64::from(window),
        "published and unfinished: the window"
    );
    assert_counters_agree(&pool, job, "concurrent claims").await;
}

/// A worker's top-up does not queue behind another claim of the same job: while one
/// runs, a claim that may skip (`skip_when_busy`, as after a recording) is refused at
/// once with `ClaimBusy` and changes nothing; once the first has committed it takes
/// what the window has room for.
#[tokio::test]
async fn a_top_up_skips_a_job_another_claim_holds() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let job = create_job(&pool, &plan(2, 20), "wav", 0)
        .await
        .expect("create");
    let mut first = pool.begin().await.expect("tx");
    let held = claim_dispatch(&mut first, job, ClaimLimits::fill(4))
        .await
        .expect("claim")
        .expect("running");
    assert_eq!(indices(&held), vec![0, 1, 2, 3]);
    let top_up = ClaimLimits {
        at_least: 1,
        ..ClaimLimits::after_recording(8, 0)
    };
    assert!(top_up.skip_when_busy, "a top-up after a recording skips");
    let mut second = pool.begin().await.expect("tx");
    let busy = claim_dispatch(&mut second, job, top_up).await;
    assert!(
        matches!(busy, Err(narrator_db::DbError::ClaimBusy(j)) if j == job),
        "refused while the first claim runs: {busy:?}"
    );
    second.rollback().await.expect("rollback");
    mark_published(&mut *first, job, &indices(&held))
        .await
        .expect("mark");
    first.commit().await.expect("commit");
    // The first claim has committed: the top-up takes the rest of its window of 8.
    assert_eq!(claim_once(&pool, job, top_up, true).await, vec![4, 5, 6, 7]);
    assert_counters_agree(&pool, job, "a skipped top-up").await;
}

/// A voice's window is cut from its running jobs and its live workers' prefetch.
#[tokio::test]
async fn fleet_shares_count_running_jobs_and_live_workers_prefetch() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let voices = vec!["en_US-joe-medium".to_string(), "kokoro".to_string()];
    let mut a = worker_row("a", narrator_db::Uuid::new_v4());
    a.plan = serde_json::json!([{"voice": "kokoro", "prefetch": 7}, {"voice": "en_US-joe-medium", "prefetch": 40}]);
    let mut b = worker_row("b", narrator_db::Uuid::new_v4());
    b.plan = serde_json::json!([{"voice": "en_US-joe-medium", "prefetch": 60}]);
    let mut gone = worker_row("gone", narrator_db::Uuid::new_v4());
    gone.plan = serde_json::json!([{"voice": "en_US-joe-medium", "prefetch": 1000}]);
    for w in [&a, &b, &gone] {
        heartbeat(&pool, w, 0).await.expect("beat");
    }
    sqlx::query("UPDATE workers SET last_seen = now() - interval '5 minutes' WHERE id = 'gone'")
        .execute(&pool)
        .await
        .expect("age");
    for _ in 0..2 {
        create_job(&pool, &plan(1, 2), "wav", 0)
            .await
            .expect("create");
    }
    let done = create_job(&pool, &plan(1, 1), "wav", 0)
        .await
        .expect("create");
    assert!(cancel_job(&pool, done).await.expect("cancel"));
    let shares = narrator_db::fleet_shares(&pool, &voices, Duration::from_secs(60))
        .await
        .expect("shares");
    let got: Vec<(u64, u64)> = shares
        .iter()
        .map(|s| (s.active_jobs, s.fleet_prefetch))
        .collect();
    assert_eq!(got, [(2, 100), (0, 7)]);
    assert_eq!(shares[0].window(), 100, "2 × 100 shared by 2");
}

#[tokio::test]
async fn views_give_rtf_and_latency_from_timestamps() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let job = create_job(&pool, &plan(1, 2), "wav", 0)
        .await
        .expect("create");
    record_segment(&pool, job, &rec(0, "w1"))
        .await
        .expect("record");
    let mut r = rec(1, "w1");
    r.inference_seconds = 0.75;
    r.audio_seconds = 3.0;
    record_segment(&pool, job, &r).await.expect("record");
    claim_assembly(&pool, job).await.expect("claim");
    finish_job(&pool, job, 5.0).await.expect("finish");
    sqlx::query(
        "UPDATE jobs SET created_at = '2026-01-01T00:00:00Z', \
         started_at = '2026-01-01T00:00:10Z', finished_at = '2026-01-01T00:00:12Z' WHERE id = $1",
    )
    .bind(job)
    .execute(&pool)
    .await
    .expect("set times");
    let s = job_status(&pool, job)
        .await
        .expect("status")
        .expect("exists")
        .summary;
    assert_eq!(s.wall_seconds, Some(2.0));
    assert_eq!(s.rtf, Some(0.4), "2 s of work for 5 s of audio");
    assert_eq!(s.latency_seconds, Some(12.0));
    assert_eq!(s.speech_seconds, 4.0);

    let rtfs: Vec<(i32, Option<f64>)> =
        sqlx::query_as("SELECT idx, rtf FROM segment_figures WHERE job_id = $1 ORDER BY idx")
            .bind(job)
            .fetch_all(&pool)
            .await
            .expect("figures");
    assert_eq!(rtfs, [(0, Some(0.25)), (1, Some(0.25))]);

    let info = |id: &str| WorkerInfo {
        id: id.into(),
        host: "h".into(),
        device: "cpu".into(),
        hardware: serde_json::json!({"cores": 2}),
        plan: serde_json::json!({"max_batch": 1}),
        instance: None,
        stale_after: None,
    };
    heartbeat(&pool, &info("w1"), 2).await.expect("beat");
    heartbeat(&pool, &info("w1"), 3).await.expect("beat again");
    heartbeat(&pool, &info("idle"), 0).await.expect("beat");
    sqlx::query("UPDATE workers SET last_seen = now() - interval '1 hour' WHERE id = 'idle'")
        .execute(&pool)
        .await
        .expect("age");
    let ws = list_workers(&pool, Duration::from_secs(60))
        .await
        .expect("workers");
    assert_eq!(ws.len(), 1, "only the live worker");
    assert_eq!((ws[0].info.id.as_str(), ws[0].segments_done), ("w1", 3));
    assert_eq!(ws[0].info.plan, serde_json::json!({"max_batch": 1}));
    assert_eq!(
        (ws[0].recent_segments, ws[0].recent_median_rtf),
        (2, Some(0.25))
    );
    // Segments older than ten minutes leave the recent window.
    sqlx::query("UPDATE segments SET done_at = now() - interval '11 minutes' WHERE idx = 0")
        .execute(&pool)
        .await
        .expect("age");
    let ws = list_workers(&pool, Duration::from_secs(60))
        .await
        .expect("workers");
    assert_eq!(ws[0].recent_segments, 1);
}

#[tokio::test]
async fn a_group_of_deliveries_is_checked_in_one_query_in_order() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    use narrator_db::{SegmentCheck, check_segment, check_segments};
    let live = create_job(&pool, &plan(1, 3), "wav", 0)
        .await
        .expect("create");
    let cancelled = create_job(&pool, &plan(1, 2), "wav", 0)
        .await
        .expect("create");
    record_segment(&pool, live, &rec(0, "w"))
        .await
        .expect("record");
    assert!(cancel_job(&pool, cancelled).await.expect("cancel"));
    let nobody = narrator_db::Uuid::new_v4();
    let asked = [
        (live, 1),
        (live, 0),
        (cancelled, 1),
        (live, 99),
        (nobody, 0),
        (live, 1),
        (live, 2),
    ];
    let checks = check_segments(&pool, &asked).await.expect("check");
    assert_eq!(
        checks,
        [
            SegmentCheck::Work,
            SegmentCheck::AlreadyDone,
            SegmentCheck::JobEnded(JobState::Cancelled),
            SegmentCheck::Unknown,
            SegmentCheck::Unknown,
            SegmentCheck::Work,
            SegmentCheck::Work,
        ]
    );
    // One at a time says the same.
    for (&(job, index), expected) in asked.iter().zip(&checks) {
        let one = check_segment(&pool, job, index).await.expect("check one");
        assert_eq!(&one, expected, "segment {index} of {job}");
    }
    assert!(check_segments(&pool, &[]).await.expect("none").is_empty());
}

#[tokio::test]
async fn a_delivery_whose_text_or_speaker_is_not_the_databases_is_a_mismatch() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    use narrator_db::{DeliveryKey, SegmentCheck, check_deliveries};
    let job = create_job(&pool, &plan(2, 1), "wav", 0)
        .await
        .expect("create");
    let stored = |index: u32| {
        let p = plan(2, 1);
        let s = &p.segments[index as usize];
        (s.text.clone(), s.speaker)
    };
    let key = |index, content| DeliveryKey {
        job,
        index,
        returned: false,
        content,
    };
    let (text1, speaker1) = stored(1);
    assert_eq!(speaker1, 1, "the plan's second chapter speaks as speaker 1");
    let keys = [
        key(0, Some(stored(0))),
        key(0, Some(("Something else entirely.".into(), 0))),
        key(1, Some((text1.clone(), 0))),
        key(1, Some((text1, 1))),
        key(1, None),
    ];
    let seen = check_deliveries(
        &pool,
        &keys,
        narrator_db::Uuid::new_v4(),
        Duration::from_secs(30),
    )
    .await
    .expect("check");
    let checks: Vec<SegmentCheck> = seen.iter().map(|h| h.check).collect();
    assert_eq!(
        checks,
        [
            SegmentCheck::Work,
            SegmentCheck::Mismatch,
            SegmentCheck::Mismatch,
            SegmentCheck::Work,
            SegmentCheck::Work,
        ]
    );
}

#[tokio::test]
async fn cancel_and_fail_end_a_job_once() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let a = create_job(&pool, &plan(1, 2), "wav", 0)
        .await
        .expect("create");
    assert!(cancel_job(&pool, a).await.expect("cancel"));
    assert!(!cancel_job(&pool, a).await.expect("cancel again"));
    assert!(
        !fail_job(&pool, a, "x", "y")
            .await
            .expect("fail after cancel")
    );
    assert_eq!(counters(&pool, a).await.0, JobState::Cancelled);
    // A late record of a cancelled job's segment records nothing and does not revive it.
    record_segment(&pool, a, &rec(0, "w"))
        .await
        .expect("record");
    assert_eq!(counters(&pool, a).await.0, JobState::Cancelled);

    let b = create_job(&pool, &plan(1, 2), "wav", 0)
        .await
        .expect("create");
    record_segment(&pool, b, &rec(0, "w"))
        .await
        .expect("record");
    assert!(
        fail_job(
            &pool,
            b,
            "dead_letter",
            "segment 1 failed 5 times: espeak error"
        )
        .await
        .expect("fail")
    );
    let s = job_status(&pool, b)
        .await
        .expect("status")
        .expect("exists")
        .summary;
    assert_eq!(s.state, JobState::Failed);
    assert_eq!(s.failure_kind.as_deref(), Some("dead_letter"));
    assert_eq!(
        s.failure_reason.as_deref(),
        Some("segment 1 failed 5 times: espeak error")
    );
    assert!(s.latency_seconds.is_some());
    assert!(
        !finish_job(&pool, b, 1.0).await.expect("finish"),
        "not assembling"
    );

    let nobody = narrator_db::Uuid::new_v4();
    assert!(matches!(
        cancel_job(&pool, nobody).await,
        Err(DbError::JobNotFound(j)) if j == nobody
    ));
    assert!(job_status(&pool, nobody).await.expect("status").is_none());
}

#[tokio::test]
async fn recording_into_an_ended_job_changes_nothing_and_says_so() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let job = create_job(&pool, &plan(1, 3), "wav", 0)
        .await
        .expect("create");
    let out = record_segments(&pool, job, &[packed(0, "pack-a", 0)])
        .await
        .expect("record");
    assert_eq!((out.recorded, out.job_ended), (vec![0], false));
    assert!(cancel_job(&pool, job).await.expect("cancel"));
    // A batch that stored its pack after the cancel (even after the storage was released)
    // records none of it: no record points at the pack, so its caller deletes it.
    let late = [packed(1, "pack-b", 0), packed(2, "pack-b", 44_144)];
    let out = record_segments(&pool, job, &late).await.expect("late");
    assert_eq!(out.newly_done, 0);
    assert!(out.recorded.is_empty(), "{:?}", out.recorded);
    assert!(out.job_ended);
    assert!(!out.job_complete);
    assert_eq!(counters(&pool, job).await, (JobState::Cancelled, 1, 1.0));
    let done = finished_segments(&pool, job).await.expect("finished");
    assert_eq!(done.len(), 1);
    assert_eq!(
        done[0].packed.as_ref().map(|p| p.key.as_str()),
        Some("pack-a")
    );
    let pending: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM segments WHERE job_id = $1 AND state = 'pending' \
         AND pack_key IS NULL",
    )
    .bind(job)
    .fetch_one(&pool)
    .await
    .expect("pending");
    assert_eq!(pending, 2, "the late segments are untouched");
    // One at a time, and into a failed job, the same.
    assert!(
        !record_segment(&pool, job, &rec(1, "w"))
            .await
            .expect("one")
            .newly_done
    );
    let failed = create_job(&pool, &plan(1, 2), "wav", 0)
        .await
        .expect("create");
    assert!(fail_job(&pool, failed, "x", "y").await.expect("fail"));
    let out = record_segments(&pool, failed, &[rec(0, "w"), rec(1, "w")])
        .await
        .expect("into failed");
    assert!(out.job_ended && out.recorded.is_empty() && out.newly_done == 0);
    assert_eq!(counters(&pool, failed).await, (JobState::Failed, 0, 0.0));
}

#[tokio::test]
async fn a_job_is_created_with_its_settings_and_trace_in_one_call() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    use narrator_db::{JobSettings, create_job_with, job_trace, load_job};
    let settings = JobSettings {
        sentence_pause_ms: 300,
        paragraph_pause_ms: 700,
        chapter_pause_ms: 2000,
        chapter_files: true,
        subtitles: vec!["srt".into(), "vtt".into()],
        speed: Some(1.5),
        scales: Some(narrator_core::Scales {
            noise: 0.3,
            length: 0.8,
            noise_w: 0.4,
        }),
        epub3: Some("word".into()),
    };
    let trace = narrator_core::TraceContext {
        traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
        tracestate: Some("vendor=1".into()),
    };
    let job = create_job_with(&pool, &plan(1, 2), "mp3", 3, &settings, Some(&trace))
        .await
        .expect("create");
    // Right after creation, with no other call: what a reconciler publishing it now reads.
    assert_eq!(load_job(&pool, job).await.expect("load").settings, settings);
    assert_eq!(job_trace(&pool, job).await.expect("trace"), Some(trace));
    // A worker's delivery check reads the rate and the exact scales the job id was hashed
    // with: its synthesizer runs the segment with them, whatever its own flags.
    let key = narrator_db::DeliveryKey {
        job,
        index: 0,
        returned: false,
        content: None,
    };
    let seen = narrator_db::check_deliveries(
        &pool,
        &[key],
        narrator_db::Uuid::new_v4(),
        Duration::from_secs(30),
    )
    .await
    .expect("check");
    assert_eq!(
        (seen[0].speed, seen[0].scales),
        (settings.speed, settings.scales)
    );
    // Without them: the defaults, no trace.
    let plain = create_job(&pool, &plan(1, 2), "wav", 0)
        .await
        .expect("create");
    let stored = load_job(&pool, plain).await.expect("load");
    assert_eq!(stored.settings, JobSettings::default());
    assert_eq!(job_trace(&pool, plain).await.expect("trace"), None);
}

#[tokio::test]
async fn a_job_claimed_for_pruning_cannot_be_retried() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    use narrator_db::{RetryOutcome, claim_prune, delete_ended_job, retry_job};
    let job = create_job(&pool, &plan(1, 2), "wav", 0)
        .await
        .expect("create");
    record_segment(&pool, job, &packed(0, "pack-a", 0))
        .await
        .expect("record");
    assert!(fail_job(&pool, job, "x", "y").await.expect("fail"));
    // Rows go only after a claim (and the objects' deletion it comes before).
    assert!(!delete_ended_job(&pool, job).await.expect("unclaimed"));
    assert!(claim_prune(&pool, job).await.expect("claim"));
    assert!(claim_prune(&pool, job).await.expect("claim again"));
    // The prune deletes the job's objects now; a retry in between is refused, and the
    // job stays as it was (failed, its done segment pointing at the pack being deleted).
    assert_eq!(
        retry_job(&pool, job).await.expect("retry"),
        RetryOutcome::Pruning
    );
    assert_eq!(counters(&pool, job).await, (JobState::Failed, 1, 1.0));
    assert!(delete_ended_job(&pool, job).await.expect("delete"));
    assert!(job_status(&pool, job).await.expect("status").is_none());

    // A job retried before the claim is running again: not claimed, not deleted.
    let other = create_job(&pool, &plan(1, 2), "wav", 0)
        .await
        .expect("create");
    assert!(fail_job(&pool, other, "x", "y").await.expect("fail"));
    assert!(matches!(
        retry_job(&pool, other).await.expect("retry"),
        RetryOutcome::Retried(_)
    ));
    assert!(!claim_prune(&pool, other).await.expect("claim"));
    assert!(!delete_ended_job(&pool, other).await.expect("delete"));
    assert_eq!(counters(&pool, other).await.0, JobState::Queued);
}

#[tokio::test]
async fn constraint_violations_are_domain_errors() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let mut p = plan(1, 3);
    p.segments[2].index = 1;
    let e = create_job(&pool, &p, "wav", 0)
        .await
        .expect_err("duplicate index");
    assert!(matches!(e, DbError::DuplicateSegment(_)), "{e:?}");
    assert_eq!(e.kind(), "duplicate_segment");
    let mut empty = plan(1, 1);
    empty.segments.clear();
    let e = create_job(&pool, &empty, "wav", 0)
        .await
        .expect_err("empty");
    assert_eq!(e.kind(), "empty_job");
    // Neither left a job behind: the transaction rolled back.
    assert!(list_jobs(&pool, 10).await.expect("list").is_empty());
}

#[tokio::test]
async fn the_state_store_seam_records_into_postgres() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let p = plan(1, 3);
    let job = create_job(&pool, &p, "wav", 0).await.expect("create");
    let any = PgStateStore::new(pool.clone());
    any.record_segment(&job.to_string(), &rec(0, "w"))
        .await
        .expect("record");
    any.record_segment(&job.to_string(), &rec(0, "w"))
        .await
        .expect("record twice is harmless");
    let e = any
        .finished_segments("digest-abc")
        .await
        .expect_err("not a uuid");
    assert_eq!(e.kind, "bad_job_id");
    assert!(e.message.contains("not a job id"), "{}", e.message);

    let bound = PgStateStore::for_job(pool.clone(), job)
        .await
        .expect("bind");
    bound
        .record_segment("digest-abc", &rec(2, "w"))
        .await
        .expect("content id");
    let idx: Vec<_> = bound
        .finished_segments(&job.to_string())
        .await
        .expect("finished")
        .iter()
        .map(|r| r.index)
        .collect();
    assert_eq!(idx, [0, 2]);
    let e = bound
        .finished_segments(&narrator_db::Uuid::new_v4().to_string())
        .await
        .expect_err("other job");
    assert_eq!(e.kind, "wrong_job");
    assert_eq!(counters(&pool, job).await.1, 2);
}

#[tokio::test]
async fn fifteen_hundred_segments_insert_in_one_statement() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let p = plan(12, 125);
    let t = Instant::now();
    let job = create_job(&pool, &p, "opus", 0).await.expect("create");
    let took = t.elapsed();
    eprintln!(
        "create_job with 1500 segments: {:.1} ms",
        took.as_secs_f64() * 1e3
    );
    let s = job_status(&pool, job)
        .await
        .expect("status")
        .expect("exists");
    assert_eq!(s.summary.segments_total, 1500);
    assert_eq!(s.chapters.len(), 12);
    let unpublished: i64 = sqlx::query_scalar("SELECT segments_unpublished::bigint FROM jobs")
        .fetch_one(&pool)
        .await
        .expect("counter");
    assert_eq!(unpublished, 1500);
    // Generous bound: catches a regression to one INSERT per row on a loaded machine.
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

fn bench_row(hardware: &str, rtf: f64) -> narrator_db::BenchRow {
    narrator_db::BenchRow {
        host: "h1".into(),
        hardware: hardware.into(),
        device: "cpu".into(),
        voice: "en_US-joe-medium".into(),
        rtf_single: rtf,
        rtf_batched: rtf / 2.0,
        batched_at: 4,
        max_stable_concurrency: 3,
        latency_target_seconds: 2.0,
        report: serde_json::json!({"batch_sweep": [{"batch": 1, "rtf": rtf}]}),
    }
}

#[tokio::test]
async fn the_fleet_table_is_the_newest_run_per_hardware_and_voice() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    use narrator_db::{bench_table_exists, fleet_bench, record_bench};
    assert!(bench_table_exists(&pool).await.expect("check"));
    assert!(fleet_bench(&pool).await.expect("empty").is_empty());
    let old = record_bench(&pool, &bench_row("RTX 3090 (24 GiB)", 0.4))
        .await
        .expect("a");
    let new = record_bench(&pool, &bench_row("RTX 3090 (24 GiB)", 0.3))
        .await
        .expect("b");
    let cpu = record_bench(&pool, &bench_row("Xeon (2 cores)", 0.07))
        .await
        .expect("c");
    assert!(new > old);
    let mut other = bench_row("Xeon (2 cores)", 0.9);
    other.voice = "en_GB-other".into();
    record_bench(&pool, &other).await.expect("d");
    let fleet = fleet_bench(&pool).await.expect("fleet");
    let rows: Vec<(&str, &str, i64)> = fleet
        .iter()
        .map(|b| (b.row.voice.as_str(), b.row.hardware.as_str(), b.id))
        .collect();
    // By voice, then fastest batched RTF first; the 3090's older run is not listed.
    assert_eq!(
        rows,
        [
            ("en_GB-other", "Xeon (2 cores)", new + 2),
            ("en_US-joe-medium", "Xeon (2 cores)", cpu),
            ("en_US-joe-medium", "RTX 3090 (24 GiB)", new),
        ]
    );
    let r = &fleet[2].row;
    assert_eq!(*r, bench_row("RTX 3090 (24 GiB)", 0.3));
    // The database's own checks refuse nonsense figures.
    let mut bad = bench_row("X", 0.1);
    bad.batched_at = 0;
    assert!(record_bench(&pool, &bad).await.is_err());
}

fn worker_row(id: &str, instance: narrator_db::Uuid) -> WorkerInfo {
    WorkerInfo {
        id: id.into(),
        host: "h".into(),
        device: "cpu".into(),
        hardware: serde_json::json!({}),
        plan: serde_json::json!([]),
        instance: Some(instance),
        stale_after: None,
    }
}

#[tokio::test]
async fn migrate_makes_one_cluster_id() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let a = narrator_db::cluster_id(&pool).await.expect("cluster id");
    assert_eq!(narrator_db::cluster_id(&pool).await.expect("again"), a);
    // A second row is refused: one database, one cluster.
    assert!(
        sqlx::query("INSERT INTO cluster (singleton) VALUES (true)")
            .execute(&pool)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn an_assembly_claimed_by_a_process_that_restarted_under_its_id_is_taken_over() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let stale = Duration::from_secs(30);
    let job = create_job(&pool, &plan(1, 1), "wav", 0)
        .await
        .expect("create");
    record_segment(&pool, job, &rec(0, "w1"))
        .await
        .expect("record");
    let (first, second) = (narrator_db::Uuid::new_v4(), narrator_db::Uuid::new_v4());
    heartbeat(&pool, &worker_row("host:1", first), 1)
        .await
        .expect("beat");
    assert!(
        narrator_db::claim_assembly_for(&pool, job, "host:1", first)
            .await
            .expect("claim")
    );
    // While the claimer's process beats, nobody takes it over.
    let other = narrator_db::Uuid::new_v4();
    heartbeat(&pool, &worker_row("other:1", other), 0)
        .await
        .expect("beat");
    let taken = narrator_db::take_over_assemblies(&pool, "other:1", other, stale)
        .await
        .expect("sweep");
    assert!(taken.is_empty(), "a live claim is kept: {taken:?}");
    // The process dies; a new one starts under the same id and beats at once. Its id
    // is fresh, but the claim names the dead instance: taken over without waiting.
    heartbeat(&pool, &worker_row("host:1", second), 0)
        .await
        .expect("beat");
    let taken = narrator_db::take_over_assemblies(&pool, "other:1", other, stale)
        .await
        .expect("sweep");
    assert_eq!(taken, [job]);
    let (assembler, instance): (String, narrator_db::Uuid) =
        sqlx::query_as("SELECT assembler, assembler_instance FROM jobs WHERE id = $1")
            .bind(job)
            .fetch_one(&pool)
            .await
            .expect("row");
    assert_eq!((assembler.as_str(), instance), ("other:1", other));
}

#[tokio::test]
async fn a_worker_is_judged_gone_by_its_own_heartbeat_not_the_observers() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    use narrator_db::{DeliveryKey, check_deliveries};
    let job = create_job(&pool, &plan(1, 2), "wav", 0)
        .await
        .expect("create");
    record_segment(&pool, job, &rec(0, "slow:1"))
        .await
        .expect("record");
    // A worker beating every 10 s (gone after 60 s) holds segment 1 in its engine and,
    // once segment 0 is its last, would claim the assembly; it was last seen 20 s ago.
    let slow = narrator_db::Uuid::new_v4();
    let mut row = worker_row("slow:1", slow);
    row.stale_after = Some(Duration::from_secs(60));
    heartbeat(&pool, &row, 1).await.expect("beat");
    let listed = narrator_db::list_workers(&pool, Duration::from_secs(600))
        .await
        .expect("workers");
    assert_eq!(listed[0].info.stale_after, Some(Duration::from_secs(60)));
    narrator_db::mark_in_engine(&pool, slow, &[(job, 1)], true)
        .await
        .expect("mark");
    sqlx::query(
        "UPDATE jobs SET state = 'assembling', assembler = 'slow:1', assembler_instance = $1, \
                 assembly_started_at = now() - interval '20 seconds' WHERE id = $2",
    )
    .bind(slow)
    .bind(job)
    .execute(&pool)
    .await
    .expect("claimed");
    sqlx::query("UPDATE workers SET last_seen = now() - interval '20 seconds' WHERE id = 'slow:1'")
        .execute(&pool)
        .await
        .expect("age");
    // A peer beating every second (its own stale: 6 s) sees a live worker: no takeover,
    // no crash counted against the segment it holds.
    let fast = narrator_db::Uuid::new_v4();
    let six = Duration::from_secs(6);
    let taken = narrator_db::take_over_assemblies(&pool, "fast:1", fast, six)
        .await
        .expect("sweep");
    assert!(taken.is_empty(), "a live claim is kept: {taken:?}");
    let key = [DeliveryKey {
        job,
        index: 1,
        returned: false,
        content: None,
    }];
    let seen = check_deliveries(&pool, &key, fast, six)
        .await
        .expect("check");
    assert_eq!(seen[0].engine_crashes, 0, "{seen:?}");
    // Past its own 60 s it is gone, for every observer.
    for aged in [
        "UPDATE workers SET last_seen = now() - interval '61 seconds' WHERE id = 'slow:1'",
        "UPDATE jobs SET assembly_started_at = now() - interval '61 seconds'",
    ] {
        sqlx::query(aged).execute(&pool).await.expect("age");
    }
    let seen = check_deliveries(&pool, &key, fast, Duration::from_secs(3600))
        .await
        .expect("check");
    assert_eq!(seen[0].engine_crashes, 1, "{seen:?}");
    let taken = narrator_db::take_over_assemblies(&pool, "fast:1", fast, Duration::from_secs(3600))
        .await
        .expect("sweep");
    assert_eq!(taken, [job]);
}

#[tokio::test]
async fn a_postponed_assembly_waits_for_its_time_then_is_claimed_again() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let me = narrator_db::Uuid::new_v4();
    heartbeat(&pool, &worker_row("w", me), 0)
        .await
        .expect("beat");
    let job = create_job(&pool, &plan(1, 1), "wav", 0)
        .await
        .expect("create");
    record_segment(&pool, job, &rec(0, "w"))
        .await
        .expect("record");
    assert!(
        narrator_db::claim_assembly_for(&pool, job, "w", me)
            .await
            .expect("claim")
    );
    // An outage is not charged; a transient error of the job's own is.
    assert!(
        narrator_db::postpone_assembly(&pool, job, "S3 away", Duration::from_secs(3600), false)
            .await
            .expect("postpone")
    );
    assert_eq!(
        narrator_db::assembly_attempts(&pool, job).await.expect("n"),
        0
    );
    assert!(
        !narrator_db::claim_assembly_for(&pool, job, "w", me)
            .await
            .expect("claim")
    );
    sqlx::query("UPDATE jobs SET state = 'assembling' WHERE id = $1")
        .bind(job)
        .execute(&pool)
        .await
        .expect("assembling again");
    assert!(
        narrator_db::postpone_assembly(
            &pool,
            job,
            "encoder hiccup",
            Duration::from_secs(3600),
            true
        )
        .await
        .expect("postpone")
    );
    assert_eq!(
        narrator_db::assembly_attempts(&pool, job).await.expect("n"),
        1
    );
    assert_eq!(counters(&pool, job).await.0, JobState::Running);
    assert!(
        !narrator_db::claim_assembly_for(&pool, job, "w", me)
            .await
            .expect("too early")
    );
    let swept = narrator_db::take_over_assemblies(&pool, "w", me, Duration::from_secs(30))
        .await
        .expect("sweep");
    assert!(swept.is_empty(), "not before its retry time");
    sqlx::query("UPDATE jobs SET assembly_retry_at = now() - interval '1 second'")
        .execute(&pool)
        .await
        .expect("time passes");
    let swept = narrator_db::take_over_assemblies(&pool, "w", me, Duration::from_secs(30))
        .await
        .expect("sweep");
    assert_eq!(swept, [job]);
}

/// A look at the voice: `missing` messages no one accounts for, `ready` per lane.
fn look(missing: u32, accounted: [u64; 2]) -> narrator_db::LossLook {
    narrator_db::LossLook {
        accounted,
        missing,
        min_age: Duration::from_secs(60),
        retry_quiet: Duration::from_secs(360),
        stale: Duration::from_secs(30),
    }
}

/// Moves every segment's publish and engine times, and the jobs' times, back by `secs`.
async fn age_by(pool: &PgPool, secs: f64) {
    sqlx::query(
        "UPDATE segments SET published_at = published_at - make_interval(secs => $1), \
           engine_at = engine_at - make_interval(secs => $1), \
           done_at = done_at - make_interval(secs => $1)",
    )
    .bind(secs)
    .execute(pool)
    .await
    .expect("age segments");
    sqlx::query(
        "UPDATE jobs SET created_at = created_at - make_interval(secs => $1), \
           progress_at = progress_at - make_interval(secs => $1)",
    )
    .bind(secs)
    .execute(pool)
    .await
    .expect("age jobs");
}

#[tokio::test]
async fn a_lost_segment_is_rescued_once_per_lease_then_given_up() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let voice = "en_US-joe-medium";
    let job = create_job(&pool, &plan(1, 4), "wav", 0)
        .await
        .expect("create");
    // Its window: 0..=2 published; 3 waits for the dispatch, not for rescues.
    mark_published(&pool, job, &[0, 1, 2])
        .await
        .expect("published");
    record_segment(&pool, job, &rec(1, "w"))
        .await
        .expect("record");
    // Published too recently to judge, though nothing accounts for it.
    let r = narrator_db::rescue_lost_segments(&pool, voice, look(2, [0, 0]), 2)
        .await
        .expect("scan");
    assert!(r.is_empty());
    age_by(&pool, 3600.0).await;
    // Another voice's loss is not this job's.
    let other = narrator_db::rescue_lost_segments(&pool, "x", look(2, [0, 0]), 2)
        .await
        .expect("scan");
    assert!(other.is_empty());
    // Both out are accounted for (ready or held): nothing is lost.
    let none = narrator_db::rescue_lost_segments(&pool, voice, look(2, [2, 0]), 2)
        .await
        .expect("scan");
    assert!(none.is_empty());
    // One of the two accounted for: the older one (first in, first out) is the lost one.
    let r = narrator_db::rescue_lost_segments(&pool, voice, look(2, [1, 0]), 2)
        .await
        .expect("scan");
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].job, job);
    let idx: Vec<u32> = r[0].segments.iter().map(|s| s.index).collect();
    assert_eq!(idx, [0], "the older published pending segment");
    // Rescued: young again, so a second watchdog (another worker) finds nothing.
    let again = narrator_db::rescue_lost_segments(&pool, voice, look(2, [0, 0]), 2)
        .await
        .expect("scan");
    let idx: Vec<u32> = again
        .iter()
        .flat_map(|r| r.segments.iter().map(|s| s.index))
        .collect();
    assert_eq!(idx, [2], "only the one not rescued a moment ago");
    // Lost again and again: after 2 rescues a segment is given up, with a reason.
    age_by(&pool, 3600.0).await;
    let second = narrator_db::rescue_lost_segments(&pool, voice, look(1, [0, 0]), 2)
        .await
        .expect("scan");
    assert_eq!((second[0].segments.len(), second[0].given_up), (1, 0));
    age_by(&pool, 3600.0).await;
    let third = narrator_db::rescue_lost_segments(&pool, voice, look(2, [0, 0]), 2)
        .await
        .expect("scan");
    assert_eq!((third[0].segments.len(), third[0].given_up), (1, 1));
    age_by(&pool, 3600.0).await;
    let fourth = narrator_db::rescue_lost_segments(&pool, voice, look(2, [0, 0]), 2)
        .await
        .expect("scan");
    assert_eq!((fourth[0].segments.len(), fourth[0].given_up), (0, 1));
    record_segment(&pool, job, &rec(3, "w"))
        .await
        .expect("record");
    let ended = narrator_db::fail_settled_jobs(&pool).await.expect("settle");
    assert_eq!(ended, [job]);
    let st = job_status(&pool, job).await.expect("status").expect("job");
    assert!(
        st.summary
            .failure_reason
            .as_deref()
            .unwrap_or("")
            .contains("lost 2 times"),
        "{:?}",
        st.summary.failure_reason
    );
}

/// Item 1 of issue 42: a book waiting behind a backlog is never charged a rescue. The
/// waiting book was submitted long ago and has recorded nothing for an hour: its window
/// is ready in the queue, published after the front of the lane. The other book made
/// progress a moment ago (its later segments were delivered and recorded) but lost a
/// segment published before them. Rescued again and again, the waiting book keeps every
/// segment (no rescue, no failure) and the lost one is found each time. Judged by the
/// jobs that stalled longest (the old rescue), the waiting book took every rescue: its
/// whole window published again, then failed `lost`.
#[tokio::test]
async fn a_rescue_finds_the_lost_segment_and_never_charges_a_waiting_book() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let voice = "en_US-joe-medium";
    let busy = create_job(&pool, &plan(1, 8), "wav", 0)
        .await
        .expect("create");
    // The busy book's first four go out; then the waiting book's window behind them.
    mark_published(&pool, busy, &[0, 1, 2, 3])
        .await
        .expect("published");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let waiting = create_job(&pool, &plan(1, 8), "wav", 0)
        .await
        .expect("create");
    mark_published(&pool, waiting, &[0, 1, 2, 3, 4, 5, 6, 7])
        .await
        .expect("published");
    sqlx::query(
        "UPDATE jobs SET created_at = now() - interval '2 hours', progress_at = NULL \
         WHERE id = $1",
    )
    .bind(waiting)
    .execute(&pool)
    .await
    .expect("old");
    age_by(&pool, 600.0).await;
    // The busy book's 1, 2 and 3 were delivered and recorded: its segment 0, published
    // before them in the same lane, is lost. The waiting book's 8 are ready.
    for i in 1..4 {
        record_segment(&pool, busy, &rec(i, "w"))
            .await
            .expect("record");
    }
    let rescued = |r: Vec<narrator_db::Rescue>| -> Vec<(narrator_db::Uuid, Vec<u32>)> {
        r.iter()
            .map(|r| (r.job, r.segments.iter().map(|s| s.index).collect()))
            .collect()
    };
    let r = narrator_db::rescue_lost_segments(&pool, voice, look(1, [8, 0]), 3)
        .await
        .expect("rescue");
    assert_eq!(rescued(r), [(busy, vec![0])], "the lost one");
    // The copy is lost too, and the watchdog looks again and again while the waiting
    // book's window is still ready: the copy is now behind it in the queue, so nothing
    // can be judged lost yet, and the waiting book is left alone.
    for round in 0..4 {
        age_by(&pool, 600.0).await;
        let r = narrator_db::rescue_lost_segments(&pool, voice, look(1, [8, 0]), 3)
            .await
            .expect("rescue");
        assert_eq!(
            rescued(r),
            [],
            "round {round}: nothing can be judged lost yet"
        );
    }
    // The waiting book's window is delivered and recorded: the copy's loss shows.
    for i in 0..8 {
        record_segment(&pool, waiting, &rec(i, "w"))
            .await
            .expect("record");
    }
    age_by(&pool, 600.0).await;
    let r = narrator_db::rescue_lost_segments(&pool, voice, look(1, [0, 0]), 3)
        .await
        .expect("rescue");
    assert_eq!(rescued(r), [(busy, vec![0])], "the lost copy");
    let (rescues, failed): (i64, i64) = sqlx::query_as(
        "SELECT coalesce(sum(rescues), 0)::bigint, count(*) FILTER (WHERE state = 'failed') \
         FROM segments WHERE job_id = $1",
    )
    .bind(waiting)
    .fetch_one(&pool)
    .await
    .expect("waiting book");
    assert_eq!(
        (rescues, failed),
        (0, 0),
        "the waiting book was never charged"
    );
}

#[tokio::test]
async fn a_retry_gives_every_failed_segment_a_whole_new_budget() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    use narrator_db::{DeliveryKey, RetryOutcome, check_deliveries, retry_job};
    let job = create_job(&pool, &plan(1, 3), "wav", 0)
        .await
        .expect("create");
    record_segment(&pool, job, &rec(2, "w"))
        .await
        .expect("record");
    let me = narrator_db::Uuid::new_v4();
    let stale = Duration::from_secs(30);
    let delivery = |index, returned| DeliveryKey {
        job,
        index,
        returned,
        content: None,
    };
    // Segment 0 came back from dying consumers twice, and one died with it in its engine;
    // segment 1 was lost and published again three times (job-wide rescues too). Then
    // both failed, each for its own reason, and the job with them.
    for _ in 0..2 {
        check_deliveries(&pool, &[delivery(0, true)], me, stale)
            .await
            .expect("returned");
    }
    sqlx::query("UPDATE segments SET engine_by = $2 WHERE job_id = $1 AND idx = 0")
        .bind(job)
        .bind(narrator_db::Uuid::new_v4())
        .execute(&pool)
        .await
        .expect("in a dead engine");
    let seen = check_deliveries(&pool, &[delivery(0, false)], me, stale)
        .await
        .expect("crash noticed");
    assert_eq!((seen[0].engine_crashes, seen[0].returns), (1, 2));
    sqlx::query(
        "UPDATE segments SET state = 'failed', failure_kind = CASE idx WHEN 0 THEN 'engine_crash' \
           ELSE 'lost' END, failure_reason = 'x', rescues = CASE idx WHEN 1 THEN 3 ELSE 0 END \
         WHERE job_id = $1 AND idx < 2",
    )
    .bind(job)
    .execute(&pool)
    .await
    .expect("fail the segments");
    sqlx::query("UPDATE jobs SET rescues = 3 WHERE id = $1")
        .bind(job)
        .execute(&pool)
        .await
        .expect("rescued");
    let ended = narrator_db::fail_settled_jobs(&pool).await.expect("settle");
    assert_eq!(ended, [job]);

    let RetryOutcome::Retried(again) = retry_job(&pool, job).await.expect("retry") else {
        panic!("a failed job is retried");
    };
    assert_eq!(again.iter().map(|s| s.index).collect::<Vec<_>>(), [0, 1]);
    // Their next deliveries reach an engine with nothing counted against them.
    let seen = check_deliveries(&pool, &[delivery(0, false), delivery(1, false)], me, stale)
        .await
        .expect("check");
    for (k, h) in seen.iter().enumerate() {
        assert_eq!(h.check, narrator_db::SegmentCheck::Work, "segment {k}");
        assert_eq!((h.engine_crashes, h.returns), (0, 0), "segment {k}: {h:?}");
    }
    let (seg_rescues, job_rescues): (i64, i32) = sqlx::query_as(
        "SELECT (SELECT sum(rescues) FROM segments WHERE job_id = $1), \
                (SELECT rescues FROM jobs WHERE id = $1)",
    )
    .bind(job)
    .fetch_one(&pool)
    .await
    .expect("counters");
    assert_eq!((seg_rescues, job_rescues), (0, 0));
    // Status keeps no old counter: with a worker alive, it does not say the segments were
    // published again.
    heartbeat(&pool, &worker_row("w:1", me), 0)
        .await
        .expect("beat");
    let st = job_status(&pool, job).await.expect("status").expect("job");
    assert!(
        !st.waiting
            .as_deref()
            .unwrap_or("")
            .contains("published again"),
        "{:?}",
        st.waiting
    );
}

/// The counters on the job row (`segments_failed`, per-chapter progress) read what the
/// job's segments say, after every kind of transition.
async fn assert_counters_agree(pool: &PgPool, job: narrator_db::Uuid, step: &str) {
    let counted: (i64, Vec<i64>, Vec<f64>) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM segments WHERE job_id = $1 AND state = 'failed'), \
           (SELECT array_agg((SELECT count(*) FROM segments s WHERE s.job_id = $1 \
              AND s.chapter = c AND s.state = 'done') ORDER BY c) FROM generate_series(0, 1) c), \
           (SELECT array_agg((SELECT coalesce(sum(audio_seconds), 0) FROM segments s \
              WHERE s.job_id = $1 AND s.chapter = c AND s.state = 'done') ORDER BY c) \
            FROM generate_series(0, 1) c)",
    )
    .bind(job)
    .fetch_one(pool)
    .await
    .expect("count");
    let unpublished: (i32, i64) = sqlx::query_as(
        "SELECT segments_unpublished, (SELECT count(*) FROM segments WHERE job_id = $1 \
           AND published_at IS NULL AND state = 'pending') FROM jobs WHERE id = $1",
    )
    .bind(job)
    .fetch_one(pool)
    .await
    .expect("unpublished");
    assert_eq!(
        i64::from(unpublished.0),
        unpublished.1,
        "{step}: unpublished"
    );
    let st = job_status(pool, job).await.expect("status").expect("job");
    assert_eq!(
        st.summary.segments_failed as i64, counted.0,
        "{step}: failed"
    );
    let done: Vec<i64> = st
        .chapters
        .iter()
        .map(|c| i64::from(c.segments_done))
        .collect();
    assert_eq!(done, counted.1, "{step}: chapters done");
    let audio: Vec<f64> = st.chapters.iter().map(|c| c.audio_seconds).collect();
    assert_eq!(audio, counted.2, "{step}: chapters' audio");
}

#[tokio::test]
async fn the_counters_on_a_job_follow_its_segments_through_every_transition() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    use narrator_db::{RetryOutcome, fail_segment, fail_settled_jobs, retry_job};
    let job = create_job(&pool, &plan(2, 3), "wav", 0)
        .await
        .expect("create");
    assert_counters_agree(&pool, job, "created").await;
    mark_published(&pool, job, &[0, 3, 2])
        .await
        .expect("published");
    assert_counters_agree(&pool, job, "three published").await;
    // One batch across both chapters.
    record_segments(&pool, job, &[rec(3, "w"), rec(0, "w")])
        .await
        .expect("record");
    assert_counters_agree(&pool, job, "batch").await;
    assert!(
        fail_segment(&pool, job, 1, 3, "engine", "bad")
            .await
            .expect("fail")
    );
    assert_counters_agree(&pool, job, "failed once").await;
    // Failed again (a redelivered dead letter): still one failed segment.
    fail_segment(&pool, job, 1, 4, "engine", "bad again")
        .await
        .expect("fail again");
    assert_counters_agree(&pool, job, "failed twice").await;
    // A failed segment recorded done after all (a late record): done, not failed.
    record_segment(&pool, job, &rec(1, "w"))
        .await
        .expect("late");
    assert_counters_agree(&pool, job, "failed, then done").await;
    for i in [2, 4] {
        fail_segment(&pool, job, i, 3, "engine", &format!("reason {i}"))
            .await
            .expect("fail");
    }
    assert_counters_agree(&pool, job, "two failed").await;
    assert!(
        fail_settled_jobs(&pool).await.expect("settle").is_empty(),
        "segment 5 is still pending"
    );
    record_segment(&pool, job, &rec(5, "w"))
        .await
        .expect("last");
    assert_eq!(fail_settled_jobs(&pool).await.expect("settle"), [job]);
    let st = job_status(&pool, job).await.expect("status").expect("job");
    assert_eq!(
        st.summary.failure_reason.as_deref(),
        Some(
            format!(
                "2 of 6 segments failed (first: segment 2: reason 2); fix the cause, then run \
                 `narrator retry {job}`"
            )
            .as_str()
        )
    );
    let RetryOutcome::Retried(again) = retry_job(&pool, job).await.expect("retry") else {
        panic!("a failed job is retried");
    };
    assert_eq!(again.len(), 2);
    assert_counters_agree(&pool, job, "retried").await;
    let outstanding = || async {
        narrator_db::voice_outstanding(&pool, &[plan(2, 3).voice], Duration::from_secs(30))
            .await
            .expect("outstanding")[0]
            .outstanding
    };
    assert_eq!(
        outstanding().await,
        0,
        "retried segments are not published yet"
    );
    mark_published(&pool, job, &[2, 4])
        .await
        .expect("published");
    assert_counters_agree(&pool, job, "published again").await;
    assert_eq!(outstanding().await, 2);
}

#[tokio::test]
async fn the_voices_served_are_those_of_live_workers_plans() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let mut a = worker_row("a", narrator_db::Uuid::new_v4());
    a.plan = serde_json::json!([{"voice": "kokoro", "held": 2}, {"voice": "en_US-joe-medium"}]);
    let mut b = worker_row("b", narrator_db::Uuid::new_v4());
    b.plan = serde_json::json!([{"voice": "en_US-joe-medium"}]);
    let mut gone = worker_row("gone", narrator_db::Uuid::new_v4());
    gone.plan = serde_json::json!([{"voice": "old-voice"}]);
    let mut odd = worker_row("odd", narrator_db::Uuid::new_v4());
    odd.plan = serde_json::json!({"max_batch": 1});
    for w in [&a, &b, &gone, &odd] {
        heartbeat(&pool, w, 0).await.expect("beat");
    }
    sqlx::query("UPDATE workers SET last_seen = now() - interval '5 minutes' WHERE id = 'gone'")
        .execute(&pool)
        .await
        .expect("age");
    let voices = narrator_db::served_voices(&pool, Duration::from_secs(60))
        .await
        .expect("voices");
    assert_eq!(voices, ["en_US-joe-medium", "kokoro"]);
}

/// The dispatch front of `job`: where a resume claim starts.
async fn dispatch_front(pool: &PgPool, job: narrator_db::Uuid) -> i32 {
    sqlx::query_scalar(
        "SELECT coalesce((SELECT dispatch_from FROM job_dispatch WHERE job_id = $1), 0)",
    )
    .bind(job)
    .fetch_one(pool)
    .await
    .expect("front")
}

/// Claims `limits` of `job` and, when `commit`, marks what it took published and commits
/// (else rolls back); returns the indices taken.
async fn claim_once(
    pool: &PgPool,
    job: narrator_db::Uuid,
    limits: ClaimLimits,
    commit: bool,
) -> Vec<u32> {
    let mut tx = pool.begin().await.expect("tx");
    let claimed = claim_dispatch(&mut tx, job, limits)
        .await
        .expect("claim")
        .expect("running");
    let idx = indices(&claimed);
    if commit {
        mark_published(&mut *tx, job, &idx).await.expect("mark");
        tx.commit().await.expect("commit");
    } else {
        tx.rollback().await.expect("rollback");
    }
    idx
}

/// The reconciler asks only for jobs whose window has room for a run (half the window, at
/// most 64; less when that is all the job has left), as its claim would judge it, with
/// each lane's window.
#[tokio::test]
async fn dispatch_candidates_skip_jobs_without_room_for_a_run() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let voice = "en_US-joe-medium".to_string();
    let job = create_job(&pool, &plan(2, 50), "wav", 0)
        .await
        .expect("create");
    let due = |windows: [u32; 2]| {
        let pool = pool.clone();
        let voices = vec![(voice.clone(), windows)];
        async move {
            dispatch_candidates(&pool, &voices, Duration::ZERO, 10)
                .await
                .expect("scan")
                .into_iter()
                .map(|(j, _)| j)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        due([8, 8]).await,
        [job],
        "nothing out: a whole window of room"
    );
    assert_eq!(
        claim_once(&pool, job, ClaimLimits::fill(8), true)
            .await
            .len(),
        8
    );
    assert!(due([8, 8]).await.is_empty(), "the window is full");
    record_segments(&pool, job, &[rec(0, "w"), rec(1, "w"), rec(2, "w")])
        .await
        .expect("record");
    assert!(due([8, 8]).await.is_empty(), "room for 3, a run is 4");
    record_segment(&pool, job, &rec(3, "w"))
        .await
        .expect("record");
    assert_eq!(due([8, 8]).await, [job], "room for a run");
    assert!(
        due([4, 64]).await.is_empty(),
        "a normal-lane job's window is the first"
    );
    // A job of the high lane is judged by the high lane's window.
    let high = create_job(&pool, &plan(1, 20), "wav", 5)
        .await
        .expect("create");
    assert_eq!(
        claim_once(&pool, high, ClaimLimits::fill(8), true)
            .await
            .len(),
        8
    );
    assert_eq!(due([8, 16]).await, [job, high]);
    assert_eq!(due([16, 8]).await, [job]);
    // All it has left is less than a run: room for that is enough.
    let small = create_job(&pool, &plan(1, 10), "wav", 0)
        .await
        .expect("create");
    assert_eq!(
        claim_once(&pool, small, ClaimLimits::fill(8), true)
            .await
            .len(),
        8
    );
    let records: Vec<_> = (0..7).map(|i| rec(i, "w")).collect();
    record_segments(&pool, small, &records)
        .await
        .expect("record");
    // small: 1 out, 2 left, room 7 with a window of 8 (run 4).
    assert_eq!(due([8, 8]).await, [job, small]);
}

/// The reconciler's claim starts at the job's dispatch front (where the claims before it
/// reached), not at index 0; a rolled-back claim leaves the front where it was, a claim
/// that comes up short because a segment below the front is unpublished sets it back to
/// 0, and a retry (failed segments unpublished again) does too.
#[tokio::test]
async fn a_resume_claim_starts_at_the_dispatch_front_and_a_retry_resets_it() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let job = create_job(&pool, &plan(2, 10), "wav", 0)
        .await
        .expect("create");
    assert_eq!(dispatch_front(&pool, job).await, 0);
    assert_eq!(
        claim_once(&pool, job, ClaimLimits::fill(4), true).await,
        [0, 1, 2, 3]
    );
    assert_eq!(dispatch_front(&pool, job).await, 4, "submit's first window");
    let records: Vec<_> = (0..4).map(|i| rec(i, "w")).collect();
    record_segments(&pool, job, &records).await.expect("record");
    // Rolled back: its segments stay unpublished and the front stays below them.
    assert_eq!(
        claim_once(&pool, job, ClaimLimits::resume(4), false).await,
        [4, 5, 6, 7]
    );
    assert_eq!(
        dispatch_front(&pool, job).await,
        4,
        "the rollback took the move back"
    );
    assert_eq!(
        claim_once(&pool, job, ClaimLimits::resume(4), true).await,
        [4, 5, 6, 7]
    );
    assert_eq!(dispatch_front(&pool, job).await, 8);
    // A worker's top-up from a recorded index at or below the front moves it too.
    let records: Vec<_> = (4..8).map(|i| rec(i, "w")).collect();
    record_segments(&pool, job, &records).await.expect("record");
    assert_eq!(
        claim_once(&pool, job, ClaimLimits::after_recording(4, 7), true).await,
        [8, 9, 10, 11]
    );
    assert_eq!(dispatch_front(&pool, job).await, 12);
    // One from past the front does not (it may step over unpublished segments): the
    // next resume claim takes what it stepped over.
    assert_eq!(
        claim_once(&pool, job, ClaimLimits::after_recording(16, 14), true).await,
        [14, 15, 16, 17, 18, 19]
    );
    assert_eq!(dispatch_front(&pool, job).await, 12);
    assert_eq!(
        claim_once(&pool, job, ClaimLimits::resume(16), true).await,
        [12, 13]
    );
    assert_eq!(dispatch_front(&pool, job).await, 14);
    // A segment below the front unpublished behind the claims' back: the resume claim
    // finds nothing from the front, sets it back to 0, and the next one finds it.
    sqlx::query("UPDATE segments SET published_at = NULL WHERE job_id = $1 AND idx = 9")
        .bind(job)
        .execute(&pool)
        .await
        .expect("unpublish");
    assert_eq!(
        claim_once(&pool, job, ClaimLimits::resume(16), true).await,
        Vec::<u32>::new()
    );
    assert_eq!(dispatch_front(&pool, job).await, 0);
    assert_eq!(
        claim_once(&pool, job, ClaimLimits::resume(16), true).await,
        [9]
    );
    assert_eq!(dispatch_front(&pool, job).await, 10);
    assert_counters_agree(&pool, job, "resumed").await;
    // A failed job retried: its segments not done are unpublished again, from index 8.
    assert!(fail_job(&pool, job, "x", "y").await.expect("fail"));
    assert!(matches!(
        narrator_db::retry_job(&pool, job).await.expect("retry"),
        narrator_db::RetryOutcome::Retried(_)
    ));
    assert_eq!(
        dispatch_front(&pool, job).await,
        0,
        "the retry reset the front"
    );
    assert_eq!(
        claim_once(&pool, job, ClaimLimits::resume(16), true).await,
        (8..20).collect::<Vec<_>>()
    );
    assert_eq!(dispatch_front(&pool, job).await, 20);
    assert_counters_agree(&pool, job, "retried").await;
}

/// The job gauges read the unfinished jobs and those finished in the last hour through
/// their indexes: 2,000 jobs finished a day ago are not read, nor counted.
#[tokio::test]
async fn voice_gauges_do_not_read_the_finished_jobs_kept() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let queued = create_job(&pool, &plan(1, 2), "wav", 0)
        .await
        .expect("create");
    sqlx::query(
        "INSERT INTO jobs (id, content_id, title, source, voice, format, state, segments_total, \
           segments_done, created_at, finished_at) \
         SELECT gen_random_uuid(), 'c', 't', 's', 'en_US-joe-medium', 'wav', \
           CASE WHEN i % 4 = 0 THEN 'failed' ELSE 'done' END, 1, \
           CASE WHEN i % 4 = 0 THEN 0 ELSE 1 END, \
           now() - interval '2 days', now() - interval '1 day' \
         FROM generate_series(1, 2000) i",
    )
    .execute(&pool)
    .await
    .expect("old jobs");
    sqlx::query(
        "INSERT INTO jobs (id, content_id, title, source, voice, format, state, segments_total, \
           segments_done, created_at, finished_at) \
         SELECT gen_random_uuid(), 'c', 't', 's', 'en_US-joe-medium', 'wav', 'done', 1, 1, \
           now() - interval '20 minutes', now() - interval '10 minutes' \
         FROM generate_series(1, 3)",
    )
    .execute(&pool)
    .await
    .expect("recent jobs");
    sqlx::query("ANALYZE jobs")
        .execute(&pool)
        .await
        .expect("analyze");
    // The transaction's own table statistics: what this statement read of `jobs`.
    let mut tx = pool.begin().await.expect("tx");
    let gauges = narrator_db::voice_gauges(&mut *tx, Duration::from_secs(3600))
        .await
        .expect("gauges");
    let (seq_read, idx_fetched): (i64, i64) = sqlx::query_as(
        "SELECT coalesce(seq_tup_read, 0), coalesce(idx_tup_fetch, 0) \
         FROM pg_stat_xact_user_tables WHERE relname = 'jobs'",
    )
    .fetch_one(&mut *tx)
    .await
    .expect("stats");
    tx.rollback().await.expect("rollback");
    assert_eq!(gauges.len(), 1);
    let g = &gauges[0];
    assert_eq!(g.voice, "en_US-joe-medium");
    let by_state: std::collections::BTreeMap<&str, i64> =
        g.by_state.iter().map(|(s, n)| (s.as_str(), *n)).collect();
    assert_eq!(
        by_state,
        [
            ("assembling", 0),
            ("cancelled", 0),
            ("done", 3),
            ("failed", 0),
            ("queued", 1),
            ("running", 0)
        ]
        .into_iter()
        .collect(),
        "every state, the finished ones of the last hour"
    );
    assert_eq!(g.stalled, 0);
    assert!(g.oldest_unfinished_seconds < 600.0);
    assert_eq!(seq_read, 0, "no sequential scan of jobs");
    assert!(
        idx_fetched <= 10,
        "read {idx_fetched} jobs through indexes: the queued one and the 3 recent"
    );
    let _ = queued;
}

/// Rows of workers not seen for a day are deleted; the others stay.
#[tokio::test]
async fn rows_of_workers_gone_a_day_are_deleted() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    for id in ["live", "gone", "quiet"] {
        heartbeat(&pool, &worker_row(id, narrator_db::Uuid::new_v4()), 0)
            .await
            .expect("beat");
    }
    sqlx::query("UPDATE workers SET last_seen = now() - interval '2 days' WHERE id = 'gone'")
        .execute(&pool)
        .await
        .expect("age");
    sqlx::query("UPDATE workers SET last_seen = now() - interval '2 hours' WHERE id = 'quiet'")
        .execute(&pool)
        .await
        .expect("age");
    let day = Duration::from_secs(24 * 3600);
    assert_eq!(
        narrator_db::forget_workers(&pool, day)
            .await
            .expect("forget"),
        1
    );
    let ids: Vec<String> = sqlx::query_scalar("SELECT id FROM workers ORDER BY id")
        .fetch_all(&pool)
        .await
        .expect("ids");
    assert_eq!(ids, ["live", "quiet"]);
    assert_eq!(
        narrator_db::forget_workers(&pool, day)
            .await
            .expect("again"),
        0
    );
}

/// `job.progress`: written for a running job whose finished segments moved, at once the
/// first time, then not more often than asked; nothing while nothing moves.
#[tokio::test]
async fn progress_is_noted_when_segments_move_and_not_more_often_than_asked() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let job = create_job(&pool, &plan(1, 4), "opus", 0)
        .await
        .expect("create");
    let note = |every: u64| narrator_db::note_progress(&pool, Duration::from_secs(every));
    assert_eq!(note(0).await.expect("note"), 0, "nothing done yet");
    record_segment(&pool, job, &rec(0, "w1"))
        .await
        .expect("record");
    sqlx::query("UPDATE jobs SET state = 'running' WHERE id = $1 AND state = 'queued'")
        .bind(job)
        .execute(&pool)
        .await
        .expect("running");
    assert_eq!(note(3600).await.expect("note"), 1, "the first at once");
    assert_eq!(note(0).await.expect("note"), 0, "nothing moved since");
    record_segment(&pool, job, &rec(1, "w1"))
        .await
        .expect("record");
    assert_eq!(
        note(3600).await.expect("note"),
        0,
        "too soon after the last"
    );
    assert_eq!(note(0).await.expect("note"), 1);
    let mut conn = pool.acquire().await.expect("conn");
    let events = narrator_db::claim_events(&mut conn, 10)
        .await
        .expect("claim");
    let kinds: Vec<(&str, &str)> = events
        .iter()
        .map(|e| (e.kind.as_str(), e.state.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("queued", "queued"),
            ("progress", "running"),
            ("progress", "running")
        ]
    );
    assert_eq!(events[2].details.as_ref().map(|d| d.segments_done), Some(2));
}
