//! Against a real S3-compatible server: `bash ops/s3-server.sh start` (ops/test.sh does it)
//! and `NARRATOR_S3_ENDPOINT` (+ `NARRATOR_S3_BUCKET`, `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`). Without the endpoint every test fails and says so.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::time::Duration;

use narrator_core::{AudioStore, SegmentAudio};
use narrator_s3::{S3AudioStore, S3Config, S3Error};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MIB: u64 = 1024 * 1024;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

/// Settings for the test server, with a prefix of its own per test run.
fn config() -> S3Config {
    let Some(endpoint) = std::env::var("NARRATOR_S3_ENDPOINT")
        .ok()
        .filter(|v| !v.is_empty())
    else {
        panic!(
            "NARRATOR_S3_ENDPOINT is not set: run `bash ops/s3-server.sh start` and \
             `export NARRATOR_S3_ENDPOINT=http://127.0.0.1:9010` (ops/test.sh does both)"
        );
    };
    S3Config {
        endpoint: Some(endpoint),
        bucket: env_or("NARRATOR_S3_BUCKET", "narrator"),
        region: env_or("AWS_REGION", "us-east-1"),
        access_key_id: Some(env_or("AWS_ACCESS_KEY_ID", "narrator")),
        secret_access_key: Some(env_or("AWS_SECRET_ACCESS_KEY", "narrator-secret")),
        prefix: "narrator-s3-tests/".into(),
        ..S3Config::default()
    }
}

fn job() -> String {
    format!("test-{}", uuid::Uuid::new_v4())
}

fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

#[tokio::test]
async fn segments_round_trip_and_has_segment_flips() {
    let store = S3AudioStore::connect(config()).await.unwrap();
    let job = job();
    let audio = SegmentAudio {
        sample_rate: 22050,
        samples: (0..22050)
            .map(|i| ((i * 37) % 65536 - 32768) as i16)
            .collect(),
    };
    assert!(!store.has_segment(&job, 7).await.unwrap());
    store.put_segment(&job, 7, &audio).await.unwrap();
    assert!(store.has_segment(&job, 7).await.unwrap());
    assert!(!store.has_segment(&job, 8).await.unwrap());
    assert_eq!(store.get_segment(&job, 7).await.unwrap(), audio);
    // The object holds exactly the WAV bytes the local store writes.
    let key = store.segment_key(&job, 7);
    assert!(
        key.ends_with(&format!("jobs/{job}/segments/000007.wav")),
        "{key}"
    );
    let wav = narrator_audio::encode_wav_bytes(audio.sample_rate, &audio.samples).unwrap();
    assert_eq!(store.get_bytes(&key).await.unwrap(), wav);
    assert_eq!(store.head(&key).await.unwrap(), Some(wav.len() as u64));
    // Storing it twice is harmless.
    store.put_segment(&job, 7, &audio).await.unwrap();
    assert_eq!(store.get_segment(&job, 7).await.unwrap(), audio);
    // A missing segment is a store_io error that names the key.
    let err = store.get_segment(&job, 9).await.unwrap_err();
    assert_eq!(err.kind, "store_io");
    assert!(err.message.contains("000009.wav"), "{}", err.message);
}

#[tokio::test]
async fn several_segments_go_into_one_pack_object() {
    let store = S3AudioStore::connect(config()).await.unwrap();
    let job = job();
    let clips: Vec<SegmentAudio> = (1..=3)
        .map(|n| SegmentAudio {
            sample_rate: 22050,
            samples: (0..n * 1000).map(|i| (i * n) as i16).collect(),
        })
        .collect();
    let items: Vec<(u32, &SegmentAudio)> = vec![(12, &clips[0]), (10, &clips[1]), (11, &clips[2])];
    let places = store.put_segments(&job, &items).await.unwrap();
    assert_eq!(places.len(), 3);
    let key = places[0].as_ref().unwrap().key.clone();
    assert!(
        key.contains(&format!("jobs/{job}/packs/000010-3-")),
        "{key}"
    );
    let pack = store.get_pack(&job, &key).await.unwrap();
    let mut end = 0;
    for ((_, audio), place) in items.iter().zip(&places) {
        let at = place.as_ref().unwrap();
        assert_eq!(at.key, key, "one object for the group");
        assert_eq!(at.offset, end, "back to back");
        end = at.offset + at.len;
        let wav = &pack[at.offset as usize..end as usize];
        let (rate, samples) = narrator_audio::decode_wav_bytes(wav).unwrap();
        assert_eq!((rate, &samples), (audio.sample_rate, &audio.samples));
    }
    assert_eq!(end, pack.len() as u64);
    // Not under the segments' own keys.
    assert!(!store.has_segment(&job, 10).await.unwrap());
    // The same segments stored again (a redelivery) get a pack of their own.
    let again = store.put_segments(&job, &items).await.unwrap();
    assert_ne!(again[0].as_ref().unwrap().key, key);
    // One segment alone is a pack of one, under a key of its own too: two copies of a
    // segment never overwrite each other.
    let one = store.put_segments(&job, &[(4, &clips[0])]).await.unwrap();
    let one_key = one[0].as_ref().expect("a pack of one").key.clone();
    let twice = store.put_segments(&job, &[(4, &clips[0])]).await.unwrap();
    assert_ne!(twice[0].as_ref().unwrap().key, one_key);
    // A missing pack is a store_io error that names it.
    let err = store.get_pack(&job, "nope/pack.wavs").await.unwrap_err();
    assert_eq!(err.kind, "store_io");
    assert_eq!(err.class, narrator_core::RetryClass::Transient);
    assert!(err.message.contains("nope/pack.wavs"), "{}", err.message);
    // A discarded copy is gone; the intermediates of a job are deleted in one call.
    store
        .discard(&job, std::slice::from_ref(&one_key))
        .await
        .unwrap();
    assert_eq!(store.head(&one_key).await.unwrap(), None);
    let left = store.intermediate_prefixes(&job);
    let before: usize = {
        let mut n = 0;
        for p in &left {
            n += store.list(p).await.unwrap().len();
        }
        n
    };
    assert_eq!(before, 3, "two packs of three and the second pack of one");
    assert_eq!(store.delete_intermediates(&job).await.unwrap(), 3);
    for p in &left {
        assert!(store.list(p).await.unwrap().is_empty());
    }
}

#[tokio::test]
async fn small_output_is_one_put() {
    let store = S3AudioStore::connect(config()).await.unwrap();
    let job = job();
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(br#"{"book":{"file":"book.opus"}}"#).unwrap();
    store
        .put_output(&job, "manifest.json", f.path())
        .await
        .unwrap();
    let key = store.output_key(&job, "manifest.json");
    assert_eq!(
        store.get_bytes(&key).await.unwrap(),
        std::fs::read(f.path()).unwrap()
    );
}

#[tokio::test]
async fn large_output_goes_up_in_parts() {
    let cfg = S3Config {
        multipart_threshold: 5 * MIB,
        part_size: 5 * MIB,
        ..config()
    };
    let store = S3AudioStore::connect(cfg).await.unwrap();
    let job = job();
    // Six parts: more than go up at once, so parts finish out of order and are put back
    // in order for the completion.
    let data = pseudo_random((27 * MIB + 12345) as usize, 42);
    let mut f = tempfile::Builder::new().suffix(".opus").tempfile().unwrap();
    f.write_all(&data).unwrap();
    store.put_output(&job, "book.opus", f.path()).await.unwrap();
    let key = store.output_key(&job, "book.opus");
    assert_eq!(store.head(&key).await.unwrap(), Some(data.len() as u64));
    assert!(
        store.get_bytes(&key).await.unwrap() == data,
        "multipart object differs"
    );
}

#[tokio::test]
async fn missing_local_file_is_a_clear_error() {
    let store = S3AudioStore::connect(config()).await.unwrap();
    let err = store
        .put_output(&job(), "x.mp3", std::path::Path::new("/nonexistent/x.mp3"))
        .await
        .unwrap_err();
    assert!(
        err.message.contains("/nonexistent/x.mp3"),
        "{}",
        err.message
    );
}

/// GET `url` (plain http) with a raw socket; returns (status, body).
async fn http_get(url: &str) -> (u16, Vec<u8>) {
    let rest = url.strip_prefix("http://").expect("http URL");
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut sock = tokio::net::TcpStream::connect(host).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    sock.write_all(req.as_bytes()).await.unwrap();
    let mut resp = Vec::new();
    sock.read_to_end(&mut resp).await.unwrap();
    let split = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("header end");
    let head = String::from_utf8_lossy(&resp[..split]).to_ascii_lowercase();
    let status = head[9..12].parse().unwrap();
    let mut body = resp[split + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        let mut out = Vec::new();
        let mut rest = &body[..];
        loop {
            let eol = rest.windows(2).position(|w| w == b"\r\n").unwrap();
            let size_text = std::str::from_utf8(&rest[..eol]).unwrap();
            let size =
                usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16).unwrap();
            if size == 0 {
                break;
            }
            out.extend_from_slice(&rest[eol + 2..eol + 2 + size]);
            rest = &rest[eol + 2 + size + 2..];
        }
        body = out;
    }
    (status, body)
}

#[tokio::test]
async fn presigned_get_works_without_credentials() {
    let store = S3AudioStore::connect(config()).await.unwrap();
    let key = store.output_key(&job(), "chapter.mp3");
    let data = pseudo_random(100_000, 7);
    store
        .put_bytes(&key, data.clone(), "audio/mpeg")
        .await
        .unwrap();
    let url = store
        .presign_get(&key, Duration::from_secs(600))
        .await
        .unwrap();
    assert!(url.contains("X-Amz-Signature="), "{url}");
    let (status, body) = http_get(&url).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(body == data, "presigned body differs");
    // A tampered URL is refused.
    let (status, _) = http_get(&url.replace("chapter.mp3", "chapter.mp4")).await;
    assert_ne!(status, 200);

    // With a public endpoint (the same server under another name, as a compose host
    // sees it), the URL points there, and works there.
    let mut cfg = config();
    let endpoint = cfg.endpoint.clone().unwrap();
    let public = endpoint.replace("127.0.0.1", "localhost");
    assert_ne!(public, endpoint, "the test endpoint names 127.0.0.1");
    cfg.public_endpoint = Some(public.clone());
    let store = S3AudioStore::connect(cfg).await.unwrap();
    let url = store
        .presign_get(&key, Duration::from_secs(600))
        .await
        .unwrap();
    assert!(url.starts_with(&format!("{public}/")), "{url}");
    let (status, body) = http_get(&url).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(body == data, "presigned body differs");
    // Signed for the public host: the same query sent to the internal name is refused.
    let (status, _) = http_get(&url.replacen(&public, &endpoint, 1)).await;
    assert_ne!(status, 200, "the signature covers the host");
}

#[tokio::test]
async fn missing_bucket_says_what_to_do() {
    let cfg = S3Config {
        bucket: format!(
            "narrator-missing-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        ),
        ..config()
    };
    let err = S3AudioStore::connect(cfg.clone()).await.unwrap_err();
    assert!(matches!(err, S3Error::NoSuchBucket { .. }), "{err:?}");
    assert_eq!(err.kind(), "store_io");
    let text = err.to_string();
    assert!(
        text.contains(&cfg.bucket) && text.contains("create it or pass --s3-bucket"),
        "{text}"
    );
    let seam = narrator_core::SeamError::from(err);
    assert_eq!(seam.kind, "store_io");
    // ensure_bucket creates it; then connect succeeds.
    S3AudioStore::ensure_bucket(cfg.clone()).await.unwrap();
    let store = S3AudioStore::connect(cfg.clone()).await.unwrap();
    assert_eq!(store.bucket(), cfg.bucket);
    // Creating it again is harmless.
    S3AudioStore::ensure_bucket(cfg).await.unwrap();
}

#[tokio::test]
async fn unreachable_endpoint_names_it() {
    let cfg = S3Config {
        endpoint: Some("http://127.0.0.1:9".into()),
        ..config()
    };
    let err = S3AudioStore::connect(cfg).await.unwrap_err();
    assert!(matches!(err, S3Error::Unreachable { .. }), "{err:?}");
    assert!(err.to_string().contains("http://127.0.0.1:9"), "{err}");
    assert_eq!(err.kind(), "store_io");
}

#[tokio::test]
async fn wrong_secret_is_denied() {
    let cfg = S3Config {
        secret_access_key: Some("not-the-secret".into()),
        ..config()
    };
    match S3AudioStore::connect(cfg).await {
        // moto does not check signatures; s3s-fs does.
        Ok(_) => eprintln!("note: this server accepts any signature"),
        Err(err) => {
            assert!(matches!(err, S3Error::Denied { .. }), "{err:?}");
            assert!(err.to_string().contains("AWS_SECRET_ACCESS_KEY"), "{err}");
        }
    }
}

#[tokio::test]
async fn debug_never_shows_the_secret() {
    let cfg = config();
    let secret = cfg.secret_access_key.clone().unwrap();
    assert!(!format!("{cfg:?}").contains(&secret));
    let store = S3AudioStore::connect(cfg).await.unwrap();
    assert!(!format!("{store:?}").contains(&secret));
}

/// A request the server rejects as such (HTTP 4xx other than 403, 404, 408 and 429: here
/// a key past S3's 1,024-byte limit) will not succeed by waiting: it is permanent, and
/// says what the server answered; it is not an outage to postpone for ever.
#[tokio::test]
async fn a_request_the_server_rejects_is_permanent_not_an_outage() {
    let store = S3AudioStore::connect(config()).await.unwrap();
    let audio = SegmentAudio {
        sample_rate: 22050,
        samples: vec![0; 100],
    };
    let long_job = "j".repeat(2000);
    let err = store.put_segment(&long_job, 0, &audio).await.unwrap_err();
    assert_eq!(
        err.class,
        narrator_core::RetryClass::Permanent,
        "{}",
        err.message
    );
    assert_eq!(err.kind, "store_rejected", "{}", err.message);
    assert!(
        err.message.contains("HTTP 400 (KeyTooLongError)"),
        "{}",
        err.message
    );
}
