//! Subtitles (SRT and WebVTT) of an assembled book, from where each segment's speech
//! falls in the output file.
//!
//! A segment's cue starts at the first sample of its speech and ends at its last, exactly
//! (the layout of the assembled file, pauses excluded). The text is what was spoken: the
//! segment's text after normalization and lexicons ("Doctor" for "Dr."). A segment too
//! long for one cue (two lines of [`LINE_CHARS`]) is split at words into several cues;
//! until word timings come from the model, the times inside a segment are shared out in
//! proportion to the characters of each part (an estimate: the segment's own start and
//! end stay exact).

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
}

/// The cues of spoken `parts`: `(text, start seconds, duration seconds)` in order, each
/// a segment's speech. Empty texts and silent parts give no cue.
pub fn cues<'a>(parts: impl IntoIterator<Item = (&'a str, f64, f64)>) -> Vec<Cue> {
    let mut out = Vec::new();
    for (text, start, seconds) in parts {
        let lines = wrap(text, LINE_CHARS);
        if lines.is_empty() || seconds <= 0.0 {
            continue;
        }
        let total: usize = lines.iter().map(|l| l.chars().count()).sum();
        let mut at = start;
        for chunk in lines.chunks(CUE_LINES) {
            let chars: usize = chunk.iter().map(|l| l.chars().count()).sum();
            let share = seconds * chars as f64 / total.max(1) as f64;
            out.push(Cue {
                start: at,
                end: at + share,
                lines: chunk.to_vec(),
            });
            at += share;
        }
        // The last cue of a segment ends exactly where its speech does.
        if let Some(last) = out.last_mut() {
            last.end = start + seconds;
        }
    }
    out
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
        for line in &cue.lines {
            // A cue's text never holds a blank line or (WebVTT) the arrow that would end
            // or start a cue.
            let line = line.replace("-->", "->");
            let _ = writeln!(out, "{}", escape(&line, format));
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

/// `HH:MM:SS,mmm` (SRT) or `HH:MM:SS.mmm` (WebVTT), rounded to the millisecond.
fn clock(seconds: f64, format: SubtitleFormat) -> String {
    let ms = (seconds.max(0.0) * 1000.0).round() as u64;
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_by_name() {
        assert_eq!("SRT".parse(), Ok(SubtitleFormat::Srt));
        assert_eq!("webvtt".parse(), Ok(SubtitleFormat::Vtt));
        let err = "ass".parse::<SubtitleFormat>().unwrap_err().to_string();
        assert!(err.contains("--subtitles srt,vtt"), "{err}");
    }

    #[test]
    fn short_segments_are_one_cue_each_at_their_exact_times() {
        let cues = cues([
            ("Hello there.", 0.5, 1.25),
            ("", 2.0, 1.0),
            ("Bye.", 3.0, 0.5),
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
        let cues = cues([(text, 10.0, 8.0)]);
        assert!(cues.len() >= 2, "{cues:?}");
        for c in &cues {
            assert!(c.lines.len() <= CUE_LINES);
            assert!(c.lines.iter().all(|l| l.chars().count() <= LINE_CHARS));
        }
        // Exact at the segment's ends, contiguous in between.
        assert_eq!(cues[0].start, 10.0);
        assert_eq!(cues.last().unwrap().end, 18.0);
        for pair in cues.windows(2) {
            assert!((pair[0].end - pair[1].start).abs() < 1e-9);
        }
        let words: Vec<String> = cues.iter().flat_map(|c| c.lines.clone()).collect();
        assert_eq!(words.join(" "), text);
    }

    #[test]
    fn clocks_round_to_the_millisecond_past_an_hour() {
        assert_eq!(clock(3723.4567, SubtitleFormat::Srt), "01:02:03,457");
        assert_eq!(clock(-1.0, SubtitleFormat::Vtt), "00:00:00.000");
        assert_eq!(escape("a < b & c", SubtitleFormat::Vtt), "a &lt; b &amp; c");
    }
}
