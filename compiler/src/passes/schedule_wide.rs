//! `schedule-wide`: q = k = v layers on rings larger than their rows, without pairing rows.
//!
//! Computing each distinct score of a shared layer once (what `schedule-rows` and
//! `schedule-split` do) halves phase 1, but ties every pair of rows together: the score
//! `x_a·x_b` is made where one row lives and must travel to the other. On a ring with more PEs
//! than the work needs, phase 1 is not what sets the pace; those trips are, and the second row's
//! softmax waits on them (16 tokens, `d = 64` on 256 PEs: 1481 cycles for a layer whose bound is
//! 149). This pass runs both dataflows with every row computing all of its own scores, both
//! halves of each pair, so rows are as independent as with separate q and k, and keeps the
//! shorter schedule. With several heads, each on a part of the ring that is not a ring itself,
//! the dag placement also runs with only the pairs far apart in the head computed by both rows
//! (the near ones once, travelling forward). Its phase-1 products are up to twice the
//! necessary ones; the manifest declares the count it executes (`ops.phase1_mac`), which the
//! verifier accepts for a shared layer without a mask when declared and holds exactly.
//!
//! `auto` tries it only where the ring has more than a quarter of a PE per token, the regime
//! where row coupling can cost more than the products saved; `compile` keeps it only when its
//! exact cycle count is the lowest.

use crate::passes::schedule_split::Apart;
use crate::passes::select::{Culprit, Refusal};
use crate::passes::{schedule_cols, schedule_dag, schedule_rows, schedule_split};
use crate::problem::Problem;
use crate::schedule::{RingSchedule, ScheduleError};
use crate::scheduler::Scheduler;

pub const NAME: &str = "schedule-wide";
pub const DESCRIPTION: &str =
    "q = k = v without pairing rows: every row computes its own scores (recomputed products; with several heads, possibly only the far pairs'), the shortest of the rows, split, columns and dag dataflows";

/// `auto` tries it up to this many necessary operations (the split dataflow's own limit under
/// `auto`), with fewer than [`AUTO_TOKENS_PER_PE`] tokens per PE.
const AUTO_OPS: u64 = 300_000;
const AUTO_TOKENS_PER_PE: u64 = 4;

/// The registry's handle on this pass.
pub struct Wide;

impl Scheduler for Wide {
    fn name(&self) -> &'static str {
        "wide"
    }
    fn pass(&self) -> &'static str {
        NAME
    }
    fn description(&self) -> &'static str {
        DESCRIPTION
    }
    fn title(&self) -> &'static str {
        "wide (q = k = v rows decoupled, scores recomputed)"
    }
    fn refusal(&self, p: &Problem, pes: u32) -> Option<Refusal> {
        if !p.symmetric || !p.shared_values {
            return Some(Refusal {
                culprit: Culprit::Qkv,
                message: "the wide dataflow recomputes the mirrored scores of a layer whose q, k and v are one tensor".into(),
                note: "add `qkv = shared;` to the layer, or use `--schedule split`".into(),
            });
        }
        if p.causal {
            return Some(Refusal {
                culprit: Culprit::Mask,
                message: "under a causal mask no score has a mirrored twin to recompute".into(),
                note: "use `--schedule split` or `auto`".into(),
            });
        }
        if let Some(r) = schedule_split::Split.refusal(p, pes) {
            return Some(Refusal {
                message: r.message.replace("split dataflow", "wide dataflow"),
                ..r
            });
        }
        None
    }
    fn tried_by_auto(&self, p: &Problem, pes: u32) -> bool {
        p.necessary_ops() <= AUTO_OPS && u64::from(p.tokens) < AUTO_TOKENS_PER_PE * u64::from(pes)
    }
    fn necessary_only(&self) -> bool {
        false
    }
    fn schedule(&self, p: &Problem, pes: u32) -> Result<RingSchedule, Vec<ScheduleError>> {
        run(p, pes)
    }
    fn schedule_within(
        &self,
        p: &Problem,
        pes: u32,
        limit: usize,
    ) -> Result<Option<RingSchedule>, Vec<ScheduleError>> {
        Ok(run_within(p, pes, limit)?.filter(|s| s.cycles() <= limit))
    }
    fn stops_early(&self) -> bool {
        true
    }
}

/// Both dataflows with rows decoupled; the shorter schedule, named after this pass.
pub fn run(p: &Problem, pes: u32) -> Result<RingSchedule, Vec<ScheduleError>> {
    run_within(p, pes, usize::MAX)?.ok_or_else(|| {
        vec![ScheduleError::Internal {
            pass: NAME,
            what: "no PE to schedule on".into(),
        }]
    })
}

/// [`run`] with the row dataflow's runs abandoned once they are sure to take more than `limit`
/// cycles: within the limit the same schedule. Nothing when neither dataflow is within it.
fn run_within(
    p: &Problem,
    pes: u32,
    limit: usize,
) -> Result<Option<RingSchedule>, Vec<ScheduleError>> {
    let rows = schedule_rows::run_mirrored_within(p, pes, limit);
    let split = schedule_split::run_mirrored(p, pes);
    let mut best = match (rows, split) {
        (Ok(Some(r)), Ok(s)) => {
            if s.cycles() < r.cycles() {
                s
            } else {
                r
            }
        }
        (Ok(Some(s)), Err(_)) | (Ok(None), Ok(s)) | (Err(_), Ok(s)) => s,
        (Ok(None), Err(_)) => return Ok(None),
        (Err(mut a), Err(b)) => {
            a.extend(b);
            return Err(a);
        }
    };
    // The cols dataflow's lanes and arcs holding their own copies of the inputs, each row
    // computing all of its own scores so that no score crosses from one lane to another.
    keep_mirrored(p, pes, &mut best, &schedule_cols::copied_lanes(p, pes));
    let arcs = schedule_cols::copied_arcs(p, pes, best.cycles());
    keep_mirrored(p, pes, &mut best, &arcs);
    // Each operation placed on its own, every row computing its own scores (or, with several
    // heads, those of the rows far from it).
    if let Ok(Some(s)) = schedule_dag::run_mirrored(p, pes) {
        if s.cycles() < best.cycles() {
            best = s;
        }
    }
    best.algorithm = NAME;
    Ok(Some(best))
}

/// `best`, or the schedule of `lanes` run with every row computing its own scores where that
/// is shorter.
fn keep_mirrored(p: &Problem, pes: u32, best: &mut RingSchedule, lanes: &[(u32, Apart)]) {
    if lanes.is_empty() {
        return;
    }
    if let Ok((s, _)) = schedule_split::run_apart_mirrored(p, pes, lanes) {
        if s.cycles() < best.cycles() {
            *best = s;
        }
    }
}
