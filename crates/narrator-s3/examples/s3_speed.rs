//! PUT/s and GET/s of small objects against the configured server:
//!
//! ```sh
//! bash ops/s3-server.sh start
//! NARRATOR_S3_ENDPOINT=http://127.0.0.1:9010 cargo run --release -p narrator-s3 --example s3_speed [N] [KB] [CONCURRENCY]
//! ```
//! Defaults: N = 1000 objects of 100 KB, 16 in flight.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use narrator_s3::{S3AudioStore, S3Config};

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

async fn run_all<F, Fut>(n: usize, concurrency: usize, f: F) -> f64
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let f = Arc::new(f);
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (f, next) = (Arc::clone(&f), Arc::clone(&next));
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                f(i).await;
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    start.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numeric arguments: N KB CONCURRENCY"))
        .collect();
    let n = args.first().copied().unwrap_or(1000);
    let kb = args.get(1).copied().unwrap_or(100);
    let concurrency = args.get(2).copied().unwrap_or(16);
    let cfg = S3Config {
        endpoint: Some(env_or("NARRATOR_S3_ENDPOINT", "http://127.0.0.1:9010")),
        bucket: env_or("NARRATOR_S3_BUCKET", "narrator"),
        access_key_id: Some(env_or("AWS_ACCESS_KEY_ID", "narrator")),
        secret_access_key: Some(env_or("AWS_SECRET_ACCESS_KEY", "narrator-secret")),
        prefix: format!("s3-speed/{}/", std::process::id()),
        ..S3Config::default()
    };
    let store = S3AudioStore::connect(cfg).await.unwrap();
    let body: Arc<Vec<u8>> = Arc::new((0..kb * 1000).map(|i| (i * 31 % 251) as u8).collect());
    let s = store.clone();
    let b = Arc::clone(&body);
    let put_s = run_all(n, concurrency, move |i| {
        let (s, b) = (s.clone(), Arc::clone(&b));
        async move {
            s.put_bytes(&s.segment_key("speed", i as u32), b.to_vec(), "audio/wav")
                .await
                .unwrap();
        }
    })
    .await;
    let s = store.clone();
    let len = body.len();
    let get_s = run_all(n, concurrency, move |i| {
        let s = s.clone();
        async move {
            let got = s
                .get_bytes(&s.segment_key("speed", i as u32))
                .await
                .unwrap();
            assert_eq!(got.len(), len);
        }
    })
    .await;
    println!(
        "{n} x {kb} KB, {concurrency} in flight: PUT {:.0}/s ({:.1} MB/s), GET {:.0}/s ({:.1} MB/s)",
        n as f64 / put_s,
        (n * len) as f64 / put_s / 1e6,
        n as f64 / get_s,
        (n * len) as f64 / get_s / 1e6,
    );
}
