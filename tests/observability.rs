//! Observability, with real parts: an OTLP receiver decoding the real protobuf wire format
//! (gRPC and HTTP/protobuf) receives a book's spans; Debian's Prometheus scrapes a
//! worker during a real job and answers the dashboard's queries; `/readyz` follows the
//! engines' warm-up and the broker connection.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use narrator_test_support::otlp::{OtlpReceiver, ReceivedSpan, Transport};
use narrator_test_support::prometheus::{Prometheus, free_port, http_get};
use narrator_test_support::{
    PrivateRabbit, Services, VOICE, World, book_text, eventually, narrator_db::JobState, root,
};

/// The spans called `name` (a trailing `*` matches any rest: `upload` spans are named
/// `PUT <file>`).
fn named<'a>(spans: &'a [ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    match name.strip_suffix('*') {
        Some(prefix) => spans
            .iter()
            .filter(|s| s.name.starts_with(prefix))
            .collect(),
        None => spans.iter().filter(|s| s.name == name).collect(),
    }
}

/// One book, one trace: `submit` (exported over HTTP/protobuf) starts it; every
/// segment's worker span (exported over gRPC) is a child of it, with its queue wait and
/// phonemizing as children; batch spans are roots that link to every segment they
/// carry; the assembly joins the trace. JSON log lines carry the trace id.
#[test]
fn a_book_is_one_trace_from_submit_through_every_segment_to_the_assembly() {
    let mut w = World::new();
    let http = OtlpReceiver::start(Transport::HttpProtobuf);
    let grpc = OtlpReceiver::start(Transport::Grpc);
    let mut env: Vec<(&str, String)> = grpc.env(Transport::Grpc);
    env.push(("NARRATOR_LOG_FORMAT", "json".into()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    w.worker("t1", &["--engine", "null"], &env);
    let book = w.book("traced.md", &book_text(3, 4, None));
    let submitted = w.submit_json(
        &book,
        &["--format", "wav", "--chapter-files"],
        &http.env(Transport::HttpProtobuf),
    );
    let job: narrator_test_support::narrator_db::Uuid = submitted["job_id"]
        .as_str()
        .expect("job_id")
        .parse()
        .expect("uuid");
    w.wait_state(job, JobState::Done, Duration::from_secs(120));
    let total = w.segment_rows(job).len();
    assert_eq!(total, 12);

    // submit flushed its spans before it exited.
    let exported = http.spans();
    let roots = named(&exported, "submit traced");
    assert_eq!(roots.len(), 1, "{exported:#?}");
    let root = roots[0];
    assert_eq!(root.parent_span_id, "", "submit starts the trace");
    assert_eq!(root.service, "narrator-submit");
    assert_eq!(root.attr("narrator.job_id"), Some(job.to_string().as_str()));
    assert_eq!(
        submitted["trace_id"],
        root.trace_id.as_str(),
        "submit --json names the trace"
    );
    for stage in ["read", "plan", "INSERT jobs", "publish narrator.segments.*"] {
        let s = named(&exported, stage);
        assert_eq!(s.len(), 1, "one {stage} span");
        assert_eq!(s[0].trace_id, root.trace_id, "{stage}");
        assert_eq!(s[0].parent_span_id, root.span_id, "{stage}");
    }
    let publish = named(&exported, "publish narrator.segments.*")[0];
    assert_eq!(publish.attr("messaging.system"), Some("rabbitmq"));

    let spans = grpc.wait_for(Duration::from_secs(30), |s| {
        named(s, "process segment").len() >= total
            && s.iter().any(|x| x.name == "assemble")
            && named(s, "PUT output *").len() >= 4
    });
    // Every segment: one worker span in the book's trace, under submit's span.
    let segments = named(&spans, "process segment");
    let indices: BTreeSet<String> = segments
        .iter()
        .map(|s| s.attr("narrator.segment").unwrap_or_default().to_string())
        .collect();
    assert_eq!(indices.len(), total, "one span per segment");
    let mut segment_ids = BTreeSet::new();
    for s in &segments {
        assert_eq!(s.trace_id, root.trace_id, "segment in the book's trace");
        assert_eq!(s.parent_span_id, root.span_id, "a child of submit's span");
        assert_eq!(s.service, "narrator-worker");
        assert_eq!(s.attr("narrator.job_id"), Some(job.to_string().as_str()));
        segment_ids.insert(s.span_id.clone());
    }
    let children = |name: &str| -> BTreeSet<String> {
        named(&spans, name)
            .iter()
            .filter(|c| c.trace_id == root.trace_id)
            .map(|c| c.parent_span_id.clone())
            .collect()
    };
    assert_eq!(
        children("queue wait"),
        segment_ids,
        "a queue wait per segment"
    );
    assert_eq!(
        children("phonemize"),
        segment_ids,
        "phonemizing per segment"
    );
    assert_eq!(
        children("batch formation"),
        segment_ids,
        "batch formation per segment"
    );
    for wait in named(&spans, "queue wait") {
        assert!(wait.end_ns >= wait.start_ns);
    }

    // Batches: roots of their own traces, linking to every segment they carried.
    let batches = named(&spans, "synthesize batch");
    assert!(
        !batches.is_empty(),
        "{:?}",
        spans
            .iter()
            .map(|s| s.name.as_str())
            .collect::<BTreeSet<_>>()
    );
    let mut linked = BTreeSet::new();
    for b in &batches {
        assert_eq!(b.parent_span_id, "", "a batch span is a root");
        assert_ne!(b.trace_id, root.trace_id);
        for (trace, span) in &b.links {
            assert_eq!(trace, &root.trace_id);
            linked.insert(span.clone());
        }
    }
    assert_eq!(linked, segment_ids, "batches link to every segment");
    let by_id: HashMap<&str, &ReceivedSpan> =
        spans.iter().map(|s| (s.span_id.as_str(), s)).collect();
    let runs = named(&spans, "engine run");
    assert!(!runs.is_empty());
    for run in &runs {
        let parent = by_id
            .get(run.parent_span_id.as_str())
            .expect("engine run parent");
        assert_eq!(
            parent.name, "synthesize batch",
            "an engine run is inside its batch"
        );
        assert!(run.attr("narrator.batch_size").is_some());
        assert!(run.attr("narrator.padded_tokens").is_some());
        assert_eq!(run.attr("narrator.device"), Some("cpu"));
    }
    for stage in ["store and record", "ack"] {
        assert!(
            named(&spans, stage).iter().all(|s| by_id
                .get(s.parent_span_id.as_str())
                .is_some_and(|p| p.name == "synthesize batch")),
            "{stage} under a batch"
        );
    }
    // Store and record join the job's trace.
    let stores = named(&spans, "PUT segment pack");
    assert!(!stores.is_empty() && stores.iter().all(|s| s.trace_id == root.trace_id));
    let records = named(&spans, "INSERT segment figures");
    assert!(!records.is_empty() && records.iter().all(|s| s.trace_id == root.trace_id));

    // The assembly joins the trace: encode per chapter, uploads, fetches.
    let assemble = named(&spans, "assemble");
    assert_eq!(assemble.len(), 1);
    assert_eq!(assemble[0].trace_id, root.trace_id);
    assert_eq!(assemble[0].parent_span_id, root.span_id);
    let encodes = named(&spans, "encode chapter");
    assert_eq!(encodes.len(), 3, "one per chapter");
    assert!(encodes.iter().all(|e| e.trace_id == root.trace_id));
    let uploads = named(&spans, "PUT output *");
    assert_eq!(uploads.len(), 3 + 1, "the chapters and the book");
    assert!(!named(&spans, "GET segment pack").is_empty());

    // Logs and traces join: the assembler's JSON log line carries the trace id.
    let log = w.worker_log("t1");
    let line = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["message"] == "assembling")
        .unwrap_or_else(|| panic!("no JSON `assembling` line: {log}"));
    assert_eq!(line["trace_id"], root.trace_id.as_str(), "{line}");
    assert_eq!(line["span"], "assemble");
    assert_eq!(line["level"], "INFO");
}

/// Prometheus scrapes a worker during a real job (the real voice): its query API returns
/// the segment counter and the engine-time histogram with the values the database
/// holds, every dashboard query (but the GPU ones, on this CPU machine) returns data, and
/// the alert rules load.
#[test]
fn prometheus_scrapes_a_worker_and_its_figures_match_the_database() {
    let mut w = World::new();
    let port = free_port();
    w.worker("m1", &["--listen", &format!("127.0.0.1:{port}")], &[]);
    let prom = Prometheus::scraping(&[format!("127.0.0.1:{port}")]);
    let job = w.submit(
        &w.book("scraped.md", &book_text(2, 4, None)),
        &["--format", "wav"],
    );
    w.wait_state(job, JobState::Done, Duration::from_secs(180));
    let rows =
        w.rt.block_on(narrator_test_support::narrator_db::finished_segments(
            &w.pool, job,
        ))
        .expect("records");
    let db_engine: f64 = rows.iter().map(|r| r.inference_seconds).sum();
    let db_audio: f64 = rows.iter().map(|r| r.audio_seconds).sum();
    let voice = format!("{{voice=\"{VOICE}\"}}");
    eventually(Duration::from_secs(30), "a scrape after the job", || {
        prom.value(&format!("sum(narrator_segments_done_total{voice})")) == Some(rows.len() as f64)
    });
    // The family label the dashboard's by-family panel sums over.
    assert_eq!(
        prom.value("sum(narrator_segments_done_total{family=\"piper\"})"),
        Some(rows.len() as f64)
    );
    let engine = prom
        .value("sum(narrator_engine_run_seconds_sum)")
        .expect("engine-time histogram");
    assert!(
        (engine - db_engine).abs() <= 1e-9 * db_engine.max(1.0),
        "engine seconds: Prometheus {engine}, database {db_engine}"
    );
    let runs = prom
        .value("sum(narrator_engine_run_seconds_count)")
        .expect("runs");
    assert!(
        runs >= 1.0 && runs <= rows.len() as f64,
        "{runs} engine runs"
    );
    let audio = prom
        .value(&format!("sum(narrator_segment_audio_seconds_sum{voice})"))
        .expect("audio");
    assert!(
        (audio - db_audio).abs() <= 1e-9 * db_audio.max(1.0),
        "{audio} vs {db_audio}"
    );
    assert_eq!(prom.value("narrator_ready"), Some(1.0));
    // Round trips counted at the client: every segment delivered and acknowledged once
    // at least, its audio PUT to S3 (in packs) with its bytes.
    for op in ["deliver", "ack"] {
        let n = prom
            .value(&format!(
                "sum(narrator_broker_messages_total{{op=\"{op}\"}})"
            ))
            .unwrap_or(0.0);
        assert!(
            n >= rows.len() as f64,
            "{n} {op} for {} segments",
            rows.len()
        );
    }
    let puts = prom
        .value("sum(narrator_s3_requests_total{method=\"PUT\"})")
        .unwrap_or(0.0);
    assert!(puts >= 1.0, "{puts} S3 PUTs");
    let sent = prom
        .value("sum(narrator_s3_bytes_total{direction=\"sent\"})")
        .unwrap_or(0.0);
    let audio_bytes: f64 = rows.iter().map(|r| r.samples as f64 * 2.0).sum();
    assert!(
        sent >= audio_bytes,
        "{sent} bytes sent to S3 for {audio_bytes} bytes of audio"
    );

    // Every dashboard query but the GPU panels returns data from this scrape (rates need
    // two samples: give them a few seconds).
    std::thread::sleep(Duration::from_secs(4));
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("ops/grafana/narrator.json")).expect("dashboard"),
    )
    .expect("dashboard JSON");
    let mut checked = 0;
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().unwrap_or_default();
        if title.starts_with("GPU") {
            continue;
        }
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            let result = prom.query(expr);
            assert!(
                !result.is_empty(),
                "panel {title:?}: {expr} returned nothing"
            );
            checked += 1;
        }
    }
    assert!(checked >= 20, "{checked} queries checked");
    let rules = prom.rule_names();
    for alert in [
        "NarratorDeadLettersRising",
        "NarratorJobStuck",
        "NarratorCpuFallback",
        "NarratorGpuThermalThrottling",
        "NarratorQueueTooOld",
    ] {
        assert!(
            rules.iter().any(|r| r == alert),
            "{alert} not loaded: {rules:?}"
        );
    }
}

/// The alert rules pass `promtool check rules` and their unit tests.
#[test]
fn the_alert_rules_pass_promtool() {
    for args in [
        ["check", "rules", "ops/prometheus/alerts.yml"],
        ["test", "rules", "ops/prometheus/alerts_test.yml"],
    ] {
        let out = std::process::Command::new("promtool")
            .args(args)
            .current_dir(root())
            .output()
            .expect("promtool (Debian's prometheus package; ops/test.sh installs it)");
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `/readyz` is 503 while the engines load and warm up, 200 once the worker consumes,
/// 503 while the broker connection is lost, 200 again once it is back; `/healthz`
/// stays 200 (the process and its loops are alive).
#[test]
fn readyz_follows_warm_up_and_the_broker_connection() {
    let rabbit = PrivateRabbit::start(5683);
    let mut w = World::on(Services {
        rabbit_node: Some(rabbit.node.clone()),
        amqp_port: rabbit.port,
        ..Services::shared()
    });
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    // The real voice: loading, calibrating and warming up take a while.
    w.spawn_worker(
        "r1",
        &[
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--broker-timeout",
            "120",
        ],
        &[],
    );
    let mut statuses = Vec::new();
    eventually(Duration::from_secs(120), "readyz 200", || {
        let (status, body) = http_get(&format!("{base}/readyz"));
        if status != 0 && statuses.last().map(|(s, _): &(u16, String)| *s) != Some(status) {
            statuses.push((status, body));
        }
        status == 200
    });
    assert_eq!(
        statuses.first().map(|s| s.0),
        Some(503),
        "not ready before warm-up: {statuses:?}"
    );
    assert!(statuses[0].1.contains("engines"), "{statuses:?}");
    assert!(
        w.worker_log("r1").contains(" ready"),
        "ready once the worker started"
    );
    assert_eq!(http_get(&format!("{base}/healthz")).0, 200);

    rabbit.stop_app();
    let mut unready = String::new();
    eventually(
        Duration::from_secs(30),
        "readyz 503 without the broker",
        || {
            let (status, body) = http_get(&format!("{base}/readyz"));
            unready = body;
            status == 503
        },
    );
    let v: serde_json::Value = serde_json::from_str(&unready).expect("JSON body");
    assert_eq!(v["checks"]["broker"]["ok"], false, "{unready}");
    assert_eq!(
        http_get(&format!("{base}/healthz")).0,
        200,
        "alive while reconnecting"
    );
    rabbit.start_app();
    eventually(
        Duration::from_secs(60),
        "readyz 200 with the broker back",
        || http_get(&format!("{base}/readyz")).0 == 200,
    );
    let (_, metrics) = http_get(&format!("{base}/metrics"));
    assert!(metrics.contains("narrator_ready 1"), "{metrics}");
}
