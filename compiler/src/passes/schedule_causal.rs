//! `schedule-causal`: our version of the paper's Algorithm 3 (§5) for a causal mask.
//!
//! Only `b ≤ a` exists, in every phase. Phase 1 runs one chain per unmasked score, finishing on
//! PE `(a + b) mod m` (the same placement as the symmetric schedule), packed into waves by start
//! PE; for odd n with m | n every PE starts exactly `n(n+1)/(2m)` chains, so phase 1 has no idle
//! slot. Row `a`'s softmax walk meets column `b` on PE `(a + b) mod m` at step `b`, so it lasts
//! `a + 1` steps; rows go in blocks of `m`, a block lasting as long as its longest row (rounded
//! up to a multiple of m in step 1 so each sum comes back to where step 2 starts). That is the
//! paper's "≈50% utilisation" for n = m, and less waste as n/m grows (n = 15, m = 5: 60 cycles of
//! phase 2 instead of the paper's 90). Phase 3 sends each unmasked weight along `d` PEs.

use crate::chains::{self, Row, ScoreChain};
use crate::passes::select::{chain_refusal, Culprit, Refusal};
use crate::problem::{Inputs, Problem};
use crate::schedule::{Builder, RingSchedule, ScheduleError};
use crate::scheduler::Scheduler;

pub const NAME: &str = "schedule-causal";
pub const DESCRIPTION: &str =
    "causal mask: only unmasked scores in every phase, paired placement (Algorithm 3)";

/// The pair schedules' shape constraints.
pub fn check_shape(p: &Problem, pes: u32) -> Option<String> {
    p.ring_divides_shape(pes, "this schedule")
}

pub fn unsupported(p: &Problem, pes: u32) -> Option<String> {
    if !p.causal {
        return Some("the causal schedule needs `mask = causal`".into());
    }
    check_shape(p, pes).or_else(|| p.needs_plain("the causal schedule"))
}

/// One chain per pair `a ≥ b` of every head, finishing on PE `(a + b + h) mod m`: the rotation by
/// head evens out the finishing PEs across heads when one head alone cannot (even n).
pub fn pair_chains(p: &Problem, m: u32) -> Vec<ScoreChain> {
    let n = p.tokens;
    let mut v = Vec::with_capacity(p.heads as usize * (n * (n + 1) / 2) as usize);
    for head in 0..p.heads {
        for a in 0..n {
            for b in 0..=a {
                v.push(ScoreChain {
                    head,
                    a,
                    b,
                    end: (a + b + head) % m,
                });
            }
        }
    }
    v
}

/// Empty rows of every head, each starting its walk where its column 0 is, `(a + h) mod m`.
pub fn empty_rows(p: &Problem, m: u32) -> Vec<Row> {
    (0..p.heads)
        .flat_map(|head| {
            (0..p.tokens).map(move |a| Row {
                head,
                a,
                start: (a + head) % m,
                scores: Vec::new(),
            })
        })
        .collect()
}

/// Heads are scheduled together: each phase packs the work of all heads, so one head's idle
/// slots carry another's.
/// The registry's handle on this pass.
pub struct Causal;

impl Scheduler for Causal {
    fn name(&self) -> &'static str {
        "causal"
    }
    fn pass(&self) -> &'static str {
        NAME
    }
    fn description(&self) -> &'static str {
        DESCRIPTION
    }
    fn title(&self) -> &'static str {
        "causal (paper Algorithm 3, improved)"
    }
    fn refusal(&self, p: &Problem, pes: u32) -> Option<Refusal> {
        let why = unsupported(p, pes)?;
        Some(if p.causal {
            chain_refusal(p, pes, "causal", why)
        } else {
            Refusal {
                culprit: Culprit::Mask,
                message: why,
                note: "`--schedule causal` applies only to layers with `mask = causal`".into(),
            }
        })
    }
    fn schedule(&self, p: &Problem, pes: u32) -> Result<RingSchedule, Vec<ScheduleError>> {
        run(p, pes)
    }
}

pub fn run(p: &Problem, pes: u32) -> Result<RingSchedule, Vec<ScheduleError>> {
    let mut b = Builder::new(NAME, pes);
    let mut inputs = Inputs::new(*p);
    let pairs = pair_chains(p, pes);
    let (scores, t1) = chains::phase1(&mut b, &mut inputs, p, 0, &pairs);
    let mut rows = empty_rows(p, pes);
    let n = p.tokens as usize;
    for (ch, &v) in pairs.iter().zip(&scores) {
        rows[ch.head as usize * n + ch.a as usize]
            .scores
            .push((ch.b, v, ch.end));
    }
    let (weights, t2) = chains::phase2(&mut b, p, t1, &rows);
    chains::phase3(&mut b, &mut inputs, p, t2, &weights);
    b.finish()
}
