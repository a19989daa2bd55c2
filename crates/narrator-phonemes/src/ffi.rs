//! The only unsafe code in narrator: hand-written bindings to Debian's libespeak-ng
//! (1.51, `libespeak-ng.so.1`, linked by `build.rs` through pkg-config).
//!
//! espeak-ng keeps all of its state in C globals (the selected voice, the text decoder,
//! characters it read ahead of the current clause), so every call goes through one
//! process-wide [`Mutex`]: [`Espeak::acquire`] returns a guard, and only the guard can
//! call into the library. espeak-ng is initialized once per process, on the first
//! acquire, with the data directory given; asking for another directory later is an
//! error (the library cannot be re-initialized safely).

use std::ffi::{CStr, CString, c_char, c_int, c_short, c_uint, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::PhonemeError;

/// `espeak_AUDIO_OUTPUT::AUDIO_OUTPUT_SYNCHRONOUS`: no audio thread is started.
const AUDIO_OUTPUT_SYNCHRONOUS: c_int = 2;
/// `espeakINITIALIZE_DONT_EXIT`: return an error instead of calling `exit()` when the
/// data is missing.
const INITIALIZE_DONT_EXIT: c_int = 0x8000;
/// `espeakCHARS_UTF8`.
const CHARS_UTF8: c_int = 1;
/// `espeakPHONEMES_IPA`.
pub(crate) const PHONEMES_IPA: c_int = 0x02;
/// espeak's own ASCII (Kirshenbaum-like) phoneme mnemonics.
pub(crate) const PHONEMES_ASCII: c_int = 0x00;
/// `EE_OK`.
const EE_OK: c_int = 0;
/// `espeakINITIALIZE_PHONEME_EVENTS`: synthesis reports every phoneme as an event.
const INITIALIZE_PHONEME_EVENTS: c_int = 0x0001;
/// `espeakINITIALIZE_PHONEME_IPA`: phoneme events carry IPA names.
const INITIALIZE_PHONEME_IPA: c_int = 0x0002;
/// `espeakEVENT_LIST_TERMINATED`, `espeakEVENT_WORD`, `espeakEVENT_PHONEME`.
const EVENT_LIST_TERMINATED: c_int = 0;
const EVENT_WORD: c_int = 1;
const EVENT_PHONEME: c_int = 7;
/// `POS_CHARACTER`.
const POS_CHARACTER: c_int = 1;

/// `espeak_EVENT` (speak_lib.h, 1.51).
#[repr(C)]
struct RawEvent {
    kind: c_int,
    unique_identifier: c_uint,
    text_position: c_int,
    length: c_int,
    audio_position: c_int,
    sample: c_int,
    user_data: *mut c_void,
    id: RawEventId,
}

/// The `id` union of `espeak_EVENT`.
#[repr(C)]
union RawEventId {
    number: c_int,
    name: *const c_char,
    string: [c_char; 8],
}

type SynthCallback =
    unsafe extern "C" fn(wav: *mut c_short, samples: c_int, events: *mut RawEvent) -> c_int;

// Signatures from /usr/include/espeak-ng/speak_lib.h (1.51). The enum parameters are C
// `int`s; `espeak_ERROR` is an `int`-sized enum.
unsafe extern "C" {
    fn espeak_Initialize(
        output: c_int,
        buflength: c_int,
        path: *const c_char,
        options: c_int,
    ) -> c_int;
    fn espeak_SetVoiceByName(name: *const c_char) -> c_int;
    fn espeak_TextToPhonemes(
        textptr: *mut *const c_void,
        textmode: c_int,
        phonememode: c_int,
    ) -> *const c_char;
    fn espeak_Info(path_data: *mut *const c_char) -> *const c_char;
    fn espeak_SetSynthCallback(callback: SynthCallback);
    fn espeak_Synth(
        text: *const c_void,
        size: usize,
        position: c_uint,
        position_type: c_int,
        end_position: c_uint,
        flags: c_uint,
        unique_identifier: *mut c_uint,
        user_data: *mut c_void,
    ) -> c_int;
}

/// What synthesis reported about the text, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SynthEvent {
    /// A word starts: its first character (0-based, in characters of the text). Words
    /// end where the next begins (the length espeak-ng reports is not needed).
    Word { char_start: usize },
    /// A phoneme of the current word, by its IPA name (without stress marks).
    Phoneme(String),
}

/// Collects the events of one `espeak_Synth` call (its `user_data` is a
/// `Vec<SynthEvent>`); the audio is not wanted.
unsafe extern "C" fn collect_events(
    _wav: *mut c_short,
    _samples: c_int,
    events: *mut RawEvent,
) -> c_int {
    if events.is_null() {
        return 0;
    }
    let mut event = events;
    // The list ends with an event of type LIST_TERMINATED; the bound only stops a
    // misbehaving library.
    for _ in 0..100_000 {
        // SAFETY: espeak-ng passes an array of events terminated by LIST_TERMINATED,
        // valid for the duration of this call; `event` never goes past the terminator.
        let e = unsafe { &*event };
        if e.kind == EVENT_LIST_TERMINATED {
            break;
        }
        if !e.user_data.is_null() {
            // SAFETY: `user_data` is the `&mut Vec<SynthEvent>` that `Espeak::synth_events`
            // passed to espeak_Synth, alive and otherwise unused until espeak_Synth
            // returns (the callback runs on the same thread, inside that call).
            let out = unsafe { &mut *e.user_data.cast::<Vec<SynthEvent>>() };
            match e.kind {
                EVENT_WORD => out.push(SynthEvent::Word {
                    char_start: usize::try_from(e.text_position.max(1) - 1).unwrap_or(0),
                }),
                EVENT_PHONEME => {
                    // SAFETY: phoneme events use the `string` member: up to 8 bytes,
                    // NUL-terminated unless all 8 are used.
                    let raw = unsafe { e.id.string };
                    let bytes: Vec<u8> = raw
                        .iter()
                        .map(|&c| c as u8)
                        .take_while(|&b| b != 0)
                        .collect();
                    out.push(SynthEvent::Phoneme(
                        String::from_utf8_lossy(&bytes).into_owned(),
                    ));
                }
                _ => {}
            }
        }
        // SAFETY: not the terminator, so the next element is part of the array.
        event = unsafe { event.add(1) };
    }
    0
}

/// What the process-wide lock protects.
struct EngineState {
    /// The directory containing `espeak-ng-data` that espeak-ng was initialized with.
    data_parent: PathBuf,
    /// The version string espeak-ng reported at initialization.
    version: String,
    /// The voice last selected (selecting reads the voice's files again, ~0.13 ms).
    voice: Option<String>,
}

static ENGINE: Mutex<Option<EngineState>> = Mutex::new(None);

/// One clause as returned by `espeak_TextToPhonemes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawClause {
    /// The phoneme string (lossily decoded as UTF-8).
    pub(crate) phonemes: String,
    /// Byte range of the input text espeak-ng consumed for this clause (it reads one
    /// character past the clause's end, so this may include the next clause's first
    /// character).
    pub(crate) start: usize,
    pub(crate) end: usize,
    /// espeak-ng reached the end of the text.
    pub(crate) at_eof: bool,
}

/// Exclusive access to the initialized espeak-ng library.
pub(crate) struct Espeak {
    guard: MutexGuard<'static, Option<EngineState>>,
}

impl Espeak {
    /// Locks espeak-ng, initializing it with `data_parent` (the directory that contains
    /// `espeak-ng-data`, already canonicalized) on first use.
    pub(crate) fn acquire(data_parent: &Path) -> Result<Espeak, PhonemeError> {
        // A panic while the lock was held cannot leave Rust state half-written (the state
        // is written once, after a successful initialization), so poisoning is ignored.
        let mut guard = ENGINE.lock().unwrap_or_else(PoisonError::into_inner);
        match guard.as_ref() {
            Some(state) if state.data_parent == data_parent => {}
            Some(state) => {
                return Err(PhonemeError::DataPathConflict {
                    active: state.data_parent.clone(),
                    requested: data_parent.to_path_buf(),
                });
            }
            None => {
                let c_path = CString::new(data_parent.as_os_str().as_bytes()).map_err(|_| {
                    PhonemeError::DataNotFound {
                        path: data_parent.to_path_buf(),
                    }
                })?;
                // SAFETY: `c_path` is a valid NUL-terminated string that outlives the call
                // (espeak-ng copies the path). The lock is held, so no other thread is
                // inside espeak-ng. DONT_EXIT makes a missing data directory an error
                // return instead of `exit()`.
                let rate = unsafe {
                    espeak_Initialize(
                        AUDIO_OUTPUT_SYNCHRONOUS,
                        0,
                        c_path.as_ptr(),
                        INITIALIZE_DONT_EXIT | INITIALIZE_PHONEME_EVENTS | INITIALIZE_PHONEME_IPA,
                    )
                };
                if rate <= 0 {
                    return Err(PhonemeError::Initialize {
                        path: data_parent.to_path_buf(),
                        code: rate,
                    });
                }
                // SAFETY: the lock is held and espeak-ng is initialized; the callback is
                // a plain function that only reads the events it is given.
                unsafe { espeak_SetSynthCallback(collect_events) };
                let version = info_version();
                *guard = Some(EngineState {
                    data_parent: data_parent.to_path_buf(),
                    version,
                    voice: None,
                });
            }
        }
        Ok(Espeak { guard })
    }

    /// espeak-ng's version string, e.g. "1.51".
    pub(crate) fn version(&self) -> &str {
        self.guard
            .as_ref()
            .map_or("", |state| state.version.as_str())
    }

    /// Selects an espeak-ng voice such as `en-us`, unless it is the one selected last:
    /// every text is phonemized to its end, which leaves no state behind that the next
    /// text could see (the Piper fixture and all of Alice phonemize the same either way),
    /// and selecting a voice reads its files from disk again.
    pub(crate) fn set_voice(&mut self, voice: &str) -> Result<(), PhonemeError> {
        if self
            .guard
            .as_ref()
            .is_some_and(|state| state.voice.as_deref() == Some(voice))
        {
            return Ok(());
        }
        let unknown = || PhonemeError::UnknownVoice {
            voice: voice.to_owned(),
        };
        let c_voice = CString::new(voice).map_err(|_| unknown())?;
        // SAFETY: the lock (held by `self`) serializes all espeak-ng calls, espeak-ng was
        // initialized by `acquire`, and `c_voice` is NUL-terminated and outlives the call.
        let rc = unsafe { espeak_SetVoiceByName(c_voice.as_ptr()) };
        if rc != EE_OK {
            if let Some(state) = self.guard.as_mut() {
                state.voice = None;
            }
            return Err(unknown());
        }
        if let Some(state) = self.guard.as_mut() {
            state.voice = Some(voice.to_owned());
        }
        Ok(())
    }

    /// Runs `espeak_TextToPhonemes` clause by clause over all of `text` with the given
    /// phoneme mode (`PHONEMES_IPA` or `PHONEMES_ASCII`, optionally `| sep << 8`).
    pub(crate) fn clauses(
        &mut self,
        text: &CStr,
        phoneme_mode: c_int,
    ) -> Result<Vec<RawClause>, PhonemeError> {
        let base: *const c_void = text.as_ptr().cast();
        let len = text.to_bytes().len();
        let mut cursor = base;
        let mut clauses = Vec::new();
        // Every clause consumes at least one byte; the bound only stops a misbehaving
        // library from looping forever.
        for _ in 0..len + 8 {
            let start = cursor.addr().wrapping_sub(base.addr());
            // SAFETY: the lock (held by `self`) serializes all espeak-ng calls and
            // espeak-ng is initialized. `cursor` points into `text`, a NUL-terminated
            // UTF-8 buffer that outlives the call; espeak-ng only reads it and moves
            // `cursor` forward within it, or sets it to NULL at the end.
            let phonemes = unsafe { espeak_TextToPhonemes(&mut cursor, CHARS_UTF8, phoneme_mode) };
            if phonemes.is_null() {
                return Err(PhonemeError::Engine { offset: start });
            }
            // SAFETY: a non-NULL return is a NUL-terminated string in espeak-ng's own
            // buffer, valid until the next call into espeak-ng; it is copied right here,
            // while the lock is still held.
            let phonemes = unsafe { CStr::from_ptr(phonemes) }
                .to_string_lossy()
                .into_owned();
            if cursor.is_null() {
                clauses.push(RawClause {
                    phonemes,
                    start,
                    end: len,
                    at_eof: true,
                });
                return Ok(clauses);
            }
            let end = cursor.addr().wrapping_sub(base.addr());
            if end > len || end < start {
                return Err(PhonemeError::Engine { offset: start });
            }
            clauses.push(RawClause {
                phonemes,
                start,
                end,
                at_eof: false,
            });
        }
        Err(PhonemeError::Engine { offset: len })
    }
}

impl Espeak {
    /// Synthesizes `text` (the voice set last) and returns the word and phoneme events
    /// it reported, the audio discarded: which characters of the text each phoneme was
    /// said for (`TextToPhonemes` has no such map).
    pub(crate) fn synth_events(&mut self, text: &CStr) -> Result<Vec<SynthEvent>, PhonemeError> {
        let mut events: Vec<SynthEvent> = Vec::new();
        let len = text.to_bytes_with_nul().len();
        // SAFETY: the lock (held by `self`) serializes all espeak-ng calls and espeak-ng is
        // initialized with the collecting callback. `text` is NUL-terminated UTF-8 that
        // outlives the call; in synchronous mode espeak_Synth returns only after the last
        // callback, so `events` (passed as user data) outlives every use of it.
        let rc = unsafe {
            espeak_Synth(
                text.as_ptr().cast(),
                len,
                0,
                POS_CHARACTER,
                0,
                CHARS_UTF8 as c_uint,
                std::ptr::null_mut(),
                (&raw mut events).cast(),
            )
        };
        if rc != EE_OK {
            return Err(PhonemeError::Engine { offset: 0 });
        }
        Ok(events)
    }
}

/// Reads espeak-ng's version string (called with the lock held, after initialization).
fn info_version() -> String {
    let mut data_path: *const c_char = std::ptr::null();
    // SAFETY: called only from `acquire` with the lock held after a successful
    // initialization; espeak_Info writes a pointer to its own static buffer into
    // `data_path` and returns a pointer to a static version string.
    let version = unsafe { espeak_Info(&mut data_path) };
    if version.is_null() {
        return String::new();
    }
    // SAFETY: non-NULL, NUL-terminated, static in libespeak-ng.
    unsafe { CStr::from_ptr(version) }
        .to_string_lossy()
        .into_owned()
}
