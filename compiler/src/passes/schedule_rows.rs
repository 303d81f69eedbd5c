//! `schedule-rows`: the row-ownership dataflow ("ring attention"), for any `n`, `d`, `m`.
//!
//! The unmasked scores of all heads, row after row, are cut into `m` contiguous, equal shares;
//! PE `p` takes share `p`. A row therefore lives on one PE, or on a run of increasing PEs
//! `first..=last` when a cut falls inside it (PEs with an empty share only pass values on). Each PE computes its scores whole (all `d` products
//! locally), so phase 1 moves input rows, not partial sums: `q`/`k`/`v` rows are preloaded on the
//! first PE of their own row and travel forward as far as the last PE that needs them. Softmax is
//! local except on a cut row, whose running sum hops `first → … → last` and whose finished sum then
//! travels on around the ring to the PEs that divide; phase 3 likewise passes the partial `y` row
//! forward across a cut. Cuts cost no extra operation: a received partial sum is simply the
//! accumulator's starting value.
//!
//! Timing comes from [`crate::flow`]'s cycle-by-cycle list scheduler, so the cycle count is exact
//! and includes every wait for data. Work per PE is within one score (`2d + 2` ops) of the average;
//! the link carries each input row at most once per hop, which hides behind compute when the rows
//! per PE are many (n ≥ m). It takes every layer; on q = k = v without a mask it computes each
//! distinct score once (the pair `{a, b}` by one of its two holders, alternating by the parity
//! of `a + b`, and sent on to the other; with several heads on a large ring also by the holder,
//! or with q = k = v any PE before both, that would otherwise finish first, see
//! [`assign_pairs`]; with q = k = v and one head also by the holder that takes its row's softmax
//! sooner, with links and tasks in that order, see [`ranked_pairs`] and [`run_on`]), so it never
//! does unnecessary work.

use crate::flow::{self, Flow, Task};
use crate::ir::Tensor;
use crate::passes::select::Refusal;
use crate::problem::{Inputs, Problem};
use crate::schedule::{Builder, Element, RingSchedule, ScheduleError, Val, Work};
use crate::scheduler::Scheduler;
use rustc_hash::FxHashMap as HashMap;

pub const NAME: &str = "schedule-rows";
pub const DESCRIPTION: &str =
    "row-ownership dataflow: rows cut evenly over the PEs, k/v rows travel (any n, d, m)";

/// The registry's handle on this pass.
pub struct Rows;

impl Scheduler for Rows {
    fn name(&self) -> &'static str {
        "rows"
    }
    fn pass(&self) -> &'static str {
        NAME
    }
    fn description(&self) -> &'static str {
        DESCRIPTION
    }
    fn title(&self) -> &'static str {
        "rows (row-ownership dataflow)"
    }
    fn refusal(&self, _p: &Problem, _pes: u32) -> Option<Refusal> {
        None
    }
    fn floor(&self, p: &Problem, pes: u32) -> u64 {
        floor(p, pes)
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
        run_with(p, pes, false, limit)
    }
    fn stops_early(&self) -> bool {
        true
    }
}

/// Per PE: whole rows' phase-2 and phase-3 tasks as `(row h·n + a, phase, task)`.
type ByRow = Vec<Vec<(u32, u8, Task)>>;

/// Per PE, per priority class: `(hops from origin, sequence, value)` to send on.
type Forwarding = Vec<Vec<Vec<(u32, usize, Val)>>>;

/// The part of row `(h, a)` that one PE holds: columns `b` in `cols`.
#[derive(Clone, Debug)]
struct Part {
    pe: u32,
    cols: Vec<u32>,
}

/// How row `(h, a)` is spread.
struct RowPlan {
    parts: Vec<Part>,
}

impl RowPlan {
    fn first(&self) -> u32 {
        self.parts[0].pe
    }
    fn last(&self) -> u32 {
        self.parts[self.parts.len() - 1].pe
    }
}

/// PEs on the way from `from` forward to `to` inclusive.
fn path(from: u32, to: u32, m: u32) -> impl Iterator<Item = u32> {
    let hops = (to + m - from) % m;
    (0..=hops).map(move |i| (from + i) % m)
}

/// When scores are few per PE, handing partial sums between PEs costs more than it saves, so
/// small layers also try sharing the work among fewer PEs (the rest only pass values on) and keep
/// the fastest. Each count is tried with k/v rows preloaded where their trip is shortest and, if
/// that moved any, on their own rows' first PEs: one source feeding a whole head can make its link
/// the bottleneck.
pub fn run(p: &Problem, pes: u32) -> Result<RingSchedule, Vec<ScheduleError>> {
    found(run_with(p, pes, false, usize::MAX))
}

/// The same search with every score of a q = k layer computed by its own row (`schedule-wide`):
/// twice the phase-1 products, but no mirrored score travels between row holders; nothing as
/// soon as every run is sure to take more than `limit` cycles.
pub(crate) fn run_mirrored_within(
    p: &Problem,
    pes: u32,
    limit: usize,
) -> Result<Option<RingSchedule>, Vec<ScheduleError>> {
    run_with(p, pes, true, limit)
}

/// Without a limit a run always finishes, so there is a schedule unless there is no PE.
fn found(
    s: Result<Option<RingSchedule>, Vec<ScheduleError>>,
) -> Result<RingSchedule, Vec<ScheduleError>> {
    s?.ok_or_else(|| {
        vec![ScheduleError::Internal {
            pass: NAME,
            what: "no PE to schedule on".into(),
        }]
    })
}

/// The search; runs that would take more than `limit` cycles (or than the best so far) are
/// abandoned as soon as that is sure, so within the limit the result is the unlimited one.
fn run_with(
    p: &Problem,
    pes: u32,
    mirror: bool,
    limit: usize,
) -> Result<Option<RingSchedule>, Vec<ScheduleError>> {
    let scores = u64::from(p.heads) * (0..p.tokens).map(|a| u64::from(columns(p, a))).sum::<u64>();
    let few = scores < SUBSET_SCORES * u64::from(pes);
    let counts = if !few {
        vec![pes]
    } else {
        let mut c = active_counts(pes, p.heads * p.tokens, scores < 4 * u64::from(pes));
        // Bounded compile time: the most promising counts come first.
        let runs = (SUBSET_BUDGET / p.necessary_ops().max(1)).max(4);
        c.truncate(usize::try_from(runs).unwrap_or(usize::MAX));
        c
    };
    let mut best: Option<RingSchedule> = None;
    // With q = k and no mask, and idle PEs, a mirrored score may have to go round through all of
    // them; computing each pair on the holder behind the other avoids that at the cost of
    // balance, so small layers try both.
    let mut mirrors: Vec<Pairing> = if !p.symmetric || p.causal || mirror {
        vec![Pairing::Parity]
    } else if few {
        vec![Pairing::Parity, Pairing::Near]
    } else if timed_tried(p, pes) && p.shared_values {
        // The relayed pairing first: where it is the fastest, the others stop early.
        vec![Pairing::Relayed, Pairing::Timed, Pairing::Parity]
    } else if timed_tried(p, pes) {
        vec![Pairing::Parity, Pairing::Timed]
    } else {
        vec![Pairing::Parity]
    };
    // q = k = v without a mask: a PE's first rows wait for mirrored scores queued behind input
    // rows on the links, and the PE idles. Runs that serve first rows first come after the
    // others (kept only where strictly shorter): with several heads on 16 to 31 PEs the pairing
    // by start times, with one head the pairing by rows' places, and every run again with links
    // and tasks ordered by urgency.
    let first_rows = p.symmetric && p.shared_values && !p.causal && !mirror;
    if first_rows && !few && timed_after(p, pes) {
        mirrors.push(Pairing::Timed);
    }
    if first_rows && p.heads == 1 {
        mirrors.push(Pairing::Ranked);
    }
    let attempt = |best: &mut Option<RingSchedule>,
                   cfg: Config|
     -> Result<(bool, usize), Vec<ScheduleError>> {
        // A run that cannot beat the best so far is abandoned as soon as that is sure.
        let limit = best
            .as_ref()
            .map_or(limit, |b| b.cycles().saturating_sub(1).min(limit));
        let (s, moved, busiest) = run_on(p, pes, cfg, mirror, limit)?;
        if let Some(s) = s {
            if best.as_ref().is_none_or(|b| s.cycles() < b.cycles()) {
                *best = Some(s);
            }
        }
        Ok((moved, busiest))
    };
    for active in counts {
        for &pairing in &mirrors {
            if (pairing == Pairing::Near && active == pes)
                || (pairing == Pairing::Ranked && !ranked_fits(p, pes, active))
            {
                continue;
            }
            // Where only q = k = v tries it (after the others), the pairing by start times.
            let after = pairing == Pairing::Timed && timed_after(p, pes);
            // Small layers start with the shortest trips and try rows' own first PEs only if
            // that moved any k/v row. Large layers start with rows' own first PEs, and try the
            // shortest trips only where the busiest link forwards more than half as many words
            // as a PE has operations (then the links, not the PEs, set the pace).
            // The relayed pairing needs each head's rows streamed from one PE, and the pairing by
            // start times takes them so.
            let order: &[bool] = if pairing == Pairing::Relayed || after {
                &[true]
            } else if few {
                &[true, false]
            } else {
                &[false, true]
            };
            for (i, &spread_homes) in order.iter().enumerate() {
                let cfg = Config {
                    active,
                    spread_homes,
                    pairing,
                    urgent: pairing == Pairing::Ranked,
                };
                let (moved, busiest) = attempt(&mut best, cfg)?;
                if first_rows && !cfg.urgent {
                    attempt(
                        &mut best,
                        Config {
                            urgent: true,
                            ..cfg
                        },
                    )?;
                }
                let again = if few {
                    moved
                } else {
                    2 * busiest as u64 > p.necessary_ops() / u64::from(pes.max(1))
                };
                if i > 0 || !again || order.len() == 1 {
                    break;
                }
            }
        }
    }
    Ok(best)
}

/// One run of the row dataflow: the scores shared among PEs `0..active`; k/v rows preloaded
/// where their trip is shortest (`spread_homes`) or on their own rows' first PEs; with q = k,
/// each pair computed where `pairing` says; with `urgent`, links and tasks ordered by how soon
/// each row is taken (see [`run_on`]).
#[derive(Clone, Copy, Debug)]
struct Config {
    active: u32,
    spread_homes: bool,
    pairing: Pairing,
    urgent: bool,
}

/// Several heads on rings from this many PEs (and fewer than [`TIMED_PES`]) also try
/// [`Pairing::Timed`] after the search with q = k = v (32 tokens, d = 8, 4 heads on 16 PEs:
/// 4307 cycles by parity, 4011 by start times; on 8 PEs it was slower on the layers tried).
const URGENT_TIMED_PES: u32 = 16;

/// Layers with fewer scores than this per PE also try fewer working PEs. With more, every PE has
/// a few rows, the row dataflow is near the lower bound on the whole ring, and the extra runs
/// would only cost compile time.
const SUBSET_SCORES: u64 = 16;

/// Operations simulated, over all counts of working PEs, before the search stops trying more.
const SUBSET_BUDGET: u64 = 2_000_000;

/// Counts of working PEs to try: every one on rings up to [`EXHAUSTIVE`] PEs when scores are very
/// few (`every`); otherwise 1 to 8, powers of two up to the whole ring and the counts that give
/// each working PE whole rows (`rows` over a small divisor, or a few PEs per row), so a large ring
/// costs a few dozen runs, not one per PE.
fn active_counts(pes: u32, rows: u32, every: bool) -> Vec<u32> {
    if every && pes <= EXHAUSTIVE {
        return (1..=pes).collect();
    }
    let mut out: Vec<u32> = (1..=8.min(pes)).collect();
    let mut a = 8;
    while a < pes {
        a = (2 * a).min(pes);
        out.push(a);
    }
    // The whole ring first, then whole rows per PE: they are often the best, a good first result
    // lets later runs stop early, and the budget may cut the list short.
    let mut natural: Vec<u32> = (1..=8)
        .flat_map(|j| [rows / j, rows.saturating_mul(j.min(4))])
        .filter(|a| (1..=pes).contains(a))
        .collect();
    natural.sort_unstable();
    natural.dedup();
    natural.retain(|&a| a != pes);
    natural.insert(0, pes);
    out.retain(|a| !natural.contains(a));
    natural.extend(out);
    natural
}

/// Rings up to this many PEs try every count of working PEs.
const EXHAUSTIVE: u32 = 64;

fn columns(p: &Problem, a: u32) -> u32 {
    if p.causal {
        a + 1
    } else {
        p.tokens
    }
}

/// The concatenated rows of all heads (head after head, row after row) cut into `active` equal
/// shares of scores, within one score: row `(h, a)` is plan `h·n + a`.
fn cut(p: &Problem, active: u32) -> Vec<RowPlan> {
    let (n, heads) = (p.tokens, p.heads);
    let total: u64 = u64::from(heads) * (0..n).map(|a| u64::from(columns(p, a))).sum::<u64>();
    let owner = |unit: u64| ((unit * u64::from(active)) / total.max(1)) as u32;
    let mut plans: Vec<RowPlan> = Vec::with_capacity((heads * n) as usize);
    let mut unit = 0u64;
    for _h in 0..heads {
        for a in 0..n {
            let mut parts: Vec<Part> = Vec::new();
            for b in 0..columns(p, a) {
                let pe = owner(unit);
                unit += 1;
                match parts.last_mut() {
                    Some(part) if part.pe == pe => part.cols.push(b),
                    _ => parts.push(Part { pe, cols: vec![b] }),
                }
            }
            plans.push(RowPlan { parts });
        }
    }
    plans
}

/// Fewer cycles than this the row dataflow cannot take on `pes` PEs, counted from its cut
/// without scheduling it: the operations of its busiest PE, each of which takes a cycle of its
/// own. Every score of a part is exponentiated, divided and multiplied into `y` (`d` products)
/// where the part is, and under a safe softmax each part reduces its own scores (`cols − 1`
/// maxima) and all but the first take in the previous part's maximum. Its `d` products are
/// computed there too, except with q = k without a mask, where the pair `{a, b}` is computed by
/// one of its two holders only ([`pair_computed_by`]; where the whole ring also pairs by start
/// times, [`assign_pairs`], the smallest of the busiest counts, since the fastest run is kept;
/// the pairing by rows' places, [`ranked_pairs`], is only run where it counts the same).
/// Only where that cut and those pairings are the ones run: on the whole ring (at least
/// [`SUBSET_SCORES`] scores per PE, where the nearer holder is never tried instead); elsewhere
/// the lower bound.
pub fn floor(p: &Problem, pes: u32) -> u64 {
    let lb = p.lower_bound(pes);
    let scores = u64::from(p.heads) * (0..p.tokens).map(|a| u64::from(columns(p, a))).sum::<u64>();
    if pes == 0 || scores < SUBSET_SCORES * u64::from(pes) {
        return lb;
    }
    let plans = cut(p, pes);
    let parity = busiest(p, pes, &plans, None);
    // The whole ring may also pair by start times, and the faster run is kept: its busiest PE
    // may have fewer operations.
    let most = if timed_tried(p, pes) || timed_after(p, pes) {
        let timed = busiest(p, pes, &plans, Some(&assign_pairs(p, &plans, pes, false)));
        let relayed = if p.shared_values && timed_tried(p, pes) {
            busiest(p, pes, &plans, Some(&assign_pairs(p, &plans, pes, true)))
        } else {
            timed
        };
        parity.min(timed).min(relayed)
    } else {
        parity
    };
    // The pairing by rows' places is only run where its busiest PE has the parity rule's
    // operations (`ranked_fits`), so it leaves this count as it is.
    most.max(lb)
}

/// The operations of the busiest PE under the cut `plans`; with q = k without a mask, each pair
/// computed by the PE [`assign_pairs`] says (`by`) or else by [`pair_computed_by`]'s holder.
fn busiest(
    p: &Problem,
    pes: u32,
    plans: &[RowPlan],
    by: Option<&HashMap<(u32, u32, u32), u32>>,
) -> u64 {
    let d = u64::from(p.dim);
    let paired = p.symmetric && !p.causal;
    let mut ops = vec![0u64; pes as usize];
    for (row, rp) in plans.iter().enumerate() {
        let (h, a) = (row as u32 / p.tokens, row as u32 % p.tokens);
        for (i, part) in rp.parts.iter().enumerate() {
            let cols = part.cols.len() as u64;
            let maxima = if p.safe() {
                cols - 1 + u64::from(i > 0)
            } else {
                0
            };
            let products = if paired {
                part.cols
                    .iter()
                    .filter(|&&c| {
                        let key = (h, a.min(c), a.max(c));
                        by.is_none_or(|by| !by.contains_key(&key)) && pair_computed_by(a, c)
                    })
                    .count() as u64
            } else {
                cols
            };
            ops[part.pe as usize] += (d + 2) * cols + d * products + maxima;
        }
    }
    if paired {
        for &pe in by.into_iter().flat_map(|by| by.values()) {
            ops[pe as usize] += d;
        }
    }
    ops.into_iter().max().unwrap_or(0)
}

/// With q = k and no mask, whether the holder of score `(a, col)` computes the pair `{a, col}`
/// (the holder of `(col, a)` otherwise): alternately by the parity of `a + col`, so that every
/// PE computes half of the pairs it shares with each other PE. The diagonal is its own pair.
fn pair_computed_by(a: u32, col: u32) -> bool {
    if a == col {
        true
    } else if (a + col).is_multiple_of(2) {
        a > col
    } else {
        a < col
    }
}

/// With q = k and no mask, which of a pair's two holders computes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pairing {
    /// Alternately by the parity of `a + b` ([`pair_computed_by`]): every PE computes half of
    /// the pairs it shares with each other PE.
    Parity,
    /// The holder from which the other is fewer hops ahead.
    Near,
    /// The holder that would otherwise finish first, counting when its own rows reach it
    /// ([`assign_pairs`]).
    Timed,
    /// The holder for which the pair serves the later of its rows (see `run_on`'s `rank`): the
    /// other, which takes its softmax sooner, does not wait for the score to come round.
    Ranked,
    /// With q = k = v, any PE of the head at or before both holders (every row of the head
    /// passes it): the one that would otherwise finish first ([`assign_pairs`]).
    Relayed,
}

/// Whether the whole ring also tries [`Pairing::Timed`] (and with q = k = v
/// [`Pairing::Relayed`]): q = k without a mask, with several heads (so each covers part of the
/// ring) on a ring of at least [`TIMED_PES`] PEs. There each head's rows
/// stream from its first PE, so the last PEs of a head get their own rows (on which all their
/// products wait) a whole head's rows after the first, and a mirrored score sent back to an
/// earlier PE of the head goes round the ring.
fn timed_tried(p: &Problem, pes: u32) -> bool {
    p.symmetric && !p.causal && pes >= TIMED_PES && p.heads >= 2
}

/// Whether a q = k = v layer without a mask tries [`Pairing::Timed`] after the search, where the
/// search itself does not: several heads on rings of [`URGENT_TIMED_PES`] to [`TIMED_PES`] PEs.
fn timed_after(p: &Problem, pes: u32) -> bool {
    p.symmetric
        && p.shared_values
        && !p.causal
        && p.heads >= 2
        && pes >= URGENT_TIMED_PES
        && !timed_tried(p, pes)
}

/// Rings from this many PEs try [`Pairing::Timed`].
const TIMED_PES: u32 = 32;

/// Which PE computes each pair `{a, b}` (`a ≤ b`) of a q = k layer, keyed `(head, a, b)`.
/// Each PE is given a start and its operations other than the pairs' products. A head's rows are
/// taken to stream from its first PE in the order the dataflow routes them (rows cut between PEs
/// first), `d` words a row, one hop a cycle. Without `relay` the pairs whose holders differ are
/// listed, each going to one of its holders, which starts when its first own row arrives (every
/// product it computes waits for it). With `relay` (q = k = v) every pair is listed and may go to
/// any PE of the head at or before both holders, since each row of the head passes it on its
/// way to them; a PE other than the head's first starts once two rows have arrived. The pairs,
/// farthest apart in row index first, each go to the candidate whose start plus work so far is
/// smallest (on a tie the one nearest the holders, so the score travels forward). A PE whose
/// rows arrive late so computes fewer products. Far pairs go first: held by a head's first and
/// last PEs, they are settled while the late PEs' starts still weigh; the near ones, which
/// neighbours can trade, even out what is left (32 tokens, d = 64, 4 heads on 64 PEs: 7870
/// cycles by increasing distance, 7432 by decreasing, holders only).
fn assign_pairs(
    p: &Problem,
    plans: &[RowPlan],
    m: u32,
    relay: bool,
) -> HashMap<(u32, u32, u32), u32> {
    let (n, d) = (p.tokens, u64::from(p.dim));
    let dist = |from: u32, to: u32| (to + m - from) % m;
    // Each row's place in its head's stream.
    let mut rank: Vec<u64> = vec![0; plans.len()];
    for h in 0..p.heads {
        let mut order: Vec<u32> = (0..n).collect();
        let plan = |r: u32| &plans[(h * n + r) as usize];
        order.sort_by_key(|&r| plan(r).first() == plan(r).last());
        for (i, r) in order.into_iter().enumerate() {
            rank[(h * n + r) as usize] = i as u64;
        }
    }
    let mut start: Vec<Option<u64>> = vec![None; m as usize];
    let mut load: Vec<u64> = vec![0; m as usize];
    let mut holder: HashMap<(u32, u32, u32), u32> = HashMap::default();
    for (row, rp) in plans.iter().enumerate() {
        let (h, a) = (row as u32 / n.max(1), row as u32 % n.max(1));
        let src = plans[(h * n) as usize].first();
        for (i, part) in rp.parts.iter().enumerate() {
            let hops = u64::from(dist(src, part.pe));
            let at = if hops == 0 {
                0
            } else if relay {
                2 * d + hops
            } else {
                (rank[row] + 1) * d + hops
            };
            let s = &mut start[part.pe as usize];
            *s = Some(s.map_or(at, |old| old.min(at)));
            let cols = part.cols.len() as u64;
            let maxima = if p.safe() {
                (cols - 1) + u64::from(i > 0)
            } else {
                0
            };
            load[part.pe as usize] += (d + 2) * cols + maxima;
            holder.extend(part.cols.iter().map(|&c| ((h, a, c), part.pe)));
        }
    }
    for (l, s) in load.iter_mut().zip(&start) {
        *l += s.unwrap_or(0);
    }
    let mut by: HashMap<(u32, u32, u32), u32> = HashMap::default();
    for h in 0..p.heads {
        let src = plans[(h * n) as usize].first();
        for gap in (0..n).rev() {
            for a in 0..n - gap {
                let b = a + gap;
                let (Some(&i), Some(&j)) = (holder.get(&(h, a, b)), holder.get(&(h, b, a))) else {
                    continue;
                };
                let pe = if relay {
                    // Candidates from the one nearest the holders back to the head's first PE.
                    let near = if dist(src, i) <= dist(src, j) { i } else { j };
                    let mut best = near;
                    for back in 1..=dist(src, near) {
                        let k = (near + m - back) % m;
                        if load[k as usize] < load[best as usize] {
                            best = k;
                        }
                    }
                    best
                } else if i == j {
                    // Both scores on one PE: one product there, whichever computes it.
                    load[i as usize] += d;
                    continue;
                } else {
                    let ahead = dist(i, j) <= dist(j, i);
                    match load[i as usize].cmp(&load[j as usize]) {
                        std::cmp::Ordering::Less => i,
                        std::cmp::Ordering::Greater => j,
                        std::cmp::Ordering::Equal if ahead => i,
                        std::cmp::Ordering::Equal => j,
                    }
                };
                load[pe as usize] += d;
                by.insert((h, a, b), pe);
            }
        }
    }
    by
}

/// Each part's place among its PE's parts, `[row][part]` (rows of all heads in order): the
/// order in which the PE takes its rows' softmax.
fn places(plans: &[RowPlan], m: u32) -> Vec<Vec<u32>> {
    let mut count = vec![0u32; m as usize];
    plans
        .iter()
        .map(|rp| {
            rp.parts
                .iter()
                .map(|pt| {
                    let c = &mut count[pt.pe as usize];
                    *c += 1;
                    *c - 1
                })
                .collect()
        })
        .collect()
}

/// Whether [`Pairing::Ranked`] on `active` PEs gives the busiest PE as many operations as the
/// parity rule: it is there to reorder the work in time, not to move it, and so the floor
/// ([`floor`]) stays the count of the busiest PE of whichever of the two is kept. Where every PE
/// holds the same rows (`m` divides `n`, one head) both are balanced.
fn ranked_fits(p: &Problem, pes: u32, active: u32) -> bool {
    let plans = cut(p, active);
    busiest(p, pes, &plans, None) == busiest(p, pes, &plans, Some(&ranked_pairs(p, &plans, pes)))
}

/// [`Pairing::Ranked`]: which PE computes each pair `{a, b}` (`a ≤ b`) of a q = k layer, keyed
/// `(head, a, b)`. The holder for which the pair serves the earlier of its rows (in the order a
/// PE takes its rows, [`places`]) computes it, so the holder taking its softmax sooner does not
/// wait for the score to come round the ring; the other gets it while it works on earlier rows.
/// Between rows of the same place, the holder that the other's row reaches in fewer hops
/// computes (the row is there early, the score goes the long way); at equal distance the one
/// with the smaller index for even places, the other for odd ones. On a ring where every PE holds the same number of rows
/// this is as balanced as the parity rule: each PE computes its earlier rows' pairs with the
/// later rows of every other PE, which compute the reverse.
fn ranked_pairs(p: &Problem, plans: &[RowPlan], m: u32) -> HashMap<(u32, u32, u32), u32> {
    let n = p.tokens;
    let place = places(plans, m);
    // Holder and place of each score (h, a, col).
    let mut at: HashMap<(u32, u32, u32), (u32, u32)> = HashMap::default();
    for (row, rp) in plans.iter().enumerate() {
        let (h, a) = (row as u32 / n.max(1), row as u32 % n.max(1));
        for (i, part) in rp.parts.iter().enumerate() {
            let pl = place[row][i];
            at.extend(part.cols.iter().map(|&c| ((h, a, c), (part.pe, pl))));
        }
    }
    let mut by: HashMap<(u32, u32, u32), u32> = HashMap::default();
    for h in 0..p.heads {
        for a in 0..n {
            for b in a..n {
                let (Some(&(i, pi)), Some(&(j, pj))) = (at.get(&(h, a, b)), at.get(&(h, b, a)))
                else {
                    continue;
                };
                let (ahead, back) = ((j + m - i) % m, (i + m - j) % m);
                let pe = if i == j {
                    i
                } else if pi == pj && ahead == back {
                    // Opposite PEs of an even ring: the one with the smaller index takes the
                    // even places, the other the odd ones.
                    if (pi % 2 == 0) == (i < j) {
                        i
                    } else {
                        j
                    }
                } else if pi != pj {
                    if pi < pj {
                        i
                    } else {
                        j
                    }
                } else if back < ahead {
                    i
                } else {
                    j
                };
                by.insert((h, a, b), pe);
            }
        }
    }
    by
}

/// The dataflow run as `cfg` says ([`Config`]). With `urgent` (always with the ranked pairing)
/// each PE's first rows are served first: a word goes on a link in the order of the soonest
/// need of it on the PEs ahead (the place, among that PE's rows, of the row it serves; phase 3's
/// needs after every phase-1 one), a PE computes its pairs in that order too, and each whole
/// row's phase 3 follows its softmax, so a PE whose next row still waits for a score works on
/// the rows it has. Also says whether `spread_homes` moved any row, and how many words the
/// busiest link forwards. No schedule if it would take more than `limit` cycles.
fn run_on(
    p: &Problem,
    pes: u32,
    cfg: Config,
    mirror: bool,
    limit: usize,
) -> Result<(Option<RingSchedule>, bool, usize), Vec<ScheduleError>> {
    let Config {
        active,
        spread_homes,
        pairing,
        urgent,
    } = cfg;
    let m = pes;
    let (n, d, heads) = (p.tokens, p.dim, p.heads);

    let plans = cut(p, active);
    let plan = |h: u32, a: u32| &plans[(h * n + a) as usize];
    // The ranked pairing also orders links and tasks by how soon each row is taken.
    let urgent = urgent || pairing == Pairing::Ranked;
    let place = places(&plans, m);
    let rank = |h: u32, a: u32, pe: u32| -> u32 {
        let row = (h * n + a) as usize;
        plans[row]
            .parts
            .iter()
            .position(|pt| pt.pe == pe)
            .map_or(u32::MAX, |i| place[row][i])
    };
    // With `urgent`, when each value is first needed on each PE (the place of the row it serves
    // there; phase 3's needs after every phase-1 one), and every route taken.
    let mut need: HashMap<(u32, Val), u32> = HashMap::default();
    let needs_at = |need: &mut HashMap<(u32, Val), u32>, pe: u32, v: Val, u: u32| {
        if urgent {
            let e = need.entry((pe, v)).or_insert(u);
            *e = (*e).min(u);
        }
    };
    let mut routes: Vec<(Val, u32, u32)> = Vec::new();
    let relay = pairing == Pairing::Relayed;
    let assigned = match pairing {
        Pairing::Timed | Pairing::Relayed => Some(assign_pairs(p, &plans, m, relay)),
        Pairing::Ranked => Some(ranked_pairs(p, &plans, m)),
        Pairing::Parity | Pairing::Near => None,
    };

    let mut b = Builder::new(NAME, pes);
    let mut moved = false;
    let mut inputs = Inputs::new(*p);
    // Tasks of all heads, per PE, in buckets taken in order at the end: phase 1; phase 2 split-row
    // heads, whole rows, continuations, divisions waiting for a sum from round the ring (the safe
    // form orders its phase 2 differently, see `safe_row`); phase 3 split-row heads, whole rows,
    // middle parts, final parts. Bucketing by kind rather than by head keeps a PE that holds the
    // tail of one head and the start of the next from making the next PE wait for work queued
    // behind a whole head.
    const BUCKETS: usize = 10;
    let mut tasks: Vec<[Vec<Task>; BUCKETS]> = vec![Default::default(); m as usize];
    // With `urgent`, whole rows' phase 2 and 3, keyed by row, per PE.
    let mut by_row: ByRow = vec![Vec::new(); m as usize];
    let mut preloaded: Vec<Vec<Val>> = vec![Vec::new(); m as usize];
    // Forwarding lists in priority classes, concatenated at the end.
    const CLASSES: usize = 6;
    let (fw_q, fw_k, fw_mirror, fw_sum, fw_v, fw_y) = (0, 1, 2, 3, 4, 5);
    // forward[pe][class] holds (hops from the value's origin, sequence, value): a PE must send
    // values in the order they reach it, or its link waits on a word still on its way.
    let mut forward: Forwarding = vec![vec![Vec::new(); CLASSES]; m as usize];
    let mut seq = 0usize;
    let mut route = |forward: &mut Forwarding, class: usize, v: Val, from: u32, to: u32| {
        if urgent {
            routes.push((v, from, to));
        }
        for (hops, pe) in path(from, to, m).filter(|&pe| pe != to).enumerate() {
            forward[pe as usize][class].push((hops as u32, seq, v));
            seq += 1;
        }
    };

    for h in 0..heads {
        // Which PEs need row r of k (and v): every PE holding a score in column r.
        let mut needs: Vec<Vec<u32>> = vec![Vec::new(); n as usize];
        for a in 0..n {
            for part in &plan(h, a).parts {
                for &c in &part.cols {
                    needs[c as usize].push(part.pe);
                }
            }
        }
        // The farthest PE (in ring order from the row's home) that needs a column's k/v row.
        let reach = |home: u32, users: &[u32]| -> u32 {
            users
                .iter()
                .copied()
                .max_by_key(|&pe| (pe + m - home) % m)
                .unwrap_or(home)
        };

        // Inputs: a row of q on its own row's first PE; k and v rows where their trip to the PEs
        // that read them is shortest (see `broadcast_home`).
        let mut qv: HashMap<(u32, u32), Val> = HashMap::default();
        let mut kv: HashMap<(u32, u32), Val> = HashMap::default();
        let mut vv: HashMap<(u32, u32), Val> = HashMap::default();
        // With q = k = v and no mask, a row cut between PEs is what the next PE starts on (its
        // own rows' scores wait for mirrored halves), so its words go on the link before the
        // home PE's whole rows (routes are sent in the order they are made). Elsewhere the
        // natural order is as good or better (causal 15 tokens on 5 PEs: 770 against 780).
        let mut order: Vec<u32> = (0..n).collect();
        if p.symmetric && p.shared_values && !p.causal {
            order.sort_by_key(|&r| plan(h, r).first() == plan(h, r).last());
        }
        // With q = k = v one value plays every role: route it once, as far as any role needs.
        let shared = p.symmetric && p.shared_values;
        // Roles that are one tensor must be preloaded in one place.
        let joint = p.symmetric || p.shared_values;
        let mut kv_from: Vec<u32> = vec![0; n as usize];
        for r in order {
            let home = plan(h, r).first();
            let q_readers: Vec<u32> = plan(h, r).parts.iter().map(|pt| pt.pe).collect();
            let mut readers: Vec<u32> = needs[r as usize].clone();
            if joint {
                readers.extend(&q_readers);
            }
            // A k/v row goes on from where it is preloaded to every PE that needs it; from the
            // row's own first PE it may have to go round the whole ring to reach the PEs of the
            // head before that one (a large ring, or a head that covers only part of it).
            let kv_at = if spread_homes {
                broadcast_home(home, &readers, m)
            } else {
                home
            };
            moved |= kv_at != home;
            let q_at = if joint { kv_at } else { home };
            let far_q = reach(q_at, &q_readers);
            let far_kv = reach(kv_at, &needs[r as usize]);
            for c in 0..d {
                let q = inputs.get(&mut b, Tensor::Q, h, r, c, q_at);
                let k = inputs.get(&mut b, Tensor::K, h, r, c, kv_at);
                let v = inputs.get(&mut b, Tensor::V, h, r, c, kv_at);
                preloaded[q_at as usize].push(q);
                preloaded[kv_at as usize].extend([k, v]);
                qv.insert((r, c), q);
                kv.insert((r, c), k);
                vv.insert((r, c), v);
            }
            for c in 0..d {
                if shared {
                    route(
                        &mut forward,
                        fw_q,
                        qv[&(r, c)],
                        kv_at,
                        reach(kv_at, &readers),
                    );
                } else {
                    route(&mut forward, fw_q, qv[&(r, c)], q_at, far_q);
                    route(&mut forward, fw_k, kv[&(r, c)], kv_at, far_kv);
                    route(&mut forward, fw_v, vv[&(r, c)], kv_at, far_kv);
                }
            }
            kv_from[r as usize] = kv_at;
        }
        if relay {
            // The relaying PEs read every row of the head as it passes: the rows must all come
            // from one PE, behind every holder (known before any score is built).
            let src = plan(h, 0).first();
            if kv_from.iter().any(|&f| f != src) {
                return Ok((None, moved, 0));
            }
        }
        // Order in which column rows reach a PE: its own first, then by distance back home.
        let arrival = |pe: u32, col: u32| (pe + m - kv_from[col as usize]) % m;

        // Phase 1: every score whole on the PE that holds it. With q = k (no mask) each pair
        // {a, b} is computed once, by default by the holder of (a, b) or of (b, a) alternately
        // by the parity of a + b, so every PE computes half of the pairs it shares with each
        // other PE (balanced work), and the value is sent on to the other holder (or holders,
        // where a relaying PE computes it).
        let mut unit_pe: HashMap<(u32, u32), u32> = HashMap::default();
        for a in 0..n {
            for part in &plan(h, a).parts {
                unit_pe.extend(part.cols.iter().map(|&c| ((a, c), part.pe)));
            }
        }
        // The PE computing the score of unit (a, col): with q = k (no mask) the one computing
        // the pair {a, col}.
        let paired = p.symmetric && !p.causal && !mirror;
        let computer = |a: u32, col: u32| -> u32 {
            let here = unit_pe[&(a, col)];
            if !paired {
                return here;
            }
            if let Some(&pe) = assigned
                .as_ref()
                .and_then(|by| by.get(&(h, a.min(col), a.max(col))))
            {
                return pe;
            }
            let there = unit_pe[&(col, a)];
            if a == col || here == there {
                return here;
            }
            if pairing == Pairing::Near {
                // The holder from which the other is fewer hops ahead computes: on a ring with
                // idle PEs the other way round can cross all of them.
                let (ahead, back) = ((there + m - here) % m, (here + m - there) % m);
                if ahead != back {
                    return if ahead < back { here } else { there };
                }
            }
            if pair_computed_by(a, col) {
                here
            } else {
                there
            }
        };
        // Each pair's computing PE and the unit it is computed as: its own unit where the PE holds
        // one (the one `pair_computed_by` names if it holds both), else (a, col) with a ≤ col.
        let mut made: HashMap<(u32, u32), (u32, (u32, u32))> = HashMap::default();
        let mut jobs: Vec<Vec<(u32, u32)>> = vec![Vec::new(); m as usize];
        for a in 0..n {
            for col in 0..n {
                let Some(&here) = unit_pe.get(&(a, col)) else {
                    continue;
                };
                if !paired {
                    jobs[here as usize].push((a, col));
                    continue;
                }
                let key = (a.min(col), a.max(col));
                if made.contains_key(&key) {
                    continue;
                }
                let pe = computer(a, col);
                let holds = |u: (u32, u32)| unit_pe.get(&u) == Some(&pe);
                let (lo, hi) = key;
                let unit = match (holds((lo, hi)), holds((hi, lo))) {
                    (true, true) if !pair_computed_by(lo, hi) => (hi, lo),
                    (true, _) => (lo, hi),
                    (false, true) => (hi, lo),
                    (false, false) => (lo, hi),
                };
                made.insert(key, (pe, unit));
                jobs[pe as usize].push(unit);
            }
        }
        // How soon a pair is needed: the earlier of its two holders' places for its rows.
        let urgency = |a: u32, c: u32| -> u32 {
            let at = |x: u32, y: u32| unit_pe.get(&(x, y)).map_or(u32::MAX, |&q| rank(h, x, q));
            at(a, c).min(at(c, a))
        };
        let mut score: HashMap<(u32, u32), Val> = HashMap::default();
        // Mirrored scores and their route (computing PE, holder), for the safe form's routing.
        let mut mirrored: HashMap<Val, (u32, u32)> = HashMap::default();
        for pe in 0..m {
            let mut mine = std::mem::take(&mut jobs[pe as usize]);
            // Within what the arrived rows allow, scores another PE waits for go first.
            let kept_here = |a: u32, c: u32| {
                !p.symmetric
                    || p.causal
                    || (unit_pe.get(&(a, c)) == Some(&pe) && unit_pe.get(&(c, a)) == Some(&pe))
            };
            if relay {
                // A relaying PE computes pairs of rows that are not its own: both must arrive.
                let both = |a: u32, c: u32| arrival(pe, a).max(arrival(pe, c));
                mine.sort_by_key(|&(a, c)| (both(a, c), kept_here(a, c), a.max(c), a.min(c)));
            } else if urgent {
                mine.sort_by_key(|&(a, c)| (urgency(a, c), arrival(pe, c), kept_here(a, c), c, a));
            } else {
                mine.sort_by_key(|&(a, c)| (arrival(pe, c), kept_here(a, c), c, a));
            }
            for (a, col) in mine {
                let mut acc = None;
                let u = urgency(a, col);
                for c in 0..d {
                    needs_at(&mut need, pe, qv[&(a, c)], u);
                    needs_at(&mut need, pe, kv[&(col, c)], u);
                    let out = b.computed();
                    let work = Work::Mac {
                        a: qv[&(a, c)],
                        b: kv[&(col, c)],
                        acc,
                        out,
                    };
                    tasks[pe as usize][0].push(Task { work, phase: 1 });
                    acc = Some(out);
                }
                match acc {
                    Some(acc) => {
                        score.insert((a, col), acc);
                    }
                    None => b.bug(NAME, "a score with no product (dim 0)"),
                }
            }
        }
        // Each computed score goes once to the farther of the holders that did not compute it,
        // passing the nearer on the way.
        let mut sent: rustc_hash::FxHashSet<(u32, u32)> = Default::default();
        for a in 0..n {
            for col in 0..n {
                let Some(&to) = unit_pe.get(&(a, col)) else {
                    continue;
                };
                let key = (a.min(col), a.max(col));
                let Some(&(from, unit)) = made.get(&key) else {
                    continue;
                };
                let Some(&v) = score.get(&unit) else {
                    continue;
                };
                score.insert((a, col), v);
                let other = unit_pe.get(&(col, a)).copied().unwrap_or(to);
                let far = if (other + m - from) % m > (to + m - from) % m {
                    other
                } else {
                    to
                };
                if from != to {
                    needs_at(&mut need, to, v, rank(h, a, to));
                }
                if from != to && to == far && sent.insert(key) {
                    route(&mut forward, fw_mirror, v, from, to);
                    mirrored.insert(v, (from, to));
                }
            }
        }
        // Phase 2: exponent-accumulate along each row's parts, then divide where the exps are.
        // Per PE the order is: [split-row heads] [whole rows] [row continuations], then the
        // divisions that wait for a sum coming round the ring, then phase 3 of split-row heads,
        // whole rows and continuations: work others wait for comes as early as it can.
        let scale = p.scale as f32;
        let mut weight: HashMap<(u32, u32), Val> = HashMap::default();
        if p.safe() {
            // Exponentials of a row's last part wait for the maximum, which needs the previous
            // PE's partial maximum: they are held back until after the PE's first whole row.
            let mut held: Vec<Vec<Task>> = vec![Vec::new(); m as usize];
            for a in 0..n {
                let rp = plan(h, a);
                let mut ctx = SafeRow {
                    b: &mut b,
                    tasks: &mut tasks,
                    held: &mut held,
                    forward: &mut forward,
                    route: &mut route,
                    score: &score,
                    mirrored: &mirrored,
                    weight: &mut weight,
                    scale,
                    pes: m,
                    key: h * n + a,
                    by_row: urgent.then_some(&mut by_row),
                };
                ctx.row(a, rp);
            }
            for (pe, list) in held.iter_mut().enumerate() {
                tasks[pe][SAFE_WHOLE].append(list);
            }
        }
        for a in (0..n).filter(|_| !p.safe()) {
            let rp = plan(h, a);
            let split = rp.parts.len() > 1;
            let mut running: Option<Val> = None;
            let mut exps: Vec<(u32, u32, Val)> = Vec::new();
            for (i, part) in rp.parts.iter().enumerate() {
                let k = if !split {
                    1
                } else if i == 0 {
                    0
                } else {
                    2
                };
                for &col in &part.cols {
                    let (e, sum) = (b.computed(), b.computed());
                    let work = Work::Exp {
                        x: score[&(a, col)],
                        bias: None,
                        scale,
                        acc: running,
                        e,
                        sum,
                    };
                    let task = Task { work, phase: 2 };
                    if urgent && !split {
                        by_row[part.pe as usize].push((h * n + a, 2, task));
                    } else {
                        tasks[part.pe as usize][1 + k].push(task);
                    }
                    running = Some(sum);
                    exps.push((part.pe, col, e));
                }
                if i + 1 < rp.parts.len() {
                    let Some(s) = running else {
                        b.bug(NAME, "a row part with no column");
                        continue;
                    };
                    // PEs between two parts (holding no score of this row) just pass it on.
                    route(&mut forward, fw_sum, s, part.pe, rp.parts[i + 1].pe);
                }
            }
            let Some(sum) = running else {
                b.bug(NAME, "a row with no score");
                continue;
            };
            let last = rp.last();
            if split {
                // The finished sum goes on around the ring to the row's other PEs, ending at
                // the part before the last.
                let before_last = rp.parts[rp.parts.len() - 2].pe;
                route(&mut forward, fw_sum, sum, last, before_last);
            }
            for (pe, col, e) in exps {
                let w = b.computed();
                let work = Work::Div {
                    num: e,
                    den: sum,
                    out: w,
                };
                let k = if !split {
                    1
                } else if pe == last {
                    2
                } else {
                    3
                };
                let task = Task { work, phase: 2 };
                if urgent && !split {
                    by_row[pe as usize].push((h * n + a, 2, task));
                } else {
                    tasks[pe as usize][1 + k].push(task);
                }
                weight.insert((a, col), w);
            }
        }

        // Phase 3: y[a][c] accumulates on each part in turn, the partial row handed forward.
        let mut y_in: HashMap<(u32, u32), Val> = HashMap::default();
        for pe in 0..m {
            // rank 0: split-row heads (their partial y is awaited downstream), 1: whole rows,
            // 2: middle parts, 3: final parts.
            let mut mine: Vec<(u8, u32, u32)> = Vec::new();
            for a in 0..n {
                let rp = plan(h, a);
                for (i, part) in rp.parts.iter().enumerate().filter(|(_, pt)| pt.pe == pe) {
                    let rank = match (rp.parts.len() == 1, i == 0, i + 1 == rp.parts.len()) {
                        (true, _, _) => 1,
                        (false, true, _) => 0,
                        (false, false, false) => 2,
                        (false, false, true) => 3,
                    };
                    mine.extend(part.cols.iter().map(|&col| (rank, a, col)));
                }
            }
            if urgent {
                mine.sort_by_key(|&(r, a, col)| (r, rank(h, a, pe), arrival(pe, col), col, a));
            } else {
                mine.sort_by_key(|&(r, a, col)| (r, arrival(pe, col), col, a));
            }
            // The partial y of (a, c) at `a·d + c`: a dense table, since every MAC reads and
            // writes one, and walking it in index order visits rows, then columns, in order.
            let mut y: Vec<Option<Val>> = vec![None; (n * d) as usize];
            for &(r, a, col) in &mine {
                let w = weight[&(a, col)];
                for c in 0..d {
                    let out = b.computed();
                    let at = (a * d + c) as usize;
                    let acc = y[at].or_else(|| y_in.get(&(a, c)).copied());
                    needs_at(&mut need, pe, vv[&(col, c)], PHASE3 + rank(h, a, pe));
                    let work = Work::Mac {
                        a: w,
                        b: vv[&(col, c)],
                        acc,
                        out,
                    };
                    let task = Task { work, phase: 3 };
                    if urgent && r == 1 {
                        by_row[pe as usize].push((h * n + a, 3, task));
                    } else {
                        tasks[pe as usize][6 + r as usize].push(task);
                    }
                    y[at] = Some(out);
                }
            }
            // Hand partial rows to the next part; keep finished rows as outputs.
            let held = y.into_iter().enumerate().filter_map(|(at, v)| {
                let at = at as u32;
                v.map(|v| ((at / d, at % d), v))
            });
            for ((a, c), val) in held {
                if is_final_part(plan(h, a), pe) {
                    let element = Element {
                        tensor: Tensor::Y,
                        head: h,
                        row: a,
                        col: c,
                    };
                    b.output(element, pe, val);
                } else {
                    match next_part(plan(h, a), pe) {
                        Some(to) => route(&mut forward, fw_y, val, pe, to),
                        None => b.bug(NAME, "a partial output row with no next part"),
                    }
                    y_in.insert((a, c), val);
                }
            }
        }
    }

    for list in &mut preloaded {
        list.sort();
        list.dedup();
    }
    // With `urgent`, a word on a link is as urgent as the soonest need of it on the PEs its
    // route still reaches; words no PE reads (partial sums and rows) count as most urgent.
    let mut soonest: HashMap<(u32, Val), u32> = HashMap::default();
    for &(v, from, to) in routes.iter() {
        let mut u = u32::MAX;
        let on: Vec<u32> = path(from, to, m).collect();
        for w in on.windows(2).rev() {
            u = u.min(need.get(&(w[1], v)).copied().unwrap_or(u32::MAX));
            let e = soonest.entry((w[0], v)).or_insert(u);
            *e = (*e).min(u);
        }
    }
    let forward: Vec<Vec<Val>> = forward
        .into_iter()
        .enumerate()
        .map(|(pe, classes)| {
            let mut all: Vec<(u32, usize, u32, usize, Val)> = Vec::new();
            for (class, list) in classes.into_iter().enumerate() {
                all.extend(list.into_iter().map(|(hops, seq, v)| {
                    let u = if urgent {
                        soonest
                            .get(&(pe as u32, v))
                            .copied()
                            .filter(|&u| u != u32::MAX)
                            .unwrap_or(0)
                    } else {
                        0
                    };
                    (u, class, hops, seq, v)
                }));
            }
            all.sort_by_key(|&(u, class, hops, seq, _)| (u, class, hops, seq));
            all.into_iter().map(|(_, _, _, _, v)| v).collect()
        })
        .collect();
    let busiest = forward.iter().map(Vec::len).max().unwrap_or(0);
    let tasks = tasks
        .into_iter()
        .zip(by_row)
        .map(|(buckets, mut rows)| {
            if rows.is_empty() {
                return buckets.concat();
            }
            // Each whole row's phase 3 right after its softmax, the rows in their order: a PE
            // whose next row still waits for a score works on the rows it has.
            rows.sort_by_key(|&(key, phase, _)| (key, phase));
            let first = rows
                .iter()
                .take_while(|&&(key, phase, _)| key == rows[0].0 && phase == 2)
                .count();
            let [b0, b1, b2, b3, b4, b5, b6, b7, b8, b9] = buckets;
            let (head, rest) = rows.split_at(first);
            let mut out = Vec::new();
            for list in [b0, b1, b2] {
                out.extend(list);
            }
            out.extend(head.iter().map(|&(_, _, t)| t));
            for list in [b3, b4, b5, b6] {
                out.extend(list);
            }
            out.extend(rest.iter().map(|&(_, _, t)| t));
            for list in [b7, b8, b9] {
                out.extend(list);
            }
            out
        })
        .collect();
    let flow = Flow {
        tasks,
        forward,
        preloaded,
    };
    match flow::simulate_within(&mut b, &flow, limit) {
        Ok(Some(_)) => {}
        Ok(None) => return Ok((None, moved, busiest)),
        Err(why) => b.bug(NAME, why),
    }
    Ok((Some(b.finish()?), moved, busiest))
}

// Phase-2 buckets of the safe form, in the order a PE takes them. Partial maxima others wait for
// come first; a last part's maximum and exponentials start the row's sum; whole rows are local;
// the other parts' exponentials wait for the maximum and the partial sum coming round the ring;
// then the divisions waiting for the finished sum.
const SAFE_PARTIAL_MAX: usize = 1;
const SAFE_LAST_MAX: usize = 2;
const SAFE_WHOLE: usize = 3;
const SAFE_REST_EXP: usize = 4;
const SAFE_WAITING_DIV: usize = 5;

/// What phase 2 of the safe form needs from the surrounding pass.
struct SafeRow<'a, R: FnMut(&mut Forwarding, usize, Val, u32, u32)> {
    b: &'a mut Builder,
    tasks: &'a mut Vec<[Vec<Task>; 10]>,
    held: &'a mut Vec<Vec<Task>>,
    forward: &'a mut Forwarding,
    route: &'a mut R,
    score: &'a HashMap<(u32, u32), Val>,
    mirrored: &'a HashMap<Val, (u32, u32)>,
    weight: &'a mut HashMap<(u32, u32), Val>,
    scale: f32,
    pes: u32,
    /// The row (`h·n + a`) and, where whole rows keep their tasks by row, where they go.
    key: u32,
    by_row: Option<&'a mut ByRow>,
}

/// Phase-3 needs of a value come after every phase-1 need (places of rows are far fewer).
const PHASE3: u32 = 1 << 20;

/// Forwarding class of partial maxima and sums (the same as the plain form's sums).
const FW_SUM: usize = 3;

impl<R: FnMut(&mut Forwarding, usize, Val, u32, u32)> SafeRow<'_, R> {
    fn push(&mut self, pe: u32, bucket: usize, work: Work) {
        let task = Task { work, phase: 2 };
        if let Some(rows) = self.by_row.as_mut().filter(|_| bucket == SAFE_WHOLE) {
            rows[pe as usize].push((self.key, 2, task));
            return;
        }
        self.tasks[pe as usize][bucket].push(task);
    }

    /// The running maximum of `vals`, one `max` per value after the first.
    fn max_chain(&mut self, pe: u32, bucket: usize, vals: &[Val]) -> Val {
        let mut acc = vals[0];
        for &v in &vals[1..] {
            let out = self.b.computed();
            self.push(pe, bucket, Work::Max { a: acc, b: v, out });
            acc = out;
        }
        acc
    }

    /// Row `a`: the maximum runs over the parts first → last, each part reducing its own scores
    /// before taking in the previous part's result, so only that one `max` waits on the ring.
    /// The finished maximum goes on around the ring to the other parts. The sum starts on the
    /// last part (which has the maximum first), goes round to the first part and on to the part
    /// before the last, where it is finished; from there it travels forward to the rest.
    fn row(&mut self, a: u32, rp: &RowPlan) {
        let k = rp.parts.len();
        let score = self.score;
        let scores =
            |part: &Part| -> Vec<Val> { part.cols.iter().map(|&c| score[&(a, c)]).collect() };
        let mut running: Option<Val> = None;
        for (i, part) in rp.parts.iter().enumerate() {
            let bucket = if k == 1 {
                SAFE_WHOLE
            } else if i + 1 == k {
                SAFE_LAST_MAX
            } else {
                SAFE_PARTIAL_MAX
            };
            let local = self.max_chain(part.pe, bucket, &scores(part));
            let here = match running {
                None => local,
                Some(prev) => {
                    let out = self.b.computed();
                    self.push(
                        part.pe,
                        bucket,
                        Work::Max {
                            a: prev,
                            b: local,
                            out,
                        },
                    );
                    out
                }
            };
            if i + 1 < k {
                let next = rp.parts[i + 1].pe;
                // A one-column first part passes on its score itself. If that score is a mirrored
                // one whose route already runs through the next part, it gets there anyway, and
                // listing it twice on one link would have the link wait for it forever.
                let m = self.pes;
                let on_its_way = self
                    .mirrored
                    .get(&here)
                    .is_some_and(|&(from, to)| (next + m - from) % m < (to + m - from) % m);
                if !on_its_way {
                    (self.route)(self.forward, FW_SUM, here, part.pe, next);
                }
            }
            running = Some(here);
        }
        // A row always has a score (the language refuses empty layers); should it not, the row's
        // outputs are never produced and validation reports them instead of a panic here.
        let Some(top) = running else {
            return;
        };
        if k > 1 {
            (self.route)(self.forward, FW_SUM, top, rp.last(), rp.parts[k - 2].pe);
        }

        // The sum's order over the parts: last, first, second, …, the one before the last.
        let order: Vec<&Part> = std::iter::once(&rp.parts[k - 1])
            .chain(&rp.parts[..k - 1])
            .collect();
        let mut sum: Option<Val> = None;
        let mut exps: Vec<(u32, u32, Val)> = Vec::new();
        for (i, part) in order.iter().enumerate() {
            for &col in &part.cols {
                let (e, s) = (self.b.computed(), self.b.computed());
                let work = Work::Exp {
                    x: self.score[&(a, col)],
                    bias: Some(top),
                    scale: self.scale,
                    acc: sum,
                    e,
                    sum: s,
                };
                if k == 1 {
                    self.push(part.pe, SAFE_WHOLE, work);
                } else if i == 0 {
                    self.held[part.pe as usize].push(Task { work, phase: 2 });
                } else {
                    self.push(part.pe, SAFE_REST_EXP, work);
                }
                sum = Some(s);
                exps.push((part.pe, col, e));
            }
            if i + 1 < k {
                let Some(s) = sum else {
                    return;
                };
                (self.route)(self.forward, FW_SUM, s, part.pe, order[i + 1].pe);
            }
        }
        let Some(den) = sum else {
            return;
        };
        let end = order[k - 1].pe;
        if k > 1 {
            // From the part before the last forward: the last part, then round to the others.
            (self.route)(self.forward, FW_SUM, den, end, order[k - 2].pe);
        }
        for (pe, col, e) in exps {
            let w = self.b.computed();
            let bucket = if k == 1 {
                SAFE_WHOLE
            } else if pe == end {
                SAFE_REST_EXP
            } else {
                SAFE_WAITING_DIV
            };
            self.push(
                pe,
                bucket,
                Work::Div {
                    num: e,
                    den,
                    out: w,
                },
            );
            self.weight.insert((a, col), w);
        }
        if k == 1 {
            // Held exponentials of this PE's last part go after its first whole row, by which
            // time the previous PE's partial maximum has arrived.
            let pe = rp.parts[0].pe as usize;
            let held = std::mem::take(&mut self.held[pe]);
            self.tasks[pe][SAFE_WHOLE].extend(held);
        }
    }
}

/// Where to preload a value read on `readers` so that its trip forward to the farthest of them
/// is shortest: the reader just after the widest gap between readers in ring order. `home` is
/// kept unless that trip is strictly shorter.
fn broadcast_home(home: u32, readers: &[u32], m: u32) -> u32 {
    let mut rs: Vec<u32> = readers.to_vec();
    rs.sort_unstable();
    rs.dedup();
    let Some(&first) = rs.first() else {
        return home;
    };
    let dist = |a: u32, b: u32| (b + m - a) % m;
    let from_home = rs.iter().map(|&pe| dist(home, pe)).max().unwrap_or(0);
    // The trip from the reader after the widest gap ends at the reader before it.
    let k = rs.len();
    let (mut at, mut far) = (first, dist(first, rs[k - 1]));
    for i in 0..k.saturating_sub(1) {
        let f = dist(rs[i + 1], rs[i]);
        if f < far {
            (at, far) = (rs[i + 1], f);
        }
    }
    if far < from_home {
        at
    } else {
        home
    }
}

/// The PE holding the part of the row after the one on `pe`.
fn next_part(rp: &RowPlan, pe: u32) -> Option<u32> {
    let i = rp.parts.iter().position(|pt| pt.pe == pe)?;
    Some(rp.parts.get(i + 1)?.pe)
}

/// Parts of a row are on increasing PEs (cuts are contiguous; with more PEs than scores some PEs
/// hold none and sit between parts), so the part on `pe` is final when it is the last part.
fn is_final_part(rp: &RowPlan, pe: u32) -> bool {
    rp.parts.last().is_some_and(|pt| pt.pe == pe)
}

#[cfg(test)]
mod tests {
    use super::{active_counts, broadcast_home};

    #[test]
    fn a_value_read_behind_its_home_moves_to_the_first_reader() {
        // Readers 2..=5 of an 8-PE ring: from PE 4 the trip to PE 3 goes round (7 hops); from
        // PE 2, the reader after the widest gap, every reader is at most 3 hops ahead.
        assert_eq!(broadcast_home(4, &[2, 3, 4, 5, 5, 3], 8), 2);
        // Readers wrapping past PE 0: 6, 7, 0, 1 from PE 0 cost 7 hops, from PE 6 three.
        assert_eq!(broadcast_home(0, &[0, 1, 6, 7], 8), 6);
    }

    #[test]
    fn a_home_that_is_no_worse_is_kept() {
        // Every PE reads it: every home is as good as any other.
        assert_eq!(broadcast_home(5, &[0, 1, 2, 3, 4, 5, 6, 7], 8), 5);
        // Already the first reader.
        assert_eq!(broadcast_home(2, &[2, 3, 4], 8), 2);
        // No reader: nothing to move for.
        assert_eq!(broadcast_home(3, &[], 8), 3);
    }

    #[test]
    fn working_pe_counts_stay_on_the_ring_and_few() {
        let all = active_counts(16, 3, true);
        assert_eq!(all, (1..=16).collect::<Vec<u32>>());
        let big = active_counts(256, 16, false);
        assert!(big.iter().all(|&a| (1..=256).contains(&a)));
        assert!(big.contains(&16) && big.contains(&1));
        assert_eq!(big.first(), Some(&256), "the whole ring first");
        let mut sorted = big.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), big.len(), "no count twice");
        assert!(big.len() < 40, "{} counts", big.len());
    }
}
