//! The one mapping from a failure to what happens to the message (STYLE: errors decide
//! delivery). Pure, so it is tested as a table.

use std::time::Duration;

use narrator_core::RetryClass;

use crate::RETRY_TIERS;

/// Most attempts a segment gets before it is dead-lettered.
pub const MAX_ATTEMPTS: u32 = 5;

/// The class of a failure, as far as delivery is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// May work later: a store, database or broker hiccup, a timeout, an overloaded GPU.
    Transient,
    /// Will never work: the segment cannot be spoken (unknown voice, unspeakable text).
    Permanent,
    /// The message itself cannot be read.
    Malformed,
    /// The segment is already recorded (a redelivery after the work was done).
    AlreadyDone,
    /// The job was cancelled: drop the segment.
    Cancelled,
    /// A service the worker needs is away (database, object store): not the segment's
    /// fault, so it is tried again later without being charged an attempt.
    Infrastructure,
}

impl From<RetryClass> for FailureKind {
    fn from(class: RetryClass) -> Self {
        match class {
            RetryClass::Transient => Self::Transient,
            RetryClass::Permanent => Self::Permanent,
            RetryClass::Malformed => Self::Malformed,
            RetryClass::Infrastructure => Self::Infrastructure,
        }
    }
}

/// What to do with a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Done (or nothing left to do): remove it.
    Ack,
    /// Deliver it again after a delay (through a retry tier), this attempt counted.
    Retry {
        /// The delay; rounded up to the next tier.
        after: Duration,
    },
    /// Deliver it again after a delay without counting this attempt: the failure was an
    /// outage of a service, not the segment's.
    Postpone {
        /// The delay; rounded up to the next tier.
        after: Duration,
    },
    /// Put it back at the end of its queue *uncharged*: with the attempts charged before
    /// it, whatever the broker counted (it came back because a consumer went away holding
    /// it, not through its own fault).
    Release,
    /// Give up: park it in `narrator.dead` with the reason.
    DeadLetter {
        /// Why, one line.
        reason: String,
    },
}

/// Maps a failure of delivery `attempt` (from 1) to a decision. Transient failures
/// retry through the tiers (attempt 1 → 5 s, 2 → 30 s, then 300 s) until
/// [`MAX_ATTEMPTS`] attempts were made.
pub fn decide(kind: FailureKind, attempt: u32) -> Decision {
    match kind {
        FailureKind::AlreadyDone | FailureKind::Cancelled => Decision::Ack,
        FailureKind::Infrastructure => Decision::Postpone {
            after: RETRY_TIERS[0],
        },
        FailureKind::Malformed => Decision::DeadLetter {
            reason: "malformed message".into(),
        },
        FailureKind::Permanent => Decision::DeadLetter {
            reason: format!("permanent failure on attempt {attempt}"),
        },
        FailureKind::Transient if attempt >= MAX_ATTEMPTS => Decision::DeadLetter {
            reason: format!("transient failures on all {MAX_ATTEMPTS} attempts"),
        },
        FailureKind::Transient => {
            let i = usize::try_from(attempt.saturating_sub(1)).unwrap_or(usize::MAX);
            let after = RETRY_TIERS[i.min(RETRY_TIERS.len() - 1)];
            Decision::Retry { after }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retry(s: u64) -> Decision {
        Decision::Retry {
            after: Duration::from_secs(s),
        }
    }

    #[test]
    fn table() {
        use FailureKind::*;
        let cases = [
            (Transient, 1, retry(5)),
            (Transient, 2, retry(30)),
            (Transient, 3, retry(300)),
            (Transient, 4, retry(300)),
            (AlreadyDone, 1, Decision::Ack),
            (AlreadyDone, 9, Decision::Ack),
            (Cancelled, 2, Decision::Ack),
        ];
        for (kind, attempt, want) in cases {
            assert_eq!(decide(kind, attempt), want, "{kind:?} attempt {attempt}");
        }
        for (kind, attempt) in [
            (Transient, 5),
            (Transient, 0xffff),
            (Permanent, 1),
            (Malformed, 1),
        ] {
            assert!(
                matches!(decide(kind, attempt), Decision::DeadLetter { ref reason } if !reason.is_empty()),
                "{kind:?} attempt {attempt}"
            );
        }
    }

    #[test]
    fn attempt_zero_is_treated_as_the_first() {
        assert_eq!(decide(FailureKind::Transient, 0), retry(5));
    }

    #[test]
    fn outages_are_postponed_uncounted_whatever_the_attempt() {
        for attempt in [1, MAX_ATTEMPTS, 0xffff] {
            assert_eq!(
                decide(RetryClass::Infrastructure.into(), attempt),
                Decision::Postpone {
                    after: RETRY_TIERS[0]
                }
            );
        }
        assert_eq!(
            FailureKind::from(RetryClass::Permanent),
            FailureKind::Permanent
        );
        assert_eq!(
            FailureKind::from(RetryClass::Malformed),
            FailureKind::Malformed
        );
    }
}
