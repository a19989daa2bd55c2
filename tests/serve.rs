//! `narrator serve` (docs/SERVE.md) with a client no one here wrote: OpenAI's Python
//! package (`.deps/clients-venv`, `bash ops/setup.sh --test`) runs
//! `examples/clients/openai_speech.py` against the server speaking with the real voice;
//! ffprobe reads what it got. Errors and the listings through plain HTTP (ureq).

use std::path::Path;

use narrator_test_support::{Served, clients_python, media, root};

/// Runs the OpenAI example against `served`, writing `out`; its JSON line.
fn speech(served: &Served, out: &Path, args: &[&str]) -> (i32, serde_json::Value) {
    let run = std::process::Command::new(clients_python())
        .arg(root().join("examples/clients/openai_speech.py"))
        .arg(format!("{}/v1", served.url))
        .arg(out)
        .args(args)
        .output()
        .expect("run examples/clients/openai_speech.py");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    let v = serde_json::from_str(line).unwrap_or_else(|_| {
        panic!(
            "no JSON from openai_speech.py: {stdout}\n{}\n{}",
            String::from_utf8_lossy(&run.stderr),
            served.log()
        )
    });
    (run.status.code().unwrap_or(-1), v)
}

/// Every format the server makes, through `openai`'s `with_streaming_response`: audio
/// ffprobe reads, of the length three sentences take, not silence; WAV and MP3 arrive in
/// pieces, the first before the whole.
#[test]
fn the_openai_package_gets_speech_in_each_format() {
    let served = Served::start(&[]);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pcm_seconds = 0.0;
    for (format, codec) in [
        ("wav", "pcm_s16le"),
        ("pcm", ""),
        ("mp3", "mp3"),
        ("opus", "opus"),
        ("aac", "aac"),
        ("flac", "flac"),
    ] {
        let out = dir.path().join(format!("speech.{format}"));
        let (code, got) = speech(&served, &out, &["--format", format]);
        assert_eq!(code, 0, "{format}: {got}\n{}", served.log());
        let bytes = std::fs::read(&out).expect("audio");
        assert_eq!(got["bytes"], bytes.len(), "{format}: {got}");
        if format == "pcm" {
            let rate: f64 = got["sample_rate"]
                .as_str()
                .and_then(|r| r.parse().ok())
                .expect("x-sample-rate");
            pcm_seconds = bytes.len() as f64 / 2.0 / rate;
            continue;
        }
        let probe = media::ffprobe(&out);
        assert_eq!(
            probe["streams"][0]["codec_name"], codec,
            "{format}: {probe}"
        );
        if format == "wav" {
            // Streamed with unknown sizes: the length is what arrived.
            let samples: Vec<i16> = bytes[44..]
                .chunks_exact(2)
                .map(|b| i16::from_le_bytes([b[0], b[1]]))
                .collect();
            let seconds = samples.len() as f64 / 22050.0;
            assert!((5.0..30.0).contains(&seconds), "{seconds} s");
            let loud = samples.iter().map(|s| s.unsigned_abs()).max().unwrap_or(0);
            assert!(loud > 1000, "speech, not silence: peak {loud}");
            assert!(
                got["chunks"].as_u64().unwrap_or(0) >= 2
                    && got["first_bytes"].as_u64() < got["bytes"].as_u64(),
                "sent sentence by sentence, the first before the whole: {got}"
            );
        } else {
            // Decoded: a stream's header may not know its length.
            let d = media::decoded_seconds(&out);
            assert!((5.0..30.0).contains(&d), "{format}: {d} s");
        }
        if ["mp3", "aac", "flac"].contains(&format) {
            assert!(
                got["chunks"].as_u64().unwrap_or(0) >= 2
                    && got["first_bytes"].as_u64() < got["bytes"].as_u64(),
                "{format} streamed too, the first frames before the whole: {got}"
            );
        }
    }
    assert!((5.0..30.0).contains(&pcm_seconds), "pcm: {pcm_seconds} s");
}

/// Each bad request gets its status and one line that says what to do, in OpenAI's
/// error shape; the openai package surfaces it; the listings answer.
#[test]
fn bad_requests_get_one_clear_error_and_the_listings_answer() {
    let served = Served::start(&["--max-input-chars", "200"]);
    let post = |body: serde_json::Value| -> (u16, serde_json::Value) {
        let mut r = ureq::post(format!("{}/v1/audio/speech", served.url))
            .config()
            .http_status_as_error(false)
            .build()
            .header("content-type", "application/json")
            .send(body.to_string())
            .expect("POST");
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string().unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
        )
    };
    let ok = serde_json::json!({"model": "tts-1", "voice": "alloy", "input": "Hello there."});
    let cases: [(&str, serde_json::Value, u16, &str); 6] = [
        (
            "voice",
            serde_json::json!("xx_XX-nobody"),
            400,
            "unknown_voice",
        ),
        (
            "model",
            serde_json::json!("whisper-1"),
            400,
            "unknown_model",
        ),
        (
            "response_format",
            serde_json::json!("vorbis"),
            400,
            "unsupported_response_format",
        ),
        ("speed", serde_json::json!(3.0), 400, "invalid_speed"),
        ("input", serde_json::json!("   "), 400, "empty_input"),
        (
            "input",
            serde_json::json!("word ".repeat(60)),
            413,
            "input_too_long",
        ),
    ];
    for (field, value, status, code) in cases {
        let mut body = ok.clone();
        body[field] = value;
        let (got, v) = post(body);
        assert_eq!(got, status, "{field}: {v}");
        assert_eq!(v["error"]["code"], code, "{field}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(!message.is_empty() && !message.contains('\n'), "{v}");
    }
    let (got, v) = post(serde_json::json!({"voice": "alloy"}));
    assert_eq!(got, 422, "missing fields: {v}");
    // The package raises it as OpenAI's error.
    let dir = tempfile::tempdir().expect("tempdir");
    let (code, v) = speech(
        &served,
        &dir.path().join("x.wav"),
        &["--voice", "xx_XX-nobody", "--format", "wav"],
    );
    assert_eq!(code, 1, "{v}");
    assert_eq!(v["status"], 400, "{v}");
    assert_eq!(v["error"]["code"], "unknown_voice", "{v}");
    let get = |path: &str| -> serde_json::Value {
        let text = ureq::get(format!("{}{path}", served.url))
            .call()
            .expect("GET")
            .body_mut()
            .read_to_string()
            .expect("body");
        serde_json::from_str(&text).expect("JSON")
    };
    let models = get("/v1/models");
    assert!(
        models["data"]
            .as_array()
            .is_some_and(|d| d.iter().any(|m| m["id"] == "tts-1")),
        "{models}"
    );
    let voices = get("/v1/voices");
    assert_eq!(voices["voices"][0]["name"], "en_US-joe-medium", "{voices}");
    assert_eq!(voices["voices"][0]["sample_rate"], 22050, "{voices}");
}

/// The API against its own `/openapi.json` (OpenAPI 3.1, generated from the code), under
/// schemathesis (PyPI, clients venv) with a token: every operation fuzzed and followed
/// through its links (a job made, then read, cancelled, its outputs asked for); no 5xx,
/// and every response's status, content type, headers and body as documented. Bounded
/// (`--max-time`) and seeded, so a run is repeatable.
#[test]
fn the_api_answers_as_its_openapi_document_says() {
    let data = tempfile::tempdir().expect("tempdir");
    let out = narrator_test_support::use_test_data(
        std::process::Command::new(narrator_test_support::narrator_bin())
            .args(["serve", "--data"])
            .arg(data.path())
            .args(["token", "add", "fuzz"]),
    )
    .output()
    .expect("token add");
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let served = Served::start(&[
        "--data",
        &data.path().display().to_string(),
        "--max-input-chars",
        "300",
        "--max-input-mb",
        "1",
    ]);
    let doc: serde_json::Value = serde_json::from_str(
        &ureq::get(format!("{}/openapi.json", served.url))
            .call()
            .expect("GET /openapi.json")
            .body_mut()
            .read_to_string()
            .expect("body"),
    )
    .expect("JSON");
    assert_eq!(doc["openapi"], "3.1.0", "{doc}");
    let schemathesis = clients_python().with_file_name("schemathesis");
    let run = std::process::Command::new(&schemathesis)
        .args(["run", &format!("{}/openapi.json", served.url)])
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance",
            "--max-examples",
            "15",
            "--max-time",
            "90",
            "--request-timeout",
            "60",
            "--seed",
            "1",
            "--continue-on-failure",
            "--header",
        ])
        .arg(format!("Authorization: Bearer {token}"))
        .output()
        .expect("run schemathesis");
    let report = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "schemathesis found failures:\n{report}\n{}\n{}",
        String::from_utf8_lossy(&run.stderr),
        served.log()
    );
    assert!(
        report.contains("Tested: 15"),
        "every operation tested: {report}"
    );
}
