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

use crate::chains::{self, RowScores, ScoreChain};
use crate::problem::{Inputs, Problem};
use crate::schedule::{Builder, RingSchedule};

pub const NAME: &str = "schedule-causal";
pub const DESCRIPTION: &str = "causal mask: only unmasked scores in every phase, paired placement (Algorithm 3)";

/// The pair schedules' shape constraints.
pub fn check_shape(p: &Problem, pes: u32) -> Option<String> {
    if p.tokens % pes != 0 {
        return Some(format!(
            "this schedule needs the number of PEs to divide `tokens` ({} is not a multiple of {pes})",
            p.tokens
        ));
    }
    if p.dim % pes != 0 {
        return Some(format!(
            "this schedule needs the number of PEs to divide `dim` ({} is not a multiple of {pes})",
            p.dim
        ));
    }
    None
}

pub fn unsupported(p: &Problem, pes: u32) -> Option<String> {
    if !p.causal {
        return Some("the causal schedule needs `mask = causal`".into());
    }
    check_shape(p, pes)
}

/// One chain per pair `a ≥ b`, finishing on PE `(a + b) mod m`.
pub fn pair_chains(n: u32, m: u32) -> Vec<ScoreChain> {
    let mut v = Vec::with_capacity((n * (n + 1) / 2) as usize);
    for a in 0..n {
        for b in 0..=a {
            v.push(ScoreChain { a, b, end: (a + b) % m });
        }
    }
    v
}

pub fn run(p: &Problem, pes: u32) -> RingSchedule {
    let mut b = Builder::new(NAME, pes);
    let mut inputs = Inputs::new(*p);
    let mut t = 0;
    for h in 0..p.heads {
        let pairs = pair_chains(p.tokens, pes);
        let (scores, t1) = chains::phase1(&mut b, &mut inputs, p, h, t, &pairs);
        let n = p.tokens as usize;
        let mut rows: Vec<RowScores> = vec![Vec::new(); n];
        for (ch, &v) in pairs.iter().zip(&scores) {
            rows[ch.a as usize].push((ch.b, v, ch.end));
        }
        let (weights, t2) = chains::phase2(&mut b, p, t1, &rows);
        t = chains::phase3(&mut b, &mut inputs, p, h, t2, &weights);
    }
    b.finish()
}
