//! `narrator serve --fleet` (docs/SERVE.md "The fleet gateway"): jobs go to a real fleet
//! (Postgres, RabbitMQ, S3, a worker with the real voice) through the intake's path;
//! status from Postgres, events from the job's row, outputs as redirects to presigned
//! S3 URLs (curl follows them, Range included); tenants apart.

use std::time::Duration;

use narrator_test_support::http::{call, curl, download, sse_events};
use narrator_test_support::{Served, World, media, narrator_bin, root, use_test_data};
use serde_json::{Value, json};

fn add_token(data: &std::path::Path, name: &str) -> String {
    let out = use_test_data(
        std::process::Command::new(narrator_bin())
            .args(["serve", "--data"])
            .arg(data)
            .args(["token", "add", name]),
    )
    .output()
    .expect("token add");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// An upload with curl becomes a fleet job of the token's tenant, made by the worker; its
/// events end at done; the book comes through the redirect (ffprobe reads it, a byte
/// range is exactly those bytes); a text job's idempotency key answers the same job; the
/// other tenant sees none of it; a done job is not retried.
#[test]
fn the_gateway_hands_jobs_to_the_fleet_and_serves_their_outputs() {
    let mut w = World::new();
    w.worker("a", &[], &[]);
    let data = tempfile::tempdir().expect("tempdir");
    let alice = add_token(data.path(), "alice");
    let bob = add_token(data.path(), "bob");
    let served = Served::in_world(
        &w,
        &["--fleet", "--data", &data.path().display().to_string()],
    );
    let auth = format!("authorization: Bearer {alice}");

    let (body, err) = curl(&[
        "-H",
        &auth,
        "-F",
        &format!("file=@{}", root().join("examples/sample.md").display()),
        "-F",
        "format=mp3",
        "-F",
        "chapter_files=true",
        &format!("{}/v1/jobs", served.url),
    ]);
    let job: Value = serde_json::from_str(&body)
        .unwrap_or_else(|_| panic!("{body} {err}\n{}\n{}", served.log(), w.logs()));
    assert_eq!(job["tenant"], "alice", "{job}");
    assert_eq!(job["title"], "sample", "{job}");
    assert_eq!(job["segments"], 13, "{job}");
    assert!(
        job["source"]
            .as_str()
            .is_some_and(|s| s.starts_with("s3://") && s.ends_with("/sample.md")),
        "the upload went to the bucket: {job}"
    );
    let id = job["id"].as_str().expect("id").to_string();
    // The fleet's own record agrees.
    let st = w.status(id.parse().expect("uuid"));
    assert_eq!(st["tenant"], "alice", "{st}");

    let (stream, err) = curl(&[
        "-N",
        "-H",
        &auth,
        &format!("{}/v1/jobs/{id}/events", served.url),
    ]);
    let events = sse_events(&stream);
    let (kind, last) = events.last().unwrap_or_else(|| panic!("{stream} {err}"));
    assert_eq!(
        (kind.as_str(), &last["state"]),
        ("state", &json!("done")),
        "{stream}\n{}",
        w.logs()
    );
    assert_eq!(last["segments_done"], 13, "{last}");

    let dir = tempfile::tempdir().expect("tempdir");
    let book = dir.path().join("book.mp3");
    let url = format!("{}/v1/jobs/{id}/outputs/book", served.url);
    let whole = download(&url, &[&auth], &book);
    let probe = media::ffprobe(&book);
    assert_eq!(probe["streams"][0]["codec_name"], "mp3", "{probe}");
    let part = download(
        &url,
        &[&auth, "Range: bytes=1000-1999"],
        &dir.path().join("part"),
    );
    assert_eq!(part, whole[1000..2000]);
    let outputs = last["outputs"].as_array().expect("outputs");
    let chapters: Vec<&Value> = outputs.iter().filter(|o| o["kind"] == "chapter").collect();
    assert_eq!(chapters.len(), 2, "{last}");
    assert_eq!(
        chapters[0]["title"], "The Lighthouse Keeper's Ledger",
        "{last}"
    );

    // JSON, and its key.
    let text =
        json!({"text": "A second book, short. It has two sentences.", "idempotency_key": "k-1"});
    let first = call(
        &served.url,
        "POST",
        "/v1/jobs",
        Some(&alice),
        Some(text.clone()),
    );
    assert_eq!(first.status, 201, "{}", first.json);
    assert_eq!(first.json["idempotency_key"], "k-1", "{}", first.json);
    let again = call(
        &served.url,
        "POST",
        "/v1/jobs",
        Some(&alice),
        Some(text.clone()),
    );
    assert_eq!(
        (again.status, &again.json["id"]),
        (200, &first.json["id"]),
        "{}",
        again.json
    );
    // The same key is bob's own.
    let bobs = call(&served.url, "POST", "/v1/jobs", Some(&bob), Some(text));
    assert_eq!(bobs.status, 201, "{}", bobs.json);
    assert_ne!(bobs.json["id"], first.json["id"]);

    // Tenants apart.
    let seen = call(
        &served.url,
        "GET",
        &format!("/v1/jobs/{id}"),
        Some(&bob),
        None,
    );
    assert_eq!(
        (seen.status, &seen.json["error"]["code"]),
        (404, &json!("job_not_found"))
    );
    let listed = call(&served.url, "GET", "/v1/jobs", Some(&bob), None);
    let ids: Vec<&Value> = listed.json["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|j| &j["id"])
        .collect();
    assert_eq!(ids, [&bobs.json["id"]], "{}", listed.json);
    let listed = call(&served.url, "GET", "/v1/jobs?limit=1", Some(&alice), None);
    assert_eq!(
        listed.json["data"][0]["id"], first.json["id"],
        "{}",
        listed.json
    );
    let cursor = listed.json["next_cursor"]
        .as_str()
        .expect("a next page")
        .to_string();
    let page2 = call(
        &served.url,
        "GET",
        &format!("/v1/jobs?limit=1&cursor={cursor}"),
        Some(&alice),
        None,
    );
    assert_eq!(page2.json["data"][0]["id"], json!(id), "{}", page2.json);
    let done = call(
        &served.url,
        "GET",
        "/v1/jobs?state=done",
        Some(&alice),
        None,
    );
    assert!(
        done.json["data"]
            .as_array()
            .expect("data")
            .iter()
            .all(|j| j["state"] == "done"),
        "{}",
        done.json
    );

    let retried = call(
        &served.url,
        "POST",
        &format!("/v1/jobs/{id}/retry"),
        Some(&alice),
        None,
    );
    assert_eq!(
        (retried.status, &retried.json["error"]["code"]),
        (409, &json!("job_not_retryable"))
    );
    let ready = call(&served.url, "GET", "/readyz", None, None);
    assert_eq!(ready.status, 200);

    // The fleet's workers, as JSON and on the page.
    let workers = call(&served.url, "GET", "/v1/workers", Some(&bob), None);
    let list = workers.json["data"].as_array().expect("data");
    assert_eq!(list.len(), 1, "{}", workers.json);
    assert_eq!(list[0]["device"], "cpu", "{}", workers.json);
    assert!(
        list[0]["segments_done"].as_u64().unwrap_or(0) >= 13,
        "{}",
        workers.json
    );
    let page = ureq::get(format!("{}/workers", served.url))
        .header("authorization", format!("Bearer {bob}"))
        .call()
        .expect("GET /workers")
        .body_mut()
        .read_to_string()
        .expect("page");
    let id = list[0]["id"].as_str().expect("id");
    assert!(
        page.contains(id) && page.contains("en_US-joe-medium"),
        "{page}"
    );
    w.wait_state(
        first.json["id"]
            .as_str()
            .expect("id")
            .parse()
            .expect("uuid"),
        narrator_db::JobState::Done,
        Duration::from_secs(120),
    );
}
