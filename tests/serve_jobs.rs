//! `narrator serve`'s jobs API, embedded (docs/SERVE.md "Jobs"), with clients no one here
//! wrote: `curl` uploads a book as multipart, follows the job's Server-Sent Events and
//! fetches its outputs with Range; ffprobe reads the audio. A server killed mid-book and
//! started again on the same data folder resumes the job. Listing, paging, cancel, retry,
//! delete and the refusals through plain HTTP (ureq).

use std::time::{Duration, Instant};

use narrator_test_support::http::{curl, download, sse_events};
use narrator_test_support::{Served, http, media, root};
use serde_json::{Value, json};

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// Any method, any body; the status and the body as JSON (null when it is none).
fn call(served: &Served, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let r = http::call(&served.url, method, path, None, body);
    (r.status, r.json)
}

/// Polls the job until `until` holds (at most `secs`).
fn wait_for(served: &Served, id: &str, secs: u64, until: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let (_, job) = call(served, "GET", &format!("/v1/jobs/{id}"), None);
        if until(&job) {
            return job;
        }
        assert!(
            Instant::now() < deadline,
            "job never got there: {job}\n{}",
            served.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A plain text of `n` sentences, a few to a paragraph, each a segment of its own.
fn long_text(n: usize) -> String {
    const PLACES: [&str; 6] = [
        "the river",
        "the old mill",
        "a quiet garden",
        "the station",
        "the hill",
        "a narrow lane",
    ];
    const DEEDS: [&str; 5] = [
        "walked slowly past",
        "stopped to look at",
        "wrote a letter about",
        "sang softly near",
        "dreamed all night of",
    ];
    let mut text = String::new();
    for i in 0..n {
        text.push_str(&format!(
            "On day {} the traveller {} {}, and nobody asked why. ",
            i + 1,
            DEEDS[i % DEEDS.len()],
            PLACES[i % PLACES.len()]
        ));
        if i % 4 == 3 {
            text.push_str("\n\n");
        }
    }
    text
}

/// The whole path with curl: a Markdown book uploaded as multipart (chapter files, SRT),
/// its events followed to `done`, the book and a chapter downloaded (ffprobe reads MP3 of
/// the manifest's length), a byte range of the book answered 206 with exactly those
/// bytes, the subtitles served, and the job deleted.
#[test]
fn a_book_uploaded_with_curl_is_made_followed_and_served_with_range() {
    let served = Served::start(&[]);
    let (body, err) = curl(&[
        "-F",
        &format!("file=@{}", root().join("examples/sample.md").display()),
        "-F",
        "format=mp3",
        "-F",
        "chapter_files=true",
        "-F",
        "subtitles=srt",
        "-F",
        "title=The Sample",
        &format!("{}/v1/jobs", served.url),
    ]);
    let job = json_of(&body);
    assert_eq!(job["state"], "queued", "{job} {err}");
    assert_eq!(job["title"], "The Sample", "{job}");
    assert_eq!(job["source"], "upload:sample.md", "{job}");
    assert!(job["segments"].as_u64().unwrap_or(0) > 5, "{job}");
    let id = job["id"].as_str().expect("id").to_string();

    // The stream ends by itself after the final state.
    let (stream, err) = curl(&["-N", &format!("{}/v1/jobs/{id}/events", served.url)]);
    let events = sse_events(&stream);
    assert!(events.len() >= 2, "{stream} {err}");
    let (last_kind, last) = events.last().expect("events");
    assert_eq!(
        (last_kind.as_str(), &last["state"]),
        ("state", &json!("done")),
        "{stream}"
    );
    let states: Vec<&Value> = events
        .iter()
        .filter(|(k, _)| k == "state")
        .map(|(_, j)| &j["state"])
        .collect();
    assert!(
        states.windows(2).all(|w| w[0] != w[1]),
        "a state event per change: {states:?}"
    );
    let progress: Vec<u64> = events
        .iter()
        .map(|(_, j)| j["segments_done"].as_u64().unwrap_or(0))
        .collect();
    assert!(progress.windows(2).all(|w| w[0] <= w[1]), "{progress:?}");

    let dir = tempfile::tempdir().expect("tempdir");
    let book = dir.path().join("book.mp3");
    let (_, err) = curl(&[
        "-f",
        "-o",
        &book.display().to_string(),
        &format!("{}/v1/jobs/{id}/outputs/book", served.url),
    ]);
    assert!(err.is_empty(), "{err}");
    let probe = media::ffprobe(&book);
    assert_eq!(probe["streams"][0]["codec_name"], "mp3", "{probe}");
    let seconds: f64 = probe["format"]["duration"]
        .as_str()
        .and_then(|d| d.parse().ok())
        .unwrap_or(0.0);
    let said = last["audio_seconds"].as_f64().unwrap_or(0.0);
    assert!((seconds - said).abs() < 0.5, "{seconds} s against {said} s");

    // Range: exactly those bytes, 206.
    let whole = std::fs::read(&book).expect("book");
    let (head, _) = curl(&[
        "-i",
        "-H",
        "Range: bytes=1000-1999",
        &format!("{}/v1/jobs/{id}/outputs/book", served.url),
    ]);
    assert!(
        head.starts_with("HTTP/1.1 206"),
        "{}",
        &head[..200.min(head.len())]
    );
    let url = format!("{}/v1/jobs/{id}/outputs/book", served.url);
    let part = download(&url, &["Range: bytes=1000-1999"], &dir.path().join("part"));
    assert_eq!(part, whole[1000..2000]);

    let outputs = last["outputs"].as_array().expect("outputs");
    let chapter = outputs
        .iter()
        .find(|o| o["kind"] == "chapter")
        .expect("a chapter file");
    let chapter_file = dir.path().join("chapter.mp3");
    curl(&[
        "-f",
        "-o",
        &chapter_file.display().to_string(),
        &format!("{}{}", served.url, chapter["url"].as_str().expect("url")),
    ]);
    let probe = media::ffprobe(&chapter_file);
    assert_eq!(probe["streams"][0]["codec_name"], "mp3", "{probe}");
    let srt = outputs
        .iter()
        .find(|o| o["kind"] == "subtitles")
        .expect("subtitles");
    let (text, _) = curl(&[&format!(
        "{}{}",
        served.url,
        srt["url"].as_str().expect("url")
    )]);
    assert!(text.starts_with("1\n") && text.contains(" --> "), "{text}");
    let (_, manifest) = call(
        &served,
        "GET",
        &format!("/v1/jobs/{id}/outputs/manifest"),
        None,
    );
    assert_eq!(
        manifest["chapters"].as_array().map(Vec::len),
        Some(2),
        "{manifest}"
    );

    let (status, _) = call(&served, "DELETE", &format!("/v1/jobs/{id}"), None);
    assert_eq!(status, 204);
    let (status, v) = call(&served, "GET", &format!("/v1/jobs/{id}"), None);
    assert_eq!(
        (status, &v["error"]["code"]),
        (404, &json!("job_not_found")),
        "{v}"
    );
}

/// Jobs as JSON: listed newest first, filtered by state, paged with the cursor; the same
/// idempotency key answers the first job; a running job is cancelled (its segments
/// kept), retried and finishes from where it stopped; an active job is not deleted.
#[test]
fn json_jobs_are_listed_paged_cancelled_and_retried() {
    let served = Served::start(&[]);
    let long = long_text(90);
    let (status, first) = call(
        &served,
        "POST",
        "/v1/jobs",
        Some(
            json!({"text": long, "text_format": "txt", "format": "wav", "idempotency_key": "alice-1"}),
        ),
    );
    assert_eq!(status, 201, "{first}");
    let id = first["id"].as_str().expect("id").to_string();
    let (status, again) = call(
        &served,
        "POST",
        "/v1/jobs",
        Some(json!({"text": "Something else.", "idempotency_key": "alice-1"})),
    );
    assert_eq!((status, &again["id"]), (200, &first["id"]), "{again}");
    let (status, short) = call(
        &served,
        "POST",
        "/v1/jobs",
        Some(json!({"text": "A short one. Two sentences.", "metadata": {"order": 7}})),
    );
    assert_eq!(status, 201, "{short}");
    assert_eq!(short["metadata"]["order"], 7, "{short}");
    assert_eq!(short["title"], "A short one. Two sentences.", "{short}");

    // Cancel while it runs; what it made is kept.
    wait_for(&served, &id, 300, |j| {
        j["segments_done"].as_u64().unwrap_or(0) >= 5
    });
    let (status, v) = call(&served, "DELETE", &format!("/v1/jobs/{id}"), None);
    assert_eq!(
        (status, &v["error"]["code"]),
        (409, &json!("job_active")),
        "{v}"
    );
    let (status, _) = call(&served, "POST", &format!("/v1/jobs/{id}/cancel"), None);
    assert_eq!(status, 202);
    let cancelled = wait_for(&served, &id, 60, |j| j["state"] == "cancelled");
    let made = cancelled["segments_done"].as_u64().unwrap_or(0);
    assert!(made >= 5, "{cancelled}");

    // Listing: newest first, by state, in pages.
    let (_, all) = call(&served, "GET", "/v1/jobs", None);
    let ids: Vec<&Value> = all["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|j| &j["id"])
        .collect();
    assert_eq!(ids, [&short["id"], &first["id"]], "{all}");
    let (_, by_state) = call(&served, "GET", "/v1/jobs?state=cancelled", None);
    assert_eq!(
        by_state["data"].as_array().map(Vec::len),
        Some(1),
        "{by_state}"
    );
    let (_, page1) = call(&served, "GET", "/v1/jobs?limit=1", None);
    assert_eq!(page1["data"][0]["id"], short["id"], "{page1}");
    let cursor = page1["next_cursor"].as_str().expect("next_cursor");
    let (_, page2) = call(
        &served,
        "GET",
        &format!("/v1/jobs?limit=1&cursor={cursor}"),
        None,
    );
    assert_eq!(page2["data"][0]["id"], first["id"], "{page2}");
    assert_eq!(page2["next_cursor"], Value::Null, "{page2}");

    // Retried: resumes from what it had.
    let (status, _) = call(&served, "POST", &format!("/v1/jobs/{id}/retry"), None);
    assert_eq!(status, 202);
    let done = wait_for(&served, &id, 600, |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    assert_eq!(done["state"], "done", "{done}\n{}", served.log());
    assert!(
        done["segments_resumed"].as_u64().unwrap_or(0) >= made.min(1),
        "the retry resumed: {done}"
    );
    let (status, v) = call(&served, "POST", &format!("/v1/jobs/{id}/retry"), None);
    assert_eq!(
        (status, &v["error"]["code"]),
        (409, &json!("job_not_retryable")),
        "{v}"
    );
}

/// A server killed in the middle of a book, started again on the same data folder, queues
/// the job again and resumes it from the segments its work folder kept.
#[test]
fn a_job_resumes_after_the_server_is_killed() {
    let data = tempfile::tempdir().expect("tempdir");
    let data_arg = data.path().display().to_string();
    let served = Served::start(&["--data", &data_arg]);
    let text = long_text(180);
    let (status, job) = call(
        &served,
        "POST",
        "/v1/jobs",
        Some(json!({"text": text, "text_format": "txt", "format": "opus"})),
    );
    assert_eq!(status, 201, "{job}");
    let id = job["id"].as_str().expect("id").to_string();
    // Past the first pack of segments (64), so some are surely kept on disk.
    wait_for(&served, &id, 600, |j| {
        j["segments_done"].as_u64().unwrap_or(0) >= 80
    });
    served.kill();

    let served = Served::start(&["--data", &data_arg]);
    let done = wait_for(&served, &id, 600, |j| {
        j["state"] == "done" || j["state"] == "failed"
    });
    assert_eq!(done["state"], "done", "{done}\n{}", served.log());
    assert!(
        done["segments_resumed"].as_u64().unwrap_or(0) >= 64,
        "resumed, not made again: {done}"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let book = dir.path().join("book.opus");
    curl(&[
        "-f",
        "-o",
        &book.display().to_string(),
        &format!("{}/v1/jobs/{id}/outputs/book", served.url),
    ]);
    let probe = media::ffprobe(&book);
    assert_eq!(probe["streams"][0]["codec_name"], "opus", "{probe}");
}

/// Each refusal has its status and one line: no file, a file that is no book, a book over
/// `--max-input-mb`, a zip bomb posing as an EPUB, an S3 source, a voice not loaded,
/// JSON that is not, unknown ids, bad filters, outputs of a job not done.
#[test]
fn bad_uploads_and_requests_get_one_clear_error() {
    let served = Served::start(&["--max-input-mb", "1"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("{}/v1/jobs", served.url);
    let form = |args: &[String]| -> Value {
        let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
        all.push(&url);
        let (body, err) = curl(&all);
        serde_json::from_str(&body).unwrap_or_else(|_| json!({"raw": body, "err": err}))
    };
    let expect = |v: Value, code: &str| {
        assert_eq!(v["error"]["code"], code, "{v}");
        let m = v["error"]["message"].as_str().unwrap_or_default();
        assert!(!m.is_empty() && !m.contains('\n'), "{v}");
    };
    expect(form(&["-F".into(), "format=mp3".into()]), "missing_file");
    let odd = dir.path().join("book.pdf");
    std::fs::write(&odd, b"%PDF-1.4").expect("write");
    expect(
        form(&["-F".into(), format!("file=@{}", odd.display())]),
        "unsupported_book",
    );
    let big = dir.path().join("big.txt");
    std::fs::write(&big, "All work and no play. ".repeat(120_000)).expect("write");
    expect(
        form(&["-F".into(), format!("file=@{}", big.display())]),
        "body_too_large",
    );
    // An EPUB whose chapter inflates far past the bound.
    let bomb = dir.path().join("bomb.epub");
    {
        use std::io::Write;
        let mut zip = zip::ZipWriter::new(std::fs::File::create(&bomb).expect("create"));
        let stored = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        let deflated = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        zip.start_file("mimetype", stored).expect("zip");
        zip.write_all(b"application/epub+zip").expect("zip");
        zip.start_file("META-INF/container.xml", deflated)
            .expect("zip");
        zip.write_all(br#"<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container"><rootfiles><rootfile full-path="content.opf" media-type="application/oebps-package+xml"/></rootfiles></container>"#).expect("zip");
        zip.start_file("content.opf", deflated).expect("zip");
        zip.write_all(br#"<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0"><metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>Bomb</dc:title></metadata><manifest><item id="c" href="c.xhtml" media-type="application/xhtml+xml"/></manifest><spine><itemref idref="c"/></spine></package>"#).expect("zip");
        zip.start_file("c.xhtml", deflated).expect("zip");
        zip.write_all(b"<html><body><p>").expect("zip");
        let zeros = vec![b'a'; 1 << 20];
        for _ in 0..64 {
            zip.write_all(&zeros).expect("zip");
        }
        zip.write_all(b"</p></body></html>").expect("zip");
        zip.finish().expect("zip");
    }
    assert!(std::fs::metadata(&bomb).expect("bomb").len() < 1 << 20);
    expect(
        form(&["-F".into(), format!("file=@{}", bomb.display())]),
        "unreadable_book",
    );

    let (status, v) = call(
        &served,
        "POST",
        "/v1/jobs",
        Some(json!({"source": "s3://b/k.txt"})),
    );
    assert_eq!(status, 400);
    expect(v, "source_not_supported");
    let (status, v) = call(
        &served,
        "POST",
        "/v1/jobs",
        Some(json!({"text": "Hi.", "voice": "xx_XX-nobody"})),
    );
    assert_eq!(status, 400);
    expect(v, "unknown_voice");
    let (status, v) = call(
        &served,
        "POST",
        "/v1/jobs",
        Some(json!({"text": "Hi.", "format": "flac"})),
    );
    assert_eq!(status, 400);
    expect(v, "invalid_request");
    let (status, v) = call(
        &served,
        "POST",
        "/v1/jobs",
        Some(json!({"text": "Hi.", "colour": "red"})),
    );
    assert_eq!(status, 400);
    expect(v, "invalid_request");
    let (status, v) = call(&served, "POST", "/v1/jobs", Some(json!({"text": "   "})));
    assert_eq!(status, 400, "{v}");
    expect(v, "invalid_request");
    let (status, v) = call(&served, "POST", "/v1/jobs", Some(json!({"text": "— … —"})));
    assert_eq!(status, 422, "{v}");
    expect(v, "unreadable_book");
    let (status, v) = call(&served, "GET", "/v1/jobs/not-a-uuid", None);
    assert_eq!(status, 404);
    expect(v, "job_not_found");
    let (status, v) = call(&served, "GET", "/v1/jobs?limit=0", None);
    assert_eq!(status, 400);
    expect(v, "invalid_limit");
    let (status, v) = call(&served, "GET", "/v1/jobs?cursor=zzz", None);
    assert_eq!(status, 400);
    expect(v, "invalid_cursor");

    let (status, job) = call(
        &served,
        "POST",
        "/v1/jobs",
        Some(json!({"text": "One sentence is enough here."})),
    );
    assert_eq!(status, 201, "{job}");
    let id = job["id"].as_str().expect("id").to_string();
    let (status, v) = call(
        &served,
        "GET",
        &format!("/v1/jobs/{id}/outputs/nothing.mp3"),
        None,
    );
    assert!(status == 409 || status == 404, "{v}");
    wait_for(&served, &id, 120, |j| j["state"] == "done");
    let (status, v) = call(
        &served,
        "GET",
        &format!("/v1/jobs/{id}/outputs/nothing.mp3"),
        None,
    );
    assert_eq!(status, 404);
    expect(v, "no_such_output");
    let raw = ureq::post(&url)
        .config()
        .http_status_as_error(false)
        .build()
        .header("content-type", "application/json")
        .send("{not json")
        .expect("POST");
    assert_eq!(raw.status().as_u16(), 400);
}
