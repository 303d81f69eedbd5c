//! `schedule-blocks`: the cols dataflow's lane with the keys cut into blocks, for rings with
//! many more PEs than the layer has tokens.
//!
//! A cols lane does all of a head's products on at most `d` PEs per phase (one column block
//! each), so on 64 or 256 PEs a layer of a few tokens leaves most of the ring idle and each
//! column PE does `d`-th of the head's products. Here each column part is `keys` tiles, tile
//! `b` holding the columns of key block `b` (the k and v rows of those keys, each read in one
//! tile only):
//!
//! * phase 1: the score `(a, j)` is a chain through the tile of `j`'s block, its partial sum
//!   riding `send acc`; the q rows pass through every tile;
//! * softmax: as in the cols lane, each row on one softmax PE after the last tile (maximum,
//!   exponentials with their sum, divisions: the per-weight formulation, no extra operation);
//! * phase 3: `y[a][c]` is a chain through the tiles in order, one segment per key block on the
//!   tile's PE of column `c`, so a partial output moves on with `send acc` and costs no
//!   operation.
//!
//! Every operation is a necessary one. What it buys: `keys` times the PEs for the products,
//! for the q rows and the partial outputs crossing every tile (about `n·d` words on a link) on
//! top of the scores and weights every lane sends. The lengths come from an estimate (see
//! [`candidates`]); the split dataflow's list scheduler pins and orders the tasks, so the cycle
//! count is exact and `auto` keeps it only where it is the lowest.

use crate::passes::schedule_split::{self, Apart};
use crate::passes::select::{Culprit, Refusal};
use crate::problem::Problem;
use crate::schedule::{RingSchedule, ScheduleError};
use crate::scheduler::Scheduler;

pub const NAME: &str = "schedule-blocks";
pub const DESCRIPTION: &str =
    "blocks dataflow: per head, key blocks × q/k columns, softmax, key blocks × v columns, list-scheduled";

/// `auto` tries it with at least [`AUTO_PES_PER_TOKEN`] PEs per token (fewer: the ring has no
/// room for a second tile beside the row and cols dataflows, which then do better), up to this
/// many necessary operations, or on larger layers with fewer rows (all heads) than PEs.
const AUTO_OPS: u64 = 300_000;
const AUTO_PES_PER_TOKEN: u64 = 2;
/// Above this many necessary operations only the best estimate is simulated.
const LARGE_OPS: u64 = 30_000;
/// Lanes simulated per layer (the best estimates), each with a softmax ladder on small layers.
const LANES_TRIED: usize = 3;

/// The registry's handle on this pass.
pub struct Blocks;

impl Scheduler for Blocks {
    fn name(&self) -> &'static str {
        "blocks"
    }
    fn pass(&self) -> &'static str {
        NAME
    }
    fn description(&self) -> &'static str {
        DESCRIPTION
    }
    fn title(&self) -> &'static str {
        "blocks (key blocks × columns, softmax and outputs on separate PEs per head)"
    }
    fn refusal(&self, p: &Problem, pes: u32) -> Option<Refusal> {
        if let Some(r) = schedule_split::Split.refusal(p, pes) {
            return Some(Refusal {
                message: r.message.replace("split dataflow", "blocks dataflow"),
                ..r
            });
        }
        if p.tokens < 2 {
            return Some(Refusal {
                culprit: Culprit::Tokens,
                message: "the blocks dataflow cuts the keys into blocks: it needs 2 tokens".into(),
                note: "use `--schedule cols`".into(),
            });
        }
        (pes < 3 * p.heads).then(|| Refusal {
            culprit: Culprit::Pes,
            message: format!(
                "the blocks dataflow needs 3 PEs per head (two key tiles, softmax): {} for {} heads, {pes} given",
                3 * p.heads,
                p.heads
            ),
            note: "use a larger `--pes`, or `--schedule split`".into(),
        })
    }
    fn tried_by_auto(&self, p: &Problem, pes: u32) -> bool {
        let rows = u64::from(p.tokens) * u64::from(p.heads);
        u64::from(pes) >= AUTO_PES_PER_TOKEN * u64::from(p.tokens)
            && (p.necessary_ops() <= AUTO_OPS || rows < u64::from(pes))
    }
    fn schedule(&self, p: &Problem, pes: u32) -> Result<RingSchedule, Vec<ScheduleError>> {
        let parts = candidates(p, pes);
        if parts.is_empty() {
            return Err(vec![ScheduleError::Internal {
                pass: NAME,
                what: format!("no lane of two key tiles per head fits {pes} PEs"),
            }]);
        }
        let mut s = schedule_split::run_apart(p, pes, &parts)?;
        s.algorithm = NAME;
        Ok(s)
    }
}

/// Layouts `(row groups, lane)` worth simulating: for each count of key blocks, row groups and
/// kind of lane (v columns apart or on the q/k tiles), the part lengths with the lowest
/// estimate; then the few best of those, each with its softmax count halved too on small
/// layers (as the cols dataflow does: a softmax PE's rows overlap the tiles' work).
pub(crate) fn candidates(p: &Problem, pes: u32) -> Vec<(u32, Apart)> {
    if let Ok(v) = std::env::var("ATTNC_BLOCKS_EXPERIMENT") {
        return v
            .split(';')
            .filter_map(|one| {
                let f: Vec<u32> = one.split(',').filter_map(|x| x.parse().ok()).collect();
                (f.len() == 6).then(|| {
                    (
                        f[0],
                        Apart {
                            r1: f[1],
                            soft: f[2],
                            r3: f[3],
                            keys: f[4],
                            interleave: f[5] == 1,
                        },
                    )
                })
            })
            .collect();
    }
    let large = p.necessary_ops() > LARGE_OPS;
    let mut best: Vec<(u64, u32, Apart)> = Vec::new();
    for keys in key_counts(p.tokens) {
        for groups in [1u32, 2] {
            for wrap in [false, true] {
                if let Some((est, lane)) = best_lane(p, pes, groups, keys, wrap) {
                    best.push((est, groups, lane));
                }
            }
        }
    }
    best.sort_by_key(|b| b.0);
    let tried = if large { 1 } else { LANES_TRIED };
    let mut out: Vec<(u32, Apart)> = Vec::new();
    for &(_, groups, lane) in best.iter().take(tried) {
        let ladder: &[u32] = if large { &[1] } else { &[1, 2] };
        for &k in ladder {
            let c = (
                groups,
                Apart {
                    soft: (lane.soft / k).max(1),
                    ..lane
                },
            );
            if !out.contains(&c) {
                out.push(c);
            }
        }
    }
    out
}

/// Key-block counts worth trying: 2, 3, 4, 6, 8, … up to the tokens (each block at least one
/// key).
fn key_counts(n: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut k = 2u32;
    while k <= n {
        out.push(k);
        k = if k.is_power_of_two() {
            k + k / 2
        } else {
            k / 3 * 4
        };
    }
    out
}

/// The lane of `keys` key blocks and `groups` row groups per head (v columns on the q/k tiles
/// when `wrap`) with the lowest estimate, and that estimate; `None` when none fits.
fn best_lane(p: &Problem, pes: u32, groups: u32, keys: u32, wrap: bool) -> Option<(u64, Apart)> {
    let (n, d) = (u64::from(p.tokens), u64::from(p.dim.max(1)));
    if groups > p.tokens || keys > p.tokens {
        return None;
    }
    let weights = if p.causal { n * (n + 1) / 2 } else { n * n };
    let scores = if p.symmetric && !p.causal {
        n * (n + 1) / 2
    } else {
        weights
    };
    let lanes = p.heads * groups;
    let per = u64::from(pes / lanes.max(1));
    let (g, kb) = (u64::from(groups), u64::from(keys));
    let rows = n.div_ceil(g);
    // Words the busiest link forwards: the lane's scores into its softmax PEs and its weights
    // out of them; the q rows and the partial outputs through every tile; with several groups
    // the k and v rows through every lane of the head; with v on the q/k tiles every head's
    // weights round the ring; with q = k = v and v apart the x rows past the softmax PEs.
    let through_tiles = rows * d;
    let mut link = (scores.div_ceil(g)).max(through_tiles);
    if wrap {
        link = link.max(weights * u64::from(lanes));
    } else {
        link = link.max(weights.div_ceil(g));
        if p.shared_values {
            link = link.max(n * d);
        }
    }
    if groups > 1 {
        link = link.max(2 * n * d);
    }
    let mut widths: Vec<u64> = (1..=d).map(|c| d.div_ceil(c)).collect();
    widths.dedup();
    let r3s: Vec<u64> = if wrap { vec![0] } else { widths.clone() };
    let mut best: Option<(u64, Apart)> = None;
    for soft in 1..=rows {
        let work2 = rows.div_ceil(soft) * 3 * n;
        for &r1 in &widths {
            for &r3 in &r3s {
                if kb * (r1 + r3) + soft > per {
                    continue;
                }
                let work1 = scores.div_ceil(g * kb) * d.div_ceil(r1);
                let (work, hops) = if wrap {
                    (
                        work1 + weights.div_ceil(g * kb) * d.div_ceil(r1),
                        u64::from(pes) - kb * r1 - soft,
                    )
                } else {
                    (
                        work1.max(weights.div_ceil(g * kb) * d.div_ceil(r3)),
                        kb * r3,
                    )
                };
                let est = work.max(link).max(work2) + d + 2 * soft + hops + (kb - 1) * r1 + 4 * n;
                let lane = Apart {
                    r1: r1 as u32,
                    soft: soft as u32,
                    r3: r3 as u32,
                    keys,
                    interleave: false,
                };
                if best.is_none_or(|(e, _)| est < e) {
                    best = Some((est, lane));
                }
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::key_counts;

    #[test]
    fn key_counts_climb_by_halves_and_quarters_up_to_the_tokens() {
        assert_eq!(key_counts(1), Vec::<u32>::new());
        assert_eq!(key_counts(2), vec![2]);
        assert_eq!(key_counts(16), vec![2, 3, 4, 6, 8, 12, 16]);
    }
}
