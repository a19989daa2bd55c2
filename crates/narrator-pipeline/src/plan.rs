//! From a parsed document to a [`JobPlan`]: dense segment indices, chapter ranges, pauses,
//! and a job id that changes exactly when the segment audio would change.

use narrator_core::{ChapterPlan, JobPlan, PauseAfter, Segment};
use narrator_text::Document;
use sha2::{Digest, Sha256};

/// Version of the segmentation and synthesis rules; part of every job id so that a
/// resumed job never mixes audio made under different rules.
pub const PLAN_VERSION: u32 = 1;

/// What besides the text decides a segment's audio.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AudioIdentity<'a> {
    /// Voice name.
    pub voice: &'a str,
    /// Digest of the voice's model file identity (size) and config text.
    pub voice_digest: &'a str,
    /// Inference scales.
    pub scales: narrator_engine::Scales,
    /// The voice's speaker id (0: the only or the first speaker; then left out of the
    /// digest, so single-speaker job ids stay as they were).
    #[serde(skip_serializing_if = "is_first_speaker")]
    pub speaker: u32,
}

fn is_first_speaker(speaker: &u32) -> bool {
    *speaker == 0
}

/// Plans the job. `source` is the input as the user named it; `fallback_title` is used
/// when the document has no title.
pub fn plan_job(
    doc: &Document,
    source: &str,
    fallback_title: &str,
    id: &AudioIdentity<'_>,
) -> JobPlan {
    let mut segments = Vec::new();
    let mut chapters = Vec::new();
    for chapter in &doc.chapters {
        let first = segments.len() as u32;
        let ch = chapters.len() as u32;
        let paragraphs: Vec<_> = chapter
            .paragraphs
            .iter()
            .filter(|p| !p.sentences.is_empty())
            .collect();
        for (pi, p) in paragraphs.iter().enumerate() {
            for (si, s) in p.sentences.iter().enumerate() {
                let last_sentence = si + 1 == p.sentences.len();
                let pause_after = match (last_sentence, pi + 1 == paragraphs.len()) {
                    (false, _) => PauseAfter::Sentence,
                    (true, false) => PauseAfter::Paragraph,
                    (true, true) => PauseAfter::Chapter,
                };
                segments.push(Segment {
                    index: segments.len() as u32,
                    chapter: ch,
                    text: s.clone(),
                    pause_after,
                    speaker: id.speaker,
                    speed: None,
                    timed: false,
                });
            }
        }
        let count = segments.len() as u32 - first;
        if count > 0 {
            // How it looked, one block per paragraph, when the reader kept it.
            let blocks = if paragraphs.iter().any(|p| p.look.is_some()) {
                paragraphs
                    .iter()
                    .map(|p| {
                        p.look
                            .clone()
                            .unwrap_or_else(|| narrator_core::SourceBlock {
                                tag: "p".into(),
                                ..Default::default()
                            })
                    })
                    .collect()
            } else {
                Vec::new()
            };
            chapters.push(ChapterPlan {
                title: chapter.title.clone(),
                first_segment: first,
                segment_count: count,
                blocks,
                stylesheets: chapter.looks.stylesheets.clone(),
                images_after: chapter.looks.images_after.clone(),
            });
        }
    }
    let mut h = Sha256::new();
    h.update(PLAN_VERSION.to_le_bytes());
    h.update(serde_json::to_vec(id).unwrap_or_default());
    for s in &segments {
        h.update(s.chapter.to_le_bytes());
        h.update((s.text.len() as u64).to_le_bytes());
        h.update(s.text.as_bytes());
    }
    let job_id = hex::encode(&h.finalize()[..10]);
    JobPlan {
        job_id,
        title: doc
            .title
            .clone()
            .unwrap_or_else(|| fallback_title.to_string()),
        source: source.to_string(),
        voice: id.voice.to_string(),
        chapters,
        segments,
        warnings: doc.warnings.clone(),
        meta: doc.meta.clone(),
        lexicon: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use narrator_text::{Chapter, Paragraph};

    fn doc() -> Document {
        let p = |s: &[&str]| Paragraph {
            sentences: s.iter().map(|s| s.to_string()).collect(),
            look: None,
        };
        Document {
            title: Some("T".into()),
            meta: Default::default(),
            chapters: vec![
                Chapter {
                    title: "One".into(),
                    paragraphs: vec![p(&["A.", "B."]), p(&["C."])],
                    looks: Default::default(),
                },
                Chapter {
                    title: "Two".into(),
                    paragraphs: vec![p(&["D."])],
                    looks: Default::default(),
                },
            ],
            warnings: vec![],
        }
    }

    fn id(voice: &str) -> AudioIdentity<'_> {
        AudioIdentity {
            voice,
            voice_digest: "x",
            scales: narrator_engine::Scales::DETERMINISTIC,
            speaker: 0,
        }
    }

    #[test]
    fn segments_are_dense_and_pauses_follow_structure() {
        let plan = plan_job(&doc(), "b.txt", "b", &id("v"));
        let idx: Vec<u32> = plan.segments.iter().map(|s| s.index).collect();
        assert_eq!(idx, [0, 1, 2, 3]);
        let pauses: Vec<PauseAfter> = plan.segments.iter().map(|s| s.pause_after).collect();
        assert_eq!(
            pauses,
            [
                PauseAfter::Sentence,
                PauseAfter::Paragraph,
                PauseAfter::Chapter,
                PauseAfter::Chapter
            ]
        );
        assert_eq!(plan.chapters[1].first_segment, 3);
        assert_eq!(plan.chapters[0].segment_count, 3);
    }

    #[test]
    fn job_id_changes_with_text_and_voice_only() {
        let a = plan_job(&doc(), "b.txt", "b", &id("v")).job_id;
        assert_eq!(a, plan_job(&doc(), "other/path.txt", "b", &id("v")).job_id);
        assert_ne!(a, plan_job(&doc(), "b.txt", "b", &id("w")).job_id);
        let mut d = doc();
        d.chapters[1].paragraphs[0].sentences[0] = "E.".into();
        assert_ne!(a, plan_job(&d, "b.txt", "b", &id("v")).job_id);
    }
}
