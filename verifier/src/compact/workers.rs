//! Evaluating PEs side by side on worker threads, with the proof's limits kept global.
//!
//! The per-PE induction evaluates each PE from a fresh state (its own expressions, variables
//! and log), so what a PE's evaluation comes to does not depend on which thread ran it or
//! which PEs that thread ran before; the caller combines the results in PE order, and the
//! verdict and the report are the same for any number of workers.
//!
//! The limits stay those of one proof: every bundle evaluation of every worker counts against
//! one total ([`super::prove::MAX_EVALUATIONS`], failed attempts giving theirs back), and all
//! workers share one deadline. PEs are handed out in increasing order; once a PE fails, PEs
//! above it stop and none is started, while PEs below it run on, so the failure reported is
//! the lowest PE's, as when PEs run one after the other.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// What evaluations running side by side share.
#[derive(Debug)]
pub(super) struct Shared {
    /// Bundle evaluations of all workers together, failed attempts' given back.
    evaluations: AtomicU64,
    /// The lowest PE that failed (`usize::MAX`: none yet).
    failed: AtomicUsize,
}

impl Shared {
    pub(super) fn new() -> Arc<Shared> {
        Arc::new(Shared {
            evaluations: AtomicU64::new(0),
            failed: AtomicUsize::new(usize::MAX),
        })
    }

    /// Counts one evaluation; returns the total so far.
    pub(super) fn count_one(&self) -> u64 {
        self.evaluations.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Takes back `n` evaluations of an attempt that failed.
    pub(super) fn give_back(&self, n: u64) {
        self.evaluations.fetch_sub(n, Ordering::Relaxed);
    }

    /// Whether PE `pe` should stop: a lower PE failed, and its failure is the verdict.
    pub(super) fn stopped(&self, pe: usize) -> bool {
        pe > self.failed.load(Ordering::Relaxed)
    }

    fn fail(&self, pe: usize) {
        self.failed.fetch_min(pe, Ordering::Relaxed);
    }
}

/// Stack of a worker thread: the evaluation recurses through terms and loop nests as deeply
/// as on the calling thread, whose stack is usually 8 MiB.
const STACK: usize = 64 << 20;

/// How many workers `asked` means: 0 is the machine's available parallelism; never more than
/// `pes`, never fewer than one.
pub(super) fn count(asked: usize, pes: usize) -> usize {
    let n = if asked == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        asked
    };
    n.min(pes).max(1)
}

/// Runs `one(state, p)` for PEs `0..pes` on `workers` threads, each thread with its own
/// `state` from `fresh` (caches only: results must not depend on it). Returns every PE's
/// result in PE order, or the lowest PE's failure. With one worker everything runs on the
/// calling thread.
pub(super) fn in_order<S, T: Send>(
    pes: usize,
    workers: usize,
    shared: &Shared,
    fresh: impl Fn() -> S + Sync,
    one: impl Fn(&mut S, usize) -> Result<T, String> + Sync,
) -> Result<Vec<T>, String> {
    let next = AtomicUsize::new(0);
    let work = || {
        let mut state = fresh();
        let mut done = Vec::new();
        loop {
            let p = next.fetch_add(1, Ordering::Relaxed);
            if p >= pes || shared.stopped(p) {
                return done;
            }
            let r = one(&mut state, p);
            if r.is_err() {
                shared.fail(p);
            }
            done.push((p, r));
        }
    };
    let mut all: Vec<(usize, Result<T, String>)> = Vec::new();
    let mut panicked = false;
    if workers <= 1 {
        all = work();
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..workers)
                .filter_map(|_| {
                    std::thread::Builder::new()
                        .stack_size(STACK)
                        .spawn_scoped(s, work)
                        .ok()
                })
                .collect();
            // No thread could be started: the calling thread does the work.
            if handles.is_empty() {
                all = work();
            }
            for h in handles {
                match h.join() {
                    Ok(done) => all.extend(done),
                    Err(_) => panicked = true,
                }
            }
        });
    }
    all.sort_by_key(|(p, _)| *p);
    let mut out = Vec::with_capacity(pes);
    for (p, r) in all {
        // PEs are taken in order, so results below the lowest failure have no gaps.
        if p != out.len() {
            break;
        }
        out.push(r?);
    }
    // A worker that panicked left its PE without a result: the proof does not go through.
    if panicked || out.len() != pes {
        return Err("a worker thread stopped without a result".into());
    }
    Ok(out)
}
