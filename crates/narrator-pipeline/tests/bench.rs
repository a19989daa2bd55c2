//! The benchmark's measurements against an engine of known speed: the null backend paced
//! to a fixed time per engine run, whatever its size (a GPU below its knee). Batching then
//! multiplies throughput by the batch, and request latency under concurrency follows from
//! how many batches queue ahead, so the figures the benchmark reports can be checked
//! against what the engine must give.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use narrator_engine::{Backend, EnginePool, NullBackend, Paced, Scales, Voice};
use narrator_phonemes::Phonemizer;
use narrator_pipeline::{BenchOptions, Budget, Synthesizer, bench};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

fn deps() -> PathBuf {
    let d = Path::new(ROOT).join(".deps");
    assert!(d.join("voices").is_dir(), "run `bash ops/setup.sh` first");
    d
}

/// A synthesizer whose every engine run takes `per_run`, with a budget of `batch` items.
fn paced(per_run: Duration, batch: usize) -> Arc<Synthesizer> {
    let d = deps();
    let voice = Voice::find(&d.join("voices"), "en_US-joe-medium").expect("voice");
    let ph = Phonemizer::new(&d).expect("espeak");
    let pool = EnginePool::start_with(1, move |_| {
        Ok(Box::new(Paced {
            inner: Box::new(NullBackend::default()),
            per_run,
        }) as Box<dyn Backend>)
    })
    .expect("pool");
    let budget = Budget {
        max_tokens: batch * 402,
        max_requests: batch,
        max_wait: Duration::from_millis(2),
    };
    Arc::new(
        Synthesizer::new(&voice, ph, pool, Scales::DETERMINISTIC)
            .expect("synth")
            .with_budget(budget),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn figures_follow_an_engine_of_known_speed() {
    let synth = paced(Duration::from_millis(40), 4);
    let before = synth.budget();
    let opts = BenchOptions {
        seconds: 0.4,
        min_samples: 5,
        batches: vec![1, 2, 4],
        plan_batch: 4,
        latency_target: 0.1,
        max_concurrency: 64,
    };
    let f = bench(synth.clone(), &opts).await.expect("bench");
    assert_eq!(synth.budget(), before, "the plan's budget is restored");
    // The utterance is about ten seconds of speech (the null engine follows the ids).
    assert!(
        (5.0..20.0).contains(&f.utterance_seconds),
        "{}",
        f.utterance_seconds
    );
    // One request per 40 ms run.
    let single = 0.040 / f.utterance_seconds;
    assert!(
        f.rtf_single >= single * 0.9 && f.rtf_single < single * 3.0,
        "rtf_single {} vs {single}",
        f.rtf_single
    );
    let batches: Vec<usize> = f.batch_sweep.iter().map(|p| p.batch).collect();
    assert_eq!(batches, [1, 2, 4]);
    for p in &f.batch_sweep {
        assert_eq!(p.largest_run, p.batch, "{p:?}");
        assert!(
            p.runs >= 5 && p.p50_seconds >= 0.039 && p.p95_seconds >= p.p50_seconds,
            "{p:?}"
        );
        assert!((p.rtf * p.throughput - 1.0).abs() < 1e-9, "{p:?}");
        assert!(p.padding >= 0.0, "{p:?}");
    }
    // Four sentences per run: about four times the audio per second of one.
    let (one, four) = (&f.batch_sweep[0], &f.batch_sweep[2]);
    assert!(
        four.throughput > 2.5 * one.throughput,
        "batch 4 {} vs batch 1 {}",
        four.throughput,
        one.throughput
    );
    assert_eq!(f.batched_at, 4);
    assert_eq!(f.rtf_batched, four.rtf);
    // Concurrency: up to 4 requests share a 40 ms run; with C clients about C/4 runs
    // queue, so p95 <= 100 ms holds to about 8 clients and fails well before 16.
    let best = f.max_stable_concurrency;
    assert!(
        (2..16).contains(&best),
        "max stable {best}: {:?}",
        f.concurrency
    );
    let at = f
        .concurrency
        .iter()
        .find(|p| p.concurrency == best)
        .expect("measured");
    assert!(at.p95_seconds <= 0.1 && at.requests >= 5, "{at:?}");
    let above = f.concurrency.iter().find(|p| p.concurrency == best + 1);
    assert!(
        above.is_none_or(|p| p.p95_seconds > 0.1),
        "{:?}",
        f.concurrency
    );
    assert!(
        f.concurrency.iter().any(|p| p.p95_seconds > 0.1),
        "the search found a bound"
    );
    for p in &f.concurrency {
        assert!(p.p50_seconds >= 0.039 && p.throughput > 0.0, "{p:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_at_a_time_over_the_target_is_zero_stable_clients() {
    let synth = paced(Duration::from_millis(150), 1);
    let opts = BenchOptions {
        seconds: 0.2,
        min_samples: 2,
        batches: vec![1],
        plan_batch: 1,
        latency_target: 0.1,
        max_concurrency: 8,
    };
    let f = bench(synth, &opts).await.expect("bench");
    assert_eq!(f.max_stable_concurrency, 0, "{:?}", f.concurrency);
    assert_eq!(f.concurrency.len(), 1);
    assert_eq!(f.batched_at, 1);
}
