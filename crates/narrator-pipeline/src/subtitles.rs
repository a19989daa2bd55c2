//! Subtitles (SRT and WebVTT) of an assembled book, from where each segment's speech
//! falls in the output file.
//!
//! A segment's cue starts at the first sample of its speech and ends at its last, exactly
//! (the layout of the assembled file, pauses excluded). The text is what was spoken: the
//! segment's text after normalization and lexicons ("Doctor" for "Dr."). A segment too
//! long for one cue (two lines of [`LINE_CHARS`]) is split at words into several cues,
//! each starting when its first word is spoken and ending when its last one ends; WebVTT
//! cues carry every word's start as an inline timestamp (`<00:00:01.250>`). Word times
//! come from the model's durations (`SegmentRecord::words`); a segment without them
//! (a graph that gives none) is shared out in proportion to the characters of each cue
//! (an estimate: the segment's own start and end stay exact) and has no inline times.

use std::fmt::Write as _;
use std::str::FromStr;

/// Characters per line at most (the common readability limit for subtitles).
pub const LINE_CHARS: usize = 42;
/// Lines per cue at most.
pub const CUE_LINES: usize = 2;

/// A subtitle file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SubtitleFormat {
    /// SubRip (`.srt`).
    Srt,
    /// WebVTT (`.vtt`).
    Vtt,
}

impl SubtitleFormat {
    /// The file extension (also the name users give it).
    pub fn extension(self) -> &'static str {
        match self {
            Self::Srt => "srt",
            Self::Vtt => "vtt",
        }
    }
}

/// A subtitle format name that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown subtitle format '{0}': use srt, vtt or both (--subtitles srt,vtt)")]
pub struct UnknownSubtitleFormat(pub String);

impl FromStr for SubtitleFormat {
    type Err = UnknownSubtitleFormat;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "srt" => Ok(Self::Srt),
            "vtt" | "webvtt" => Ok(Self::Vtt),
            _ => Err(UnknownSubtitleFormat(s.to_string())),
        }
    }
}

/// One cue: seconds from the start of its file, and its lines.
#[derive(Debug, Clone, PartialEq)]
pub struct Cue {
    /// Start, seconds.
    pub start: f64,
    /// End, seconds.
    pub end: f64,
    /// Lines of text (at most [`CUE_LINES`]).
    pub lines: Vec<String>,
    /// For each word of `lines` (split at whitespace, in order), when it starts where
    /// that is known: the first word of a spoken word (a word said with the one before
    /// it, "of" in "out of", has none). Empty: no word times.
    pub word_starts: Vec<Option<f64>>,
}

/// One segment's speech in a file: its text, where it starts and how long it lasts
/// (seconds), and its words' times (seconds in the same file) where known.
#[derive(Debug, Clone, PartialEq)]
pub struct Spoken<'a> {
    /// What was spoken.
    pub text: &'a str,
    /// Its first sample, in seconds.
    pub start: f64,
    /// Its length, in seconds.
    pub seconds: f64,
    /// Its words: byte range in `text`, start and end in seconds. Empty: not known.
    pub words: Vec<(std::ops::Range<usize>, f64, f64)>,
}

/// The cues of spoken `parts`, in order, each a segment's speech. Empty texts and silent
/// parts give no cue.
pub fn cues<'a>(parts: impl IntoIterator<Item = Spoken<'a>>) -> Vec<Cue> {
    let mut out: Vec<Cue> = Vec::new();
    for part in parts {
        let lines = wrap(part.text, LINE_CHARS);
        if lines.is_empty() || part.seconds <= 0.0 {
            continue;
        }
        let times = token_times(&part);
        let end = part.start + part.seconds;
        let total: usize = lines.iter().map(|l| l.chars().count()).sum();
        let mut at = part.start;
        let mut first_token = 0;
        let first_cue = out.len();
        for chunk in lines.chunks(CUE_LINES) {
            let chars: usize = chunk.iter().map(|l| l.chars().count()).sum();
            let tokens: usize = chunk.iter().map(|l| l.split_whitespace().count()).sum();
            let span = first_token..first_token + tokens;
            first_token += tokens;
            let share = part.seconds * chars as f64 / total.max(1) as f64;
            let word_start = |t: &Vec<TokenTime>| t[span.clone()].iter().find_map(|x| x.0);
            let word_end = |t: &Vec<TokenTime>| t[span.clone()].iter().rev().find_map(|x| x.1);
            // The first cue starts with the segment's speech, exactly; a later one with
            // its first word, and each ends with its last word.
            let start = if out.len() == first_cue {
                part.start
            } else {
                times.as_ref().and_then(word_start).unwrap_or(at)
            };
            let stop = times.as_ref().and_then(word_end).unwrap_or(at + share);
            if out.len() > first_cue
                && let Some(prev) = out.last_mut()
            {
                // Consecutive cues of a segment never overlap.
                prev.end = prev.end.min(start);
            }
            out.push(Cue {
                start,
                end: stop.max(start),
                lines: chunk.to_vec(),
                word_starts: times
                    .as_ref()
                    .map(|t| t[span].iter().map(|x| x.0.filter(|_| x.2)).collect())
                    .unwrap_or_default(),
            });
            at += share;
        }
        // The last cue of a segment ends exactly where its speech does.
        if let Some(last) = out.last_mut() {
            last.end = end;
        }
    }
    out
}

/// A token's word's start and end (seconds), and whether it is the word's first token.
type TokenTime = (Option<f64>, Option<f64>, bool);

/// For each whitespace token of a segment's text: the start and end of the spoken word
/// that holds it (a word can hold several tokens: "out of"), and whether the token is
/// that word's first. `None` without word times; a token of no word has `None` times.
fn token_times(part: &Spoken<'_>) -> Option<Vec<TokenTime>> {
    if part.words.is_empty() {
        return None;
    }
    let base = part.text.as_ptr().addr();
    Some(
        part.text
            .split_whitespace()
            .map(|token| {
                let from = token.as_ptr().addr() - base;
                match part
                    .words
                    .iter()
                    .find(|w| w.0.start <= from && from < w.0.end)
                {
                    Some(w) => (Some(w.1), Some(w.2), w.0.start == from),
                    None => (None, None, false),
                }
            })
            .collect(),
    )
}

/// `text` in lines of at most `width` characters, broken at spaces (a word longer than
/// `width` gets a line of its own).
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        let fits = line.chars().count() + 1 + word.chars().count() <= width;
        if !line.is_empty() && !fits {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// `cues` as a file of `format`.
pub fn render(format: SubtitleFormat, cues: &[Cue]) -> String {
    let mut out = String::new();
    if format == SubtitleFormat::Vtt {
        out.push_str("WEBVTT\n\n");
    }
    for (i, cue) in cues.iter().enumerate() {
        let (start, end) = (clock(cue.start, format), clock(cue.end, format));
        if format == SubtitleFormat::Srt {
            let _ = writeln!(out, "{}", i + 1);
        }
        let _ = writeln!(out, "{start} --> {end}");
        let mut word = 0;
        // WebVTT inline timestamps: inside the cue, each later than the one before.
        let mut last = cue.start;
        for line in &cue.lines {
            // A cue's text never holds a blank line or (WebVTT) the arrow that would end
            // or start a cue.
            let line = line.replace("-->", "->");
            if format == SubtitleFormat::Srt || cue.word_starts.is_empty() {
                let _ = writeln!(out, "{}", escape(&line, format));
                continue;
            }
            let mut text = String::new();
            for (i, token) in line.split_whitespace().enumerate() {
                if i > 0 {
                    text.push(' ');
                }
                let at = cue.word_starts.get(word).copied().flatten();
                word += 1;
                if let Some(t) = at.filter(|&t| ms(t) > ms(last) && ms(t) < ms(cue.end)) {
                    let _ = write!(text, "<{}>", clock(t, format));
                    last = t;
                }
                text.push_str(&escape(token, format));
            }
            let _ = writeln!(out, "{text}");
        }
        out.push('\n');
    }
    out
}

/// WebVTT text is markup: `&`, `<` and `>` are escaped. SRT is plain text.
fn escape(line: &str, format: SubtitleFormat) -> String {
    match format {
        SubtitleFormat::Srt => line.to_string(),
        SubtitleFormat::Vtt => line
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;"),
    }
}

/// Whole milliseconds, as the files write them.
fn ms(seconds: f64) -> u64 {
    (seconds.max(0.0) * 1000.0).round() as u64
}

/// `HH:MM:SS,mmm` (SRT) or `HH:MM:SS.mmm` (WebVTT), rounded to the millisecond.
fn clock(seconds: f64, format: SubtitleFormat) -> String {
    let ms = ms(seconds);
    let sep = match format {
        SubtitleFormat::Srt => ',',
        SubtitleFormat::Vtt => '.',
    };
    format!(
        "{:02}:{:02}:{:02}{sep}{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

/// `timings.json`: where every sentence is spoken in the book file.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Timings {
    /// The book file the times are in.
    pub file: String,
    /// Its sample rate (samples below are at this rate).
    pub sample_rate: u32,
    /// Every sentence (segment) in order.
    pub sentences: Vec<SentenceTiming>,
}

/// One sentence's speech in the book file: from its first sample to the sample after its
/// last (pauses excluded).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SentenceTiming {
    /// Segment index.
    pub index: u32,
    /// Chapter index.
    pub chapter: u32,
    /// What was spoken (after normalization and lexicons).
    pub text: String,
    /// First sample.
    pub start_sample: u64,
    /// The sample after the last.
    pub end_sample: u64,
    /// `start_sample` in seconds.
    pub start: f64,
    /// `end_sample` in seconds.
    pub end: f64,
    /// Its words, where the model gave their durations (empty otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub words: Vec<WordEntry>,
}

/// One word's speech in the book file: from its first sample to the sample after its
/// last.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WordEntry {
    /// The word as written in the sentence's text (with its punctuation).
    pub text: String,
    /// First sample.
    pub start_sample: u64,
    /// The sample after the last.
    pub end_sample: u64,
    /// `start_sample` in seconds.
    pub start: f64,
    /// `end_sample` in seconds.
    pub end: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_by_name() {
        assert_eq!("SRT".parse(), Ok(SubtitleFormat::Srt));
        assert_eq!("webvtt".parse(), Ok(SubtitleFormat::Vtt));
        let err = "ass"
            .parse::<SubtitleFormat>()
            .expect_err("not a format")
            .to_string();
        assert!(err.contains("--subtitles srt,vtt"), "{err}");
    }

    fn spoken(text: &str, start: f64, seconds: f64) -> Spoken<'_> {
        Spoken {
            text,
            start,
            seconds,
            words: Vec::new(),
        }
    }

    /// `text`'s tokens timed one after another from `start`, `each` seconds apiece.
    fn timed(text: &str, start: f64, each: f64) -> Spoken<'_> {
        let base = text.as_ptr().addr();
        let words: Vec<_> = text
            .split_whitespace()
            .enumerate()
            .map(|(i, t)| {
                let from = t.as_ptr().addr() - base;
                let at = start + i as f64 * each;
                (from..from + t.len(), at, at + each * 0.8)
            })
            .collect();
        let seconds = words.len() as f64 * each;
        Spoken {
            text,
            start,
            seconds,
            words,
        }
    }

    #[test]
    fn short_segments_are_one_cue_each_at_their_exact_times() {
        let cues = cues([
            spoken("Hello there.", 0.5, 1.25),
            spoken("", 2.0, 1.0),
            spoken("Bye.", 3.0, 0.5),
        ]);
        assert_eq!(cues.len(), 2);
        assert_eq!((cues[0].start, cues[0].end), (0.5, 1.75));
        assert_eq!(cues[1].lines, vec!["Bye.".to_string()]);
        let srt = render(SubtitleFormat::Srt, &cues);
        assert_eq!(
            srt,
            "1\n00:00:00,500 --> 00:00:01,750\nHello there.\n\n2\n00:00:03,000 --> 00:00:03,500\nBye.\n\n"
        );
        let vtt = render(SubtitleFormat::Vtt, &cues);
        assert!(vtt.starts_with("WEBVTT\n\n00:00:00.500 --> 00:00:01.750\n"));
    }

    #[test]
    fn long_segments_split_at_words_into_cues_of_two_readable_lines() {
        let text = "It was the best of times, it was the worst of times, it was the age of \
                    wisdom, it was the age of foolishness, it was the epoch of belief.";
        let cues = cues([spoken(text, 10.0, 8.0)]);
        assert!(cues.len() >= 2, "{cues:?}");
        for c in &cues {
            assert!(c.lines.len() <= CUE_LINES);
            assert!(c.lines.iter().all(|l| l.chars().count() <= LINE_CHARS));
        }
        // Exact at the segment's ends, contiguous in between.
        assert_eq!(cues[0].start, 10.0);
        assert_eq!(cues.last().expect("a cue").end, 18.0);
        for pair in cues.windows(2) {
            assert!((pair[0].end - pair[1].start).abs() < 1e-9);
        }
        let words: Vec<String> = cues.iter().flat_map(|c| c.lines.clone()).collect();
        assert_eq!(words.join(" "), text);
    }

    #[test]
    fn word_times_start_each_cue_and_stamp_each_word_in_webvtt() {
        let text = "It was the best of times, it was the worst of times, it was the age of \
                    wisdom, it was the age of foolishness, it was the epoch of belief.";
        let cues = cues([timed(text, 10.0, 0.25)]);
        assert!(cues.len() >= 2, "{cues:?}");
        assert_eq!(cues[0].start, 10.0);
        // A later cue starts with its first word: word k starts at 10 + k/4.
        let first_words = cues[0]
            .lines
            .iter()
            .map(|l| l.split_whitespace().count())
            .sum::<usize>();
        assert_eq!(cues[1].start, 10.0 + first_words as f64 * 0.25);
        // and the cue before it ends with its own last word.
        assert_eq!(cues[0].end, 10.0 + (first_words - 1) as f64 * 0.25 + 0.2);
        assert_eq!(cues.last().expect("a cue").end, 10.0 + 30.0 * 0.25);
        let vtt = render(SubtitleFormat::Vtt, &cues);
        // Every word after a cue's first carries its start.
        assert!(
            vtt.contains("It <00:00:10.250>was <00:00:10.500>the"),
            "{vtt}"
        );
        let stamps = vtt.matches("<00:").count();
        assert_eq!(stamps, 30 - cues.len(), "{vtt}");
        // SRT has no inline times.
        assert!(!render(SubtitleFormat::Srt, &cues).contains('<'));
    }

    #[test]
    fn a_word_said_with_the_one_before_gets_no_timestamp_of_its_own() {
        // "out of" is one spoken word: "of" has no start, and the timestamps still grow.
        let text = "get out of here";
        let words = vec![(0..3, 1.0, 1.2), (4..10, 1.3, 1.6), (11..15, 1.7, 2.0)];
        let cues = cues([Spoken {
            text,
            start: 1.0,
            seconds: 1.0,
            words,
        }]);
        assert_eq!(cues[0].word_starts, [Some(1.0), Some(1.3), None, Some(1.7)]);
        let vtt = render(SubtitleFormat::Vtt, &cues);
        assert!(
            vtt.contains("get <00:00:01.300>out of <00:00:01.700>here"),
            "{vtt}"
        );
    }

    #[test]
    fn clocks_round_to_the_millisecond_past_an_hour() {
        assert_eq!(clock(3723.4567, SubtitleFormat::Srt), "01:02:03,457");
        assert_eq!(clock(-1.0, SubtitleFormat::Vtt), "00:00:00.000");
        assert_eq!(escape("a < b & c", SubtitleFormat::Vtt), "a &lt; b &amp; c");
    }
}
