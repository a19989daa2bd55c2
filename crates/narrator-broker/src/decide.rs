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

/// How long a segment may be postponed for outages, counted from its first
/// postponement, before it fails with the outage as its reason (the default of
/// `narrator worker --postpone-budget`).
pub const POSTPONE_BUDGET: Duration = Duration::from_secs(24 * 3600);

/// Bounds postponement: a [`Decision::Postpone`] of a delivery first postponed
/// `postponed_for` ago becomes a dead letter once that reaches `budget`, so an outage
/// that never ends (or a permanent error taken for one) fails the segment instead of
/// postponing it for ever. Any other decision is returned as it is.
pub fn within_budget(
    decision: Decision,
    postponed_for: Option<Duration>,
    budget: Duration,
) -> Decision {
    match (decision, postponed_for) {
        (Decision::Postpone { .. }, Some(waited)) if waited >= budget => Decision::DeadLetter {
            reason: format!(
                "a service was away for {} (the postponement budget is {}; raise it with --postpone-budget)",
                human(waited),
                human(budget)
            ),
        },
        (decision, _) => decision,
    }
}

/// `1 h 30 min`, `45 s`: durations in reasons.
fn human(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, s % 3600 / 60, s % 60) {
        (0, 0, s) => format!("{s} s"),
        (0, m, s) => format!("{m} min {s} s"),
        (h, m, _) => format!("{h} h {m} min"),
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
    fn a_postponement_past_its_budget_is_a_dead_letter() {
        let day = Duration::from_secs(24 * 3600);
        let postpone = Decision::Postpone {
            after: RETRY_TIERS[0],
        };
        // Never postponed before, or within the budget: postponed again.
        assert_eq!(within_budget(postpone.clone(), None, day), postpone);
        let hour = Duration::from_secs(3600);
        assert_eq!(within_budget(postpone.clone(), Some(hour), day), postpone);
        // Past it: fails, and says for how long and how to change the budget.
        let Decision::DeadLetter { reason } = within_budget(postpone, Some(day + hour), day) else {
            panic!("past the budget must be a dead letter");
        };
        assert!(reason.contains("25 h 0 min"), "{reason}");
        assert!(reason.contains("--postpone-budget"), "{reason}");
        // Other decisions are not touched, whatever the time.
        assert_eq!(within_budget(retry(5), Some(day * 2), day), retry(5));
        assert_eq!(
            within_budget(Decision::Ack, Some(day * 2), day),
            Decision::Ack
        );
        assert_eq!(human(Duration::from_secs(95)), "1 min 35 s");
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
