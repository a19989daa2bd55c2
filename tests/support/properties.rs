//! The harness of the property tests of narrator's parsers and decoders
//! (`crates/narrator-text/tests/properties.rs`, `crates/narrator-engine/tests/properties.rs`,
//! `crates/narrator-broker/tests/properties.rs`), each of which includes this file with
//! `#[path = "../../../tests/support/properties.rs"] mod properties;`. It needs nothing but
//! `std` and `proptest`, so it is not part of the `narrator_test_support` library.
//!
//! What it adds to proptest:
//!
//! - **Case counts from the environment.** Every property runs [`cases`] cases:
//!   `NARRATOR_PROPTEST_CASES` (default 256, proptest's own default). `ops/fuzz.sh` sets
//!   it to 100,000. A property whose every input is a bomb of megabytes runs a tenth as
//!   many ([`check_heavy`], never fewer than 256). `NARRATOR_PROPTEST_SEED` fixes the
//!   seed; otherwise a fresh one is drawn and printed, so any run can be replayed.
//! - **A line per property**, on stderr: `property NAME: N cases, F failures, …` with the
//!   largest allocation peak and the slowest parse seen. A failing run stops at its first
//!   failure (proptest's way), shrinks it and prints the minimal input, so F is 0 or 1.
//! - **Panics are failures**, caught per case ([`check`]), whatever their origin.
//! - **Bounded memory and time.** [`within_bounds`] runs one parse and fails the case when
//!   the parse allocated more than [`memory_bound`] bytes at its peak, or took longer than
//!   [`MAX_PARSE`]. The count is exact, not sampled: a `#[global_allocator]` wrapping the
//!   system allocator keeps, per thread, the bytes live and the highest value they reached.
//!   Per thread, so the tests of one binary can run in parallel (cargo's default) without
//!   counting each other's allocations, and the counters (thread-local `Cell`s with a
//!   `const` initializer, which never allocate) cannot recurse into the allocator. The
//!   parsers are single-threaded, so everything a parse allocates is on its thread. A
//!   `realloc` counts the new block before freeing the old one (what a moving `realloc`
//!   holds at its peak), so the figure errs high, never low.

// Each binary uses the part it needs.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use proptest::collection::vec;
use proptest::prelude::{any, prop_oneof};
use proptest::sample::{Index, select};
use proptest::strategy::Strategy;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};

/// Counts the bytes each thread holds (see the module's documentation).
struct Counting;

thread_local! {
    /// Bytes allocated minus bytes freed by this thread (negative when it frees what
    /// another thread allocated).
    static LIVE: Cell<isize> = const { Cell::new(0) };
    /// The highest `LIVE` since the last [`reset_peak`].
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn grow(bytes: usize) {
    let bytes = isize::try_from(bytes).unwrap_or(isize::MAX);
    // `try_with`: a thread being torn down still frees memory.
    let _ = LIVE.try_with(|live| {
        let now = live.get().saturating_add(bytes);
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

fn shrink(bytes: usize) {
    let bytes = isize::try_from(bytes).unwrap_or(isize::MAX);
    let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(bytes)));
}

// A global allocator is `unsafe` by its nature: it hands every call to the system
// allocator unchanged and only counts.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is passed on unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, i.e. from `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        shrink(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`; `new_size` is the caller's.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            grow(new_size);
            shrink(layout.size());
        }
        p
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn live() -> isize {
    LIVE.with(Cell::get)
}

fn reset_peak() -> isize {
    let now = live();
    PEAK.with(|p| p.set(now));
    now
}

fn peak() -> isize {
    PEAK.with(Cell::get)
}

/// Cases per property: `NARRATOR_PROPTEST_CASES`, else 256.
pub(crate) fn cases() -> u32 {
    std::env::var("NARRATOR_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(256)
}

/// Cases of a property whose every input is large (a bomb of megabytes): a tenth of
/// [`cases`], and never fewer than 256 or [`cases`] if that is less.
pub(crate) fn heavy_cases() -> u32 {
    let cases = cases();
    (cases / 10).max(cases.min(256))
}

/// Most bytes one parse may allocate at its peak, for `input` bytes of input:
/// 64 MiB + 64 × the input. The constant covers what a parser may hold whatever the
/// input's size: the reads of a few bounded archive entries (8 MiB metadata files, a
/// 16 MiB chapter held in a vector that doubles as it is read) and the tables of the
/// libraries (regex, YAML, XML); the factor covers what grows with the input: the parsed
/// tree, the normalized copies, the document. Real inputs stay far below it (Alice in
/// Wonderland, 152 KB of text, peaks under 1 MiB as text or Markdown, see
/// `real_inputs_stay_within_the_memory_bound`); what it catches is amplification: an
/// input that asks for memory out of proportion to its size (an alias bomb, an entity
/// bomb, a zip bomb, a rule that feeds on its own output).
pub(crate) fn memory_bound(input: usize) -> usize {
    (64 << 20) + 64 * input
}

/// Longest one parse may take before the case fails: no input of these tests (a few KB,
/// or a bomb of a few MB) needs more than a fraction of it, even in a debug build on two
/// slow cores with every test running at once; a parse that hangs or goes quadratic does.
pub(crate) const MAX_PARSE: Duration = Duration::from_secs(20);

/// What one parse used.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Usage {
    /// Highest number of bytes allocated at once during the parse, above what the thread
    /// held when it started.
    pub(crate) peak: usize,
    /// Wall time.
    pub(crate) elapsed: Duration,
}

thread_local! {
    /// The largest peak (with its input's size) and the slowest parse of the property
    /// running on this thread.
    static WORST: Cell<(usize, usize, Duration)> = const { Cell::new((0, 0, Duration::ZERO)) };
    /// How the cases of the property running on this thread ended ([`note`]).
    static OUTCOMES: RefCell<BTreeMap<&'static str, u64>> = const { RefCell::new(BTreeMap::new()) };
}

/// Counts one case's outcome (`ok`, or an error's kind) for the property's line, so a run
/// shows how deep its inputs got: a generator whose inputs all fail at the first check
/// tests little.
pub(crate) fn note(outcome: &'static str) {
    OUTCOMES.with(|o| *o.borrow_mut().entry(outcome).or_default() += 1);
}

/// Runs `parse` and measures it.
pub(crate) fn measure<R>(parse: impl FnOnce() -> R) -> (R, Usage) {
    let start = reset_peak();
    let started = Instant::now();
    let out = parse();
    let elapsed = started.elapsed();
    let peak = usize::try_from(peak().saturating_sub(start)).unwrap_or(0);
    (out, Usage { peak, elapsed })
}

/// Runs `parse` of an input of `input` bytes; an error when it allocated more than
/// [`memory_bound`]`(input)` at its peak or took longer than [`MAX_PARSE`].
pub(crate) fn within_bounds<R>(
    input: usize,
    parse: impl FnOnce() -> R,
) -> Result<R, TestCaseError> {
    let (out, used) = measure(parse);
    WORST.with(|w| {
        let (peak, len, slowest) = w.get();
        let (peak, len) = if used.peak > peak {
            (used.peak, input)
        } else {
            (peak, len)
        };
        w.set((peak, len, slowest.max(used.elapsed)));
    });
    if used.peak > memory_bound(input) {
        return Err(TestCaseError::fail(format!(
            "the parse of {input} bytes allocated {} bytes at its peak, over the bound of {}",
            used.peak,
            memory_bound(input)
        )));
    }
    if used.elapsed > MAX_PARSE {
        return Err(TestCaseError::fail(format!(
            "the parse of {input} bytes took {:?}, over {MAX_PARSE:?}",
            used.elapsed
        )));
    }
    Ok(out)
}

/// Fails the case with `why` unless `ok`.
pub(crate) fn ensure(ok: bool, why: impl FnOnce() -> String) -> Result<(), TestCaseError> {
    if ok {
        Ok(())
    } else {
        Err(TestCaseError::fail(why()))
    }
}

fn seed() -> u64 {
    if let Some(seed) = std::env::var("NARRATOR_PROPTEST_SEED")
        .ok()
        .and_then(|v| v.trim().parse().ok())
    {
        return seed;
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    // Distinct per property even when they start in the same nanosecond.
    let here = Instant::now();
    let mixed = nanos as u64 ^ (std::ptr::from_ref(&here) as usize as u64).rotate_left(32);
    mixed.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

/// Runs the property `name`: [`cases`] inputs drawn from `strategy`, each handed to
/// `property`, which fails the case by returning an error (or by panicking). Prints the
/// property's line; panics with the minimal failing input when a case failed.
pub(crate) fn check<S>(
    name: &str,
    strategy: S,
    property: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S: Strategy,
    S::Value: Debug,
{
    run(name, cases(), strategy, property);
}

/// [`check`] with [`heavy_cases`].
pub(crate) fn check_heavy<S>(
    name: &str,
    strategy: S,
    property: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S: Strategy,
    S::Value: Debug,
{
    run(name, heavy_cases(), strategy, property);
}

fn run<S>(
    name: &str,
    cases: u32,
    strategy: S,
    property: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S: Strategy,
    S::Value: Debug,
{
    let seed = seed();
    let config = Config {
        cases,
        // Failures are kept as regression tests beside the code, not in files proptest
        // would write into the source tree.
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(seed),
        // Shrinking a large input case by case could take long; these bound it.
        max_shrink_iters: 2_000,
        max_shrink_time: 120_000,
        ..Config::default()
    };
    WORST.with(|w| w.set((0, 0, Duration::ZERO)));
    OUTCOMES.with(|o| o.borrow_mut().clear());
    let tried = Cell::new(0u64);
    let shrinks = Cell::new(0u64);
    let failed = Cell::new(false);
    let started = Instant::now();
    let mut runner = TestRunner::new(config);
    let result = runner.run(&strategy, |value| {
        if failed.get() {
            shrinks.set(shrinks.get() + 1);
        } else {
            tried.set(tried.get() + 1);
        }
        let outcome = match catch_unwind(AssertUnwindSafe(|| property(value))) {
            Ok(outcome) => outcome,
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)");
                Err(TestCaseError::fail(format!("panicked: {message}")))
            }
        };
        if matches!(outcome, Err(TestCaseError::Fail(_))) {
            failed.set(true);
        }
        outcome
    });
    let (worst_peak, worst_len, slowest) = WORST.with(Cell::get);
    let failures = u32::from(failed.get());
    let outcomes = OUTCOMES.with(|o| {
        o.borrow()
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    });
    eprintln!(
        "property {name}: {} cases, {failures} failures, largest peak {} (input {worst_len} bytes), \
         slowest parse {:.3} s, {:.1} s in all, seed {seed}; outcomes: {outcomes}",
        tried.get(),
        mib(worst_peak),
        slowest.as_secs_f64(),
        started.elapsed().as_secs_f64(),
    );
    match result {
        Ok(()) => {}
        Err(TestError::Fail(why, minimal)) => panic!(
            "property {name} failed (seed {seed}; replay with NARRATOR_PROPTEST_SEED={seed}): \
             {why}\nminimal input ({} shrink steps): {minimal:?}",
            shrinks.get()
        ),
        Err(TestError::Abort(why)) => panic!("property {name} aborted (seed {seed}): {why}"),
    }
}

/// One edit of a byte string (mutations of real files); positions are fractions of its
/// length when applied.
#[derive(Debug, Clone)]
pub(crate) enum Mutation {
    /// Flips one bit.
    Flip(Index, u8),
    /// Sets one byte.
    Set(Index, u8),
    /// Inserts random bytes.
    Insert(Index, Vec<u8>),
    /// Inserts a token of the formats' syntax.
    Token(Index, &'static str),
    /// Deletes up to this many bytes.
    Delete(Index, usize),
    /// Copies a stretch elsewhere (duplicated headings, nested markup).
    Copy(Index, usize, Index),
    /// Repeats a stretch many times.
    Repeat(Index, usize, usize),
    /// Cuts the rest off.
    Truncate(Index),
}

pub(crate) fn mutation(tokens: &'static [&'static str]) -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => (any::<Index>(), 0u8..8).prop_map(|(i, b)| Mutation::Flip(i, b)),
        2 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        2 => (any::<Index>(), vec(any::<u8>(), 1..16)).prop_map(|(i, b)| Mutation::Insert(i, b)),
        4 => (any::<Index>(), select(tokens)).prop_map(|(i, t)| Mutation::Token(i, t)),
        2 => (any::<Index>(), 1usize..256).prop_map(|(i, n)| Mutation::Delete(i, n)),
        2 => (any::<Index>(), 1usize..512, any::<Index>())
            .prop_map(|(i, n, to)| Mutation::Copy(i, n, to)),
        1 => (any::<Index>(), 1usize..64, 1usize..64)
            .prop_map(|(i, n, times)| Mutation::Repeat(i, n, times)),
        1 => any::<Index>().prop_map(Mutation::Truncate),
    ]
}

/// One to nine edits, inserting `tokens` among others.
pub(crate) fn mutations(tokens: &'static [&'static str]) -> impl Strategy<Value = Vec<Mutation>> {
    vec(mutation(tokens), 1..10)
}

/// `bytes` with `edits` applied in order.
pub(crate) fn mutate(mut bytes: Vec<u8>, edits: &[Mutation]) -> Vec<u8> {
    let at = |i: &Index, len: usize| if len == 0 { 0 } else { i.index(len + 1) };
    for m in edits {
        let len = bytes.len();
        match m {
            Mutation::Flip(i, bit) if len > 0 => bytes[i.index(len)] ^= 1 << bit,
            Mutation::Set(i, b) if len > 0 => bytes[i.index(len)] = *b,
            Mutation::Flip(..) | Mutation::Set(..) => {}
            Mutation::Insert(i, b) => {
                let p = at(i, len);
                bytes.splice(p..p, b.iter().copied());
            }
            Mutation::Token(i, t) => {
                let p = at(i, len);
                bytes.splice(p..p, t.bytes());
            }
            Mutation::Delete(i, n) => {
                let p = at(i, len);
                bytes.drain(p..(p + n).min(len));
            }
            Mutation::Copy(i, n, to) => {
                let p = at(i, len);
                let piece = bytes[p..(p + n).min(len)].to_vec();
                let q = at(to, len);
                bytes.splice(q..q, piece);
            }
            Mutation::Repeat(i, n, times) => {
                let p = at(i, len);
                let piece = bytes[p..(p + n).min(len)].to_vec();
                let repeated = piece.repeat(*times);
                bytes.splice(p..p, repeated);
            }
            Mutation::Truncate(i) => bytes.truncate(at(i, len)),
        }
    }
    bytes
}
