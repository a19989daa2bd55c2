//! Kokoro-82M through the real runtime: packed runs cut at the items' token boundaries,
//! speed, blends, and installs that are broken or voices that cannot be read.

use std::path::{Path, PathBuf};

use narrator_engine::kokoro::{KokoroVoice, VoiceSpec};
use narrator_engine::{
    ArenaPolicy, Backend, CpuArena, Device, EngineError, Family, Scales, SessionOptions, Voice,
    load_runtime,
};
use narrator_phonemes::Phonemizer;

const HOP: usize = 600;

fn deps() -> PathBuf {
    let d = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.deps"));
    assert!(
        d.join("voices/kokoro/model.onnx").is_file(),
        "Kokoro is missing: run `bash ops/setup.sh --kokoro` first"
    );
    d
}

fn voice(name: &str) -> Voice {
    Voice::find(&deps().join("voices"), name).expect("kokoro voice")
}

fn runtime() -> &'static narrator_engine::Runtime {
    load_runtime(&deps().join("onnxruntime/libonnxruntime.so.1.32.0")).expect("runtime")
}

fn cpu() -> SessionOptions {
    SessionOptions {
        intra_threads: 2,
        device: Device::Cpu,
        gpu_mem_limit: None,
        spin: false,
        cpu_arena: ArenaPolicy::new(CpuArena::default()),
        pad_multiple: 1,
        graph: None,
    }
}

fn session(v: &Voice) -> Box<dyn Backend> {
    v.family.open(runtime(), &cpu()).expect("session")
}

/// One id sequence per sentence of `text`, as the pipeline makes them.
fn utterances(v: &Voice, text: &str) -> Vec<Vec<i64>> {
    let p = Phonemizer::new(&deps()).expect("espeak-ng");
    p.phonemize(v.family.espeak_voice(), text)
        .expect("phonemize")
        .into_iter()
        .map(|s| v.family.phoneme_ids(&s).0)
        .filter(|ids| !ids.is_empty())
        .collect()
}

fn rms(x: &[f32]) -> f32 {
    (x.iter().map(|s| s * s).sum::<f32>() / x.len().max(1) as f32).sqrt()
}

const NORMAL: Scales = Scales {
    noise: 0.0,
    length: 1.0,
    noise_w: 0.0,
};

#[test]
fn packed_runs_cut_each_item_where_its_tokens_end() {
    let v = voice("af_heart");
    let mut engine = session(&v);
    assert!(
        engine.supports_batching(),
        "the durations output was not spliced in"
    );
    let items = utterances(
        &v,
        "The rabbit looked at its watch. Then it hurried on, down the long hall! \
         Was it late again?",
    );
    assert_eq!(items.len(), 3, "three sentences");
    let refs: Vec<&[i64]> = items.iter().map(Vec::as_slice).collect();
    let singles: Vec<Vec<f32>> = refs
        .iter()
        .map(|it| {
            engine
                .synthesize(&[it], NORMAL)
                .expect("single")
                .audio
                .remove(0)
        })
        .collect();
    let packed = engine.synthesize(&refs, NORMAL).expect("packed").audio;
    assert_eq!(packed.len(), 3, "one waveform per item");
    let whole = engine
        .synthesize(
            &[&{
                let mut all = Vec::new();
                for (k, it) in items.iter().enumerate() {
                    if k > 0 {
                        all.push(16);
                    }
                    all.extend_from_slice(it);
                }
                all
            }],
            NORMAL,
        )
        .expect("whole")
        .audio
        .remove(0);
    // The pieces are the packed run's audio, cut on frame boundaries, nothing lost.
    assert_eq!(
        packed.iter().map(Vec::len).sum::<usize>(),
        whole.len(),
        "the pieces add up to the run"
    );
    let loud = rms(&whole);
    let mut at = 0;
    for (k, (piece, single)) in packed.iter().zip(&singles).enumerate() {
        assert_eq!(piece.len() % HOP, 0, "item {k} ends on a frame boundary");
        assert_eq!(single.len() % HOP, 0, "single run {k} is whole frames");
        // The same sentence, so about the same length as when it ran alone: one style
        // vector serves the whole packed run, so durations move a little, and a single
        // run also holds the pauses of its two boundary tokens, where a packed item
        // between others has the model's own pause at its separator.
        let ratio = piece.len() as f64 / single.len() as f64;
        assert!(
            (0.7..1.3).contains(&ratio),
            "item {k}: packed {} vs single {} samples",
            piece.len(),
            single.len()
        );
        at += piece.len();
        if k + 1 < packed.len() {
            // A cut ends the pause after a sentence's last token (the next word may start
            // within the frame before it): some frame of the last four is near silence.
            let quiet = (1..=4)
                .map(|f| rms(&whole[at - f * HOP..at - (f - 1) * HOP]))
                .fold(f32::MAX, f32::min);
            assert!(
                quiet < loud * 0.2,
                "cut {k} at {at} is inside speech (quietest frame rms {quiet} of {loud})"
            );
        }
    }
}

#[test]
fn speed_changes_the_duration_as_asked() {
    let v = voice("af_heart");
    let mut engine = session(&v);
    let items = utterances(&v, "Down, down, down. Would the fall never come to an end?");
    let refs: Vec<&[i64]> = items.iter().map(Vec::as_slice).collect();
    let mut len = |speed: f32| -> usize {
        let scales = Scales {
            length: 1.0 / speed,
            ..NORMAL
        };
        engine
            .synthesize(&refs, scales)
            .expect("run")
            .audio
            .iter()
            .map(Vec::len)
            .sum()
    };
    let (normal, fast, slow) = (len(1.0), len(1.5), len(0.75));
    let f = normal as f64 / fast as f64;
    let s = slow as f64 / normal as f64;
    assert!(
        (1.3..1.7).contains(&f),
        "1.5x speed gave {f:.2}x shorter audio"
    );
    assert!(
        (1.2..1.45).contains(&s),
        "0.75x speed gave {s:.2}x longer audio"
    );
}

#[test]
fn a_blend_differs_from_both_parents() {
    let dir = deps().join("voices/kokoro");
    let spec = |s: &str| VoiceSpec::parse(s).expect("parse").expect("kokoro");
    let bella = KokoroVoice::open(&dir, &spec("af_bella")).expect("bella");
    let sky = KokoroVoice::open(&dir, &spec("af_sky")).expect("sky");
    let blend = KokoroVoice::open(&dir, &spec("af_bella:2+af_sky:1")).expect("blend");
    for n in [1, 50, 510] {
        let (b, s, m) = (bella.style(n), sky.style(n), blend.style(n));
        for i in 0..b.len() {
            let want = (2.0 * b[i] + s[i]) / 3.0;
            assert!((m[i] - want).abs() < 1e-5, "row {n}, column {i}");
        }
        assert_ne!(m, b);
        assert_ne!(m, s);
    }
    // The blend is its own voice: another identity, another sound.
    assert_ne!(blend.identity(), bella.identity());
    let v = voice("af_bella:2+af_sky:1");
    assert_eq!(v.name, "af_bella:2+af_sky:1");
    assert_eq!(v.info().quality, "blend");
    let items = utterances(&v, "Curiouser and curiouser!");
    let refs: Vec<&[i64]> = items.iter().map(Vec::as_slice).collect();
    let mut a = session(&v);
    let mut b = session(&voice("af_bella"));
    let blended = a.synthesize(&refs, NORMAL).expect("blend").audio.concat();
    let parent = b.synthesize(&refs, NORMAL).expect("bella").audio.concat();
    let n = blended.len().min(parent.len());
    let diff: f32 = rms(&blended[..n]
        .iter()
        .zip(&parent[..n])
        .map(|(x, y)| x - y)
        .collect::<Vec<_>>());
    assert!(
        diff > 0.01 * rms(&parent),
        "the blend sounds like its parent"
    );
}

fn copy_install(to: &Path, skip: &str) {
    let from = deps().join("voices/kokoro");
    std::fs::create_dir_all(to.join("kokoro/voices")).expect("mkdir");
    for f in ["model.onnx", "vocab.json"] {
        if f != skip {
            std::os::unix::fs::symlink(from.join(f), to.join("kokoro").join(f)).expect("link");
        }
    }
    if skip != "voices" {
        std::fs::copy(
            from.join("voices/af_heart.bin"),
            to.join("kokoro/voices/af_heart.bin"),
        )
        .expect("copy");
    }
}

#[test]
fn broken_installs_and_unreadable_voices_say_what_to_do_in_one_line() {
    let tmp = tempfile::tempdir().expect("tmp");
    // Not installed at all.
    let e = Voice::find(tmp.path(), "af_heart").expect_err("not installed");
    assert_eq!(e.kind(), "voice_not_installed");
    assert!(
        e.to_string().contains("narrator voices install kokoro"),
        "{e}"
    );
    // The model missing, then a voice file missing, then a truncated voice file.
    copy_install(tmp.path(), "model.onnx");
    let e = Voice::find(tmp.path(), "af_heart").expect_err("no model");
    assert!(e.to_string().contains("model.onnx"), "{e}");
    let tmp = tempfile::tempdir().expect("tmp");
    copy_install(tmp.path(), "voices");
    let e = Voice::find(tmp.path(), "af_heart").expect_err("no voice file");
    assert!(e.to_string().contains("af_heart.bin"), "{e}");
    std::fs::write(tmp.path().join("kokoro/voices/af_heart.bin"), [0u8; 100]).expect("write");
    let e = Voice::find(tmp.path(), "af_heart").expect_err("short voice file");
    assert_eq!(e.kind(), "voice_config");
    assert!(e.to_string().contains("522240"), "{e}");
    // Languages without a G2P here are refused with why; unknown names list what exists.
    let e = Voice::find(&deps().join("voices"), "jf_alpha").expect_err("japanese");
    assert_eq!(e.kind(), "unsupported_language");
    let e = Voice::find(&deps().join("voices"), "af_nobody").expect_err("unknown");
    assert_eq!(e.kind(), "unknown_voice");
    assert!(e.to_string().contains("Kokoro"), "{e}");
    for e in [
        Voice::find(&deps().join("voices"), "af_bella+nobody").expect_err("blend"),
        Voice::find(&deps().join("voices"), "af_heart:-1+af_sky").expect_err("weight"),
    ] {
        assert_eq!(e.kind(), "bad_blend");
        assert!(!e.to_string().contains('\n'), "one line: {e}");
    }
}

#[test]
fn every_language_espeak_serves_is_spoken() {
    // Each language's first voice phonemizes a sentence of its own into known ids.
    for (name, text) in [
        ("bf_emma", "The Queen of Hearts, she made some tarts."),
        ("ef_dora", "El conejo blanco corre por el bosque."),
        ("ff_siwis", "Le lapin blanc court dans la forêt."),
        ("hf_alpha", "सफेद खरगोश जंगल में दौड़ता है।"),
        ("if_sara", "Il coniglio bianco corre nel bosco."),
        ("pf_dora", "O coelho branco corre pela floresta."),
    ] {
        let v = voice(name);
        let items = utterances(&v, text);
        let ids: usize = items.iter().map(Vec::len).sum();
        assert!(ids > 10, "{name}: {ids} ids for {text:?}");
        let p = Phonemizer::new(&deps()).expect("espeak-ng");
        let unknown: Vec<String> = p
            .phonemize(v.family.espeak_voice(), text)
            .expect("phonemize")
            .iter()
            .flat_map(|s| v.family.phoneme_ids(s).1)
            .collect();
        assert!(
            unknown.len() * 10 <= ids,
            "{name}: too many phonemes outside the vocabulary: {unknown:?}"
        );
    }
    let e: EngineError = Voice::find(&deps().join("voices"), "zf_xiaoxiao").expect_err("zh");
    assert!(e.to_string().contains("G2P"), "{e}");
}

/// RMS of each 600-sample frame.
fn envelope(x: &[f32]) -> Vec<f32> {
    x.chunks(HOP).map(rms).collect()
}

/// Pearson correlation of two envelopes after stretching `b` to `a`'s length.
fn envelope_correlation(a: &[f32], b: &[f32]) -> f64 {
    let (ea, eb) = (envelope(a), envelope(b));
    let stretched: Vec<f64> = (0..ea.len())
        .map(|i| f64::from(eb[(i * eb.len() / ea.len()).min(eb.len() - 1)]))
        .collect();
    let ea: Vec<f64> = ea.iter().map(|&v| f64::from(v)).collect();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (ma, mb) = (mean(&ea), mean(&stretched));
    let cov: f64 = ea
        .iter()
        .zip(&stretched)
        .map(|(x, y)| (x - ma) * (y - mb))
        .sum();
    let var = |v: &[f64], m: f64| v.iter().map(|x| (x - m) * (x - m)).sum::<f64>();
    cov / (var(&ea, ma) * var(&stretched, mb)).sqrt()
}

#[test]
fn the_fp32_graph_speaks_like_the_int8_one() {
    let d = deps();
    let dir = d.join("voices/kokoro");
    assert!(
        dir.join("model.fp32.onnx").is_file(),
        "the fp32 graph is missing: run `bash ops/setup.sh --kokoro --gpu`"
    );
    let (rt, opts) = (runtime(), cpu());
    let open = |voice: &str, graph: &str| {
        let spec = VoiceSpec::parse(voice).expect("parse").expect("kokoro");
        let v = KokoroVoice::open(&dir, &spec).expect("voice");
        let styles = (1..=510)
            .flat_map(|n| v.style(n).to_vec())
            .collect::<Vec<_>>();
        narrator_engine::KokoroEngine::load(
            rt,
            &dir.join(graph),
            std::sync::Arc::new(styles),
            16,
            &opts,
        )
        .expect("session")
    };
    let v = voice("af_heart");
    let items = utterances(
        &v,
        "Alice was beginning to get very tired of sitting by her sister on the bank, \
         and of having nothing to do.",
    );
    let refs: Vec<&[i64]> = items.iter().map(Vec::as_slice).collect();
    let run = |e: &mut narrator_engine::KokoroEngine| {
        e.synthesize(&refs, NORMAL).expect("run").audio.concat()
    };
    let int8 = run(&mut open("af_heart", "model.onnx"));
    let fp32 = run(&mut open("af_heart", "model.fp32.onnx"));
    let other_voice = run(&mut open("am_adam", "model.onnx"));
    // The same durations within a few frames, and the same loudness contour.
    let len_ratio = fp32.len() as f64 / int8.len() as f64;
    assert!(
        (0.95..1.05).contains(&len_ratio),
        "fp32 {} vs int8 {} samples",
        fp32.len(),
        int8.len()
    );
    let same = envelope_correlation(&int8, &fp32);
    let differs = envelope_correlation(&int8, &other_voice);
    eprintln!("envelope correlation: fp32 {same:.3}, another voice {differs:.3}");
    // Measured here: 0.83 for the fp32 graph, 0.31 for another voice (the stretch that
    // aligns the two is linear, so a few frames of drift cost some correlation).
    assert!(same > 0.7, "fp32 envelope correlation {same:.3}");
    assert!(
        same > differs + 0.25,
        "fp32 ({same:.3}) should be far closer than another voice ({differs:.3})"
    );
    // Loudness within 2 dB.
    let db = 20.0 * (rms(&fp32) / rms(&int8)).log10();
    assert!(db.abs() < 2.0, "fp32 is {db:.2} dB from int8");
}

#[test]
fn each_item_starts_at_its_first_phoneme_not_at_the_models_lead_silence() {
    let v = voice("af_heart");
    let mut engine = session(&v);
    let items = utterances(&v, "Curiouser and curiouser! Down, down, down.");
    let refs: Vec<&[i64]> = items.iter().map(Vec::as_slice).collect();
    for (k, it) in refs.iter().enumerate() {
        let wave = engine
            .synthesize(&[it], NORMAL)
            .expect("single")
            .audio
            .remove(0);
        let loud = rms(&wave);
        // The model spends ~15 frames (375 ms) of near silence on its leading boundary
        // token; with it cut, speech is under way within the first 100 ms.
        let onset = rms(&wave[..4 * HOP]);
        assert!(
            onset > 0.1 * loud,
            "item {k}: first 100 ms rms {onset} of {loud}: still the lead silence"
        );
        // Whole frames still, and the fade-in starts from silence.
        assert_eq!(wave.len() % HOP, 0);
        assert_eq!(wave[0], 0.0);
    }
}

#[test]
fn every_ids_duration_falls_in_its_items_audio_single_and_packed() {
    let v = voice("af_heart");
    let mut engine = session(&v);
    let items = utterances(&v, "The rabbit looked at its watch. Then it hurried on!");
    let refs: Vec<&[i64]> = items.iter().map(Vec::as_slice).collect();
    let packed = engine.synthesize(&refs, NORMAL).expect("packed");
    for (k, it) in refs.iter().enumerate() {
        let single = engine.synthesize(&[it], NORMAL).expect("single");
        for (how, t, audio) in [
            ("single", &single.token_samples[0], &single.audio[0]),
            ("packed", &packed.token_samples[k], &packed.audio[k]),
        ] {
            assert_eq!(t.len(), it.len(), "{how} {k}: one duration per id");
            assert!(
                t.iter().all(|&n| n > 0 && (n as usize).is_multiple_of(HOP)),
                "{t:?}"
            );
            // The ids start the item's audio (its lead silence cut); what is left after
            // the last id is the model's pause (the separator or the trailing token).
            let spoken: usize = t.iter().map(|&n| n as usize).sum();
            let rest = audio.len() - spoken;
            assert!(
                rest.is_multiple_of(HOP) && rest <= 40 * HOP,
                "{how} {k}: {spoken} samples of ids in {} of audio",
                audio.len()
            );
        }
    }
}
