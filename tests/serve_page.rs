//! `narrator serve` with tokens (docs/SERVE.md "Tokens and tenants"): its web page in a
//! real browser (Debian's Chromium driven by playwright-core, `tests/browser/job_page.mjs`,
//! installed by `bash ops/setup.sh --test`), tenants kept apart, OpenAI's package sending
//! its key, speech bounded per tenant, and the refusals.

use std::process::{Command, Stdio};
use std::time::Duration;

use narrator_test_support::{Served, clients_python, http, narrator_bin, root, use_test_data};
use serde_json::{Value, json};

/// `narrator serve --data DATA token add NAME [--tenant T]`: the token it prints.
fn add_token(data: &std::path::Path, name: &str, tenant: Option<&str>) -> String {
    let mut c = Command::new(narrator_bin());
    c.args(["serve", "--data"])
        .arg(data)
        .args(["token", "add", name]);
    if let Some(t) = tenant {
        c.args(["--tenant", t]);
    }
    let out = use_test_data(&mut c).output().expect("token add");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(token.starts_with("nrt_") && token.len() > 60, "{token}");
    // Only its hash is kept.
    let file = std::fs::read_to_string(data.join("tokens.json")).expect("tokens.json");
    assert!(!file.contains(&token), "the token itself is not stored");
    token
}

/// A request with an optional bearer token: status, `Retry-After` or
/// `WWW-Authenticate`, and the body as JSON.
fn call(
    served: &Served,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Option<String>, Value) {
    let r = http::call(&served.url, method, path, token, body);
    (r.status, r.retry_after.or(r.authenticate), r.json)
}

/// The page in Chromium: sign in with a token, the voice's preview plays, a book
/// submitted through the form (by keyboard) is followed live to done, a chapter's player
/// loads with a duration, a download returns the file, every control is labelled, and
/// with JavaScript off the list and the job page still show the work. The job page's
/// screenshot is kept (target/tmp/serve-job-page.png).
#[test]
fn the_web_page_makes_a_book_in_a_real_browser() {
    let node_modules = root().join(".deps/browser-node/node_modules/playwright-core");
    assert!(
        node_modules.exists(),
        "{} is missing: run `bash ops/setup.sh --test` (bash ops/test.sh does)",
        node_modules.display()
    );
    let data = tempfile::tempdir().expect("tempdir");
    let token = add_token(data.path(), "web", None);
    let served = Served::start(&["--data", &data.path().display().to_string()]);
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("serve-job-page.png");
    let _ = std::fs::remove_file(&shot);
    let out = Command::new("node")
        .arg("--preserve-symlinks-main")
        .arg(root().join(".deps/browser-node/job_page.mjs"))
        .arg(&served.url)
        .arg(root().join("examples/sample.md"))
        .arg(&shot)
        .arg(&token)
        .output()
        .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|_| {
            panic!(
                "no JSON from job_page.mjs: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let log = served.log();
    assert_eq!(seen["failure"], Value::Null, "{seen}\n{log}");
    assert_eq!(
        seen["first_url"],
        format!("{}/signin", served.url),
        "{seen}"
    );
    assert_eq!(seen["errors"], json!([]), "no script errors: {seen}");
    assert_eq!(
        seen["unlabelled"],
        json!([]),
        "every control labelled: {seen}"
    );
    assert!(
        seen["preview_seconds"].as_f64().unwrap_or(0.0) > 1.0,
        "{seen}"
    );
    let states = seen["states"].as_array().expect("states");
    assert_eq!(states.last(), Some(&json!("done")), "{seen}");
    assert!(
        states.len() >= 2,
        "the live stream showed the job before it was done: {seen}"
    );
    assert!(
        seen["chapter_seconds"].as_f64().unwrap_or(0.0) > 5.0,
        "{seen}"
    );
    assert_eq!(seen["players"], 3, "the book and its two chapters: {seen}");
    assert_eq!(seen["download_name"], "sample.mp3", "{seen}");
    assert!(
        seen["download_bytes"].as_u64().unwrap_or(0) > 100_000,
        "{seen}"
    );
    assert_eq!(seen["nojs_rows"], 1, "{seen}");
    assert_eq!(seen["nojs_state"], "done", "{seen}");
    assert_eq!(seen["nojs_players"], 3, "{seen}");
    let png = std::fs::read(&shot).expect("the screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "a real screenshot"
    );
    eprintln!("screenshot: {}", shot.display());
}

/// Two tenants: neither sees the other's job; no token or a wrong one is 401 (with
/// `WWW-Authenticate`), `/healthz` and `/readyz` stay open; OpenAI's package speaks with
/// the token as its key and is refused without; a tenant's second speech request while
/// its first is spoken is 429 with `Retry-After` (`--speech-per-tenant 1`), another
/// tenant's is not; without tokens the server refuses to listen beyond loopback.
#[test]
fn tokens_keep_tenants_apart() {
    let data = tempfile::tempdir().expect("tempdir");
    let alice = add_token(data.path(), "alice", None);
    let bob = add_token(data.path(), "bob", Some("b-team"));
    let served = Served::start(&[
        "--data",
        &data.path().display().to_string(),
        "--speech-per-tenant",
        "1",
    ]);
    let (status, auth, v) = call(&served, "GET", "/v1/jobs", None, None);
    assert_eq!(
        (status, &v["error"]["code"]),
        (401, &json!("missing_token")),
        "{v}"
    );
    assert!(auth.is_some_and(|a| a.starts_with("Bearer")));
    let (status, _, v) = call(&served, "GET", "/v1/jobs", Some("nrt_wrong"), None);
    assert_eq!(
        (status, &v["error"]["code"]),
        (401, &json!("invalid_token")),
        "{v}"
    );
    for open in ["/healthz", "/readyz"] {
        let (status, _, _) = call(&served, "GET", open, None, None);
        assert_eq!(status, 200, "{open}");
    }
    // /metrics needs a token too (no --metrics-open).
    let (status, _, _) = call(&served, "GET", "/metrics", None, None);
    assert_eq!(status, 401);

    let (status, _, job) = call(
        &served,
        "POST",
        "/v1/jobs",
        Some(&alice),
        Some(json!({"text": "Alice's own book. It is short."})),
    );
    assert_eq!(status, 201, "{job}");
    assert_eq!(job["tenant"], "alice", "{job}");
    let id = job["id"].as_str().expect("id");
    let (status, _, v) = call(&served, "GET", &format!("/v1/jobs/{id}"), Some(&bob), None);
    assert_eq!(
        (status, &v["error"]["code"]),
        (404, &json!("job_not_found")),
        "{v}"
    );
    let (status, _, _) = call(
        &served,
        "POST",
        &format!("/v1/jobs/{id}/cancel"),
        Some(&bob),
        None,
    );
    assert_eq!(status, 404);
    let (_, _, list) = call(&served, "GET", "/v1/jobs", Some(&bob), None);
    assert_eq!(list["data"], json!([]), "{list}");
    let (_, _, list) = call(&served, "GET", "/v1/jobs", Some(&alice), None);
    assert_eq!(list["data"][0]["id"], job["id"], "{list}");

    // OpenAI's package, its key the token.
    let dir = tempfile::tempdir().expect("tempdir");
    let speech = |key: &str, out: &str| -> (i32, Value) {
        let run = Command::new(clients_python())
            .arg(root().join("examples/clients/openai_speech.py"))
            .arg(format!("{}/v1", served.url))
            .arg(dir.path().join(out))
            .args(["--format", "wav", "--api-key", key])
            .output()
            .expect("openai_speech.py");
        let stdout = String::from_utf8_lossy(&run.stdout);
        (
            run.status.code().unwrap_or(-1),
            serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap_or(Value::Null),
        )
    };
    let (code, v) = speech(&alice, "a.wav");
    assert_eq!(code, 0, "{v}");
    assert!(v["bytes"].as_u64().unwrap_or(0) > 100_000, "{v}");
    let (code, v) = speech("nrt_wrong", "x.wav");
    assert_eq!((code, &v["status"]), (1, &json!(401)), "{v}");

    // One speech request at a time per tenant.
    let long = "The lamps were lit one by one along the quay. ".repeat(60);
    let mut first = Command::new("curl")
        .args(["-sS", "-N", "-o", "/dev/null", "-H"])
        .arg(format!("authorization: Bearer {alice}"))
        .args(["-H", "content-type: application/json", "-d"])
        .arg(
            json!({"model": "tts-1", "voice": "alloy", "input": long, "response_format": "wav"})
                .to_string(),
        )
        .arg(format!("{}/v1/audio/speech", served.url))
        .stdout(Stdio::null())
        .spawn()
        .expect("curl");
    // Until the first request holds its place (it speaks for many seconds).
    let body =
        json!({"model": "tts-1", "voice": "alloy", "input": "Me too.", "response_format": "wav"});
    let mut refused = None;
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(100));
        let (status, retry_after, v) = call(
            &served,
            "POST",
            "/v1/audio/speech",
            Some(&alice),
            Some(body.clone()),
        );
        if status == 429 {
            refused = Some((retry_after, v));
            break;
        }
    }
    let (retry_after, v) = refused.expect("a second request of the same tenant refused");
    assert_eq!(v["error"]["code"], "too_many_requests", "{v}");
    assert_eq!(retry_after.as_deref(), Some("1"));
    // Another tenant is not held back by alice's.
    let (status, _, v) = call(&served, "POST", "/v1/audio/speech", Some(&bob), Some(body));
    assert_eq!(status, 200, "{v}");
    let _ = first.kill();
    let _ = first.wait();

    // The requests above, counted by route and status.
    let metrics = ureq::get(format!("{}/metrics", served.url))
        .header("authorization", format!("Bearer {alice}"))
        .call()
        .expect("GET /metrics")
        .body_mut()
        .read_to_string()
        .expect("body");
    for line in [
        r#"narrator_http_requests_total{route="/v1/jobs",method="GET",status="401"}"#,
        r#"narrator_http_requests_total{route="/v1/audio/speech",method="POST",status="429"}"#,
        r#"narrator_http_requests_total{route="/v1/jobs/{id}",method="GET",status="404"}"#,
    ] {
        assert!(metrics.contains(line), "{line} in:\n{metrics}");
    }

    // No tokens: loopback only.
    let empty = tempfile::tempdir().expect("tempdir");
    let out = use_test_data(
        Command::new(narrator_bin())
            .args(["serve", "--listen", "0.0.0.0:0", "--data"])
            .arg(empty.path()),
    )
    .output()
    .expect("serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("token add"), "{err}");
}
