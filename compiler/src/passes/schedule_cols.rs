//! `schedule-cols`: phase 1, the softmax and phase 3 on PEs of their own, for rings much larger
//! than the sequence.
//!
//! The split dataflow's lanes put a head's rows on separate runs of PEs, and every run needs
//! every k and v row: on a ring of 64 or 256 PEs those words, each preloaded once, cross most
//! links and the links set the pace. The ring-spanning lane avoids that but sends every weight
//! round the whole ring. This pass lays each head out as one lane of three parts:
//!
//! * `r1` PEs holding the head's q and k columns in contiguous blocks: every score's `d`
//!   products run through them, its partial sum riding `send acc` from block to block;
//! * `soft` PEs after them, where the scores land, the rows dealt to them in turn: the row
//!   maximum, the exponentials with their sum, the divisions;
//! * `r3` PEs after those holding the v columns: each weight travels forward through them and
//!   `y[a][c]` accumulates on the PE of column `c`.
//!
//! No input word is read by two parts, so nothing but partial sums, scores and weights cross
//! the links (with q = k = v the x rows are read in both column parts and do travel). Each part
//! is as long as balances its work against its hops (see [`candidates`]); the list scheduler
//! and searches of the split dataflow pin and order the tasks, so the cycle count is exact.
//! `auto` keeps it only where that count is the lowest.

use crate::passes::schedule_split::{self, Apart};
use crate::passes::select::{Culprit, Refusal};
use crate::problem::Problem;
use crate::schedule::{RingSchedule, ScheduleError};
use crate::scheduler::Scheduler;

pub const NAME: &str = "schedule-cols";
pub const DESCRIPTION: &str =
    "cols dataflow: per head, q/k columns, softmax and v columns on separate runs of PEs, list-scheduled";

/// `auto` tries it in the split dataflow's range: up to this many necessary operations, with
/// fewer than [`AUTO_TOKENS_PER_PE`] tokens per PE.
const AUTO_OPS: u64 = 300_000;
const AUTO_TOKENS_PER_PE: u64 = 4;
/// Layouts simulated per layer (the best by the estimate in [`candidates`]).
const TRIED: usize = 4;

/// The registry's handle on this pass.
pub struct Cols;

impl Scheduler for Cols {
    fn name(&self) -> &'static str {
        "cols"
    }
    fn pass(&self) -> &'static str {
        NAME
    }
    fn description(&self) -> &'static str {
        DESCRIPTION
    }
    fn title(&self) -> &'static str {
        "cols (columns, softmax and outputs on separate PEs per head)"
    }
    fn refusal(&self, p: &Problem, pes: u32) -> Option<Refusal> {
        if let Some(r) = schedule_split::Split.refusal(p, pes) {
            return Some(Refusal {
                message: r.message.replace("split dataflow", "cols dataflow"),
                ..r
            });
        }
        (pes < 3 * p.heads).then(|| Refusal {
            culprit: Culprit::Pes,
            message: format!(
                "the cols dataflow needs 3 PEs per head (q/k columns, softmax, v columns): {} for {} heads, {pes} given",
                3 * p.heads,
                p.heads
            ),
            note: "use a larger `--pes`, or `--schedule split`".into(),
        })
    }
    fn tried_by_auto(&self, p: &Problem, pes: u32) -> bool {
        p.necessary_ops() <= AUTO_OPS && u64::from(p.tokens) < AUTO_TOKENS_PER_PE * u64::from(pes)
    }
    fn schedule(&self, p: &Problem, pes: u32) -> Result<RingSchedule, Vec<ScheduleError>> {
        let parts = candidates(p, pes);
        if parts.is_empty() {
            return Err(vec![ScheduleError::Internal {
                pass: NAME,
                what: format!("no lane of 3 PEs per head fits {pes} PEs"),
            }]);
        }
        let mut s = schedule_split::run_apart(p, pes, &parts)?;
        s.algorithm = NAME;
        Ok(s)
    }
}

/// Layouts `(row groups, lane)` worth simulating, best first by a rough estimate: the busiest
/// part's work, or the words a link must carry when row groups share k and v rows (or x rows
/// travel from the q/k part to the v part), plus the hops and chains a row waits through.
pub(crate) fn candidates(p: &Problem, pes: u32) -> Vec<(u32, Apart)> {
    let (n, d) = (u64::from(p.tokens), u64::from(p.dim.max(1)));
    let weights = if p.causal { n * (n + 1) / 2 } else { n * n };
    // Distinct scores per head: q = k without a mask computes each pair once.
    let scores = if p.symmetric && !p.causal {
        n * (n + 1) / 2
    } else {
        weights
    };
    // Column counts per PE worth trying: each gives the fewest PEs holding that many.
    let mut widths: Vec<u64> = (1..=d).map(|c| d.div_ceil(c)).collect();
    widths.dedup();
    let mut out: Vec<(u64, (u32, Apart))> = Vec::new();
    for groups in [1u32, 2, 4] {
        if groups > p.tokens {
            break;
        }
        let lanes = p.heads * groups;
        let per = u64::from(pes / lanes.max(1));
        if per < 3 {
            break;
        }
        let g = u64::from(groups);
        let rows = n.div_ceil(g);
        // Words every link of the busiest stretch forwards: k and v rows to the other groups,
        // x rows from the q/k part to the v part.
        let replicated = 2 * n * d * (g - 1) / g;
        let shared_x = if p.shared_values { n * d } else { 0 };
        let link = replicated.max(shared_x);
        for soft in 1..=rows.min(8) {
            for &r1 in &widths {
                for &r3 in &widths {
                    if r1 + soft + r3 > per {
                        continue;
                    }
                    let work1 = scores.div_ceil(g) * d.div_ceil(r1);
                    let work3 = weights.div_ceil(g) * d.div_ceil(r3);
                    // Maximum, exponential and division per weight of the rows a PE takes.
                    let work2 = rows.div_ceil(soft) * 3 * n;
                    let busiest = work1.max(work3).max(work2).max(link);
                    let waits = d + 2 * soft + r3 + 4 * n;
                    let lane = Apart {
                        r1: r1 as u32,
                        soft: soft as u32,
                        r3: r3 as u32,
                    };
                    out.push((busiest + waits, (groups, lane)));
                }
            }
        }
    }
    out.sort_by_key(|&(est, (g, a))| (est, g, a.len()));
    out.into_iter().map(|(_, c)| c).take(TRIED).collect()
}
