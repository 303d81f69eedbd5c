//! Bulk windows over any loop structure, for the stretches the other two planners leave to
//! cycle-by-cycle stepping: a PE inside a body of several bundles with loops nested more than
//! one deep (a row's maximum and exponentials between its score and output loops), while the
//! other PEs are anywhere.
//!
//! A PE's part of the window is the list of stretches its cursor walks through in the window's
//! cycles, each planned and checked on its own (the single-loop window's rules, where a word
//! an earlier stretch of the window writes counts as initialized for the later ones: the PE's
//! stretches run in its own order). Planning is
//! per stretch, not per cycle, and the PEs need not sit in alike loops. Windows are short
//! (at most [`MAX_STRETCHES`] stretches on any PE) because nothing is shared between
//! iterations: the planners over one loop or whole iterations take over again as soon as every
//! PE is back in such a loop.

use super::defer::{meet, Access, Meet};
use super::nest::{stretch_ok, PeMem, Segment};
use super::{count_times, fx, plan_of, run_plan, LoopMachine, Stepped};
use crate::machine::F32Domain;

/// Most cycles one window covers.
const MAX_CYCLES: u64 = 4096;

/// Most stretches one PE plans for a window.
const MAX_STRETCHES: usize = 4;

/// A PE's stretches in a window, in its order (`None`: the PE has finished).
type PeSegments = Option<Vec<Segment>>;

impl LoopMachine<F32Domain> {
    /// A window of at least 2 cycles: each PE's stretches, planned and checked (`None`: the
    /// PE has finished). `Stepped(k)`: step `k` cycles before trying again.
    pub(super) fn plan_general(&mut self) -> Result<(u32, Vec<PeSegments>, bool), Stepped> {
        let n = self.progs.len();
        let mut w = MAX_CYCLES.min(self.len - self.m.cycle());
        // Each PE's next stretches up to the cap, walked once; the window ends where the PE
        // with the most stretches per cycle reaches its cap.
        let mut walked = Vec::with_capacity(n);
        for p in 0..n {
            let mut runs = Vec::new();
            if !self.cursors[p].done {
                let mut probe = self.cursors[p];
                let mut reach = 0u64;
                probe.walk(&self.progs[p].body, 0, w, |b, idx, len, inner| {
                    runs.push((b, *idx, len, inner));
                    reach += u64::from(len);
                    runs.len() < MAX_STRETCHES
                });
                w = w.min(reach);
            }
            walked.push(runs);
        }
        if w < 2 {
            return Err(Stepped(1));
        }
        let mems = self.m.mems();
        let mut wins = Vec::with_capacity(n);
        for (p, runs) in walked.iter().enumerate() {
            if self.cursors[p].done {
                wins.push(None);
                continue;
            }
            let next = if p + 1 == n { 0 } else { p + 1 };
            let mut segs = Vec::new();
            // Words the PE writes before the stretch at hand: initialized by then.
            let mut fresh = Vec::new();
            let mut left = w;
            for (b, idx, len, inner) in runs {
                if left == 0 {
                    break;
                }
                // The last stretch in the window is cut to what is left of it.
                let len = (*len).min(u32::try_from(left).unwrap_or(u32::MAX));
                left -= u64::from(len);
                let plan = plan_of(b, idx, *inner);
                let l = i64::from(len);
                let mut at = PeMem {
                    mem: &mems[p],
                    next_len: mems[next].len(),
                    init: &mut self.init[p],
                    fresh: &fresh,
                };
                if !stretch_ok(&plan, l, &[0; 7], 1, &mut at) {
                    return Err(Stepped(1));
                }
                fresh.extend(
                    fx::WRITES
                        .iter()
                        .filter_map(|&k| plan.progs[k].map(|pr| (pr, l))),
                );
                segs.push(Segment { plan, len });
            }
            wins.push(Some(segs));
        }
        // The PEs run one after another: what a PE's predecessor sends in the window must not
        // meet anything the PE writes in it, and meet what it reads only where every read
        // comes first (the sends are then held back to the window's end).
        let accesses = |segs: &Vec<Segment>, fields: &[usize]| -> Vec<Access> {
            let mut out = Vec::new();
            let mut at = 0i64;
            for s in segs {
                let len = i64::from(s.len);
                out.extend(
                    fields
                        .iter()
                        .filter_map(|&k| s.plan.progs[k].map(|pr| (at, pr, len))),
                );
                at += len;
            }
            out
        };
        let mut held = false;
        for p in 0..n {
            let prev = if p == 0 { n - 1 } else { p - 1 };
            let (Some(mine), Some(theirs)) = (&wins[p], &wins[prev]) else {
                continue;
            };
            let sends = accesses(theirs, &[fx::XFER_DST]);
            if sends.is_empty() {
                continue;
            }
            match meet(
                &sends,
                &accesses(mine, &fx::READS),
                &accesses(mine, &fx::WRITES),
            ) {
                Meet::Apart => {}
                Meet::ReadsFirst => held = true,
                Meet::Clash => return Err(Stepped(1)),
            }
        }
        Ok((w as u32, wins, held))
    }

    pub(super) fn exec_general(&mut self, w: u32, wins: &[PeSegments], held: bool) {
        let n = wins.len();
        let mut sink = self.sink(held, w);
        let mems = self.m.mems_mut();
        for (p, segs) in wins.iter().enumerate() {
            let Some(segs) = segs else { continue };
            let next = if p + 1 == n { 0 } else { p + 1 };
            for s in segs {
                run_plan(mems, &mut sink, p, next, &s.plan, i64::from(s.len));
            }
        }
        self.held_buf = sink.flush(mems);
        for (p, segs) in wins.iter().enumerate() {
            let Some(segs) = segs else { continue };
            for s in segs {
                count_times(&mut self.stats[p], &s.plan.bundle, u64::from(s.len));
            }
            self.cursors[p].walk(&self.progs[p].body, 0, u64::from(w), |_, _, _, _| true);
        }
        self.m.advance(u64::from(w));
        self.bulk += u64::from(w);
        self.general += u64::from(w);
    }
}
