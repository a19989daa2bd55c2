//! The progress bar of `narrator run`: segments done, audio made, live RTF, ETA.

use std::sync::Mutex;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use narrator_pipeline::Event;

/// `h:mm:ss` for a duration in seconds.
pub(crate) fn hms(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

#[derive(Default)]
struct Counts {
    audio: f64,
    made_audio: f64,
}

pub(crate) struct Progress {
    bar: ProgressBar,
    started: Instant,
    counts: Mutex<Counts>,
}

impl Progress {
    pub(crate) fn new(visible: bool, started: Instant) -> Self {
        let bar = ProgressBar::with_draw_target(
            Some(0),
            if visible {
                ProgressDrawTarget::stderr()
            } else {
                ProgressDrawTarget::hidden()
            },
        );
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix} {bar:30} {pos}/{len} segments  {msg}  ETA {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Self {
            bar,
            started,
            counts: Mutex::new(Counts::default()),
        }
    }

    pub(crate) fn event(&self, e: &Event) {
        let Ok(mut c) = self.counts.lock() else {
            return;
        };
        match e {
            Event::Started {
                total,
                done,
                done_audio_seconds,
            } => {
                c.audio = *done_audio_seconds;
                self.bar.set_length(*total as u64);
                self.bar.set_position(*done as u64);
                self.bar.reset_eta();
                if *done > 0 {
                    self.bar
                        .println(format!("resuming: {done} of {total} segments already made"));
                }
            }
            Event::SegmentDone { record } => {
                c.audio += record.audio_seconds;
                c.made_audio += record.audio_seconds;
                self.bar.inc(1);
                let wall = self.started.elapsed().as_secs_f64();
                let rtf = narrator_core::rtf(wall, c.made_audio);
                self.bar.set_message(format!(
                    "{} audio  RTF {:.3} ({:.1}x)",
                    hms(c.audio),
                    rtf,
                    if rtf > 0.0 { 1.0 / rtf } else { 0.0 }
                ));
            }
            Event::Assembling => self.bar.set_message("assembling the output files"),
            Event::Warning(w) => {
                if self.bar.is_hidden() {
                    eprintln!("warning: {w}");
                } else {
                    self.bar.println(format!("warning: {w}"));
                }
            }
        }
    }

    /// The layout the voice runs with: printed once, and kept short at the line's start.
    pub(crate) fn layout(&self, plan: &narrator_hardware::Plan) {
        if self.bar.is_hidden() {
            return;
        }
        self.bar.println(format!("layout: {}", plan.layout_line()));
        self.bar.set_prefix(format!(
            "[{}x{} b{} {}]",
            plan.sessions, plan.intra_threads, plan.max_batch_requests, plan.source
        ));
    }

    pub(crate) fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
