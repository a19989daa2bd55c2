//! Dynamic batching: which waiting segments go to the device together.
//!
//! Plain state, no runtime: [`Batcher::append`] adds a segment with its longest utterance
//! and its number of utterances; [`Batcher::next_batch`] hands out a batch when one is
//! worth running. Segments are kept in buckets by length (powers of two of their longest
//! utterance), so a batch mixes similar lengths and pads little. The cost of a batch is
//! its padded cost: its longest utterance × its utterances, the size of the tensors the
//! engine allocates for it (as TEI/TGI count `max_batch_tokens`).
//!
//! A batch leaves when a bucket fills the token or request budget, or when the oldest
//! segment has waited `max_wait` (then it goes with the nearest lengths that still fit),
//! or at once when the caller flushes (input ended, or a zero wait). A segment costlier
//! than the whole budget runs alone. [`Batcher::drop_where`] removes segments of
//! cancelled jobs before they reach the device. The runner drives it as a small actor.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// Limits of one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Padded cost (longest utterance × utterances) at most.
    pub max_tokens: usize,
    /// Utterances at most.
    pub max_requests: usize,
    /// How long the oldest segment may wait for a fuller batch.
    pub max_wait: Duration,
}

impl Budget {
    /// One utterance per batch, no waiting (the CPU default before calibration).
    pub fn single() -> Self {
        Self {
            max_tokens: 1,
            max_requests: 1,
            max_wait: Duration::ZERO,
        }
    }
}

#[derive(Debug)]
struct Entry<T> {
    item: T,
    max_len: usize,
    items: usize,
    at: Instant,
    seq: u64,
}

/// Waiting segments in length buckets (see the module docs).
#[derive(Debug)]
pub struct Batcher<T> {
    buckets: BTreeMap<usize, VecDeque<Entry<T>>>,
    len: usize,
    seq: u64,
}

impl<T> Default for Batcher<T> {
    fn default() -> Self {
        Self {
            buckets: BTreeMap::new(),
            len: 0,
            seq: 0,
        }
    }
}

/// What a growing batch holds so far.
#[derive(Default, Clone, Copy)]
struct Tally {
    max_len: usize,
    items: usize,
    entries: usize,
}

impl Tally {
    fn with(self, max_len: usize, items: usize) -> Tally {
        Tally {
            max_len: self.max_len.max(max_len),
            items: self.items + items,
            entries: self.entries + 1,
        }
    }

    fn cost(self) -> usize {
        self.max_len * self.items
    }

    /// Whether an entry may join: always the first one; later ones while within budget.
    fn admits(self, budget: &Budget, max_len: usize, items: usize) -> bool {
        if self.entries == 0 {
            return true;
        }
        let next = self.with(max_len, items);
        next.cost() <= budget.max_tokens && next.items <= budget.max_requests
    }

    fn full(self, budget: &Budget) -> bool {
        self.cost() >= budget.max_tokens || self.items >= budget.max_requests
    }
}

fn bucket_of(max_len: usize) -> usize {
    max_len.max(1).next_power_of_two()
}

impl<T> Batcher<T> {
    /// An empty batcher.
    pub fn new() -> Self {
        Self::default()
    }

    /// Segments waiting.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds a segment whose longest utterance has `max_len` ids and which has `items`
    /// utterances, waiting since `at`.
    pub fn append(&mut self, item: T, max_len: usize, items: usize, at: Instant) {
        self.seq += 1;
        self.buckets
            .entry(bucket_of(max_len))
            .or_default()
            .push_back(Entry {
                item,
                max_len,
                items: items.max(1),
                at,
                seq: self.seq,
            });
        self.len += 1;
    }

    /// When the oldest segment's wait runs out (`None` when empty).
    pub fn deadline(&self, budget: &Budget) -> Option<Instant> {
        self.oldest().map(|(_, e)| e.at + budget.max_wait)
    }

    fn oldest(&self) -> Option<(usize, &Entry<T>)> {
        self.buckets
            .iter()
            .filter_map(|(k, q)| q.front().map(|e| (*k, e)))
            .min_by_key(|(_, e)| e.seq)
    }

    /// How many entries from the front of `bucket` join a batch that already holds
    /// `tally`, and the tally after them.
    fn fill(&self, bucket: usize, mut tally: Tally, budget: &Budget) -> (usize, Tally) {
        let mut n = 0;
        if let Some(q) = self.buckets.get(&bucket) {
            for e in q {
                if !tally.admits(budget, e.max_len, e.items) {
                    break;
                }
                tally = tally.with(e.max_len, e.items);
                n += 1;
            }
        }
        (n, tally)
    }

    /// The next batch, if one should leave now: a full bucket (the one whose head waited
    /// longest), else, once the oldest segment waited `max_wait` or `flush` is set, the
    /// oldest segment's bucket topped up from the nearest lengths.
    pub fn next_batch(&mut self, budget: &Budget, now: Instant, flush: bool) -> Option<Vec<T>> {
        let mut full: Option<(u64, usize, usize)> = None;
        for (&k, q) in &self.buckets {
            let Some(head) = q.front() else { continue };
            let (n, tally) = self.fill(k, Tally::default(), budget);
            let stopped_early = n < q.len();
            if (stopped_early || tally.full(budget)) && full.is_none_or(|(s, _, _)| head.seq < s) {
                full = Some((head.seq, k, n));
            }
        }
        if let Some((_, k, n)) = full {
            return Some(self.take(&[(k, n)]));
        }
        let (_, oldest) = self.oldest()?;
        if !(flush || now.saturating_duration_since(oldest.at) >= budget.max_wait) {
            return None;
        }
        self.oldest_batch(budget)
    }

    /// When the oldest segment started waiting (`None` when empty).
    pub fn oldest_at(&self) -> Option<Instant> {
        self.oldest().map(|(_, e)| e.at)
    }

    /// A batch around the oldest segment, now: its bucket, topped up from the nearest
    /// lengths (`None` when empty).
    pub fn oldest_batch(&mut self, budget: &Budget) -> Option<Vec<T>> {
        let (home, _) = self.oldest()?;
        let (n, mut tally) = self.fill(home, Tally::default(), budget);
        let mut plan = vec![(home, n)];
        // Nearest lengths first: neighbours below and above, alternating by distance.
        let mut others: Vec<usize> = self
            .buckets
            .keys()
            .copied()
            .filter(|&k| k != home)
            .collect();
        others.sort_by_key(|&k| (k.max(home) / k.min(home).max(1), k));
        for k in others {
            let (n, t) = self.fill(k, tally, budget);
            if n > 0 {
                plan.push((k, n));
                tally = t;
            }
        }
        Some(self.take(&plan))
    }

    fn take(&mut self, plan: &[(usize, usize)]) -> Vec<T> {
        let mut out = Vec::new();
        for &(k, n) in plan {
            if let Some(q) = self.buckets.get_mut(&k) {
                out.extend(q.drain(..n.min(q.len())).map(|e| e.item));
                if q.is_empty() {
                    self.buckets.remove(&k);
                }
            }
        }
        self.len -= out.len();
        out
    }

    /// Removes and returns every waiting segment for which `pred` holds (segments of
    /// cancelled jobs, before they reach the device).
    pub fn drop_where(&mut self, mut pred: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut out = Vec::new();
        for q in self.buckets.values_mut() {
            let (gone, kept): (VecDeque<_>, VecDeque<_>) = q.drain(..).partition(|e| pred(&e.item));
            *q = kept;
            out.extend(gone.into_iter().map(|e| e.item));
        }
        self.buckets.retain(|_, q| !q.is_empty());
        self.len -= out.len();
        out
    }

    /// Every waiting segment, oldest first (when the worker stops).
    pub fn drain(&mut self) -> Vec<T> {
        let mut all: Vec<Entry<T>> = std::mem::take(&mut self.buckets)
            .into_values()
            .flatten()
            .collect();
        all.sort_by_key(|e| e.seq);
        self.len = 0;
        all.into_iter().map(|e| e.item).collect()
    }
}

/// Default for the longest a segment waits in a [`LaneBatcher`] before it goes ahead of
/// the higher lanes ([`LaneBatcher::with_max_hold`]): well under RabbitMQ's
/// `consumer_timeout` (30 minutes by default), past which the broker closes the channel
/// and every delivery it holds goes back to the queue (a return, counted against the
/// segment).
pub const MAX_HOLD: Duration = Duration::from_secs(300);

/// A [`Batcher`] per priority lane: a segment of a higher lane leaves in the next batch,
/// without waiting for a fuller one, ahead of everything of the lanes below.
///
/// Ageing: a segment that has waited `max_hold` or longer goes first, whatever its lane
/// (the longest-waiting first, in a batch of its lane built around it), so a flood of a
/// higher lane delays the lanes below by at most `max_hold`.
#[derive(Debug)]
pub struct LaneBatcher<T> {
    /// Highest lane first.
    lanes: Vec<Batcher<T>>,
    /// Segments that run in a batch of their own, first come first.
    alone: VecDeque<T>,
    /// Past this wait a segment goes ahead of younger ones of higher lanes.
    max_hold: Duration,
    /// The lowest lane waits (but for aged segments): more of a higher lane is on its
    /// way ([`LaneBatcher::hold_lowest`]).
    holding: bool,
}

/// How often a held-back lowest lane is looked at again (the hold is lifted by the
/// queue's acknowledgements, which the batcher is not told of).
const HOLD_POLL: Duration = Duration::from_millis(10);

impl<T> LaneBatcher<T> {
    /// Batchers for lanes `0..lanes`, ageing after [`MAX_HOLD`].
    pub fn new(lanes: u8) -> Self {
        Self {
            lanes: (0..lanes.max(1)).map(|_| Batcher::new()).collect(),
            alone: VecDeque::new(),
            max_hold: MAX_HOLD,
            holding: false,
        }
    }

    /// Holds the lowest lane back (`true`) while the queue has deliveries of a higher
    /// lane out (held, not acknowledged): a worker busy with a priority book gets its
    /// next deliveries as the batches in flight are acknowledged, and a batch of the
    /// lowest lane started in between would go ahead of them. Aged segments still go
    /// ([`LaneBatcher::with_max_hold`]).
    pub fn hold_lowest(&mut self, on: bool) {
        self.holding = on;
    }

    /// Ages segments after `max_hold` instead of [`MAX_HOLD`].
    pub fn with_max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = max_hold;
        self
    }

    /// The lane whose oldest segment has waited longest, once that is `max_hold` or more.
    fn aged(&self, now: Instant) -> Option<usize> {
        self.lanes
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.oldest_at().map(|at| (i, at)))
            .filter(|(_, at)| now.saturating_duration_since(*at) >= self.max_hold)
            .min_by_key(|(i, at)| (*at, *i))
            .map(|(i, _)| i)
    }

    /// A segment that runs in a batch of its own, before anything else (it was in the
    /// engine when a worker process died: alone, it cannot take others down with it).
    pub fn append_alone(&mut self, item: T) {
        self.alone.push_back(item);
    }

    fn lane(&mut self, lane: u8) -> &mut Batcher<T> {
        let top = self.lanes.len() - 1;
        let i = top - usize::from(lane).min(top);
        &mut self.lanes[i]
    }

    /// [`Batcher::append`] into `lane` (lanes above the highest go to the highest).
    pub fn append(&mut self, lane: u8, item: T, max_len: usize, items: usize, at: Instant) {
        self.lane(lane).append(item, max_len, items, at);
    }

    /// Whether nothing waits in any lane.
    pub fn is_empty(&self) -> bool {
        self.alone.is_empty() && self.lanes.iter().all(Batcher::is_empty)
    }

    /// The next batch: a segment that waited `max_hold` or more first (the longest
    /// waiting, at once, with what of its lane fits around it); else from the highest
    /// lane that has segments: a lane above the lowest leaves at once (flushed), the
    /// lowest waits as [`Batcher::next_batch`] decides.
    pub fn next_batch(&mut self, budget: &Budget, now: Instant, flush: bool) -> Option<Vec<T>> {
        if let Some(item) = self.alone.pop_front() {
            return Some(vec![item]);
        }
        if let Some(i) = self.aged(now) {
            return self.lanes[i].oldest_batch(budget);
        }
        let last = self.lanes.len() - 1;
        let holding = self.holding;
        for (i, b) in self.lanes.iter_mut().enumerate() {
            if b.is_empty() || (i == last && holding) {
                continue;
            }
            return b.next_batch(budget, now, flush || i < last);
        }
        None
    }

    /// When the next batch must leave (`None` when empty): now if a higher lane waits,
    /// else when the lowest lane's wait runs out or its oldest segment ages.
    pub fn deadline(&self, budget: &Budget) -> Option<Instant> {
        let last = self.lanes.len() - 1;
        if !self.alone.is_empty() || self.lanes[..last].iter().any(|b| !b.is_empty()) {
            return Some(Instant::now());
        }
        let aged = self
            .lanes
            .iter()
            .filter_map(Batcher::oldest_at)
            .min()
            .and_then(|at| at.checked_add(self.max_hold));
        let lowest = if self.holding {
            // Looked at again soon: the hold ends with the queue's acknowledgements.
            self.lanes[last]
                .oldest_at()
                .map(|_| Instant::now() + HOLD_POLL)
        } else {
            self.lanes[last].deadline(budget)
        };
        match (lowest, aged) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// [`Batcher::drop_where`] in every lane.
    pub fn drop_where(&mut self, mut pred: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut gone = Vec::new();
        for x in std::mem::take(&mut self.alone) {
            if pred(&x) {
                gone.push(x);
            } else {
                self.alone.push_back(x);
            }
        }
        gone.extend(self.lanes.iter_mut().flat_map(|b| b.drop_where(&mut pred)));
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_higher_lane_leaves_first_and_at_once() {
        let b = budget(1000, 4, 10_000);
        let mut lanes = LaneBatcher::new(2);
        let t0 = Instant::now();
        for i in 0..3 {
            lanes.append(0, i, 10, 1, t0);
        }
        // Normal segments wait for a fuller batch (10 s).
        assert_eq!(lanes.next_batch(&b, t0, false), None);
        lanes.append(1, 100, 10, 1, t0);
        lanes.append(7, 101, 10, 1, t0);
        assert!(lanes.deadline(&b).is_some_and(|d| d <= Instant::now()));
        assert_eq!(lanes.next_batch(&b, t0, false), Some(vec![100, 101]));
        assert_eq!(lanes.next_batch(&b, t0, false), None);
        assert_eq!(lanes.next_batch(&b, t0, true), Some(vec![0, 1, 2]));
        assert!(lanes.is_empty());
        // A suspect runs alone, before the lanes.
        lanes.append(1, 200, 10, 1, t0);
        lanes.append_alone(300);
        lanes.append_alone(301);
        assert_eq!(lanes.next_batch(&b, t0, false), Some(vec![300]));
        assert_eq!(lanes.next_batch(&b, t0, false), Some(vec![301]));
        assert_eq!(lanes.next_batch(&b, t0, false), Some(vec![200]));
    }

    #[test]
    fn an_aged_lower_lane_segment_goes_ahead_of_a_younger_higher_lane_flood() {
        let hold = Duration::from_secs(60);
        let b = budget(1000, 2, 10);
        let mut lanes = LaneBatcher::new(2).with_max_hold(hold);
        let t0 = Instant::now();
        lanes.append(0, 0, 10, 1, t0);
        lanes.append(0, 1, 10, 1, t0);
        lanes.append(0, 2, 10, 1, t0 + Duration::from_secs(1));
        // A flood of the high lane: always two waiting, each batch refilled.
        let mut next = 100;
        let mut served = Vec::new();
        let mut at = t0;
        while at <= t0 + hold + Duration::from_secs(1) {
            while lanes.lanes[0].len() < 2 {
                lanes.append(1, next, 10, 1, at);
                next += 1;
            }
            served.push((at, lanes.next_batch(&b, at, false).expect("a batch")));
            at += Duration::from_millis(500);
        }
        // Before the hold, only the flood; at the hold, the two oldest normal segments
        // (their lane's batch built around them), then the flood again until the third
        // ages a second later.
        let normal: Vec<(Duration, Vec<i32>)> = served
            .iter()
            .filter(|(_, batch)| batch.iter().any(|i| *i < 100))
            .map(|(at, batch)| (at.duration_since(t0), batch.clone()))
            .collect();
        assert_eq!(
            normal,
            [(hold, vec![0, 1]), (hold + Duration::from_secs(1), vec![2])]
        );
        assert!(served.iter().all(|(_, batch)| batch.len() <= 2));
        // The flood went on around them, oldest first.
        let high: Vec<i32> = served
            .iter()
            .flat_map(|(_, batch)| batch.iter().copied())
            .filter(|i| *i >= 100)
            .collect();
        assert!(high.windows(2).all(|w| w[0] < w[1]), "{high:?}");
        assert_eq!(high.len(), (served.len() - 2) * 2);
    }

    #[test]
    fn without_age_the_higher_lane_goes_first_and_aged_segments_go_oldest_first() {
        let hold = Duration::from_secs(300);
        assert_eq!(MAX_HOLD, hold, "the default");
        let b = budget(1000, 4, 10);
        let mut lanes = LaneBatcher::new(2);
        let t0 = Instant::now();
        lanes.append(0, 0, 10, 1, t0);
        lanes.append(1, 100, 10, 1, t0 + Duration::from_secs(1));
        // Just under the hold: the high lane first, as without ageing.
        let young = t0 + hold - Duration::from_millis(1);
        assert_eq!(lanes.next_batch(&b, young, false), Some(vec![100]));
        assert_eq!(lanes.next_batch(&b, young, false), Some(vec![0]));
        // Both aged: the one held longest first, whatever its lane.
        lanes.append(1, 101, 10, 1, t0 + Duration::from_secs(1));
        lanes.append(0, 1, 10, 1, t0);
        let old = t0 + hold + Duration::from_secs(5);
        assert_eq!(lanes.next_batch(&b, old, false), Some(vec![1]));
        assert_eq!(lanes.next_batch(&b, old, false), Some(vec![101]));
        // Segments that run alone still go before aged ones.
        lanes.append(0, 2, 10, 1, t0);
        lanes.append_alone(300);
        assert_eq!(lanes.next_batch(&b, old, false), Some(vec![300]));
        assert_eq!(lanes.next_batch(&b, old, false), Some(vec![2]));
        assert!(lanes.is_empty());
    }

    #[test]
    fn the_deadline_includes_the_hold() {
        // A lowest lane waiting longer than the hold for a fuller batch: it leaves at
        // the hold.
        let hold = Duration::from_secs(2);
        let b = budget(1000, 4, 10_000);
        let mut lanes = LaneBatcher::new(2).with_max_hold(hold);
        let t0 = Instant::now();
        lanes.append(0, 0, 10, 1, t0);
        assert_eq!(lanes.deadline(&b), Some(t0 + hold));
        assert_eq!(
            lanes.next_batch(&b, t0 + hold - Duration::from_millis(1), false),
            None
        );
        assert_eq!(lanes.next_batch(&b, t0 + hold, false), Some(vec![0]));
        // A hold too large to add to an instant is no deadline of its own.
        let mut lanes = LaneBatcher::new(2).with_max_hold(Duration::MAX);
        lanes.append(0, 0, 10, 1, t0);
        assert_eq!(lanes.deadline(&b), Some(t0 + Duration::from_secs(10)));
        assert_eq!(
            lanes.next_batch(&b, t0 + Duration::from_secs(10), false),
            Some(vec![0])
        );
    }

    #[test]
    fn a_held_lowest_lane_waits_for_the_higher_lane_but_not_past_the_hold() {
        let hold = Duration::from_secs(60);
        let b = budget(1000, 2, 0);
        let mut lanes = LaneBatcher::new(2).with_max_hold(hold);
        let t0 = Instant::now();
        lanes.append(0, 0, 10, 1, t0);
        lanes.hold_lowest(true);
        assert_eq!(lanes.next_batch(&b, t0, false), None, "held back");
        assert!(lanes.deadline(&b).is_some(), "looked at again");
        // What arrives of the higher lane goes at once.
        lanes.append(1, 100, 10, 1, t0);
        assert_eq!(lanes.next_batch(&b, t0, false), Some(vec![100]));
        // Aged, it goes even while held.
        assert_eq!(lanes.next_batch(&b, t0 + hold, false), Some(vec![0]));
        // Released, the lowest lane goes as before.
        lanes.append(0, 1, 10, 1, t0);
        lanes.hold_lowest(false);
        assert_eq!(lanes.next_batch(&b, t0, false), Some(vec![1]));
    }

    fn budget(tokens: usize, requests: usize, wait_ms: u64) -> Budget {
        Budget {
            max_tokens: tokens,
            max_requests: requests,
            max_wait: Duration::from_millis(wait_ms),
        }
    }

    #[test]
    fn a_full_bucket_leaves_at_once_and_a_partial_one_waits() {
        let t0 = Instant::now();
        let mut b = Batcher::new();
        let bud = budget(400, 64, 50);
        b.append("a", 100, 1, t0);
        b.append("b", 100, 1, t0);
        assert!(
            b.next_batch(&bud, t0, false).is_none(),
            "half full, not waited"
        );
        assert_eq!(b.deadline(&bud), Some(t0 + Duration::from_millis(50)));
        b.append("c", 100, 1, t0);
        b.append("d", 100, 1, t0);
        b.append("e", 100, 1, t0);
        assert_eq!(
            b.next_batch(&bud, t0, false),
            Some(vec!["a", "b", "c", "d"])
        );
        assert_eq!(b.len(), 1);
        assert!(
            b.next_batch(&bud, t0 + Duration::from_millis(49), false)
                .is_none()
        );
        assert_eq!(
            b.next_batch(&bud, t0 + Duration::from_millis(50), false),
            Some(vec!["e"])
        );
        assert!(b.is_empty());
    }

    #[test]
    fn the_request_limit_fills_a_batch_too() {
        let t0 = Instant::now();
        let mut b = Batcher::new();
        for i in 0..5 {
            b.append(i, 10, 1, t0);
        }
        assert_eq!(
            b.next_batch(&budget(10_000, 3, 1000), t0, false),
            Some(vec![0, 1, 2])
        );
    }

    #[test]
    fn lengths_are_bucketed_so_short_items_do_not_pad_to_long_ones() {
        let t0 = Instant::now();
        let mut b = Batcher::new();
        let bud = budget(1000, 64, 0);
        b.append("long1", 400, 1, t0);
        b.append("short1", 20, 1, t0);
        b.append("short2", 20, 1, t0);
        b.append("long2", 390, 1, t0);
        // Oldest is long1: its bucket (512) goes together; shorts would raise the padded
        // cost to 400 × 4 = 1600 > 1000, so they wait for the next batch.
        assert_eq!(b.next_batch(&bud, t0, true), Some(vec!["long1", "long2"]));
        assert_eq!(b.next_batch(&bud, t0, true), Some(vec!["short1", "short2"]));
    }

    #[test]
    fn a_timed_out_batch_tops_up_from_the_nearest_lengths() {
        let t0 = Instant::now();
        let mut b = Batcher::new();
        let bud = budget(10_000, 4, 10);
        b.append("64", 60, 1, t0);
        b.append("512", 500, 1, t0);
        b.append("128", 100, 1, t0);
        b.append("32", 30, 1, t0);
        b.append("16", 16, 1, t0);
        let batch = b.next_batch(&bud, t0 + Duration::from_millis(10), false);
        // Home bucket 64, then 32 and 128 (a factor 2 away), then 16 (factor 4); 512 left.
        assert_eq!(batch, Some(vec!["64", "32", "128", "16"]));
        assert_eq!(b.drain(), vec!["512"]);
    }

    #[test]
    fn a_segment_larger_than_the_budget_runs_alone() {
        let t0 = Instant::now();
        let mut b = Batcher::new();
        b.append("huge", 400, 8, t0);
        b.append("small", 400, 1, t0);
        let bud = budget(1000, 64, 1000);
        assert_eq!(b.next_batch(&bud, t0, false), Some(vec!["huge"]));
        assert!(b.next_batch(&bud, t0, false).is_none());
    }

    #[test]
    fn with_no_wait_whatever_is_there_leaves() {
        let t0 = Instant::now();
        let mut b = Batcher::new();
        b.append(1, 50, 3, t0);
        assert_eq!(b.next_batch(&budget(1000, 64, 0), t0, false), Some(vec![1]));
    }

    #[test]
    fn cancelled_segments_are_dropped_before_batching() {
        let t0 = Instant::now();
        let mut b = Batcher::new();
        for (job, len) in [("a", 10), ("b", 10), ("a", 300), ("c", 40)] {
            b.append(job, len, 1, t0);
        }
        assert_eq!(b.drop_where(|j| *j == "a"), vec!["a", "a"]);
        assert_eq!(b.len(), 2);
        assert_eq!(
            b.next_batch(&budget(10_000, 64, 0), t0, true),
            Some(vec!["b", "c"])
        );
        assert!(b.is_empty());
        assert_eq!(b.deadline(&budget(1, 1, 0)), None);
    }

    #[test]
    fn the_oldest_full_bucket_goes_first() {
        let t0 = Instant::now();
        let mut b = Batcher::new();
        let bud = budget(100, 2, 1000);
        b.append("long-old", 300, 1, t0);
        b.append("short-a", 10, 1, t0);
        b.append("short-b", 10, 1, t0);
        b.append("short-c", 10, 1, t0);
        // long-old alone exceeds the budget (a full bucket) and is older.
        assert_eq!(b.next_batch(&bud, t0, false), Some(vec!["long-old"]));
        assert_eq!(
            b.next_batch(&bud, t0, false),
            Some(vec!["short-a", "short-b"])
        );
    }
}
