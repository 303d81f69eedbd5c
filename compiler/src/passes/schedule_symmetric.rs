//! `schedule-symmetric`: our version of the paper's Algorithm 2 (§4) for q = k = v.
//!
//! `w'` is symmetric, so phase 1 computes only the pairs `a ≥ b` (`n(n+1)/2` chains, the
//! necessary count for every n: unlike the paper we never recompute the `n/2` middle-diagonal
//! pairs of even n). The value of pair `{a, b}` finishes on PE `(a + b) mod m`, so in row `a`
//! the score of column `b` sits on PE `(a + b) mod m`: a symmetric Latin-square assignment. Row
//! `a`'s softmax walk, which is on PE `(a + j) mod m` at step `j`, therefore finds column `b = j`
//! right there, for both `w'[a][b]` and its mirror `w'[b][a]` — no reuse transfers at all, which
//! is where the paper's Algorithm 2 spends extra cycles. Phase 3 is the baseline's, each weight
//! starting from wherever phase 2 left it.
//!
//! Cycles per head: `d·W + 2n²/m + d·n²/m` where `W` is the largest number of pairs with one
//! finishing PE; `W = n(n+1)/(2m)` exactly when that is balanced (every odd n with m | n; even n
//! is one wave over).

use super::schedule_causal::{check_shape, empty_rows, pair_chains};
use crate::chains;
use crate::passes::select::{chain_refusal, Culprit, Refusal};
use crate::problem::{Inputs, Problem};
use crate::schedule::{Builder, RingSchedule, ScheduleError};
use crate::scheduler::Scheduler;

pub const NAME: &str = "schedule-symmetric";
pub const DESCRIPTION: &str =
    "q = k = v: compute each distinct score once, Latin-square placement (Algorithm 2)";

pub fn unsupported(p: &Problem, pes: u32) -> Option<String> {
    if !p.symmetric {
        return Some("the symmetric schedule needs q = k (`qkv = shared`)".into());
    }
    if p.causal {
        // Every weight of the symmetric schedule is unmasked: on a causal layer it would
        // compute the wrong attention.
        return Some("the symmetric schedule does not apply the causal mask".into());
    }
    check_shape(p, pes).or_else(|| p.needs_plain("the symmetric schedule"))
}

/// Heads are scheduled together, as in the causal schedule.
/// The registry's handle on this pass.
pub struct Symmetric;

impl Scheduler for Symmetric {
    fn name(&self) -> &'static str {
        "symmetric"
    }
    fn pass(&self) -> &'static str {
        NAME
    }
    fn description(&self) -> &'static str {
        DESCRIPTION
    }
    fn title(&self) -> &'static str {
        "symmetric (paper Algorithm 2, improved)"
    }
    fn refusal(&self, p: &Problem, pes: u32) -> Option<Refusal> {
        let why = unsupported(p, pes)?;
        Some(if !p.symmetric {
            Refusal {
                culprit: Culprit::Qkv,
                message: why,
                note: "`--schedule symmetric` applies only to layers with `qkv = shared`".into(),
            }
        } else if p.causal {
            Refusal {
                culprit: Culprit::Mask,
                message: why,
                note: "for a layer with `mask = causal` use `--schedule causal`".into(),
            }
        } else {
            chain_refusal(p, pes, "symmetric", why)
        })
    }
    fn tried_by_auto(&self, p: &Problem, _pes: u32) -> bool {
        // Under a causal mask every unmasked score is already one unordered pair: the causal
        // schedule covers the layer.
        !p.causal
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
        let base = ch.head as usize * n;
        rows[base + ch.a as usize].scores.push((ch.b, v, ch.end));
        if ch.a != ch.b {
            rows[base + ch.b as usize].scores.push((ch.a, v, ch.end));
        }
    }
    let (weights, t2) = chains::phase2(&mut b, p, t1, &rows);
    chains::phase3(&mut b, &mut inputs, p, t2, &weights);
    b.finish()
}
