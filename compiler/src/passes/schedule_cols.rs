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
//!   `y[a][c]` accumulates on the PE of column `c` (or, in the lanes of [`cut_lanes`], on the
//!   v PE its run of outputs was cut to, so that `r3` need not divide `d`).
//!
//! With fractional columns (see [`frac_lanes`]) each column part's products are cut evenly over
//! its PEs instead, a column's rows splitting between neighbours. With several heads the lanes
//! of [`next_lanes`] are arcs of q/k PEs alone, each head's softmax and outputs on the next
//! head's arc; with q = k = v those of [`scores_round_lanes`] are arcs whose softmax PEs come
//! first, the scores going round the ring to them.
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
use runtime::layer::Normalisation;

pub const NAME: &str = "schedule-cols";
pub const DESCRIPTION: &str =
    "cols dataflow: per head, q/k columns, softmax and v columns on separate runs of PEs, list-scheduled";

/// `auto` tries it in the split dataflow's range — up to this many necessary operations, with
/// fewer than [`AUTO_TOKENS_PER_PE`] tokens per PE — and on larger layers with fewer rows (all
/// heads) than PEs.
const AUTO_OPS: u64 = 300_000;
const AUTO_TOKENS_PER_PE: u64 = 4;
/// Above this many necessary operations each kind of lane is simulated once (see
/// [`candidates`]).
const LARGE_OPS: u64 = 30_000;
/// From this many PEs [`candidates`] also tries more softmax PEs than the estimate likes.
const WIDE_SOFT_PES: u32 = 64;
/// From this many PEs [`candidates`]' lanes are joined by those of [`local_v_lanes`] (on 8 PEs
/// none of the small-shapes table's `d = 8` layers gained from them).
const LOCAL_V_PES: u32 = 16;
/// [`other_softmax_counts`] tries every softmax count up to this one, on rings of at least
/// [`SOFT_STEP_PES`] PEs and heads of at most [`SOFT_STEP_DIM`] columns: the small-shapes
/// table gained only there (none of its 48 shapes on 8 PEs with `d = 8`, nor of the 48 on 64
/// PEs with `d = 64`, moved), and the extra run costs a quarter to a third more compile time.
const MAX_SOFT_STEP: u32 = 8;
const SOFT_STEP_PES: u32 = 16;
const SOFT_STEP_DIM: u32 = 16;

/// [`cut_lanes`] tried in one run, on heads of at most `CUT_MAX_PES` PEs (where the ring has
/// many more PEs than columns the other lanes leave it idle anyway).
const CUT_LANES: usize = 3;
const CUT_MAX_PES: u64 = 32;

/// [`near_lanes`] tried in one run (one above [`LARGE_OPS`]): the estimate ranks them only
/// roughly, and a run's cost is mostly its search, which only its best layout gets.
const NEAR_LANES: usize = 3;

/// Most tokens for which [`tucked_lanes`] are tried: its lanes have a softmax PE per row and
/// cut phase 3 for the last row's latency, not for throughput.
const TUCK_MAX_TOKENS: u32 = 4;

/// Multiples of a winning lane's softmax count that [`pairs_by_smaller_row`] tries.
const SMALLER_ROW_SOFT: [u32; 4] = [1, 2, 4, 8];
/// Lane shapes run per row-group count with preload copies (the estimate's best).
const COPIED_LANES: usize = 3;
/// Most softmax PEs per lane with preload copies.
const MAX_COPIED_SOFT: u64 = 4;

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
        // Larger layers too (up to the split dataflow's refusal) while the rows of all heads
        // are fewer than the PEs: the row dataflow then leaves most of the ring idle, and each
        // kind of lane is one run (32 tokens, d = 128, 4 heads, causal on 256 PEs: 10928 cycles
        // before, 2952 with this dataflow, in about 6 s).
        let rows = u64::from(p.tokens) * u64::from(p.heads);
        (p.necessary_ops() <= AUTO_OPS && u64::from(p.tokens) < AUTO_TOKENS_PER_PE * u64::from(pes))
            || rows < u64::from(pes)
    }
    fn schedule(&self, p: &Problem, pes: u32) -> Result<RingSchedule, Vec<ScheduleError>> {
        let parts = candidates(p, pes);
        if parts.is_empty() {
            return Err(vec![ScheduleError::Internal {
                pass: NAME,
                what: format!("no lane of 3 PEs per head fits {pes} PEs"),
            }]);
        }
        // The shortest schedule so far, the lanes of the run that gave it (for
        // [`pairs_by_smaller_row`]) and the one of them it came from (for [`soft_columns`]).
        let (first, won) = schedule_split::run_apart(p, pes, &parts)?;
        let mut best = (first, parts.clone(), won);
        // Each other kind of lane in a run of its own, so the lanes above keep their retries
        // and search budget and no layer can lose the schedule it had; the shorter one is kept.
        keep_shorter(p, pes, &mut best, overlapped(p, pes), Run::Plain);
        // Every other softmax count of the lanes above.
        keep_shorter(
            p,
            pes,
            &mut best,
            other_softmax_counts(p, pes, &parts),
            Run::Plain,
        );
        // The lanes with each row's outputs on its own softmax PE.
        keep_shorter(p, pes, &mut best, local_v_lanes(p, pes), Run::Plain);
        // The lanes with outputs on the softmax PEs, each with a helper PE taking some.
        keep_shorter(p, pes, &mut best, helper_lanes(p, pes), Run::Plain);
        // The lanes with phase 3 cut by outputs over the v PEs.
        keep_shorter(p, pes, &mut best, cut_lanes(p, pes), Run::Plain);
        // Under a causal mask, the same with the shortest rows' outputs on the q/k PEs.
        keep_shorter(p, pes, &mut best, qk_row_lanes(p, pes), Run::Plain);
        // The lanes whose columns split between the two ways of reaching phase 3.
        let count = if p.necessary_ops() > LARGE_OPS {
            1
        } else {
            NEAR_LANES
        };
        let near: Vec<(u32, Apart)> = near_lanes(p, pes, count)
            .into_iter()
            .map(|(_, groups, lane)| (groups, lane))
            .collect();
        keep_shorter(p, pes, &mut best, near, Run::Plain);
        // The lanes of a q/k PE and a softmax PE per row, the inputs streamed in order.
        keep_shorter(p, pes, &mut best, pair_lanes(p, pes), Run::KeysFirst);
        // Under a causal mask, the same lanes laid from the last row.
        keep_shorter(
            p,
            pes,
            &mut best,
            reversed_pair_lanes(p, pes),
            Run::KeysFirst,
        );
        // The lanes with fractional columns.
        keep_shorter(p, pes, &mut best, frac_lanes(p, pes), Run::Plain);
        // The arcs whose softmax and phase 3 run on the next head's arc, abandoned as soon as
        // they cannot beat the schedule so far (they mostly do not on longer sequences).
        keep_shorter(p, pes, &mut best, next_lanes(p, pes), Run::Below);
        // The winning lanes with each q = k pair computed with its smaller row.
        let smaller = pairs_by_smaller_row(p, pes, &best.1);
        keep_shorter(p, pes, &mut best, smaller, Run::Plain);
        // The winning lane with some columns held whole, both phases, by its softmax PE.
        let on_soft = soft_columns(p, best.2);
        keep_shorter(p, pes, &mut best, on_soft, Run::Plain);
        // Under a causal mask, the winning lane with its rows dealt from the last softmax PE.
        let from_last = soft_from_last(p, pes, best.2);
        keep_shorter(p, pes, &mut best, from_last, Run::Below);
        // On few tokens, the winning lane's q/k PEs with a softmax PE per row starting on the
        // last of them and the v part overlapping the softmax PEs.
        for tucked in tucked_lanes(p, pes, best.2) {
            keep_shorter(p, pes, &mut best, tucked, Run::Plain);
        }
        // With q = k = v, arcs whose scores go round the ring to softmax PEs before the q/k
        // PEs, wanting a schedule below the best so far, and where they win, with each pair
        // computed with its smaller row. Last, so that the runs above still start from the
        // lanes they had (run before them, the arcs' win of 4 tokens, `d = 64`, 2 heads on
        // 128 PEs left the smaller-row run on the arcs and the layer a cycle slower, 222
        // against 221).
        let before = best.0.cycles();
        keep_shorter(p, pes, &mut best, scores_round_lanes(p, pes), Run::Below);
        if best.0.cycles() < before {
            let smaller = pairs_by_smaller_row(p, pes, &best.1);
            keep_shorter(p, pes, &mut best, smaller, Run::Below);
        }
        // Lanes of row groups, each holding its own copies of the inputs it reads.
        keep_shorter(p, pes, &mut best, copied_lanes(p, pes), Run::Below);
        let arcs = copied_arcs(p, pes, best.0.cycles());
        keep_shorter(p, pes, &mut best, arcs, Run::Below);
        let mut s = best.0;
        s.algorithm = NAME;
        Ok(s)
    }
}

/// Lanes of 1, 2, 4, … row groups per head (as far as the tokens and three PEs per lane allow),
/// every PE holding its own preload copy of each input word it reads (`Apart::copies`), where
/// copies are tried ([`schedule_split::copies_tried`]): no input word then crosses a link, so
/// the k and v rows need not stream from lane to lane and, with q = k = v, the x words need
/// not cross from the q/k PEs to the v PEs. Each row group's lane
/// shapes are ranked by the busiest part's work (no link term: only scores and weights move)
/// plus a row's chains and hops, and the [`COPIED_LANES`] best are run ([`LARGE_OPS`]: one).
pub(crate) fn copied_lanes(p: &Problem, pes: u32) -> Vec<(u32, Apart)> {
    if !schedule_split::copies_tried(p, pes) {
        return Vec::new();
    }
    let (n, d) = (u64::from(p.tokens), u64::from(p.dim.max(1)));
    let (weights, scores) = per_head(p);
    let mut widths: Vec<u64> = (1..=d).map(|c| d.div_ceil(c)).collect();
    widths.dedup();
    let keep = if p.necessary_ops() > LARGE_OPS {
        1
    } else {
        COPIED_LANES
    };
    let mut out = Vec::new();
    for groups in row_groups(p, pes, 3).map(u64::from) {
        let per = u64::from(pes) / (u64::from(p.heads) * groups);
        let rows = n.div_ceil(groups);
        let mut ranked: Vec<(u64, Apart)> = Vec::new();
        // Scores whole on each q/k PE: any number of them, up to the lane's scores.
        let lane_scores = scores.div_ceil(groups);
        let wholes: Vec<u64> = (0..)
            .map(|k| 1u64 << k)
            .take_while(|&r| r <= lane_scores.min(per))
            .collect();
        for soft in 1..=rows.min(MAX_COPIED_SOFT) {
            // Maximum, exponential and division per weight of the rows a softmax PE takes.
            let work2 = rows.div_ceil(soft) * 3 * n;
            let r1s = widths
                .iter()
                .map(|&r| (r, false))
                .chain(wholes.iter().map(|&r| (r, true)));
            for (r1, whole_scores) in r1s {
                for &r3 in widths.iter().filter(|&&r3| r1 + soft + r3 <= per) {
                    let work1 = if whole_scores {
                        lane_scores.div_ceil(r1) * d
                    } else {
                        lane_scores * d.div_ceil(r1)
                    };
                    let work3 = weights.div_ceil(groups) * d.div_ceil(r3);
                    let est = work1.max(work2).max(work3) + d + 2 * soft + r3 + 2 * n;
                    let lane = Apart::columns(r1 as u32, soft as u32, r3 as u32);
                    ranked.push((
                        est,
                        Apart {
                            copies: true,
                            whole_scores,
                            ..lane
                        },
                    ));
                }
            }
        }
        ranked.sort_by_key(|r| r.0);
        for (_, lane) in ranked.into_iter().take(keep) {
            push_new(&mut out, (groups as u32, lane));
        }
    }
    out
}

/// Row-group counts 1, 2, 4, … per head, as far as the tokens go and each group's lane keeps
/// at least `lane_pes` PEs.
fn row_groups(p: &Problem, pes: u32, lane_pes: u64) -> impl Iterator<Item = u32> {
    let (n, heads) = (p.tokens, u64::from(p.heads));
    std::iter::successors(Some(1u32), |&g| g.checked_mul(2))
        .take_while(move |&g| g <= n && lane_pes * heads * u64::from(g) <= u64::from(pes))
}

/// How far above the bound (in percent) the dataflow's own schedule so far must be for
/// [`copied_arcs`] to run: within it arcs could gain at most that much, for a run that costs
/// up to half the layer's compile time again.
const ARCS_GAP_PERCENT: u64 = 10;
/// Softmax PEs per arc [`copied_arcs`] tries.
const COPIED_ARC_SOFT: [u32; 3] = [1, 2, 4];
/// The arcs [`copied_arcs`] tries at each softmax count: scores crossing the arc or whole, and
/// with whole scores, the softmax PEs also taking outputs with their own scores lighter by 30 or
/// 70 % of their softmax work, their outputs made up for it or not (`Apart::soft_outputs`,
/// `Apart::soft_light`, `Apart::soft_repaid`).
const COPIED_ARC_KINDS: [(bool, bool, u32, bool); 6] = [
    (false, false, 0, false),
    (true, false, 0, false),
    (true, true, 30, false),
    (true, true, 70, false),
    (true, true, 30, true),
    (true, true, 70, true),
];

/// Arcs (`Apart::next`) of 1, 2, 4, … row groups per head, each arc holding its own copies of
/// the inputs it reads, where copies are tried: an arc of `m / (heads · groups)` PEs computes
/// its rows' scores, the softmax runs on the first PEs of the next arc and the outputs on the
/// others, so every PE does phase 1 of its own rows and phase 3 of the arc before it. With
/// parts apart (the lanes of [`copied_lanes`]) a lane's q/k PEs idle once its scores are done
/// and its v PEs until its first weights come; on arcs each PE's two phases follow one
/// another. Scores whole on one PE or crossing the arc column by column, at the softmax
/// counts of [`COPIED_ARC_SOFT`]. Not run where the schedule found so far, `best` cycles, is
/// within [`ARCS_GAP_PERCENT`] of the bound for programs with copies.
pub(crate) fn copied_arcs(p: &Problem, pes: u32, best: usize) -> Vec<(u32, Apart)> {
    if !schedule_split::copies_tried(p, pes) {
        return Vec::new();
    }
    let bound = p
        .shape()
        .bound_with_copies(pes, Normalisation::PerWeight)
        .map_or(0, |b| b.value);
    let best = u64::try_from(best).unwrap_or(u64::MAX);
    if best.saturating_mul(100) <= bound.saturating_mul(100 + ARCS_GAP_PERCENT) {
        return Vec::new();
    }
    let mut out = Vec::new();
    for groups in row_groups(p, pes, 2) {
        let r1 = pes / (p.heads * groups);
        let rows = p.tokens.div_ceil(groups);
        for soft in COPIED_ARC_SOFT {
            if soft > rows || soft + 1 > r1 {
                continue;
            }
            for (whole_scores, soft_outputs, soft_light, soft_repaid) in COPIED_ARC_KINDS {
                let lane = Apart {
                    next: true,
                    copies: true,
                    whole_scores,
                    soft_outputs,
                    soft_light,
                    soft_repaid,
                    ..Apart::columns(r1, soft, 0)
                };
                push_new(&mut out, (groups, lane));
            }
        }
    }
    out
}

/// A head's unmasked weights and its distinct scores (q = k without a mask computes each pair
/// once).
fn per_head(p: &Problem) -> (u64, u64) {
    let n = u64::from(p.tokens);
    let weights = if p.causal { n * (n + 1) / 2 } else { n * n };
    let scores = if p.symmetric && !p.causal {
        n * (n + 1) / 2
    } else {
        weights
    };
    (weights, scores)
}

/// How [`keep_shorter`] runs its lanes.
#[derive(Clone, Copy)]
enum Run {
    /// [`schedule_split::run_apart`].
    Plain,
    /// The inputs streamed in a fixed order ([`schedule_split::run_apart_keys_first`]).
    KeysFirst,
    /// Wanting a schedule below the best so far ([`schedule_split::run_apart_below`]): runs
    /// that cannot beat it stop once that is sure, and retries are seeded only by runs below it.
    Below,
}

/// `lanes` run as `how` says, kept in `best` with them if shorter; nothing to do for no lanes.
fn keep_shorter(
    p: &Problem,
    pes: u32,
    best: &mut (RingSchedule, Vec<(u32, Apart)>, (u32, Apart)),
    lanes: Vec<(u32, Apart)>,
    how: Run,
) {
    if lanes.is_empty() {
        return;
    }
    let run = match how {
        Run::Plain => schedule_split::run_apart(p, pes, &lanes),
        Run::KeysFirst => schedule_split::run_apart_keys_first(p, pes, &lanes),
        Run::Below => schedule_split::run_apart_below(p, pes, &lanes, best.0.cycles()),
    };
    if let Ok((o, won)) = run {
        if o.cycles() < best.0.cycles() {
            *best = (o, lanes, won);
        }
    }
}

/// Layouts `(row groups, lane)` worth simulating. Each kind of lane — v columns apart or on the
/// q/k PEs, one row group or several — gets the part lengths a rough estimate likes best: the
/// busiest part's work, or the words its busiest link forwards, plus the hops and chains a row
/// waits through. Its softmax PEs are then tried at that count and at a half and a quarter of
/// it: rows finish one after another, so a softmax PE's rows overlap the column parts' work
/// more than the estimate assumes, and each softmax PE adds a hop to every weight. On rings of
/// [`WIDE_SOFT_PES`] or more, small layers also try twice and four times that count: a lane
/// there leaves most PEs idle, and where the weights go on round the ring to the q/k PEs a
/// softmax PE adds no hop to them (it shortens their way back by one). Several row groups are tried only
/// where their estimate beats one group's.
pub(crate) fn candidates(p: &Problem, pes: u32) -> Vec<(u32, Apart)> {
    let large = p.necessary_ops() > LARGE_OPS;
    let mut best: Vec<(u64, u32, Apart)> = Vec::new();
    for groups in [1u32, 2, 4] {
        for wrap in [true, false] {
            if wrap && groups > 1 {
                continue;
            }
            if let Some((est, lane)) = best_lane(p, pes, groups, wrap, false) {
                best.push((est, groups, lane));
            }
        }
    }

    let one_group = best
        .iter()
        .filter(|b| b.1 == 1)
        .map(|b| b.0)
        .min()
        .unwrap_or(u64::MAX);
    let mut out: Vec<(u32, Apart)> = Vec::new();
    for (est, groups, lane) in best {
        if groups > 1 && est >= one_group {
            continue;
        }
        let ladder: &[u32] = if large { &[1] } else { &[1, 2, 4] };
        let mut softs: Vec<u32> = ladder.iter().map(|&k| (lane.soft / k).max(1)).collect();
        // On rings of 64 PEs or more the PEs a lane leaves idle cost nothing, and more softmax
        // PEs let later rows' maxima and exponentials run beside earlier rows' divisions: twice
        // and four times the estimate's count, as far as the rows and the lane's share allow.
        if !large && pes >= WIDE_SOFT_PES {
            let rows = p.tokens.div_ceil(groups);
            let room = (pes / (p.heads * groups).max(1)).saturating_sub(lane.r1 + lane.r3);
            for k in [2, 4] {
                softs.push((lane.soft * k).min(rows).min(room).max(1));
            }
        }
        for soft in softs {
            let c = (groups, Apart { soft, ..lane });
            push_new(&mut out, c);
        }
    }
    out.extend(row_lanes(p, pes));
    out
}

/// The lanes of `parts` (one row group, not one lane per row) with each softmax count from 1 to
/// [`MAX_SOFT_STEP`] (as far as the lane's rows and its share of the ring allow) that `parts`
/// does not already try, on layers up to [`LARGE_OPS`] operations (and the ring and head
/// sizes of [`MAX_SOFT_STEP`]). The estimate's ladder
/// (halves, quarters, doubles) skips counts such as 3, and which count wins depends on how the
/// rows' softmax work overlaps the columns', which the estimate does not model (8 tokens,
/// `d = 8` on 64 PEs: 115 cycles with the ladder's counts, 106 with 3 softmax PEs).
fn other_softmax_counts(p: &Problem, pes: u32, parts: &[(u32, Apart)]) -> Vec<(u32, Apart)> {
    if p.necessary_ops() > LARGE_OPS || pes < SOFT_STEP_PES || p.dim > SOFT_STEP_DIM {
        return Vec::new();
    }
    let mut out: Vec<(u32, Apart)> = Vec::new();
    for &(groups, lane) in parts {
        if groups != 1 || lane.spread {
            continue;
        }
        let room = (pes / p.heads.max(1)).saturating_sub(lane.r1 + lane.r3);
        for soft in 1..=MAX_SOFT_STEP.min(p.tokens).min(room) {
            let c = (groups, Apart { soft, ..lane });
            if !parts.contains(&c) && !out.contains(&c) {
                out.push(c);
            }
        }
    }
    out
}

/// Lanes whose phase 3 is cut by outputs over the v PEs (`Apart::cut3`), so that the v part
/// may have any length: one row group, all three parts, each part's busiest PE estimated
/// (phase 1 by its whole columns, the softmax by the rows dealt to it by weight, phase 3 evenly
/// cut) together with the words on the links into the softmax and v parts; the
/// [`CUT_LANES`] best. Tried on layers up to [`LARGE_OPS`] operations whose head has at
/// least as many PEs as columns and no more than [`CUT_MAX_PES`]: with whole columns the
/// PEs beyond the columns can only take the softmax, which leaves every v PE a column's
/// products (or two) while the softmax PEs idle.
fn cut_lanes(p: &Problem, pes: u32) -> Vec<(u32, Apart)> {
    best_cut_lanes(p, pes, false)
}

/// The softmax operations of the busiest of `soft` softmax PEs, the rows (of `len[row]`
/// unmasked scores) dealt to them by weight: per weight an exponential and a division, and with
/// a safe softmax a maximum for all but a row's first.
fn busiest_softmax_pe(p: &Problem, soft: u64, len: &[u64], safe: u64) -> u64 {
    let mut dealt = vec![0u64; soft as usize];
    let deal = schedule_split::deal_by_weight(p, soft as u32);
    for (&l, &pe) in len.iter().zip(&deal) {
        if let Some(x) = dealt.get_mut(pe as usize) {
            *x += 2 * l + safe * l.saturating_sub(1);
        }
    }
    dealt.iter().copied().max().unwrap_or(0)
}

/// The lanes of [`cut_lanes`] with the outputs of their shortest rows on the q/k PEs
/// (`Apart::qk_rows`): whole-column q/k PEs do only phase 1 and idle once it is done, while
/// the v PEs, starting only when the first weights arrive, end the schedule. Each lane is
/// estimated as [`cut_lanes`] estimates it, a q/k PE also doing its columns' products of the
/// rows it takes, for every count of them, and the [`CUT_LANES`] best with at least one such
/// row are returned. Same range as [`cut_lanes`], causal layers of one head only: the shortest
/// rows are the ones that finish last (`plan` takes the longest first), and with several heads
/// each head's weights and v words bound for its q/k PEs would cross every other head's lane
/// (16 tokens, `d = 8`, 4 heads on 64 PEs: 252 cycles without, 512 to 650 with the three best).
fn qk_row_lanes(p: &Problem, pes: u32) -> Vec<(u32, Apart)> {
    if !p.causal || p.heads != 1 {
        return Vec::new();
    }
    best_cut_lanes(p, pes, true)
}

/// The [`CUT_LANES`] best-estimated `cut3` lanes: without `qk_rows` the lanes of
/// [`cut_lanes`]; with it, for every count `k ≥ 1` of the shortest rows short of all of them,
/// those lanes with the `k` rows' outputs on the q/k PEs (each q/k PE also doing its columns'
/// products of them), as [`qk_row_lanes`] takes them.
fn best_cut_lanes(p: &Problem, pes: u32, qk_rows: bool) -> Vec<(u32, Apart)> {
    let (n, d) = (u64::from(p.tokens), u64::from(p.dim.max(1)));
    let per = u64::from(pes / p.heads.max(1));
    if p.necessary_ops() > LARGE_OPS || per < d + 2 || per > CUT_MAX_PES {
        return Vec::new();
    }
    let len: Vec<u64> = (0..p.tokens).map(|a| u64::from(p.keys_in_row(a))).collect();
    let weights: u64 = len.iter().sum();
    let scores = if p.symmetric && !p.causal {
        n * (n + 1) / 2
    } else {
        weights
    };
    // The weights of the shortest rows kept on the q/k PEs, 0 (none) for plain cut lanes.
    let mut taken: Vec<u64> = vec![0];
    if qk_rows {
        let mut shortest = len.clone();
        shortest.sort_unstable();
        taken = shortest
            .iter()
            .scan(0, |sum, &l| {
                *sum += l;
                Some(*sum)
            })
            // Not every row: the v PEs would have nothing to do.
            .take_while(|&t| t < weights)
            .collect();
    }
    let safe = u64::from(p.safe());
    let mut found: Vec<(u64, Apart)> = Vec::new();
    for r1 in 1..=d.min(per - 2) {
        let work1 = d.div_ceil(r1) * scores;
        for soft in 1..=(per - r1 - 1).min(n) {
            let work2 = busiest_softmax_pe(p, soft, &len, safe);
            let r3 = per - r1 - soft;
            for (k, &t) in taken.iter().enumerate() {
                let on_qk = work1 + d.div_ceil(r1) * t;
                let work3 = (d * (weights - t)).div_ceil(r3);
                let est = on_qk.max(work2).max(work3).max(scores).max(weights) + r1 + soft + r3;
                found.push((
                    est,
                    Apart {
                        cut3: true,
                        qk_rows: if qk_rows { k as u32 + 1 } else { 0 },
                        ..Apart::columns(r1 as u32, soft as u32, r3 as u32)
                    },
                ));
            }
        }
    }
    found.sort_by_key(|f| f.0);
    found.truncate(CUT_LANES);
    found.into_iter().map(|(_, lane)| (1, lane)).collect()
}

/// With q = k = v the x words bound for the v columns are inputs, ready in cycle 0: they can
/// cross the softmax PEs while the scores are still being summed, which [`candidates`]'
/// estimate charges as if they came after. The lane estimated with them overlapping, at its
/// softmax count and half of it (one run on large layers); empty for other layers.
fn overlapped(p: &Problem, pes: u32) -> Vec<(u32, Apart)> {
    if !p.shared_values {
        return Vec::new();
    }
    let Some((_, lane)) = best_lane(p, pes, 1, false, true) else {
        return Vec::new();
    };
    let ladder: &[u32] = if p.necessary_ops() > LARGE_OPS {
        &[1]
    } else {
        &[1, 2]
    };
    let mut out: Vec<(u32, Apart)> = Vec::new();
    for &k in ladder {
        let c = (
            1,
            Apart {
                soft: (lane.soft / k).max(1),
                ..lane
            },
        );
        push_new(&mut out, c);
    }
    out
}

/// Lanes whose rows each take their softmax and their outputs on a softmax PE of their own
/// (`Apart::local_v`): the v rows stream from the q/k PEs past the softmax PEs, `n·d` words,
/// and no weight leaves the PE that divides it, where the other lanes send the `n²` weights
/// (and with q = k = v the x rows as well) over the link into the v columns. Tried on rings of
/// [`LOCAL_V_PES`] or more with `d ≤ 2n` (a softmax PE then does about `n·d` products of its
/// row beside `3n` softmax operations), up to 30 000 operations or, with `d ≤ n/2`, 300 000,
/// at a softmax PE per row and at half as many.
fn local_v_lanes(p: &Problem, pes: u32) -> Vec<(u32, Apart)> {
    let (n, d) = (p.tokens, p.dim.max(1));
    // Larger layers only where a row's products are few against its scores (32 tokens, d = 8,
    // 4 heads on 256 PEs: 975 cycles before, 887 with these lanes).
    let ops = p.necessary_ops();
    if pes < LOCAL_V_PES || d > 2 * n || ops > AUTO_OPS || (ops > LARGE_OPS && 2 * d > n) {
        return Vec::new();
    }
    let per = pes / p.heads.max(1);
    let mut out = Vec::new();
    for soft in [n, n.div_ceil(2)] {
        let r1 = d.min(per.saturating_sub(soft));
        if r1 == 0 {
            continue;
        }
        let c = (
            1,
            Apart {
                local_v: true,
                ..Apart::columns(r1, soft, 0)
            },
        );
        push_new(&mut out, c);
    }
    out
}

/// The lanes of [`local_v_lanes`] with a helper PE after each softmax PE (`Apart::helper`)
/// taking the last half of each of its rows' output columns. On those lanes a row's softmax
/// PE does all `n·d` products of its row after its softmax, so the last rows finish well after
/// the link into the softmax PEs has drained (16 tokens, `d = 8` on 256 PEs: the link carries
/// its 264 words by cycle 263, the softmax PEs end at 274 to 304). A helper halves that tail
/// for one more hop per softmax PE on the words that stream past them and one link for the
/// row's weights. One run, kept only when shorter.
fn helper_lanes(p: &Problem, pes: u32) -> Vec<(u32, Apart)> {
    let d = p.dim;
    let per = pes / p.heads.max(1);
    let keep = (d / 2).max(1);
    // Separate q, k, v without a mask gained nowhere measured (4 to 16 tokens, `d = 8`, on 16
    // to 256 PEs): their lanes with a v part are shorter there.
    if d < 2 || (!p.shared_values && !p.causal) {
        return Vec::new();
    }
    local_v_lanes(p, pes)
        .into_iter()
        .filter(|&(_, lane)| lane.r1 + 2 * lane.soft <= per)
        .map(|(groups, lane)| {
            (
                groups,
                Apart {
                    helper: 1,
                    keep_v: keep,
                    ..lane
                },
            )
        })
        .collect()
}

/// One lane per row, each k and v row homed in its own row's lane (`Apart::spread`): every
/// lane computes one row's scores, softmax and outputs while the k and v rows stream round
/// the ring past all of them. Each link then forwards about `2·n·d` words of k and v, where
/// the lanes above gather a head's `n²` scores into its softmax PEs, so it is tried only with
/// separate q, k and v (q = k = v rows would stream too), no mask (causal rows are short, the
/// gather small) and `2·n·d ≤ n²`. Each lane is a softmax PE between q/k and v column runs
/// of about equal length (measured best on 16 and 32 tokens, `d = 8`, on 64 and 256 PEs: 306
/// and 602 cycles, against 318 and 638 for the row dataflow).
fn row_lanes(p: &Problem, pes: u32) -> Vec<(u32, Apart)> {
    let (n, d) = (p.tokens, p.dim.max(1));
    if p.symmetric || p.shared_values || p.causal || 2 * u64::from(d) > u64::from(n) {
        return Vec::new();
    }
    let per = pes / (p.heads * n).max(1);
    if per < 3 {
        return Vec::new();
    }
    let half = (per - 1).div_ceil(2);
    let mut out = Vec::new();
    for r1 in [half, per - 1 - half] {
        let (r1, r3) = (r1.clamp(1, d), (per - 1 - r1).clamp(1, d));
        let c = (
            n,
            Apart {
                spread: true,
                ..Apart::columns(r1, 1, r3)
            },
        );
        push_new(&mut out, c);
    }
    out
}

/// A lane per row of two PEs: one computing the row's scores whole (its q row preloaded there,
/// every k row streaming past), one taking its softmax and half of its outputs (every v row
/// streaming past), the other half on the next lane's q/k PE, which has finished its own scores
/// by the time the weights come (`Apart::local_v`, `Apart::keep_v`). The k and v rows are
/// preloaded in the head's first lane and stream one way through its lanes, k rows first, in
/// order (`schedule_split::run_apart_keys_first`), so nothing goes round the ring: each link
/// carries the head's `2·n·d` input words and one row's `n` scores. Where a head has under 3
/// PEs per row, the lanes above either gather all `n²` scores into few softmax PEs or (the row
/// dataflow) send each cut row's maximum and sum round the whole ring: 32 tokens, `d = 8`, 4
/// heads on 256 PEs take 966 cycles with the row dataflow (every link carrying 784 words) and
/// 670 with these lanes. Tried with separate q, k and v, where the `2·n·d` words are no more
/// than the unmasked scores (`2d ≤ n`, causal `4d ≤ n + 1`: fewer rows gather fewer scores,
/// 16 tokens, 4 heads on 256 PEs took 332 against 318, causal 268 against 199) and at least 2
/// PEs per row and head.
fn pair_lanes(p: &Problem, pes: u32) -> Vec<(u32, Apart)> {
    let (n, d) = (p.tokens, p.dim.max(1));
    // Each link carries the head's `2·n·d` k and v words, where lanes gathering a head's
    // scores into few softmax PEs put its unmasked scores on one link.
    let weights = p.shape().weights_per_head().unwrap_or(u64::MAX);
    if p.symmetric
        || p.shared_values
        || 2 * u64::from(n) * u64::from(d) > weights
        || p.necessary_ops() > AUTO_OPS
        || pes / (p.heads * n).max(1) < 2
    {
        return Vec::new();
    }
    vec![(
        n,
        Apart {
            local_v: true,
            keep_v: d / 2,
            ..Apart::columns(1, 1, 0)
        },
    )]
}

/// Under a causal mask, [`pair_lanes`] with the rows laid along the ring from the last
/// (`Apart::rows_from_last`): the last row's lane first, the k and v rows preloaded there and
/// streaming on through the lanes of shorter rows. Laid from the first row, every k and v row
/// crosses every lane on its way to the last one, which reads them all (32 tokens, `d = 8` on
/// 64 PEs: 512 words on every link, 556 cycles); from the last, the link into a row's lane
/// carries only the rows it and the lanes after it read, fewer lane by lane, and the first
/// lane, holding them all, starts at once (550 cycles). What is left is the link into the
/// second lane, which still carries nearly all `2·n·d` words: every layout of one row per lane
/// has such a link (docs/scheduling.md).
fn reversed_pair_lanes(p: &Problem, pes: u32) -> Vec<(u32, Apart)> {
    if !p.causal {
        return Vec::new();
    }
    pair_lanes(p, pes)
        .into_iter()
        .map(|(groups, lane)| {
            (
                groups,
                Apart {
                    rows_from_last: true,
                    ..lane
                },
            )
        })
        .collect()
}

/// Under a causal mask, the lane `won` (one row group, two or more softmax PEs, rows dealt in
/// turn) with its rows dealt from the last softmax PE back in the order they finish
/// (`Apart::soft_from_last`), at its softmax count and one more. Rows finish longest first, and
/// dealt from the first softmax PE the first row's weights leave by the links that carry every
/// later row's scores to the other softmax PEs, behind them: 16 tokens, `d = 8` on 64 PEs, the
/// first row's divisions ran at cycles 40–55 and its first weight reached the v PEs at cycle 56
/// (199 cycles); dealt from the last, at 44 (196 cycles). The lane is then bound by its links: all `W`
/// scores leave the last q/k PE one a cycle and all `W` weights enter the v part one a cycle,
/// the first of them about `2n` cycles after the first score (the longest row's scores and its
/// exponentials), so about `d + W + 2n` cycles in all (docs/scheduling.md).
fn soft_from_last(p: &Problem, pes: u32, won: (u32, Apart)) -> Vec<(u32, Apart)> {
    let (groups, lane) = won;
    // Not on wider heads: none of the causal `d = 64` layers tried (8 to 16 tokens on 16, 64
    // and 256 PEs) moved, and the run costs a fifth more compile time there.
    if !p.causal
        || p.dim > SOFT_STEP_DIM
        || groups != 1
        || lane.soft < 2
        || lane.local_v
        || lane.spread
        || lane.cut3
        || lane.next
        || lane.soft_from_last
    {
        return Vec::new();
    }
    let room = (pes / p.heads.max(1)).saturating_sub(lane.r1 + lane.r3);
    let mut out: Vec<(u32, Apart)> = Vec::new();
    for soft in [lane.soft, lane.soft + 1] {
        if soft > p.tokens || soft > room {
            continue;
        }
        out.push((
            1,
            Apart {
                soft,
                soft_from_last: true,
                ..lane
            },
        ));
    }
    out
}

/// Lanes for layers of a few tokens, where the last row's softmax and phase 3 are the
/// critical path: its scores finish on the last q/k PE one chain after another, and in the
/// lanes above its softmax waits a hop for them, its weights cross the other rows' softmax PEs
/// before the first v PE, and each v PE does `n` products of every output it holds. Here
/// (`Apart::tuck`) the softmax part starts on the last q/k PE, one softmax PE per row, the
/// rows dealt from the last softmax PE back in the order they finish (`soft_from_last`), so the
/// last row takes its softmax where its scores end. The v part starts `v_back` PEs (1, `n − 1`
/// or `n`) before the softmax part's end, the softmax PEs taking phase-3 products once their
/// rows are divided, and spans `r1/2 + n − 1` to `r1/2 + n + 1` PEs, its outputs cut row by
/// row with the last row's first (`Apart::late_near`), by column (`cut3`), fractionally
/// (`frac`) or by whole columns. Returned as one run per `(r3, v_back)` of those four cuts:
/// all in one run, the retries went to the three best plain runs and missed the lane a run of
/// its own finds (4 tokens, `d = 8` on 16 PEs: 48 cycles in one run, 44 in runs of four).
/// Tried on one row group of 2 to [`TUCK_MAX_TOKENS`] tokens, heads of at most
/// [`SOFT_STEP_DIM`] columns (at `d = 64` and 128 the small-shapes table gained a cycle on 5
/// layers for up to 3 × the compile time) and layers up to [`LARGE_OPS`] operations, with the
/// winning lane's q/k PEs; none where that lane has none of its own (`next`, or softmax PEs
/// before the q/k PEs).
fn tucked_lanes(p: &Problem, pes: u32, won: (u32, Apart)) -> Vec<Vec<(u32, Apart)>> {
    let (groups, lane) = won;
    let n = p.tokens;
    if !(2..=TUCK_MAX_TOKENS).contains(&n)
        || p.necessary_ops() > LARGE_OPS
        || p.dim > SOFT_STEP_DIM
        || groups != 1
        || lane.next
        || lane.soft_before
        || lane.r1 < 2
    {
        return Vec::new();
    }
    let per = pes / p.heads.max(1);
    let r1 = lane.r1;
    let mut runs: Vec<Vec<(u32, Apart)>> = Vec::new();
    for r3 in [r1 / 2 + n - 1, r1 / 2 + n, r1 / 2 + n + 1] {
        for v_back in [1, n - 1, n] {
            let mut out: Vec<(u32, Apart)> = Vec::new();
            let base = Apart {
                tuck: true,
                soft_from_last: true,
                v_back,
                ..Apart::columns(r1, n, r3)
            };
            for c in [
                Apart {
                    cut3: true,
                    late_near: true,
                    ..base
                },
                Apart { frac: true, ..base },
                Apart { cut3: true, ..base },
                base,
            ] {
                if c.len() <= per {
                    push_new(&mut out, (1, c));
                }
            }
            if !out.is_empty() && !runs.contains(&out) {
                runs.push(out);
            }
        }
    }
    runs
}

/// With q = k = v, lanes whose first `near` columns keep their phase 3 on their q/k PEs
/// (`Apart::near`), the weights going on round the ring to them, while the other columns'
/// phase 3 runs on `r3` PEs after the softmax PEs, their x words crossing to it. Either way
/// alone has a floor: the weights' trip round the ring is about `m` cycles after the scores,
/// and the x words crossing the softmax PEs' links are `n·d`; splitting the columns lets each
/// take part. Each lane is the one the estimate likes best for its `near`, the estimate being
/// the later of the two kinds of column (the round trip to the last near PE, or the crossing
/// words and the hops after them); the best `count` of those are returned.
fn near_lanes(p: &Problem, pes: u32, count: usize) -> Vec<(u64, u32, Apart)> {
    if !p.shared_values {
        return Vec::new();
    }
    let (n, d) = (u64::from(p.tokens), u64::from(p.dim.max(1)));
    let (weights, scores) = per_head(p);
    let heads = u64::from(p.heads.max(1));
    let per = u64::from(pes) / heads;
    let mut widths: Vec<u64> = (1..=d).map(|c| d.div_ceil(c)).collect();
    widths.dedup();
    let step = (d / 16).max(1);
    let mut found: Vec<(u64, u32, Apart)> = Vec::new();
    for near in (step..d).step_by(step as usize) {
        let far = d - near;
        let mut far_widths: Vec<u64> = (1..=far).map(|c| far.div_ceil(c)).collect();
        far_widths.dedup();
        let mut best: Option<(u64, Apart)> = None;
        for soft in 1..=n {
            let work2 = n.div_ceil(soft) * 3 * n;
            for &r1 in &widths {
                let near_pes = (near * r1).div_ceil(d);
                for &r3 in &far_widths {
                    if r1 + soft + r3 > per {
                        continue;
                    }
                    let cols = d.div_ceil(r1);
                    let work1 = scores * cols;
                    let tail = d + 2 * soft + 4 * n;
                    // The near PEs wait for the weights' trip round the whole ring.
                    let hops = u64::from(pes) - r1 - soft + near_pes;
                    let wrap = (work1 + weights * cols).max(work2) + tail + hops;
                    // Every head's weights pass every link; the far columns' x words cross
                    // into their PEs from cycle 0.
                    let link = n * far + weights * heads;
                    let apart = (work1.max(weights * far.div_ceil(r3)).max(work2) + tail + r3)
                        .max(link + 2 * soft + r3);
                    let est = wrap.max(apart);
                    let lane = Apart {
                        near: near as u32,
                        ..Apart::columns(r1 as u32, soft as u32, r3 as u32)
                    };
                    if best.is_none_or(|(e, _)| est < e) {
                        best = Some((est, lane));
                    }
                }
            }
        }
        if let Some((est, lane)) = best {
            found.push((est, 1, lane));
        }
    }
    // Where all x words crossing beside phase 1 is estimated no later, the split gains
    // nothing: the trip round the ring is then the longer way by far (8 tokens, `d = 8` on 256
    // PEs: 124 cycles with all words crossing, 366 at best split).
    let crossing = best_lane(p, pes, 1, false, true).map_or(u64::MAX, |b| b.0);
    found.retain(|f| f.0 < crossing);
    found.sort_by_key(|f| f.0);
    found.truncate(count);
    found
}

/// Lanes with fractional columns (`Apart::frac`): each column part's products cut evenly over
/// its PEs, a column's rows split between neighbouring PEs where the cut falls inside it.
/// Whole columns tie each part to a count of PEs that suits `d`: 1 head, 32 tokens, `d = 128`
/// on 256 PEs cannot give both parts a PE per column, and its best whole-column lane (the v
/// columns on the q/k PEs, each PE doing both phases of a column) takes 2240 cycles, where
/// 128 q/k PEs, 3 softmax PEs and 125 v PEs take about 1040 products each (1407 cycles).
///
/// The softmax PEs are as few as keep pace with the rows leaving the q/k part (each takes
/// three operations per weight of the rows dealt to it). The q/k part gets a count near the
/// products' share of the PEs that divides `d` where there is one (every row then takes the
/// same pace through every q/k PE), else the share and one more (a score's partial sum visits
/// the q/k PEs one after another, so that part needs the slack more than the v part, whose PEs
/// forward each weight before they use it). On layers up to [`LARGE_OPS`] operations the
/// share and one more, the share, and one more softmax PE are tried too. Forced, 32 tokens,
/// `d = 128`, causal on 256 PEs: 907 cycles with 128, 3, 125 PEs; 968 with 127, 3, 126; 997
/// with 126, 3, 127; 992 with 127, 4, 125; 938 with 129, 3, 124. Each link of a part forwards
/// about a word per product of its PEs (a partial sum, a weight), so only lanes whose
/// estimate, those words counted, beats whole columns' (which does not count them) are
/// returned. Not with q = k = v: the x words bound for the v part would cross the softmax PEs,
/// `n·d` of them (32 tokens, `d = 128`: 5838 cycles against 1966).
fn frac_lanes(p: &Problem, pes: u32) -> Vec<(u32, Apart)> {
    let (n, d) = (u64::from(p.tokens), u64::from(p.dim.max(1)));
    let per = u64::from(pes) / u64::from(p.heads.max(1));
    if p.shared_values || per < 3 {
        return Vec::new();
    }
    let (weights, scores) = per_head(p);
    let est = |r1: u64, soft: u64, r3: u64| -> u64 {
        // A row's products of a column are the cut's grain.
        let work1 = (scores * d).div_ceil(r1) + n;
        let work3 = (weights * d).div_ceil(r3) + n;
        let work2 = (3 * weights).div_ceil(soft) + 3 * n;
        let link = if r1 > 1 { scores } else { 0 }.max(weights);
        work1.max(work3).max(work2).max(link) + d.min(r1) + 2 * soft + r3 + 4 * n
    };
    let share = |soft: u64| (per.saturating_sub(soft) * scores) / (scores + weights).max(1);
    // Rows leave the q/k part about every `scores·d / (n·r1)` cycles, and take `3·weights / n`
    // operations each on their softmax PE.
    let r1 = share(1).max(1);
    let soft = (3 * weights * r1).div_ceil(scores * d).clamp(1, n);
    let mut tries = vec![(share(soft) + 1, soft), (share(soft), soft)];
    if soft < n {
        tries.push((share(soft + 1) + 1, soft + 1));
    }
    // A q/k part of whole columns, where one near the share divides `d`, goes first: every
    // row then takes the same pace through every q/k PE, and only the v part is cut.
    let near = share(soft);
    if let Some(whole) = (near.saturating_sub(near / 16).max(1)..=near + 2)
        .rev()
        .find(|&r1| r1 <= d && d % r1 == 0)
    {
        tries.insert(0, (whole, soft));
    }
    if p.necessary_ops() > LARGE_OPS {
        tries.truncate(1);
    }
    let whole = [true, false]
        .into_iter()
        .filter_map(|wrap| best_lane(p, pes, 1, wrap, false).map(|b| b.0))
        .min()
        .unwrap_or(u64::MAX);
    let mut out: Vec<(u32, Apart)> = Vec::new();
    for (r1, soft) in tries {
        let Some(r3) = per.checked_sub(r1 + soft).filter(|&r3| r3 >= 1 && r1 >= 1) else {
            continue;
        };
        let lane = (1, frac_lane(r1, soft, r3));
        if est(r1, soft, r3) < whole && !out.contains(&lane) {
            out.push(lane);
        }
    }
    out
}

/// With q = k and no mask, `lanes` with each pair's score computed with its smaller row
/// (`Apart::smaller_row`); empty for other layers and for fractional lanes. Computed with its
/// larger row, as the other lanes do, a pair waits for the later of its two rows, so row 0's
/// last score is row `n − 1`'s turn and no row's softmax starts before phase 1 ends: on the
/// lanes whose weights go on round the ring to the q/k PEs the whole trip round the ring then
/// follows phase 1 (16 tokens, `d = 64` on 256 PEs: first weight at cycle 204, 713 cycles).
/// With its smaller row, row `a` computes the `n − a` pairs from `a` on, so row 0's scores
/// are done after `n` of them and the rows complete one after another (641 cycles there). It
/// is a run of its own over the lanes that gave the schedule, kept only when shorter: the
/// rows' work is front-loaded (row 0 has `n` scores, the last row one), and on some lanes
/// that costs more than it gains (2 tokens, `d = 128`, 4 heads on 256 PEs: 297 → 310).
///
/// Each lane also comes with [`SMALLER_ROW_SOFT`] times its softmax PEs, as far as its rows
/// and its head's share of the ring allow: with rows completing early their softmax work
/// overlaps phase 1, and more softmax PEs let several rows' weights leave at once (8 tokens,
/// `d = 64` on 256 PEs: 415 cycles at 2 softmax PEs, 387 at 4; 12 tokens, 4 heads: 997 at 1 a
/// head, 962 at 4).
fn pairs_by_smaller_row(p: &Problem, pes: u32, lanes: &[(u32, Apart)]) -> Vec<(u32, Apart)> {
    if !p.symmetric || p.causal {
        return Vec::new();
    }
    let mut out: Vec<(u32, Apart)> = Vec::new();
    for &(groups, lane) in lanes.iter().filter(|(_, lane)| !lane.frac) {
        let rows = p.tokens.div_ceil(groups.max(1));
        let room = (pes / (p.heads * groups).max(1)).saturating_sub(lane.r1 + lane.r3);
        for k in SMALLER_ROW_SOFT {
            let soft = (lane.soft * k).min(rows).min(room).max(lane.soft);
            let c = (
                groups,
                Apart {
                    smaller_row: true,
                    soft,
                    ..lane
                },
            );
            push_new(&mut out, c);
        }
    }
    out
}

/// With q = k = v, the lane `won` (one row group, v columns apart, whole columns) with its
/// last `k` columns held whole by one softmax PE for both phases (`Apart::on_soft`), for a
/// few `k`. Every other column's x words go from its q/k PE over the links into and out of the
/// softmax PEs to its v PE: `n·d` words on those two links, and on large rings they set the
/// pace (4 tokens, `d = 64` on 256 PEs: 272 words on the link out of the softmax PE, 289
/// cycles). A column held by the softmax PE moves none of its `n` words; the price is its
/// products (`scores + weights` of them) on that PE, beside every row's softmax. So `k` is
/// kept where the softmax PE's work, from the first score's arrival (about `r1` cycles in),
/// still fits in the time the remaining words take to cross.
fn soft_columns(p: &Problem, won: (u32, Apart)) -> Vec<(u32, Apart)> {
    let (groups, lane) = won;
    // Not with `near` columns: their weights' trip round the ring sets the pace there, and
    // the softmax PE's products only delay the weights (4 tokens, `d = 128` on 256 PEs: 347
    // cycles, 397 with 4 columns on the softmax PE).
    if !p.shared_values
        || groups != 1
        || lane.near > 0
        || lane.r3 == 0
        || lane.frac
        || lane.cut3
        || lane.local_v
        || lane.spread
        || lane.on_soft > 0
    {
        return Vec::new();
    }
    let (n, d) = (u64::from(p.tokens), u64::from(p.dim));
    let weights = p.shape().weights_per_head().unwrap_or(u64::MAX);
    let scores = if p.symmetric && !p.causal {
        n * (n + 1) / 2
    } else {
        weights
    };
    // Maximum (safe), exponential and division per weight.
    let softmax = (2 + u64::from(p.safe())) * weights;
    // The most columns for which `r1 + softmax + k·(scores + weights)`, the softmax PE's
    // work from the first score's arrival, stays within `n·(d − k) + weights`, the words
    // still crossing; then two thirds and a third of that (measured on 2 to 4 tokens, `d = 64`
    // and 128, on 256 PEs, the best count was at or below the estimate's).
    let room = (n * d + weights).saturating_sub(u64::from(lane.r1) + softmax);
    let most = room / (scores + weights + n).max(1);
    let mut out: Vec<(u32, Apart)> = Vec::new();
    for k in [most, (2 * most).div_ceil(3), most.div_ceil(3)] {
        if k == 0 || k >= d {
            continue;
        }
        let c = (
            1,
            Apart {
                soft: 1,
                on_soft: k as u32,
                ..lane
            },
        );
        push_new(&mut out, c);
    }
    out
}

/// Softmax PEs and tapers ([`Apart::taper`]) of the arcs [`next_lanes`] tries: over 4 heads
/// on 256 PEs (8 to 16 tokens, `d = 64` and 128, causal or not) each of these was the best of
/// the softmax counts 2, 3, 4, 6, 8 and tapers 0, 16, 32 on some layer, and which wins follows
/// no rule the layers show.
const NEXT_ARCS: [(u32, u32); 4] = [(2, 0), (4, 0), (3, 32), (6, 32)];

/// Arcs of `m / heads` PEs, one per head, each holding its head's q and k columns
/// (`Apart::next`): a head's softmax runs on the first PEs of the next arc and its outputs on
/// the others, so every PE does phase 1 of its own head and the softmax or phase 3 of the head
/// before. A run of PEs that is not the whole ring is not a ring: a score's chain must enter
/// the arc at its first PE (a q or k word is preloaded on one PE, so all chains of a head visit
/// a column on the same PE, in ring order), so the arc's phase 1 is a flow shop, PE `j` busy
/// from cycle `j` on. With parts apart (the lanes of [`candidates`]) a head's q/k PEs then idle
/// once its scores are done and its v PEs until its first weights come (4 heads, 8 tokens,
/// `d = 64` on 256 PEs: 32 q/k PEs, 2 softmax PEs and 30 v PEs, each busy about half of 257
/// cycles); on arcs the phase-1 PEs take the previous head's weights as they come, and
/// nothing but the last head's softmax and weights crosses the wrap (215 cycles there). Tried
/// with separate q, k and v (with q = k = v the x rows would be read on two arcs, every one
/// of them crossing a whole arc) on rings of at least 2 heads whose arcs hold a whole number
/// of columns each.
fn next_lanes(p: &Problem, pes: u32) -> Vec<(u32, Apart)> {
    let (n, d) = (p.tokens, p.dim.max(1));
    let per = pes / p.heads.max(1);
    if p.heads < 2 || p.shared_values || per < 2 || per > d || d % per != 0 {
        return Vec::new();
    }
    let mut out: Vec<(u32, Apart)> = Vec::new();
    for (soft, taper) in NEXT_ARCS {
        let soft = soft.min(n).min(per - 1).max(1);
        let c = (
            1,
            Apart {
                next: true,
                taper,
                ..Apart::columns(per, soft, 0)
            },
        );
        push_new(&mut out, c);
    }
    out
}

/// Softmax PE counts of the lanes [`scores_round_lanes`] tries.
const SCORES_ROUND_SOFT: [u32; 3] = [1, 2, 3];
/// The shortest arc [`scores_round_lanes`] tries: of every q = k = v layer of the small-shapes
/// table with 4 heads on 16 and 64 PEs (arcs of 4 and 16 PEs) none gained.
const SCORES_ROUND_MIN_ARC: u32 = 32;

/// With q = k = v and several heads, arcs of `m / heads` PEs, one per head, that take phase 1
/// and phase 3 of their own head on the PEs holding its x columns, with the head's softmax PEs
/// first on the arc and its q/k PEs after them (`Apart::soft_before`): the scores go on round
/// the ring to the softmax PEs and the weights cross one link into the q/k PEs. An x word is
/// read before and after its row's softmax, so with no word crossing the softmax PEs' links
/// every head's words go once round the ring either way; the lanes of [`candidates`] whose v
/// columns are on the q/k PEs send the weights round, `n²` words a head, on every link for
/// every head (8 tokens, `d = 64`, 4 heads on 256 PEs: 292 words on every link, after a trip
/// of about 222 hops: 622 cycles). Sending the scores round instead puts `n(n+1)/2` words a head (q = k
/// without a mask computes each pair once; under a causal mask as many as the weights) on
/// the links of the other heads' arcs, and the weights only on the head's own (208 words a
/// link there: 442 cycles). Each softmax count of [`SCORES_ROUND_SOFT`], with whole columns
/// (at most one a PE) and with fractional ones over all of the arc's other PEs. One head gains
/// nothing (its weights are the only words round the ring: 8 tokens, `d = 64` on 256 PEs,
/// 421 cycles at best against 387), nor do separate q, k and v (whose v part needs no loop:
/// the arcs of [`next_lanes`]); tried with q = k = v and at least 2 heads on arcs of
/// [`SCORES_ROUND_MIN_ARC`] PEs or more, with at least half as many columns as PEs (with
/// `d = 8` and 16, 4 heads on 256 PEs, none gained).
fn scores_round_lanes(p: &Problem, pes: u32) -> Vec<(u32, Apart)> {
    let d = p.dim.max(1);
    let per = pes / p.heads.max(1);
    let mut out: Vec<(u32, Apart)> = Vec::new();
    if !p.shared_values || p.heads < 2 || per < SCORES_ROUND_MIN_ARC || 2 * d < per {
        return out;
    }
    for soft in SCORES_ROUND_SOFT {
        for frac in [false, true] {
            let room = per.saturating_sub(soft);
            let r1 = if frac { room } else { room.min(d) };
            if r1 == 0 || soft > p.tokens {
                continue;
            }
            let c = (
                1,
                Apart {
                    soft_before: true,
                    frac,
                    ..Apart::columns(r1, soft, 0)
                },
            );
            push_new(&mut out, c);
        }
    }
    out
}

/// Adds lane `c` to `out` unless it is there (lanes built by several formulas coincide).
fn push_new(out: &mut Vec<(u32, Apart)>, c: (u32, Apart)) {
    if !out.contains(&c) {
        out.push(c);
    }
}

fn frac_lane(r1: u64, soft: u64, r3: u64) -> Apart {
    Apart {
        frac: true,
        ..Apart::columns(r1 as u32, soft as u32, r3 as u32)
    }
}

/// The lane of `groups` row groups per head (v columns on the q/k PEs when `wrap`) with the
/// lowest estimate, and that estimate; `None` when no lane fits. With `overlap` the words the
/// links forward are taken to flow beside the column parts' work rather than before it.
fn best_lane(
    p: &Problem,
    pes: u32,
    groups: u32,
    wrap: bool,
    overlap: bool,
) -> Option<(u64, Apart)> {
    let (n, d) = (u64::from(p.tokens), u64::from(p.dim.max(1)));
    if groups > p.tokens {
        return None;
    }
    let (weights, scores) = per_head(p);
    let lanes = p.heads * groups;
    let per = u64::from(pes / lanes.max(1));
    let g = u64::from(groups);
    let rows = n.div_ceil(g);
    // Words the busiest link forwards: with several groups the k and v rows (preloaded in the
    // first) cross every link up to the last; with q = k = v and v columns apart the x rows
    // cross from the q/k part to the v part; with v on the q/k PEs every head's weights go
    // round the whole ring.
    let link = if wrap {
        weights * u64::from(lanes)
    } else {
        let replicated = if groups > 1 { 2 * n * d } else { 0 };
        let shared_x = if p.shared_values { n * d } else { 0 };
        replicated.max(shared_x)
    };
    // Column counts per PE worth trying: each gives the fewest PEs holding that many.
    let mut widths: Vec<u64> = (1..=d).map(|c| d.div_ceil(c)).collect();
    widths.dedup();
    let r3s: Vec<u64> = if wrap { vec![0] } else { widths.clone() };
    let mut best: Option<(u64, Apart)> = None;
    for soft in 1..=rows {
        // Maximum, exponential and division per weight of the rows a softmax PE takes.
        let work2 = rows.div_ceil(soft) * 3 * n;
        for &r1 in &widths {
            for &r3 in &r3s {
                if r1 + soft + r3 > per {
                    continue;
                }
                let work1 = scores.div_ceil(g) * d.div_ceil(r1);
                let (work, hops) = if wrap {
                    (work1 + weights * d.div_ceil(r1), u64::from(pes) - r1 - soft)
                } else {
                    (work1.max(weights.div_ceil(g) * d.div_ceil(r3)), r3)
                };
                let tail = d + 2 * soft + hops + 4 * n;
                let est = if overlap {
                    (work.max(work2) + tail).max(link + 2 * soft + hops)
                } else {
                    work.max(link).max(work2) + tail
                };
                let lane = Apart::columns(r1 as u32, soft as u32, r3 as u32);
                if best.is_none_or(|(e, _)| est < e) {
                    best = Some((est, lane));
                }
            }
        }
    }
    best
}
