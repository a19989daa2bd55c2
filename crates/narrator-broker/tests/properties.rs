//! Property tests of the segment message decoder (`SegmentMessage::decode`), the one
//! parser of bytes that anyone who reaches the broker can send to a worker. No RabbitMQ:
//! only the bodies. Inputs: arbitrary bytes, JSON objects of random fields and types,
//! messages nested or sized to hurt, mutations of a real encoded message, and arbitrary
//! valid messages.
//!
//! Asserted of every body: `decode` returns, within the memory and time bounds of the
//! harness (`tests/support/properties.rs`), a message or a `message_malformed` error of
//! one line (which the consumer dead-letters alone); a message it accepts encodes again
//! to a body that decodes to the same message. Of every valid message: `encode` then
//! `decode` gives it back (all but the trace, which travels in the headers).

#[path = "../../../tests/support/properties.rs"]
mod properties;

use narrator_broker::{BrokerError, MESSAGE_VERSION, SegmentMessage};
use narrator_core::{PauseAfter, Segment};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::TestCaseError;
use serde_json::{Value, json};

use properties::{check, check_heavy, ensure, mutate, mutations, within_bounds};

/// What a decoded body must satisfy: an error of the one kind, in one line; or a message
/// that survives its own round trip.
fn check_decoded(result: Result<SegmentMessage, BrokerError>) -> Result<(), TestCaseError> {
    match result {
        Ok(m) => {
            properties::note("ok");
            let body = m.encode().map_err(|e| {
                TestCaseError::fail(format!("a decoded message does not encode: {e}"))
            })?;
            let again = SegmentMessage::decode(&body);
            ensure(again.as_ref().is_ok_and(|a| *a == m), || {
                format!("{m:?} encodes to a body that decodes as {again:?}")
            })
        }
        Err(e) => {
            properties::note(e.kind());
            let line = e.to_string();
            ensure(e.kind() == "message_malformed", || {
                format!("decode failed with {}: {line}", e.kind())
            })?;
            ensure(!line.contains('\n'), || format!("not one line: {line:?}"))
        }
    }
}

/// A real message as the publisher sends it.
fn real() -> SegmentMessage {
    SegmentMessage {
        job_id: "6f1c2a4e-8d3b-4c55-9e1a-2b7f0c9d4e31".into(),
        voice: "en_US-joe-medium".into(),
        segment: Segment {
            index: 41,
            chapter: 3,
            text: "\u{201c}Curiouser and curiouser!\u{201d} cried Alice.".into(),
            pause_after: PauseAfter::Paragraph,
            speaker: 2,
            speed: None,
            timed: false,
        },
        enqueued_at_ms: 1_796_000_000_000,
        cluster: Some("0b7f6e0c-5d1e-4f4a-8a59-3c2d1e0f9a8b".into()),
        lane: 1,
        trace: None,
    }
}

#[test]
fn messages_of_arbitrary_bytes() {
    check(
        "amqp_message_arbitrary_bytes",
        prop_oneof![
            vec(any::<u8>(), 0..2_048),
            // JSON's own characters, so more bodies get past the first byte.
            vec(
                select(&b"{}[]\":,0123456789-.eE truefalsnul\\\"vjob_idsegment"[..]),
                0..512
            ),
        ],
        |body| {
            let result = within_bounds(body.len(), || SegmentMessage::decode(&body))?;
            check_decoded(result)
        },
    );
}

/// A JSON value of any type, for any field.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "\\PC{0,12}".prop_map(Value::from),
        ".{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::from),
            vec(("[a-z_]{1,8}", inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// A field's value: mostly of the right type and range, sometimes not.
fn field(right: impl Strategy<Value = Value> + 'static) -> BoxedStrategy<Option<Value>> {
    prop_oneof![
        16 => right.prop_map(Some),
        1 => any_json().prop_map(Some),
        1 => Just(None),
    ]
    .boxed()
}

/// A message body as a JSON object whose fields are each right, wrong or missing, with
/// unknown fields now and then.
fn message_object() -> impl Strategy<Value = Value> {
    let u32ish = || {
        prop_oneof![
            12 => any::<u32>().prop_map(Value::from),
            1 => Just(json!(u64::from(u32::MAX) + 1)),
            1 => Just(json!(-1)),
            1 => Just(json!(1.5)),
            1 => Just(json!(i64::MAX)),
        ]
    };
    let segment = (
        field(u32ish()),
        field(u32ish()),
        field(prop_oneof![
            ".{0,60}".prop_map(Value::from),
            "\\PC{0,600}".prop_map(Value::from)
        ]),
        field(
            select(&["sentence", "paragraph", "chapter", "none", "Sentence", ""][..])
                .prop_map(Value::from),
        ),
        prop_oneof![3 => Just(None), 1 => field(u32ish())],
    )
        .prop_map(|(index, chapter, text, pause, speaker)| {
            let mut o = serde_json::Map::new();
            for (k, v) in [
                ("index", index),
                ("chapter", chapter),
                ("text", text),
                ("pause_after", pause),
                ("speaker", speaker),
            ] {
                if let Some(v) = v {
                    o.insert(k.into(), v);
                }
            }
            Value::Object(o)
        });
    (
        field(prop_oneof![9 => Just(json!(MESSAGE_VERSION)), 1 => (0u32..5).prop_map(Value::from)]),
        field(
            prop_oneof![
                "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
                "\\PC{0,40}"
            ]
            .prop_map(Value::from),
        ),
        field("[a-zA-Z_:+.0-9-]{0,24}".prop_map(Value::from)),
        field(segment),
        field(any::<u64>().prop_map(Value::from)),
        prop_oneof![2 => Just(None), 1 => field("\\PC{0,36}".prop_map(Value::from))],
        prop_oneof![2 => Just(None), 1 => field((0u16..300).prop_map(Value::from))],
        vec(("[a-z_]{1,8}", any_json()), 0..3),
    )
        .prop_map(|(v, job, voice, segment, at, cluster, lane, extra)| {
            let mut o = serde_json::Map::new();
            for (k, v) in extra {
                o.insert(k, v);
            }
            for (k, v) in [
                ("v", v),
                ("job_id", job),
                ("voice", voice),
                ("segment", segment),
                ("enqueued_at_ms", at),
                ("cluster", cluster),
                ("lane", lane),
            ] {
                if let Some(v) = v {
                    o.insert(k.into(), v);
                }
            }
            Value::Object(o)
        })
}

#[test]
fn messages_of_random_fields() {
    check("amqp_message_random_fields", message_object(), |object| {
        let body = object.to_string().into_bytes();
        let result = within_bounds(body.len(), || SegmentMessage::decode(&body))?;
        check_decoded(result)
    });
}

/// Bodies built to hurt: nested arrays past serde_json's recursion limit, in a field
/// the message knows or one it does not; many unknown fields; a long text; a long run
/// of escapes.
#[derive(Debug, Clone)]
enum Hostile {
    Nested { depth: usize, known: bool },
    ManyFields { count: usize },
    LongText { kib: usize },
    Escapes { count: usize },
}

fn hostile() -> impl Strategy<Value = Hostile> {
    prop_oneof![
        (1usize..100_000, any::<bool>())
            .prop_map(|(depth, known)| Hostile::Nested { depth, known }),
        (1usize..20_000).prop_map(|count| Hostile::ManyFields { count }),
        (1usize..4_096).prop_map(|kib| Hostile::LongText { kib }),
        (1usize..100_000).prop_map(|count| Hostile::Escapes { count }),
    ]
}

impl Hostile {
    fn body(&self) -> Vec<u8> {
        let base = String::from_utf8(real().encode().expect("encode")).expect("utf8");
        let inner = base.trim_start_matches('{');
        match *self {
            Hostile::Nested { depth, known } => {
                let nest = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
                if known {
                    base.replacen("\"chapter\":3", &format!("\"chapter\":{nest}"), 1)
                } else {
                    format!("{{\"x\":{nest},{inner}")
                }
            }
            Hostile::ManyFields { count } => {
                let fields: String = (0..count).map(|i| format!("\"f{i}\":{i},")).collect();
                format!("{{{fields}{inner}")
            }
            Hostile::LongText { kib } => base.replacen(
                "cried Alice.",
                &"Curiouser and curiouser! ".repeat(kib * 1024 / 25),
                1,
            ),
            Hostile::Escapes { count } => {
                base.replacen("cried Alice.", &"\\u00e9\\ud83d\\ude00\\n".repeat(count), 1)
            }
        }
        .into_bytes()
    }
}

#[test]
fn hostile_messages_are_decoded_within_bounds() {
    check_heavy("amqp_message_hostile", hostile(), |h| {
        let body = h.body();
        let result = within_bounds(body.len(), || SegmentMessage::decode(&body))?;
        check_decoded(result)
    });
}

/// What a message is made of: JSON's syntax, its fields' names and values of every type.
const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    "\"",
    ":",
    ",",
    "\\",
    "null",
    "true",
    "false",
    "0",
    "-1",
    "1e999",
    "4294967296",
    "18446744073709551616",
    "0.5",
    "\"v\"",
    "\"job_id\"",
    "\"voice\"",
    "\"segment\"",
    "\"index\"",
    "\"chapter\"",
    "\"text\"",
    "\"pause_after\"",
    "\"speaker\"",
    "\"enqueued_at_ms\"",
    "\"cluster\"",
    "\"lane\"",
    "\"trace\"",
    "\"sentence\"",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "\u{1f600}",
    "\u{0}",
];

#[test]
fn mutations_of_a_real_message() {
    let body = real().encode().expect("encode");
    check("amqp_message_mutations", mutations(TOKENS), |edits| {
        let body = mutate(body.clone(), &edits);
        let result = within_bounds(body.len(), || SegmentMessage::decode(&body))?;
        check_decoded(result)
    });
}

fn pause() -> impl Strategy<Value = PauseAfter> {
    select(
        &[
            PauseAfter::Sentence,
            PauseAfter::Paragraph,
            PauseAfter::Chapter,
            PauseAfter::None,
        ][..],
    )
}

/// Any message the publisher may send: any strings (control characters, quotes,
/// surrogate-free Unicode), any numbers.
fn message() -> impl Strategy<Value = SegmentMessage> {
    (
        (".*", ".*", any::<u32>(), any::<u32>(), ".*"),
        (
            pause(),
            any::<u32>(),
            any::<u64>(),
            prop::option::of(".*"),
            any::<u8>(),
        ),
    )
        .prop_map(
            |((job_id, voice, index, chapter, text), (pause_after, speaker, at, cluster, lane))| {
                SegmentMessage {
                    job_id,
                    voice,
                    segment: Segment {
                        index,
                        chapter,
                        text,
                        pause_after,
                        speaker,
                        speed: None,
                        timed: false,
                    },
                    enqueued_at_ms: at,
                    cluster,
                    lane,
                    trace: None,
                }
            },
        )
}

#[test]
fn every_message_round_trips() {
    check("amqp_message_round_trip", message(), |m| {
        let body = m
            .encode()
            .map_err(|e| TestCaseError::fail(format!("does not encode: {e}")))?;
        let back = within_bounds(body.len(), || SegmentMessage::decode(&body))?;
        properties::note(if back.is_ok() { "ok" } else { "refused" });
        ensure(back.as_ref().is_ok_and(|b| *b == m), || {
            format!("{m:?} came back as {back:?}")
        })
    });
}
