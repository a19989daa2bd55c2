//! Faults, with the real services and real processes: a worker on the wrong database,
//! duplicate deliveries processed at once, segments lost by the broker, an assembler
//! that died and came back under the same id, the object store down while a job is
//! assembled. Every test ends with `check_job`: the job `done` with no action beyond
//! removing the fault, every segment once and in order, figures that agree with the
//! audio, nothing intermediate left behind. docs/RELIABILITY.md names the promise each
//! test keeps.

use std::process::Command;
use std::time::{Duration, Instant};

use lapin::options::{BasicAckOptions, BasicGetOptions};
use narrator_broker::{Publisher, SegmentMessage, work_queue};
use narrator_db::{JobState, Uuid};
use narrator_test_support::{
    PrivatePostgres, PrivateRabbit, PrivateS3, Services, VOICE, World, book_text, check_job,
    eventually,
};

fn segments_of(w: &World, job: Uuid) -> Vec<narrator_core::Segment> {
    w.rt.block_on(narrator_db::load_job(&w.pool, job))
        .expect("job")
        .plan
        .segments
}

fn cluster_of(w: &World) -> String {
    w.rt.block_on(narrator_db::cluster_id(&w.pool))
        .expect("cluster id")
        .to_string()
}

/// Waits until the job's assembly failed for now and was postponed (not failed), and
/// `status` says so.
fn wait_postponed_assembly(w: &World, job: Uuid) {
    eventually(Duration::from_secs(60), "the assembly postponed", || {
        w.rt.block_on(
            sqlx::query_scalar::<_, bool>(
                "SELECT assembly_retry_at IS NOT NULL FROM jobs WHERE id = $1",
            )
            .bind(job)
            .fetch_one(&w.pool),
        )
        .expect("retry time")
    });
    let st = w.status(job);
    assert_eq!(st["state"], "running", "not failed: {st}");
    let waiting = st["waiting"].as_str().unwrap_or("");
    assert!(waiting.contains("assembly failed for now"), "{st}");
}

/// Promise 2: a worker never acts on a database that is not its queue's.
#[test]
fn a_worker_on_another_database_leaves_the_messages_and_says_why_in_one_line() {
    let mut w = World::new();
    let other = w.other_database();
    let book = w.book("wrong.md", &book_text(1, 4, None));
    let job = w.submit(&book, &["--format", "wav"]);
    let total = segments_of(&w, job).len() as u32;
    assert_eq!(w.queue_ready(&work_queue(VOICE)), total);

    let wrong = w.spawn_worker(
        "wrong",
        &["--engine", "null"],
        &[("NARRATOR_DATABASE_URL", other.as_str())],
    );
    let status = w.wait_exit(wrong, Duration::from_secs(60));
    let log = w.worker_log("wrong");
    assert!(!status.success(), "the worker must fail: {log}");
    let errors: Vec<&str> = log.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "one error line: {log}");
    assert!(
        errors[0].contains("is cluster") && errors[0].contains("left the message in the queue"),
        "{}",
        errors[0]
    );
    assert!(!log.contains("panicked"), "{log}");
    // Nothing was acknowledged or recorded: every message is back, the job untouched.
    eventually(
        Duration::from_secs(10),
        "messages back in the queue",
        || w.queue_ready(&work_queue(VOICE)) == total,
    );
    assert_eq!(w.state(job), JobState::Queued);

    // The right worker then does the job.
    w.worker("right", &["--engine", "null"], &[]);
    w.ok(&["status", &job.to_string(), "--wait"]);
    check_job(&w, job, false);
}

/// Promise 3: duplicates processed at the same time cannot corrupt. Every segment is
/// published three times before two workers start; round-robin delivery hands copies
/// of one segment to both, which synthesize them at once (the voice's noise makes the
/// copies differ in length). Whichever copy is recorded, the audio it points at is the
/// one it describes; the losers' objects are deleted.
#[test]
fn duplicate_deliveries_processed_at_once_leave_audio_and_figures_in_agreement() {
    let mut w = World::new();
    let book = w.book("dup.md", &book_text(2, 5, None));
    let job = w.submit(&book, &["--format", "wav"]);
    let segments = segments_of(&w, job);
    let cluster = cluster_of(&w);
    w.rt.block_on(async {
        let conn = narrator_broker::connect(&w.amqp_url).await.expect("amqp");
        let publisher = Publisher::new(&conn).await.expect("publisher");
        let copies: Vec<SegmentMessage> = segments
            .iter()
            .flat_map(|s| {
                (0..2).map(|_| {
                    SegmentMessage::new(job.to_string(), VOICE, s.clone()).in_cluster(&cluster)
                })
            })
            .collect();
        publisher
            .publish_batch(&copies)
            .await
            .expect("publish copies");
        let _ = conn.close(200, "ok".into()).await;
    });
    let args = [
        "--keep-intermediates",
        "--pack-max",
        "1",
        "--prefetch",
        "64",
    ];
    w.spawn_worker("d1", &args, &[]);
    w.spawn_worker("d2", &args, &[]);
    w.ok(&["status", &job.to_string(), "--wait"]);
    check_job(&w, job, true);
    // The job can finish while a losing copy is still between its upload and its
    // delete; a copy is acknowledged only after that delete, so wait until every copy
    // has been settled before listing.
    eventually(Duration::from_secs(60), "every copy settled", || {
        w.queue_ready(&work_queue(VOICE)) == 0
            && w.consumer_holdings()
                .iter()
                .all(|&(_, unacked)| unacked == 0)
    });
    // Every object left is one a record points at: the losers' copies are gone.
    let store = w.store();
    let packs =
        w.rt.block_on(store.list(&store.intermediate_prefixes(&job.to_string())[1]))
            .expect("list");
    let records =
        w.rt.block_on(narrator_db::finished_segments(&w.pool, job))
            .expect("records");
    let mut pointed: Vec<String> = records
        .iter()
        .filter_map(|r| r.packed.as_ref().map(|p| p.key.clone()))
        .collect();
    pointed.sort();
    pointed.dedup();
    assert_eq!(packs, pointed, "only the recorded copies are stored");
    let discarded = w
        .worker_log("d1")
        .matches("another copy was recorded first")
        .count()
        + w.worker_log("d2")
            .matches("another copy was recorded first")
            .count();
    eprintln!(
        "{} segments, {} copies each: {discarded} losing copies deleted",
        segments.len(),
        3
    );
}

/// Promise 1: no job is ever stuck. Two of a job's messages are lost (taken off the
/// queue and dropped, as a broker that lost its disk or dead-lettered them would); the
/// worker's watchdog notices two messages of the voice missing, finds which (the lane's
/// front passed them a lease ago) and publishes them again.
#[test]
fn segments_lost_by_the_broker_are_published_again_after_a_lease() {
    let mut w = World::new();
    let book = w.book("lost.md", &book_text(1, 6, None));
    let job = w.submit(&book, &["--format", "wav"]);
    let lost = w.rt.block_on(async {
        let conn = narrator_broker::connect(&w.amqp_url).await.expect("amqp");
        let ch = conn.create_channel().await.expect("channel");
        let mut lost = Vec::new();
        for _ in 0..2 {
            let m = ch
                .basic_get(
                    work_queue(VOICE).as_str().into(),
                    BasicGetOptions { no_ack: false },
                )
                .await
                .expect("basic.get")
                .expect("a message");
            lost.push(
                SegmentMessage::decode(&m.delivery.data)
                    .expect("message")
                    .segment
                    .index,
            );
            m.delivery
                .acker
                .ack(BasicAckOptions::default())
                .await
                .expect("ack");
        }
        let _ = conn.close(200, "ok".into()).await;
        lost
    });
    w.worker("watch", &["--engine", "null", "--lease", "3"], &[]);
    eventually(Duration::from_secs(30), "the others done", || {
        w.done_count(job) == 4
    });
    w.ok(&["status", &job.to_string(), "--wait"]);
    check_job(&w, job, false);
    let log = w.worker_log("watch");
    assert!(log.contains("were lost; publishing them again"), "{log}");
    let rescues: i32 =
        w.rt.block_on(
            sqlx::query_scalar("SELECT rescues FROM jobs WHERE id = $1")
                .bind(job)
                .fetch_one(&w.pool),
        )
        .expect("rescues");
    assert!(rescues >= 1, "lost {lost:?}, rescues {rescues}");
}

/// Promise 1, assembly: a job left `assembling` by a process that died is taken over,
/// also when its worker comes back under the same id (a container's hostname) and
/// beats at once. The crash point is set in the database (an assembly claimed by a
/// process instance that no longer runs), exactly what a SIGKILL mid-assembly leaves.
#[test]
fn an_assembly_of_a_dead_process_is_taken_over_by_its_successor_under_the_same_id() {
    let mut w = World::new();
    let book = w.book("orphan.md", &book_text(2, 3, None));
    let first = w.worker("host:1", &["--engine", "null", "--keep-intermediates"], &[]);
    let job = w.submit(&book, &["--format", "wav"]);
    w.ok(&["status", &job.to_string(), "--wait"]);
    assert!(w.stop(first, 15).success());
    // The first process "died" while assembling: its claim names its instance.
    w.rt.block_on(
        sqlx::query(
            "UPDATE jobs SET state = 'assembling', assembler = 'host:1', \
             assembler_instance = gen_random_uuid(), assembly_started_at = now(), \
             finished_at = NULL, outputs = '[]' WHERE id = $1",
        )
        .bind(job)
        .execute(&w.pool),
    )
    .expect("crash point");
    let st = w.status(job);
    assert!(
        st["waiting"]
            .as_str()
            .unwrap_or("")
            .contains("no worker has been seen")
            || st["waiting"].as_str().unwrap_or("").contains("is gone"),
        "status says what the job waits on: {st}"
    );
    // The same id comes back: without instance checks its fresh heartbeat would keep the
    // dead claim alive for ever.
    w.worker("host:1", &["--engine", "null", "--keep-intermediates"], &[]);
    w.wait_state(job, JobState::Done, Duration::from_secs(60));
    check_job(&w, job, true);
}

/// Promise 4: a transient fault during assembly is retried, not fatal. The object store
/// is down when the job is assembled: the assembly is postponed (the status says so),
/// and the job finishes by itself once the store is back.
#[test]
fn an_object_store_outage_during_assembly_postpones_it_and_the_job_finishes_after() {
    let mut w = World::new();
    let mut s3 = PrivateS3::start(9017);
    w.use_s3_endpoint(&s3.endpoint());
    let book = w.book("outage.md", &book_text(2, 3, None));
    let first = w.worker("s3a", &["--engine", "null", "--keep-intermediates"], &[]);
    let job = w.submit(&book, &["--format", "wav"]);
    w.wait_state(job, JobState::Done, Duration::from_secs(60));
    assert!(w.stop(first, 15).success());
    // A worker that started with the store up; then the store goes away, and the job is
    // back to "every segment done, not assembled yet".
    w.worker("s3b", &["--engine", "null", "--keep-intermediates"], &[]);
    s3.down();
    w.rt.block_on(
        sqlx::query(
            "UPDATE jobs SET state = 'running', assembler = NULL, assembler_instance = NULL, \
             finished_at = NULL, outputs = '[]' WHERE id = $1",
        )
        .bind(job)
        .execute(&w.pool),
    )
    .expect("reset");
    wait_postponed_assembly(&w, job);
    s3.up();
    w.wait_state(job, JobState::Done, Duration::from_secs(90));
    check_job(&w, job, true);
}

/// Promise 5: an outage shorter than the retry budget loses nothing and charges no
/// attempt. The object store is down while a book's segments are synthesized: every
/// delivery is postponed (not counted), the worker says so once and pauses with
/// backoff, nothing is dead-lettered, and the job finishes once the store is back with
/// every segment on its first attempt.
#[test]
fn an_object_store_outage_while_synthesizing_charges_no_attempt_and_loses_nothing() {
    let mut w = World::new();
    let mut s3 = PrivateS3::start(9018);
    w.use_s3_endpoint(&s3.endpoint());
    w.worker("o1", &["--engine", "null"], &[]);
    s3.down();
    let book = w.book("outage2.md", &book_text(2, 4, None));
    let job = w.submit(&book, &["--format", "wav"]);
    // Longer than the 5 s retry tier: each segment comes back at least once meanwhile.
    eventually(
        Duration::from_secs(60),
        "the worker reports the outage",
        || w.worker_log("o1").contains("a service is away"),
    );
    std::thread::sleep(Duration::from_secs(12));
    assert_eq!(w.done_count(job), 0);
    assert_eq!(w.state(job), JobState::Queued);
    let failed: i64 =
        w.rt.block_on(
            sqlx::query_scalar(
                "SELECT count(*) FROM segments WHERE job_id = $1 AND state = 'failed'",
            )
            .bind(job)
            .fetch_one(&w.pool),
        )
        .expect("failed");
    assert_eq!(failed, 0);
    let plan = w.ok(&["workers", "--json"]);
    let workers: serde_json::Value = serde_json::from_slice(&plan.stdout).expect("json");
    assert_eq!(
        workers[0]["plan"][0]["outage"]["kind"], "store_io",
        "the worker's row shows the outage: {workers}"
    );
    s3.up();
    w.wait_state(job, JobState::Done, Duration::from_secs(120));
    check_job(&w, job, false);
    let log = w.worker_log("o1");
    assert_eq!(
        log.matches("a service is away").count(),
        1,
        "logged once: {log}"
    );
    assert_eq!(log.matches("the service is back").count(), 1, "{log}");
    let attempts: Vec<i32> = w.segment_rows(job).iter().map(|r| r.2).collect();
    assert!(
        attempts.iter().all(|&a| a == 1),
        "no attempt charged: {attempts:?}"
    );
    assert_eq!(w.queue_ready(narrator_broker::DEAD_LETTER_QUEUE), 0);
}

/// Promise 6: a broker restart (stop_app, start_app: an upgrade) is survived by the
/// worker: it consumes again and a book submitted afterwards is done. A broker gone for
/// good ends the worker with an error, so its supervisor restarts it, instead of a worker
/// that idles with a healthy-looking heartbeat.
#[test]
fn a_broker_restart_is_survived_and_a_broker_gone_for_good_stops_the_worker() {
    let rabbit = PrivateRabbit::start(5682);
    let mut w = World::on(Services {
        rabbit_node: Some(rabbit.node.clone()),
        amqp_port: rabbit.port,
        ..Services::shared()
    });
    // The restart is 5 s plus the node's start, which has taken over 10 s on two busy
    // cores: a timeout well above that, so only "gone for good" stops the worker.
    let worker = w.worker("b1", &["--engine", "null", "--broker-timeout", "30"], &[]);
    let first = w.submit(
        &w.book("before.md", &book_text(1, 4, None)),
        &["--format", "wav"],
    );
    w.wait_state(first, JobState::Done, Duration::from_secs(60));
    rabbit.stop_app();
    std::thread::sleep(Duration::from_secs(5));
    rabbit.start_app();
    let second = w.submit(
        &w.book("after.md", &book_text(2, 3, None)),
        &["--format", "wav"],
    );
    w.wait_state(second, JobState::Done, Duration::from_secs(90));
    check_job(&w, first, false);
    check_job(&w, second, false);
    // Gone for good: the worker gives up after --broker-timeout and exits non-zero.
    rabbit.stop_app();
    let status = w.wait_exit(worker, Duration::from_secs(60));
    let log = w.worker_log("b1");
    assert!(!status.success(), "{log}");
    let errors: Vec<&str> = log.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{log}");
    assert!(errors[0].contains("RabbitMQ"), "{}", errors[0]);
}

/// Promise 5 and 6 for the database: Postgres restarts (fast shutdown, as in a failover)
/// while a book is being synthesized. Nothing fails, nothing is dead-lettered, no
/// attempt is charged for the outage, and the job finishes by itself.
#[test]
fn a_database_restart_mid_book_loses_nothing_and_charges_no_attempt() {
    let pg = PrivatePostgres::start(5442);
    let mut w = World::on(Services {
        admin_url: pg.url(),
        ..Services::shared()
    });
    w.worker("p1", &[], &[]);
    let job = w.submit(
        &w.book("pg.md", &book_text(2, 8, None)),
        &["--format", "wav"],
    );
    eventually(Duration::from_secs(120), "the first segments done", || {
        w.done_count(job) >= 2
    });
    assert!(w.done_count(job) < 16, "the outage must come mid-book");
    pg.down();
    std::thread::sleep(Duration::from_secs(8));
    pg.up();
    w.wait_state(job, JobState::Done, Duration::from_secs(180));
    check_job(&w, job, false);
    let (failed, max_attempts): (i64, i32) =
        w.rt.block_on(
            sqlx::query_as(
                "SELECT count(*) FILTER (WHERE state = 'failed'), max(attempts) \
                 FROM segments WHERE job_id = $1",
            )
            .bind(job)
            .fetch_one(&w.pool),
        )
        .expect("segments");
    assert_eq!((failed, max_attempts), (0, 1), "{}", w.logs());
    // The outage reached the worker: either an operation failed (an outage, postponed)
    // or it waited for a connection until the database was back (shorter than the
    // pool's 10 s acquire timeout).
    let log = w.worker_log("p1");
    assert!(
        log.contains("a service is away") || log.contains("time to acquire exceeded"),
        "the worker met the outage: {log}"
    );
    assert_eq!(w.queue_ready(narrator_broker::DEAD_LETTER_QUEUE), 0);
}

/// Promise 6 for the producer: the broker refuses a publish in the middle of a folder
/// (a length limit set by policy, as a full or failing broker would). Every book is
/// still recorded, the output says which are not fully enqueued, and a worker's
/// reconciler enqueues them: every book ends done.
#[test]
fn a_broker_refusing_mid_folder_leaves_every_book_recorded_and_eventually_done() {
    let mut w = World::new();
    let dir = w.tmp.path().join("folder");
    std::fs::create_dir_all(&dir).expect("folder");
    for n in 1..=3 {
        std::fs::write(dir.join(format!("book{n}.md")), book_text(1, 4, None)).expect("book");
    }
    let vhost = w.amqp_url.rsplit('/').next().expect("vhost").to_string();
    let policy = |args: &[&str]| {
        let out = Command::new("rabbitmqctl")
            .args(args)
            .output()
            .expect("rabbitmqctl");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // Declare the queues first (a worker would), then cap them at 6 messages.
    w.rt.block_on(async {
        let conn = narrator_broker::connect(&w.amqp_url).await.expect("amqp");
        let ch = conn.create_channel().await.expect("channel");
        narrator_broker::declare(&ch, VOICE).await.expect("declare");
        let _ = conn.close(200, "ok".into()).await;
    });
    policy(&[
        "-q",
        "set_policy",
        "-p",
        &vhost,
        "cap",
        "^narrator\\.segments\\.",
        r#"{"max-length":6,"overflow":"reject-publish"}"#,
        "--apply-to",
        "queues",
    ]);
    let out = w
        .cmd()
        .args([
            "submit",
            dir.to_str().expect("utf8"),
            "--json",
            "--format",
            "wav",
        ])
        .output()
        .expect("submit");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(lines.len(), 3, "every book recorded: {stdout}");
    let published: Vec<bool> = lines
        .iter()
        .map(|l| l["published"].as_bool().expect("published"))
        .collect();
    // The quorum queue applies its limit loosely (a few messages over it get in): the
    // first book is enqueued, the last is refused.
    assert!(published[0] && !published[2], "{stdout}");
    let refused = published.iter().filter(|p| !**p).count();
    assert!(
        stderr.contains(&format!(
            "{refused} of 3 books are recorded but not fully enqueued"
        )),
        "{stderr}"
    );
    policy(&["-q", "clear_policy", "-p", &vhost, "cap"]);
    w.worker("r1", &["--engine", "null", "--reconcile-after", "1"], &[]);
    for l in &lines {
        let job: Uuid = l["job_id"].as_str().expect("id").parse().expect("uuid");
        w.wait_state(job, JobState::Done, Duration::from_secs(60));
        check_job(&w, job, false);
    }
}

/// Promise 7, the other half: deliveries a worker held but had not started when it was
/// stopped cleanly (SIGTERM) go back to the queue uncharged; the next worker does them
/// on attempt 1.
#[test]
fn prefetched_deliveries_returned_by_a_clean_stop_are_not_charged() {
    let mut w = World::new();
    let job = w.submit(
        &w.book("drain.md", &book_text(2, 8, None)),
        &["--format", "wav"],
    );
    // A slow engine (300 ms a run, one item a run) and a prefetch that holds the book.
    let slow = w.worker(
        "slow",
        &["--engine", "null", "--max-batch", "1", "--prefetch", "32"],
        &[("NARRATOR_TEST_RUN_MS", "300")],
    );
    eventually(Duration::from_secs(60), "a few segments done", || {
        w.done_count(job) >= 2
    });
    assert!(w.stop(slow, 15).success(), "{}", w.worker_log("slow"));
    assert!(w.done_count(job) < 16, "the stop must come mid-book");
    assert!(
        w.worker_log("slow").contains("uncharged"),
        "{}",
        w.worker_log("slow")
    );
    w.worker("fast", &["--engine", "null"], &[]);
    w.wait_state(job, JobState::Done, Duration::from_secs(60));
    check_job(&w, job, false);
    let attempts: Vec<i32> = w.segment_rows(job).iter().map(|r| r.2).collect();
    assert!(attempts.iter().all(|&a| a == 1), "{attempts:?}");
}

/// A small filesystem (tmpfs, mounted by the test: it needs root, as CI and these
/// machines run) used as a worker's temp folder; unmounted on drop.
struct SmallDisk {
    path: std::path::PathBuf,
}

impl SmallDisk {
    fn mount(path: std::path::PathBuf, size: &str) -> Self {
        std::fs::create_dir_all(&path).expect("mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .output()
            .expect("mount");
        assert!(
            out.status.success(),
            "mounting a small tmpfs needs root: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self { path }
    }

    fn resize(&self, size: &str) {
        let out = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.path)
            .output()
            .expect("remount");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).output();
    }
}

/// Promise 4 with a full disk: the worker's temp folder has no room for the book being
/// assembled. The assembly is postponed (not failed); once there is room it finishes.
#[test]
fn a_full_temp_disk_during_assembly_postpones_it_and_the_job_finishes_once_there_is_room() {
    let mut w = World::new();
    let disk = SmallDisk::mount(w.tmp.path().join("small-tmp"), "64k");
    let tmpdir = disk.path.to_str().expect("utf8").to_string();
    w.worker(
        "disk",
        &["--engine", "null"],
        &[("TMPDIR", tmpdir.as_str())],
    );
    let job = w.submit(
        &w.book("full.md", &book_text(2, 3, None)),
        &["--format", "wav"],
    );
    wait_postponed_assembly(&w, job);
    disk.resize("64m");
    w.wait_state(job, JobState::Done, Duration::from_secs(90));
    check_job(&w, job, false);
}

/// Promise 8: priority is honoured. Behind a backlog of 50 books, a book submitted with
/// a higher priority goes to the device in the next batches of every worker serving its
/// voice (its own lane, consumed first, leaving the batcher at once): it is done while
/// most of the backlog still waits, and every worker did some of it.
#[test]
fn a_priority_book_behind_a_backlog_of_50_starts_at_once_on_every_worker() {
    let mut w = World::new();
    let dir = w.tmp.path().join("backlog");
    std::fs::create_dir_all(&dir).expect("folder");
    for n in 1..=50 {
        std::fs::write(dir.join(format!("book{n:02}.md")), book_text(1, 2, None)).expect("book");
    }
    let out = w.ok(&["submit", dir.to_str().expect("utf8"), "--format", "wav"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 50);
    let slow = [("NARRATOR_TEST_RUN_MS", "300")];
    let args = ["--engine", "null", "--max-batch", "2", "--prefetch", "4"];
    w.worker("w1", &args, &slow);
    w.worker("w2", &args, &slow);
    let backlog_done = |w: &World| -> i64 {
        w.rt.block_on(
            sqlx::query_scalar("SELECT count(*) FROM segments WHERE state = 'done'")
                .fetch_one(&w.pool),
        )
        .expect("count")
    };
    eventually(Duration::from_secs(60), "the backlog under way", || {
        backlog_done(&w) >= 4
    });
    let urgent = w.submit(
        &w.book("urgent.md", &book_text(1, 6, None)),
        &["--format", "wav", "--priority", "5"],
    );
    w.wait_state(urgent, JobState::Done, Duration::from_secs(60));
    let urgent_segments = 6;
    let backlog_left = 100 - (backlog_done(&w) - urgent_segments);
    assert!(
        backlog_left >= 60,
        "the priority book waited behind the backlog: only {backlog_left} of 100 backlog segments were left"
    );
    let (workers, first_s): (Vec<String>, f64) = w.rt.block_on(async {
        let workers = sqlx::query_scalar(
            "SELECT DISTINCT worker FROM segments WHERE job_id = $1 ORDER BY worker",
        )
        .bind(urgent)
        .fetch_all(&w.pool)
        .await
        .expect("workers");
        let first = sqlx::query_scalar(
            "SELECT extract(epoch FROM min(s.done_at) - j.created_at)::float8 \
             FROM segments s JOIN jobs j ON j.id = s.job_id WHERE j.id = $1 GROUP BY j.created_at",
        )
        .bind(urgent)
        .fetch_one(&w.pool)
        .await
        .expect("first");
        (workers, first)
    });
    assert_eq!(
        workers,
        ["w1", "w2"],
        "every worker served the priority lane"
    );
    eprintln!(
        "priority book: first segment done {first_s:.2} s after submit (batches of 300 ms), \
         {backlog_left} of 100 backlog segments still waiting when it was done"
    );
    check_job(&w, urgent, false);
}

/// Promise 8 with more workers than a backlog book's window feeds (issue 42, item 5): 4
/// workers taking batches of 32, 20 backlog books, then a 1,000-segment priority book.
/// The priority book's window is the voice's whole depth shared by the high lane's books
/// alone, so once a worker has done its first priority batch, its next batches are the
/// priority book's until fewer than 4 batches of it are left. Cut like a backlog book's
/// (64, the floor, with 21 books running), the window fed two workers' batches and the
/// other two went on with the backlog.
#[test]
fn a_priority_book_takes_every_workers_next_batches_until_it_is_done() {
    let mut w = World::new();
    let dir = w.tmp.path().join("backlog");
    std::fs::create_dir_all(&dir).expect("folder");
    for n in 1..=20 {
        std::fs::write(dir.join(format!("book{n:02}.md")), book_text(1, 200, None)).expect("book");
    }
    let slow = [("NARRATOR_TEST_RUN_MS", "150")];
    let args = ["--engine", "null", "--max-batch", "32", "--prefetch", "64"];
    let ids = ["p1", "p2", "p3", "p4"];
    for id in ids {
        w.worker(id, &args, &slow);
    }
    let out = w.ok(&["submit", dir.to_str().expect("utf8"), "--format", "wav"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 20);
    let done = |w: &World| -> i64 {
        w.rt.block_on(
            sqlx::query_scalar("SELECT count(*) FROM segments WHERE state = 'done'")
                .fetch_one(&w.pool),
        )
        .expect("count")
    };
    eventually(Duration::from_secs(60), "the backlog under way", || {
        done(&w) >= 256
    });
    let urgent = w.submit(
        &w.book("urgent.md", &book_text(10, 100, None)),
        &["--format", "wav", "--priority", "5"],
    );
    w.wait_state(urgent, JobState::Done, Duration::from_secs(120));
    // Per worker: backlog segments it recorded after its first priority segment and
    // before the priority book's last 4 batches (then some workers find its lane empty).
    let rows: Vec<(String, i64, i64)> = w.rt.block_on(async {
        sqlx::query_as(
            "WITH tail AS (SELECT done_at FROM segments WHERE job_id = $1 \
               ORDER BY done_at OFFSET 1000 - 4 * 32 LIMIT 1), \
             firsts AS (SELECT worker, min(done_at) AS first, count(*) AS n FROM segments \
               WHERE job_id = $1 GROUP BY worker) \
             SELECT f.worker, f.n, (SELECT count(*) FROM segments s WHERE s.job_id <> $1 \
               AND s.worker = f.worker AND s.done_at > f.first \
               AND s.done_at < (SELECT done_at FROM tail)) \
             FROM firsts f ORDER BY f.worker",
        )
        .bind(urgent)
        .fetch_all(&w.pool)
        .await
        .expect("per worker")
    });
    eprintln!("per worker (id, priority segments, backlog segments meanwhile): {rows:?}");
    let workers: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(
        workers, ids,
        "every worker served the priority book: {rows:?}"
    );
    for (id, _, backlog) in &rows {
        // Backlog batches already in flight when the first priority batch started may
        // finish after it: at most the worker's batches in flight (2 of 32 here).
        assert!(
            *backlog <= 2 * 32,
            "worker {id} recorded {backlog} backlog segments while the priority book had \
             batches left: {rows:?}"
        );
    }
    check_job(&w, urgent, false);
}

/// Promise 7, a segment that kills its process: the worker dies each time this segment
/// reaches its engine (a crash of the runtime), and a supervisor restarts it under the
/// same id. Deliveries the dead process held are put back uncharged (the broker's count
/// of returns is not theirs); the segments that were in the engine run alone from then
/// on, so only the culprit crashes again; after 3 crashes it is dead-lettered with the
/// reason, and every neighbour is done on attempt 1.
#[test]
fn a_segment_that_kills_its_worker_is_given_up_alone_and_its_neighbours_are_not_charged() {
    let mut w = World::new();
    let book = w.book(
        "killer.md",
        &book_text(
            1,
            8,
            Some((4, "This sentence brings the whole worker down.")),
        ),
    );
    let job = w.submit(&book, &["--format", "wav"]);
    let args = ["--engine", "null", "--max-batch", "4", "--prefetch", "8"];
    let env = [("NARRATOR_TEST_ABORT_TEXT", "brings the whole worker down")];
    let mut current = w.spawn_worker("k:1", &args, &env);
    let mut restarts = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while !w.state(job).is_final() {
        if let Ok(Some(_)) = w.workers[current].try_wait() {
            // A supervisor restarts it under the same id.
            restarts += 1;
            current = w.spawn_worker("k:1", &args, &env);
        }
        assert!(
            Instant::now() < deadline,
            "job stuck: {}\n{}",
            w.status(job),
            w.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(w.state(job), JobState::Failed, "{}", w.logs());
    let rows = w.segment_rows(job);
    for (idx, state, attempts, kind, reason) in rows {
        if idx == 3 {
            assert_eq!(
                (state.as_str(), kind.as_deref()),
                ("failed", Some("engine_crash"))
            );
            assert!(
                reason.as_deref().unwrap_or("").contains("died 3 times"),
                "{reason:?}"
            );
        } else {
            assert_eq!(
                (state.as_str(), attempts),
                ("done", 1),
                "segment {idx}: {kind:?} {reason:?}\n{}",
                w.logs()
            );
        }
    }
    assert_eq!(
        restarts,
        3,
        "one crash per try of the culprit: {}",
        w.logs()
    );
    assert_eq!(w.queue_ready(narrator_broker::DEAD_LETTER_QUEUE), 1);
}

/// Promise 8, the other side: a flood of high-priority books never holds normal-lane
/// deliveries up to the broker's consumer timeout. A private broker whose
/// `consumer_timeout` is 60 s; one worker (one item a run, 100 ms a run, 8 held per
/// lane, `--max-hold 10`); a normal book held from the worker's start, then
/// high-priority books submitted faster than the worker does them for 80 s, past the
/// timeout. The normal deliveries age past 10 s and go ahead of the flood: the normal
/// book advances during the flood, the broker closes no channel, no segment is returned
/// or failed, and the book is done. Without ageing the normal deliveries waited behind
/// the flood until the broker closed the channel (tried with `--max-hold 100000`: after
/// 60 s, "delivery acknowledgement on channel 3 timed out", and the worker loop ended
/// with that error); every delivery it held goes back as a return (the tenth fails a
/// segment as `returned`).
#[test]
fn a_high_priority_flood_never_holds_normal_deliveries_past_the_consumer_timeout() {
    let rabbit = PrivateRabbit::start_with_consumer_timeout(5688, Duration::from_secs(60));
    let mut w = World::on(Services {
        rabbit_node: Some(rabbit.node.clone()),
        amqp_port: rabbit.port,
        ..Services::shared()
    });
    let high_args = ["--format", "wav", "--priority", "5"];
    let mut n = 0;
    let mut submit_high = |w: &World| {
        n += 1;
        let book = w.book(&format!("high{n}.md"), &book_text(1, 30, None));
        w.submit(&book, &high_args)
    };
    // The flood is under way when the worker starts: the normal deliveries it takes
    // wait behind it from the first batch.
    submit_high(&w);
    submit_high(&w);
    let normal = w.submit(
        &w.book("normal.md", &book_text(1, 40, None)),
        &["--format", "wav"],
    );
    let worker = w.worker(
        "flood",
        &[
            "--engine",
            "null",
            "--max-batch",
            "1",
            "--prefetch",
            "8",
            "--max-hold",
            "10",
        ],
        &[("NARRATOR_TEST_RUN_MS", "100")],
    );
    let high_lane = narrator_broker::lane_queue(VOICE, 1);
    let flood = Duration::from_secs(80);
    let start = Instant::now();
    let mut low_water = u32::MAX;
    while start.elapsed() < flood {
        let ready = w.queue_ready(&high_lane);
        if start.elapsed() > Duration::from_secs(5) {
            low_water = low_water.min(ready);
        }
        // About 6 s of work ahead (10 segments a second): a 30-segment book whenever
        // fewer than 60 wait.
        if ready < 60 {
            submit_high(&w);
        }
        assert!(
            w.workers[worker].try_wait().expect("worker").is_none(),
            "the worker exited: {}",
            w.worker_log("flood")
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let normal_during_flood = w.done_count(normal);
    let high_left = w.queue_ready(&high_lane);
    eprintln!(
        "flood of {n} high-priority books for {} s: {normal_during_flood} normal segments \
         done meanwhile; high lane ready: at least {low_water} after the first 5 s, \
         {high_left} at the end",
        flood.as_secs()
    );
    assert!(
        high_left > 0,
        "the flood must last past the consumer timeout"
    );
    assert!(
        normal_during_flood >= 8,
        "the normal lane starved behind the flood: {normal_during_flood} segments done\n{}",
        w.logs()
    );
    let (returns, failed): (i64, i64) =
        w.rt.block_on(
            sqlx::query_as(
                "SELECT coalesce(sum(returns), 0)::int8, \
                   count(*) FILTER (WHERE state = 'failed') FROM segments",
            )
            .fetch_one(&w.pool),
        )
        .expect("returns");
    let log = w.worker_log("flood");
    assert!(
        !log.contains("timed out") && !log.contains("PRECONDITION_FAILED"),
        "the broker closed a channel for a late acknowledgement: {log}"
    );
    assert_eq!((returns, failed), (0, 0), "returned or failed segments");
    w.wait_state(normal, JobState::Done, Duration::from_secs(90));
    check_job(&w, normal, false);
}
