//! `POST /v1/audio/speech`, as OpenAI's API takes it (`model`, `input`, `voice`,
//! `response_format`, `speed`): the input read and planned as `narrator synth` reads a
//! text ([`narrator_pipeline::book`]), then spoken sentence by sentence on the server's
//! engine. WAV (its sizes unknown: 0xFFFFFFFF, as OpenAI streams it), PCM (16-bit
//! little-endian mono at the voice's rate, in `X-Sample-Rate`) and MP3 (frames without a
//! tag or Info frame) are sent as each sentence finishes; Opus once the whole is
//! encoded. A failure after the first bytes aborts the body (the client sees a broken
//! transfer, never a short file as complete); a client that goes away stops the
//! synthesis.

use std::io::{Cursor, Seek, SeekFrom, Write};
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::rejection::JsonRejection;
use axum::extract::{Extension, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use futures_util::StreamExt;
use futures_util::stream::FuturesOrdered;
use narrator_audio::{AudioFormat, AudioSink, EncoderSpec, PauseKind};
use narrator_core::{PauseAfter, Segment};
use narrator_engine::ScaleOverrides;
use narrator_pipeline::book::{Identity, load_options, plan_book};
use serde::Deserialize;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::mpsc;

use crate::auth::Tenant;
use crate::{ApiError, AppState, MODELS, OPENAI_VOICES};

/// The body of `POST /v1/audio/speech`. Fields OpenAI added that narrator does not use
/// (`instructions`) are accepted and ignored.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct SpeechRequest {
    #[schema(
        pattern = "^(narrator|tts-1|tts-1-hd|gpt-4o-mini-tts)$",
        example = "tts-1"
    )]
    pub model: String,
    /// The text to speak (at most --max-input-chars characters).
    #[schema(min_length = 1, example = "Hello from narrator.")]
    pub input: String,
    /// The server's voice, or one of OpenAI's names.
    #[schema(example = "alloy")]
    pub voice: String,
    #[schema(pattern = "^(mp3|opus|aac|flac|wav|pcm)$", example = "wav")]
    pub response_format: Option<String>,
    #[schema(minimum = 0.5, maximum = 2.0)]
    pub speed: Option<f32>,
    /// Accepted, not used.
    pub instructions: Option<String>,
    #[schema(pattern = "^audio$")]
    pub stream_format: Option<String>,
}

/// What the audio is sent as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Wav,
    Pcm,
    Mp3,
    Opus,
    Aac,
    Flac,
}

impl Format {
    /// `response_format` (OpenAI's default: mp3).
    pub fn parse(name: Option<&str>) -> Result<Self, ApiError> {
        match name.unwrap_or("mp3") {
            "wav" => Ok(Format::Wav),
            "pcm" => Ok(Format::Pcm),
            "mp3" => Ok(Format::Mp3),
            "opus" => Ok(Format::Opus),
            "aac" => Ok(Format::Aac),
            "flac" => Ok(Format::Flac),
            other => Err(ApiError::bad(
                "unsupported_response_format",
                format!(
                    "response_format {other:?} is not one this server makes; choose mp3, opus, aac, flac, wav or pcm"
                ),
            )),
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            Format::Wav => "audio/wav",
            Format::Pcm => "audio/pcm",
            Format::Mp3 => "audio/mpeg",
            Format::Opus => "audio/ogg; codecs=opus",
            Format::Aac => "audio/aac",
            Format::Flac => "audio/flac",
        }
    }
}

/// Checks a request against what this server speaks; its format.
pub fn check(state: &AppState, r: &SpeechRequest) -> Result<Format, ApiError> {
    if !MODELS.contains(&r.model.as_str()) {
        return Err(ApiError::bad(
            "unknown_model",
            format!(
                "model {:?} is not one of {}; see GET /v1/models",
                r.model,
                MODELS.join(", ")
            ),
        ));
    }
    if r.voice != state.voice.name && !OPENAI_VOICES.contains(&r.voice.as_str()) {
        return Err(ApiError::bad(
            "unknown_voice",
            format!(
                "voice {:?} is not served here; use {:?} or one of OpenAI's names ({}), see GET /v1/voices",
                r.voice,
                state.voice.name,
                OPENAI_VOICES.join(", ")
            ),
        ));
    }
    if r.input.trim().is_empty() {
        return Err(ApiError::bad(
            "empty_input",
            "input is empty; send the text to speak",
        ));
    }
    let chars = r.input.chars().count();
    if chars > state.max_input_chars {
        return Err(ApiError::with(
            StatusCode::PAYLOAD_TOO_LARGE,
            "input_too_long",
            format!(
                "input is {chars} characters, over the {} this server speaks in one request; split it, or submit it as a job",
                state.max_input_chars
            ),
        ));
    }
    if let Some(speed) = r.speed
        && !(0.5..=2.0).contains(&speed)
    {
        return Err(ApiError::bad(
            "invalid_speed",
            format!("speed {speed} is outside what narrator's voices do (0.5 to 2.0)"),
        ));
    }
    if r.stream_format.as_deref().is_some_and(|f| f != "audio") {
        return Err(ApiError::bad(
            "unsupported_stream_format",
            "stream_format must be \"audio\" (server-sent events are not made here)",
        ));
    }
    Format::parse(r.response_format.as_deref())
}

/// The input as segments, each at the request's speed.
pub fn plan(state: &AppState, r: &SpeechRequest) -> Result<Vec<Segment>, ApiError> {
    let unprocessable =
        |e: String| ApiError::with(StatusCode::UNPROCESSABLE_ENTITY, "unreadable_input", e);
    let load = load_options(&state.voice, r.input.len() as u64, false);
    let doc = narrator_text::parse_document(&r.input, narrator_text::InputFormat::Text, &load)
        .map_err(|e| unprocessable(e.to_string()))?;
    let identity = Identity::of(&state.voice, &ScaleOverrides::default(), None).map_err(|e| {
        ApiError::with(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("{e:#}"),
        )
    })?;
    let plan = plan_book(
        &doc,
        "input",
        "speech",
        &identity,
        &narrator_text::Lexicon::default(),
    )
    .map_err(|e| unprocessable(format!("{e:#}")))?;
    Ok(plan
        .segments
        .into_iter()
        .map(|mut s| {
            s.speed = r.speed;
            s
        })
        .collect())
}

/// `POST /v1/audio/speech`.
#[utoipa::path(post, path = "/v1/audio/speech", tag = "speech",
    request_body(content = SpeechRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The audio, in response_format (all but Opus streamed sentence by sentence; PCM's rate in X-Sample-Rate)",
            content(("audio/mpeg"), ("audio/ogg"), ("audio/aac"), ("audio/flac"), ("audio/wav"), ("audio/pcm"))),
        (status = 400, description = "A request this server does not take (model, voice, format, speed, empty input, JSON)", body = crate::error::ErrorBody),
        (status = 401, description = "No token, or one this server does not know (with tokens)", body = crate::error::ErrorBody),
        (status = 413, description = "Input or body too long", body = crate::error::ErrorBody),
        (status = 415, description = "Not JSON", body = crate::error::ErrorBody),
        (status = 422, description = "A required field missing, or nothing speakable", body = crate::error::ErrorBody),
        (status = 429, description = "This tenant's speech requests are at --speech-per-tenant (Retry-After)", body = crate::error::ErrorBody),
    ))]
pub async fn speak(
    State(state): State<Arc<AppState>>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    body: Result<Json<SpeechRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    // Held until the last byte is sent (or the client goes).
    let slot = state.speech_slots.take(&tenant)?;
    let Json(request) = body.map_err(|e| {
        let status = e.status();
        let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "body_too_large"
        } else {
            "invalid_request"
        };
        ApiError::with(
            status,
            code,
            format!(
                "{}; send a JSON body as OpenAI's /v1/audio/speech takes it",
                e.body_text()
            ),
        )
    })?;
    let format = check(&state, &request)?;
    let segments = {
        let state = state.clone();
        tokio::task::spawn_blocking(move || plan(&state, &request))
            .await
            .map_err(|e| {
                ApiError::with(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
            })??
    };
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let rate = state.synth.sample_rate();
    tokio::spawn(produce(state, segments, format, tx, Some(slot)));
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let mut response = Response::new(Body::from_stream(stream));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(format.content_type()),
    );
    headers.insert("x-sample-rate", HeaderValue::from(rate));
    Ok(response)
}

/// What a voice's preview says.
pub const PREVIEW_TEXT: &str =
    "Hello. This is how I sound, reading a book aloud from beginning to end.";

/// `GET /v1/voices/{name}/preview`: a few seconds of the voice as MP3, made once and
/// kept for the server's life.
#[utoipa::path(get, path = "/v1/voices/{name}/preview", tag = "speech",
    params(("name" = String, Path, description = "The voice, or one of OpenAI's names")),
    responses(
        (status = 200, description = "A few seconds of the voice", content_type = "audio/mpeg"),
        (status = 401, description = "No token, or one this server does not know (with tokens)", body = crate::error::ErrorBody),
        (status = 404, description = "No such voice here", body = crate::error::ErrorBody),
        (status = 500, description = "The preview could not be made", body = crate::error::ErrorBody),
    ))]
pub async fn preview(
    State(state): State<Arc<AppState>>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    if name != state.voice.name && !OPENAI_VOICES.contains(&name.as_str()) {
        return Err(ApiError::with(
            StatusCode::NOT_FOUND,
            "unknown_voice",
            format!("voice {name:?} is not served here; GET /v1/voices lists the voices"),
        ));
    }
    let audio = state
        .preview
        .get_or_try_init(|| async {
            let request = SpeechRequest {
                model: "narrator".into(),
                input: PREVIEW_TEXT.into(),
                voice: state.voice.name.clone(),
                response_format: Some("mp3".into()),
                speed: None,
                instructions: None,
                stream_format: None,
            };
            let segments = plan(&state, &request)?;
            let (tx, mut rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(4);
            tokio::spawn(produce(state.clone(), segments, Format::Mp3, tx, None));
            let mut whole = Vec::new();
            while let Some(piece) = rx.recv().await {
                let piece = piece.map_err(|e| {
                    ApiError::with(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "internal",
                        format!("making the preview: {e}"),
                    )
                })?;
                whole.extend_from_slice(&piece);
            }
            Ok::<_, ApiError>(Bytes::from(whole))
        })
        .await?
        .clone();
    let mut response = Response::new(Body::from(audio));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("audio/mpeg"));
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, max-age=3600"),
    );
    Ok(response)
}

/// Synthesizes the segments one after the other and sends their audio down `tx`.
///
/// `slot` (the tenant's place) is given back before `tx` is dropped: the response ends
/// only when `tx` goes, so a client that sends its next request on seeing the end finds
/// its place free.
async fn produce(
    state: Arc<AppState>,
    segments: Vec<Segment>,
    format: Format,
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    slot: Option<crate::auth::SpeechSlot>,
) {
    let rate = state.synth.sample_rate();
    let mut encoder = match Encoded::new(format, rate) {
        Ok(e) => e,
        Err(e) => {
            let _ = tx.send(Err(std::io::Error::other(e))).await;
            return;
        }
    };
    let last = segments.len().saturating_sub(1);
    let pauses: Vec<usize> = segments
        .iter()
        .enumerate()
        .map(|(n, s)| match n == last {
            true => 0,
            false => state.pauses.samples(pause_kind(s.pause_after), rate),
        })
        .collect();
    // Alone on the server, a request has its next sentences synthesized while the first
    // is sent (as many at once as the engine runs batches); beside others, one at a time,
    // so that every request's first sentence waits behind one sentence of each other's,
    // not behind their lookahead. Sent in order.
    let _active = Active::enter(&state.active);
    let mut queue = segments.into_iter();
    let mut in_hand = FuturesOrdered::new();
    let mut n = 0;
    loop {
        let room = match state.active.load(Ordering::Relaxed) {
            0 | 1 => state.parallel.max(1),
            _ => 1,
        };
        while in_hand.len() < room {
            match queue.next() {
                Some(segment) => in_hand.push_back(speak_one(&state, segment)),
                None => break,
            }
        }
        let Some(result) = in_hand.next().await else {
            break;
        };
        let pause = pauses[n];
        let samples = match result {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "speech failed mid-request; the response is cut");
                let _ = tx.send(Err(std::io::Error::other(e))).await;
                return;
            }
        };
        // MP3 and Opus encode here: CPU work, kept off the other tasks' threads.
        match tokio::task::block_in_place(|| encoder.push(&samples, pause, n == 0)) {
            Ok(Some(bytes)) => {
                if tx.send(Ok(bytes)).await.is_err() {
                    return; // The client went away.
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "encoding failed mid-request; the response is cut");
                let _ = tx.send(Err(std::io::Error::other(e))).await;
                return;
            }
        }
        n += 1;
    }
    match tokio::task::block_in_place(|| encoder.finish()) {
        Ok(Some(bytes)) => {
            let _ = tx.send(Ok(bytes)).await;
        }
        Ok(None) => {}
        Err(e) => {
            let _ = tx.send(Err(std::io::Error::other(e))).await;
        }
    }
    drop(slot);
    drop(tx);
}

/// One segment's samples.
async fn speak_one(state: &AppState, segment: Segment) -> Result<Vec<i16>, String> {
    let synth = state.synth.clone();
    let prepared = tokio::task::spawn_blocking(move || synth.prepare(segment))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let mut out = state
        .synth
        .synthesize(vec![prepared])
        .await
        .map_err(|e| e.to_string())?;
    Ok(out.pop().map(|s| s.audio.samples).unwrap_or_default())
}

/// Counts a request as speaking while it lives.
struct Active<'a>(&'a AtomicUsize);

impl<'a> Active<'a> {
    fn enter(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Active(count)
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn pause_kind(p: PauseAfter) -> PauseKind {
    match p {
        PauseAfter::Sentence => PauseKind::Sentence,
        PauseAfter::Paragraph => PauseKind::Paragraph,
        PauseAfter::Chapter => PauseKind::Chapter,
        PauseAfter::None => PauseKind::None,
    }
}

/// How samples become the response's bytes.
enum Encoded {
    /// WAV or PCM: bytes as they come.
    Raw { wav: bool, rate: u32 },
    /// MP3: frames as they are encoded.
    Mp3(narrator_audio::Mp3Stream),
    /// AAC (ADTS) or FLAC: frames as they are encoded.
    Codec(narrator_audio::CodecStream),
    /// Opus: encoded into memory (its Ogg pages' granule positions and header are set at
    /// the end), sent at the end.
    Whole {
        sink: Box<dyn AudioSink + Send>,
        buffer: SharedBuffer,
    },
}

impl Encoded {
    fn new(format: Format, rate: u32) -> Result<Self, String> {
        match format {
            Format::Wav | Format::Pcm => Ok(Encoded::Raw {
                wav: format == Format::Wav,
                rate,
            }),
            Format::Mp3 => {
                let spec = EncoderSpec::new(AudioFormat::Mp3, rate);
                narrator_audio::Mp3Stream::new(rate, spec.tuning.mp3_quality)
                    .map(Encoded::Mp3)
                    .map_err(|e| e.to_string())
            }
            Format::Aac | Format::Flac => narrator_audio::CodecStream::new(
                match format {
                    Format::Aac => narrator_audio::StreamCodec::Aac,
                    _ => narrator_audio::StreamCodec::Flac,
                },
                rate,
            )
            .map(Encoded::Codec)
            .map_err(|e| e.to_string()),
            Format::Opus => {
                let buffer = SharedBuffer::default();
                let sink = narrator_audio::create_encoder(
                    &EncoderSpec::new(AudioFormat::Opus, rate),
                    buffer.clone(),
                )
                .map_err(|e| e.to_string())?;
                Ok(Encoded::Whole { sink, buffer })
            }
        }
    }

    /// Bytes to send now, if any.
    fn push(
        &mut self,
        samples: &[i16],
        pause: usize,
        first: bool,
    ) -> Result<Option<Bytes>, String> {
        match self {
            Encoded::Raw { wav, rate } => {
                let mut bytes = Vec::with_capacity(44 + 2 * (samples.len() + pause));
                if *wav && first {
                    bytes.extend_from_slice(&streaming_wav_header(*rate));
                }
                for s in samples {
                    bytes.extend_from_slice(&s.to_le_bytes());
                }
                bytes.resize(bytes.len() + 2 * pause, 0);
                Ok(Some(Bytes::from(bytes)))
            }
            Encoded::Mp3(stream) => frames(|x| stream.encode(x), samples, pause),
            Encoded::Codec(stream) => frames(|x| stream.encode(x), samples, pause),
            Encoded::Whole { sink, .. } => {
                sink.write(samples)
                    .and_then(|()| sink.write_silence(pause))
                    .map_err(|e| e.to_string())?;
                Ok(None)
            }
        }
    }

    fn finish(self) -> Result<Option<Bytes>, String> {
        match self {
            Encoded::Raw { .. } => Ok(None),
            Encoded::Mp3(stream) => last(stream.finish()),
            Encoded::Codec(stream) => last(stream.finish()),
            Encoded::Whole { sink, buffer } => {
                sink.finish().map_err(|e| e.to_string())?;
                Ok(Some(Bytes::from(buffer.take())))
            }
        }
    }
}

/// The frames an encoder made of `samples` and `pause` samples of silence after them.
fn frames(
    mut encode: impl FnMut(&[i16]) -> Result<Vec<u8>, narrator_audio::AudioError>,
    samples: &[i16],
    pause: usize,
) -> Result<Option<Bytes>, String> {
    let mut bytes = encode(samples).map_err(|e| e.to_string())?;
    if pause > 0 {
        bytes.extend(encode(&vec![0; pause]).map_err(|e| e.to_string())?);
    }
    Ok((!bytes.is_empty()).then(|| Bytes::from(bytes)))
}

/// An encoder's last frames.
fn last(finished: Result<Vec<u8>, narrator_audio::AudioError>) -> Result<Option<Bytes>, String> {
    finished
        .map(|b| (!b.is_empty()).then(|| Bytes::from(b)))
        .map_err(|e| e.to_string())
}

/// A 44-byte WAV header for 16-bit mono at `rate` whose sizes are unknown (0xFFFFFFFF):
/// how a WAV is streamed before its length is known.
pub fn streaming_wav_header(rate: u32) -> [u8; 44] {
    let mut h = [0u8; 44];
    h[0..4].copy_from_slice(b"RIFF");
    h[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    h[8..12].copy_from_slice(b"WAVE");
    h[12..16].copy_from_slice(b"fmt ");
    h[16..20].copy_from_slice(&16u32.to_le_bytes());
    h[20..22].copy_from_slice(&1u16.to_le_bytes()); // PCM
    h[22..24].copy_from_slice(&1u16.to_le_bytes()); // mono
    h[24..28].copy_from_slice(&rate.to_le_bytes());
    h[28..32].copy_from_slice(&(rate * 2).to_le_bytes());
    h[32..34].copy_from_slice(&2u16.to_le_bytes());
    h[34..36].copy_from_slice(&16u16.to_le_bytes());
    h[36..40].copy_from_slice(b"data");
    h[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
    h
}

/// An in-memory file the encoders write into (they seek back to fix their headers) that
/// the server takes the bytes from once they finish.
#[derive(Clone, Default)]
struct SharedBuffer(Arc<Mutex<Cursor<Vec<u8>>>>);

impl SharedBuffer {
    fn take(&self) -> Vec<u8> {
        let mut c = self.0.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(c.get_mut())
    }
}

impl Write for SharedBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Seek for SharedBuffer {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).seek(pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_openai_s_names() {
        assert_eq!(Format::parse(None), Ok(Format::Mp3));
        assert_eq!(Format::parse(Some("wav")), Ok(Format::Wav));
        assert_eq!(Format::parse(Some("flac")), Ok(Format::Flac));
        assert_eq!(Format::parse(Some("aac")), Ok(Format::Aac));
        let e = Format::parse(Some("vorbis")).expect_err("not OpenAI's");
        assert_eq!(e.code, "unsupported_response_format");
        assert!(
            e.message.contains("mp3, opus, aac, flac, wav or pcm"),
            "{}",
            e.message
        );
    }

    #[test]
    fn the_streaming_header_says_16_bit_mono_of_unknown_length() {
        let h = streaming_wav_header(22050);
        assert_eq!(&h[0..4], b"RIFF");
        assert_eq!(u32::from_le_bytes([h[24], h[25], h[26], h[27]]), 22050);
        assert_eq!(u32::from_le_bytes([h[40], h[41], h[42], h[43]]), u32::MAX);
        assert_eq!(u16::from_le_bytes([h[34], h[35]]), 16);
    }
}
