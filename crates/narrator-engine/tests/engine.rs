//! The real voice through the real runtime: batching must not change any item's audio.

use std::path::PathBuf;

use narrator_engine::{
    ArenaPolicy, Backend, CpuArena, Device, PiperEngine, PiperVoice, Scales, SessionOptions,
    load_runtime,
};

fn deps() -> PathBuf {
    let d = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.deps"));
    assert!(
        d.join("onnxruntime/libonnxruntime.so.1.32.0").is_file(),
        "the voice and ONNX Runtime are missing: run `bash ops/setup.sh` first"
    );
    d
}

/// Phoneme ids the way Piper builds them: BOS, each phoneme followed by PAD, EOS.
fn ids(voice: &PiperVoice, ipa: &str) -> Vec<i64> {
    let map = voice.config.raw["phoneme_id_map"].as_object().expect("map");
    let id = |p: &str| map[p][0].as_i64().expect("id");
    let mut out = vec![id("^"), id("_")];
    for c in ipa.chars() {
        let s = c.to_string();
        if map.contains_key(&s) {
            out.push(id(&s));
            out.push(id("_"));
        }
    }
    out.push(id("$"));
    out
}

fn engine() -> (PiperVoice, PiperEngine) {
    engine_padded_to(1)
}

fn engine_padded_to(pad_multiple: usize) -> (PiperVoice, PiperEngine) {
    let d = deps();
    let rt = load_runtime(&d.join("onnxruntime/libonnxruntime.so.1.32.0")).expect("runtime");
    let voice = PiperVoice::load(&d.join("voices/en_US-joe-medium.onnx")).expect("voice");
    let opts = SessionOptions {
        intra_threads: 2,
        device: Device::Cpu,
        gpu_mem_limit: None,
        spin: true,
        cpu_arena: ArenaPolicy::new(CpuArena::default()),
        pad_multiple,
        graph: None,
    };
    let engine = PiperEngine::load(rt, &voice.model_path, &opts).expect("session");
    (voice, engine)
}

#[test]
fn padded_batch_items_equal_single_item_synthesis() {
    let (voice, mut engine) = engine();
    assert!(
        engine.supports_batching(),
        "frames output was not spliced in"
    );
    let texts = [
        "hɛloʊ.",
        "ðə kwɪk bɹaʊn fɑks dʒʌmps oʊvɚ ðə leɪzi dɑɡ.",
        "ɪt wʌz ðə bɛst ʌv taɪmz, ɪt wʌz ðə wɜːst ʌv taɪmz; ænd ɔːl ðə wɜːld wʌz wɛɪtɪŋ.",
    ];
    let items: Vec<Vec<i64>> = texts.iter().map(|t| ids(&voice, t)).collect();
    let lens: Vec<usize> = items.iter().map(Vec::len).collect();
    assert!(
        lens[0] < lens[1] && lens[1] < lens[2],
        "items must differ in length: {lens:?}"
    );

    let refs: Vec<&[i64]> = items.iter().map(Vec::as_slice).collect();
    let batch = engine
        .synthesize(&refs, Scales::DETERMINISTIC)
        .expect("batch");
    assert_eq!(batch.audio.len(), 3);
    for (i, item) in items.iter().enumerate() {
        let single = engine
            .synthesize(&[item.as_slice()], Scales::DETERMINISTIC)
            .expect("single");
        let (a, b) = (&batch.audio[i], &single.audio[0]);
        assert_eq!(
            a.len(),
            b.len(),
            "item {i}: batched length differs from single"
        );
        assert!(
            a.len() > 2000,
            "item {i}: too short to be speech ({} samples)",
            a.len()
        );
        let max_diff = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(
            max_diff <= 1e-3,
            "item {i}: batched differs from single by {max_diff}"
        );
    }
    // Shorter items must not carry the padding's audio.
    assert!(batch.audio[0].len() < batch.audio[2].len());
}

/// Rounding the padded length up (fewer distinct shapes for cuDNN on CUDA) changes no
/// sample: padding is masked by `input_lengths` and trimmed by the frame counts.
#[test]
fn padding_to_a_multiple_gives_the_same_audio() {
    let (voice, mut exact) = engine();
    let (_, mut rounded) = engine_padded_to(32);
    let items: Vec<Vec<i64>> = ["hɛloʊ.", "ðə kwɪk bɹaʊn fɑks dʒʌmps oʊvɚ ðə leɪzi dɑɡ."]
        .iter()
        .map(|t| ids(&voice, t))
        .collect();
    assert!(
        items.iter().all(|it| it.len() % 32 != 0),
        "the items must need rounding"
    );
    let refs: Vec<&[i64]> = items.iter().map(Vec::as_slice).collect();
    for batch in [&refs[..1], &refs[..]] {
        let a = exact
            .synthesize(batch, Scales::DETERMINISTIC)
            .expect("exact");
        let b = rounded
            .synthesize(batch, Scales::DETERMINISTIC)
            .expect("rounded");
        for (x, y) in a.audio.iter().zip(&b.audio) {
            assert_eq!(x.len(), y.len(), "rounded padding changed the length");
            let max_diff = x
                .iter()
                .zip(y)
                .map(|(p, q)| (p - q).abs())
                .fold(0.0f32, f32::max);
            assert!(
                max_diff <= 1e-3,
                "rounded padding changed the audio by {max_diff}"
            );
        }
    }
}

#[test]
fn a_missing_runtime_is_a_clear_error() {
    let e = load_runtime(std::path::Path::new(
        "/nonexistent/libonnxruntime.so.1.32.0",
    ))
    .expect_err("missing");
    assert!(e.to_string().contains("ops/setup.sh"), "{e}");
}

#[test]
fn every_ids_duration_adds_up_to_its_items_audio_in_a_padded_batch() {
    let (voice, mut engine) = engine();
    let items: Vec<Vec<i64>> = ["hɛloʊ.", "ðə kwɪk bɹaʊn fɑks dʒʌmps oʊvɚ ðə leɪzi dɑɡ."]
        .iter()
        .map(|t| ids(&voice, t))
        .collect();
    let refs: Vec<&[i64]> = items.iter().map(Vec::as_slice).collect();
    for scales in [
        Scales::DETERMINISTIC,
        Scales {
            length: 1.5,
            ..Scales::DETERMINISTIC
        },
    ] {
        let out = engine.synthesize(&refs, scales).expect("batch");
        for (i, item) in items.iter().enumerate() {
            let t = &out.token_samples[i];
            assert_eq!(t.len(), item.len(), "one duration per id");
            // Whole frames of 256 samples (the vocoder's hop), summing to the audio
            // exactly: the timings are in step with the samples.
            assert!(t.iter().all(|&n| n % 256 == 0), "{t:?}");
            let sum: u64 = t.iter().map(|&n| u64::from(n)).sum();
            assert_eq!(sum, out.audio[i].len() as u64, "item {i} at {scales:?}");
            // Every phoneme is spoken (VITS gives each real id at least one frame).
            assert!(t.iter().all(|&n| n > 0), "{t:?}");
        }
    }
}
