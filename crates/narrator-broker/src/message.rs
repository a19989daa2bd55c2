//! The wire format of a segment message: JSON, versioned by a `v` field.

use narrator_core::{Segment, TraceContext};
use serde::{Deserialize, Serialize};

use crate::BrokerError;

/// The version this crate writes and reads.
pub const MESSAGE_VERSION: u32 = 1;

/// One segment of one job, addressed to one voice's queue.
#[derive(Debug, Clone, PartialEq)]
pub struct SegmentMessage {
    /// The job it belongs to.
    pub job_id: String,
    /// The voice; picks the queue `narrator.segments.<voice>`.
    pub voice: String,
    /// The segment.
    pub segment: Segment,
    /// When the producer enqueued it (Unix milliseconds), for queue-wait figures.
    pub enqueued_at_ms: u64,
    /// The cluster (database) the job is recorded in, as `narrator migrate` made it. A
    /// worker whose database is another cluster leaves the message alone. `None` in
    /// messages of versions before it existed.
    pub cluster: Option<String>,
    /// Its priority lane ([`crate::lane_of`] the job's priority): picks the queue.
    pub lane: u8,
    /// The job's trace, carried in the `traceparent` / `tracestate` headers (not in the
    /// body).
    pub trace: Option<TraceContext>,
}

#[derive(Serialize)]
struct WireOut<'a> {
    v: u32,
    job_id: &'a str,
    voice: &'a str,
    segment: &'a Segment,
    enqueued_at_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster: Option<&'a str>,
    #[serde(skip_serializing_if = "is_zero")]
    lane: u8,
}

fn is_zero(v: &u8) -> bool {
    *v == 0
}

#[derive(Deserialize)]
struct WireIn {
    v: u32,
    job_id: String,
    voice: String,
    segment: Segment,
    enqueued_at_ms: u64,
    #[serde(default)]
    cluster: Option<String>,
    #[serde(default)]
    lane: u8,
}

impl SegmentMessage {
    /// A message enqueued now.
    pub fn new(job_id: impl Into<String>, voice: impl Into<String>, segment: Segment) -> Self {
        let enqueued_at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        Self {
            job_id: job_id.into(),
            voice: voice.into(),
            segment,
            enqueued_at_ms,
            cluster: None,
            lane: 0,
            trace: None,
        }
    }

    /// The message carrying the trace `trace` (of its job), if any.
    pub fn traced(mut self, trace: Option<&TraceContext>) -> Self {
        self.trace = trace.cloned();
        self
    }

    /// The message in priority lane `lane`.
    pub fn in_lane(mut self, lane: u8) -> Self {
        self.lane = lane;
        self
    }

    /// The message tied to `cluster` (the database's cluster id).
    pub fn in_cluster(mut self, cluster: impl Into<String>) -> Self {
        self.cluster = Some(cluster.into());
        self
    }

    /// The JSON body.
    pub fn encode(&self) -> Result<Vec<u8>, BrokerError> {
        serde_json::to_vec(&WireOut {
            v: MESSAGE_VERSION,
            job_id: &self.job_id,
            voice: &self.voice,
            segment: &self.segment,
            enqueued_at_ms: self.enqueued_at_ms,
            cluster: self.cluster.as_deref(),
            lane: self.lane,
        })
        .map_err(BrokerError::Encode)
    }

    /// Parses a JSON body; an unknown version is malformed.
    pub fn decode(body: &[u8]) -> Result<Self, BrokerError> {
        let w: WireIn =
            serde_json::from_slice(body).map_err(|e| BrokerError::Malformed(e.to_string()))?;
        if w.v != MESSAGE_VERSION {
            return Err(BrokerError::Malformed(format!(
                "version {} (this build reads version {MESSAGE_VERSION})",
                w.v
            )));
        }
        Ok(Self {
            job_id: w.job_id,
            voice: w.voice,
            segment: w.segment,
            enqueued_at_ms: w.enqueued_at_ms,
            cluster: w.cluster,
            lane: w.lane,
            trace: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use narrator_core::PauseAfter;

    fn msg() -> SegmentMessage {
        SegmentMessage {
            job_id: "j1".into(),
            voice: "en_US-joe-medium".into(),
            segment: Segment {
                index: 3,
                chapter: 1,
                text: "Hello, \"world\".".into(),
                pause_after: PauseAfter::Paragraph,
                speaker: 0,
                speed: None,
                timed: false,
            },
            enqueued_at_ms: 42,
            cluster: Some("c1".into()),
            lane: 1,
            trace: None,
        }
    }

    #[test]
    fn round_trips_and_carries_the_version() {
        let body = msg().encode().expect("encode");
        let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(v["v"], 1);
        assert_eq!(SegmentMessage::decode(&body).expect("decode"), msg());
    }

    #[test]
    fn the_speaker_travels_and_is_left_out_when_it_is_the_first() {
        let body = msg().encode().expect("encode");
        assert!(!String::from_utf8_lossy(&body).contains("speaker"));
        let mut m = msg();
        m.segment.speaker = 7;
        let decoded = SegmentMessage::decode(&m.encode().expect("encode")).expect("decode");
        assert_eq!(decoded.segment.speaker, 7);
    }

    #[test]
    fn a_message_without_a_cluster_reads_as_none() {
        let mut m = msg();
        m.cluster = None;
        let body = m.encode().expect("encode");
        assert!(!String::from_utf8_lossy(&body).contains("cluster"));
        assert_eq!(SegmentMessage::decode(&body).expect("decode").cluster, None);
    }

    #[test]
    fn another_version_or_garbage_is_malformed() {
        let body = msg().encode().expect("encode");
        let mut v: serde_json::Value = serde_json::from_slice(&body).expect("json");
        v["v"] = 2.into();
        let e = SegmentMessage::decode(v.to_string().as_bytes()).expect_err("v2");
        assert_eq!(e.kind(), "message_malformed");
        assert!(SegmentMessage::decode(b"\xff not json").is_err());
    }
}
