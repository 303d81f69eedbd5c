//! `schedule-split`: every axis in parallel, for rings larger than the work and for `n ≈ m`.
//!
//! The row dataflow gives each PE whole scores, so with fewer scores than PEs most of the ring
//! idles, and its phases meet at row hand-offs. This pass splits along every axis instead:
//!
//! * **Lanes.** The ring is cut into `L` lanes of `r` consecutive PEs; a lane is one head and one
//!   group of query rows (rows cut by their weight counts). With one lane (one head, `d` columns
//!   spread over the whole ring) it is the paper's structure: a score's partial sum starts on any
//!   PE and goes round the ring, so scores land evenly on every PE.
//! * **Columns.** Within a lane, feature `c` of `q`, `k` and `v` lives on one PE (contiguous
//!   blocks), so each score's `d` products are split over the lane's PEs and the partial sum
//!   travels with `send acc`, which costs no cycle. With several lanes the softmax counts as one
//!   more column on the lane's last PE (its work, `2W`, equals one column's phase-1 plus phase-3
//!   work), where all the lane's scores land; phase 3 of lane `l` runs on lane `l + 1`'s PEs,
//!   so weights only travel forward through one lane.
//! * **Row sums** are chains over the PEs where the row's scores landed; the finished sum (and,
//!   for a safe softmax, the row maximum before it) travels to the others for the divisions.
//!   On the ring-spanning lane that is nearly a whole trip round the ring per row, so it is also
//!   tried with each row's landings, exponentials and divisions on runs of PEs one after another
//!   (`Layout::forward`), in a search of its own; the shorter schedule is kept.
//! * **No phase barriers.** Every accumulation is a chain whose terms a PE takes in any order
//!   (the verifier proves sums as multisets of terms). A cycle-by-cycle list scheduler runs every
//!   PE's ready operation of highest static priority (longest remaining path, ring hops
//!   included), and every link's most urgent waiting word, so a finished row's softmax and its
//!   weights overlap other rows' products. The simulated timeline is the schedule, so the
//!   predicted cycle count is exact.
//!
//! Several lane counts, and on small layers priorities perturbed by a fixed pseudo-random
//! sequence, are tried; the shortest schedule is kept, and on small layers a local search then
//! changes a few of its landings and priorities at a time, within a fixed budget of simulation
//! work (so the result does not depend on the machine). `select` keeps it only where it beats the
//! other schedules.

use crate::ir::Tensor;
use crate::passes::select::{Culprit, Refusal};
use crate::problem::{Inputs, Problem};
use crate::schedule::{Builder, Element, RingSchedule, ScheduleError, Val, Work};
use crate::scheduler::Scheduler;
use cranelift_entity::EntityRef;
use rustc_hash::FxHashMap as HashMap;

mod book;
mod ready;

use book::{Book, Tally};

pub const NAME: &str = "schedule-split";
pub const DESCRIPTION: &str =
    "split dataflow: d products, heads, rows and row sums over all PEs, list-scheduled without phase barriers";

/// Layers with more necessary operations than this are refused: the list scheduler's cost grows
/// faster than linearly, and such layers have enough rows per PE for the row dataflow.
pub const MAX_OPS: u64 = 2_000_000;

/// Layouts with preload copies are tried on rings of this many PEs or more (where single
/// placements stream inputs through few links; see `schedule_cols`'s `copied_lanes`), for
/// layers of at most two rows (of all heads) per PE: the 181 layers of the small-shapes table
/// they shortened have at most that many, and beyond it their runs would only cost time.
pub(crate) const COPIES_MIN_PES: u32 = 16;

/// Whether layouts with preload copies are tried for `p` on `pes` PEs (see [`COPIES_MIN_PES`]).
pub(crate) fn copies_tried(p: &Problem, pes: u32) -> bool {
    p.copies
        && pes >= COPIES_MIN_PES
        && u64::from(p.tokens) * u64::from(p.heads) <= 2 * u64::from(pes)
}
/// Above this many necessary operations fewer layouts and variants are tried.
const LARGE_OPS: u64 = 30_000;
/// `auto` tries the pass up to this many necessary operations, on rings with fewer than
/// [`AUTO_TOKENS_PER_PE`] tokens per PE.
const AUTO_OPS: u64 = 300_000;
const AUTO_TOKENS_PER_PE: u64 = 4;
/// Simulated operations spent on perturbed retries (per layer, on top of the plain runs), and the
/// most retries. Only rings with more than half a PE per token get them: with more tokens the row
/// dataflow is near the bound and the retries would only cost time.
const RETRY_BUDGET: u64 = 20_000;
const MAX_RETRIES: u64 = 200;
/// Work a layer's runs may take in all before the local search stops (plain runs and retries
/// included), in units of the simulation's own effort — a task looked at, a word on a link
/// looked at, a PE's cycle — plus [`PLAN_FIXED`] and [`PLAN_WORK`] per task for each run's plan,
/// so the search's length is the same on every machine: at most [`SEARCH_PER_OP`] per
/// necessary operation (tiny layers, which the test grids compile by the thousand, stay fast)
/// and at most [`SEARCH_BUDGET`] (under half a second here). Also the most search steps, and
/// the largest layer (necessary operations) searched.
const SEARCH_BUDGET: u64 = 50_000_000;
const SEARCH_PER_OP: u64 = 30_000;
const PLAN_FIXED: u64 = 1_000;
const PLAN_WORK: u64 = 8;
const MAX_SEARCH: u64 = 20_000;
const SEARCH_MAX_OPS: u64 = 20_000;
/// The search's allowance on one causal head whose columns span the ring (the paper's causal
/// instances and their kin), from [`SEARCH_RING_MIN_OPS`] necessary operations: four times the
/// above. There the list scheduler's first schedules sit 3–5 % above the lower bound, the gap
/// shrinks steadily with the search's length (n = m = d = 16: 304 cycles unsearched, 300 after
/// the usual allowance, 295 after this one; LB 289), and each step costs a whole simulation. The
/// test grids compile a few such layers (n = m = d = 12 to 16), each some seconds longer.
const SEARCH_RING_BUDGET: u64 = 4 * SEARCH_BUDGET;
const SEARCH_RING_PER_OP: u64 = 4 * SEARCH_PER_OP;
const SEARCH_RING_STEPS: u64 = 4 * MAX_SEARCH;
const SEARCH_RING_MIN_OPS: u64 = 2_000;
const SEARCH_RING_MAX_OPS: u64 = 30_000;
/// From this many necessary operations (n = m = d = 18 on) such layers get three times that
/// again: their steps cost more and the gap closes more slowly (n = 20: 460 cycles with the usual
/// allowance, 457 with four times it, 450 with about twelve times; LB 441). No test grid has
/// such a layer; the price is seconds of compile time per layer (docs/scheduling.md).
const SEARCH_LONG_RING_OPS: u64 = 6_000;
const SEARCH_LONG_RING_FACTOR: u64 = 3;
/// One head whose columns span the ring (with a mask: more columns than PEs, where the above
/// does not apply), with fewer tokens than PEs, above the usual search's limit and up to this
/// many necessary operations, gets the ring allowance too (four times the usual): such a layer
/// had only its one plain run, and its links and op slots are both nearly saturated, so what
/// the search moves is the same per-PE imbalance as above (16 tokens, d = 64 on 64 PEs: 744
/// cycles unsearched, 678 with it; LB 524).
const SEARCH_SHORT_RING_MAX_OPS: u64 = 40_000;

/// Row-order weights tried (see [`Layout::row_weight`]).
const ROW_WEIGHTS: [(i64, bool); 6] = [
    (0, false),
    (1, false),
    (0, true),
    (1, true),
    (4, false),
    (4, true),
];

/// The registry's handle on this pass.
pub struct Split;

impl Scheduler for Split {
    fn name(&self) -> &'static str {
        "split"
    }
    fn pass(&self) -> &'static str {
        NAME
    }
    fn description(&self) -> &'static str {
        DESCRIPTION
    }
    fn title(&self) -> &'static str {
        "split (every axis, list-scheduled)"
    }
    fn refusal(&self, p: &Problem, _pes: u32) -> Option<Refusal> {
        (p.necessary_ops() > MAX_OPS).then(|| Refusal {
            culprit: Culprit::Tokens,
            message: format!(
                "the split dataflow schedules at most {MAX_OPS} operations ({} here)",
                p.necessary_ops()
            ),
            note: "use `--schedule rows` or `auto`, which suit layers with many rows per PE".into(),
        })
    }
    fn tried_by_auto(&self, p: &Problem, pes: u32) -> bool {
        // With at least 4 tokens per PE the row dataflow is within a fraction of a percent of
        // the lower bound (the shapes table), and the list scheduler would only add seconds.
        p.necessary_ops() <= AUTO_OPS && u64::from(p.tokens) < AUTO_TOKENS_PER_PE * u64::from(pes)
    }
    fn schedule(&self, p: &Problem, pes: u32) -> Result<RingSchedule, Vec<ScheduleError>> {
        run(p, pes)
    }
}

/// One way to lay the layer out on the ring.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Layout {
    /// Query-row groups per head; lanes = heads × groups.
    groups: u32,
    /// Every head on one lane spanning the ring (needs `d ≥ m`); `groups` is then 1.
    all_heads_on_ring: bool,
    /// How much a row's place in the finishing order weighs against the longest-path priority
    /// (0: pure longest path; large: rows finish one after another).
    row_weight: i64,
    /// Ready softmax work (maxima, exponentials, divisions) goes before any product: it is
    /// little work and everything after it waits for it.
    softmax_first: bool,
    /// PEs per lane that take the softmax, after its columns, rows dealt to them in turn.
    soft: u32,
    /// With q = k and no mask, every row computes its own scores, both halves of each pair
    /// (`schedule-wide`): twice the phase-1 products, but no row waits on another's.
    mirror: bool,
    /// The cols dataflow's lanes (`schedule-cols`): phase 1, the softmax and phase 3 each on
    /// PEs of their own.
    apart: Option<Apart>,
    /// On the ring-spanning lane with a safe softmax: a row's scores land, its exponentials run
    /// and its divisions run on three runs of PEs one after another in ring order, so its
    /// maximum and its sum only ever travel forward (see `plan`). 0: not; 1: the three runs
    /// cut from one row-major sequence; 2: each run as wide as the row's share of the ring, so
    /// that scores land on every PE.
    forward: u8,
    /// The inputs go over the links in row-major order below every computed word, the v words
    /// last (see [`run_apart_keys_first`]).
    keys_first: bool,
    /// With q = k and no mask, each pair's score is computed with its smaller row (see
    /// [`Apart::smaller_row`]); tried on the best layout in a run of its own ([`run_with`]).
    smaller_row: bool,
    /// Every PE holds its own preload copy of each input word it reads (where the layer
    /// allows copies): no input word crosses a link.
    copies: bool,
}

/// One lane of the cols dataflow: `r1` PEs holding the q and k columns (the scores' partial
/// sums travel through them), then `soft` PEs taking the rows' softmax in turn, then `r3` PEs
/// holding the v columns and accumulating the outputs. Nothing but words in flight crosses
/// from one part to the next, and no input is needed by two lanes of one head unless its rows
/// are cut into groups. `r3 = 0` puts the v columns on the q/k PEs instead: the weights then
/// travel on round the ring to them, which costs hops but moves no input word (with
/// q = k = v, the x rows would otherwise cross from the first part to the last). With
/// `local_v` (and `r3 = 0`) each row's outputs accumulate on its own softmax PE instead.
///
/// `spread` homes each k and v row in the lane of its own row group instead of the head's
/// first lane, so that with many lanes (one per row) the rows stream round the ring from
/// every lane at once rather than all from the first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Apart {
    pub(crate) r1: u32,
    pub(crate) soft: u32,
    pub(crate) r3: u32,
    pub(crate) spread: bool,
    /// Phase 3 on each row's own softmax PE (`r3 = 0`): the v rows stream there past the
    /// softmax PEs and no weight moves.
    pub(crate) local_v: bool,
    /// With `r3 > 0`, the first `near` columns keep their phase 3 on their q/k PEs (the
    /// weights going on round the ring to them) and only the others' are on the `r3` PEs: with
    /// q = k = v only those columns' x words then cross the softmax PEs.
    pub(crate) near: u32,
    /// Fractional columns: each part's products are cut evenly over its PEs by column, then
    /// row, so a column's rows may split between neighbouring PEs (rows before the cut on one,
    /// the rest on the next) rather than the column going whole to one PE. `r1` and `r3` then
    /// need not suit `d`: with fewer PEs per part than columns whole columns leave some PEs a
    /// column more than others, and with more PEs than columns whole columns leave the extra
    /// PEs idle. A `k` or `v` word read on both sides of a cut is preloaded on the first and
    /// forwarded to the next, like any input read by several PEs; `q` words and outputs go
    /// with their row. One row group, no `near`, `spread` or `local_v`.
    pub(crate) frac: bool,
    /// With `r3 > 0` (one row group, `near = 0`), phase 3 cut by outputs rather than by
    /// columns: the outputs `y[a][c]`, column by column and row by row within a column, are
    /// cut into `r3` runs of about equal products, one per v PE. A v PE so holds parts of
    /// one or two columns (its v words forwarded one or two hops to the next) instead of a
    /// whole number of them, so `r3` need not divide `d`: on 16 PEs with `d = 8`, 8 q/k PEs,
    /// 2 softmax PEs and 6 v PEs each doing a sixth of phase 3, where whole columns leave one
    /// PE two of them.
    pub(crate) cut3: bool,
    /// With `local_v` and `keep_v > 0`, only columns `c < keep_v` of a row's outputs
    /// accumulate on its softmax PE; the others on the PE after the lane (the next lane's
    /// first), which the v rows pass anyway, the weights going one hop on. With a lane per row
    /// of a q/k PE and a softmax PE, the softmax PE would otherwise do all `n·d` products of
    /// its row after its softmax, while the next row's q/k PE, done with its scores, idles.
    pub(crate) keep_v: u32,
    /// With q = k and no mask, each pair's score is computed with its smaller row rather than
    /// its larger one (see [`pairs_by_smaller`]): row `a` then computes `n − a` scores, all its
    /// own but the first `a`, so rows complete one after another from the first instead of all
    /// at the end of phase 1.
    pub(crate) smaller_row: bool,
    /// With one softmax PE and `r3 > 0` (one row group, not `frac`, `cut3`, `local_v` or
    /// `spread`), the last `on_soft` columns are held whole by the softmax PE for both phases:
    /// their x words are preloaded there, each score's chain ends with their products on it,
    /// and their outputs accumulate there from the weights it divides. With q = k = v every
    /// other column's x words cross the links into and out of the softmax PE (`n·d` words in
    /// all, which set the pace on large rings); these cross neither.
    pub(crate) on_soft: u32,
    /// Arcs (one head each, one row group, `r3 = 0`): the lane is its `r1` q/k PEs alone, and
    /// its softmax and phase 3 run on the first PEs of the next lane (the last lane's on the
    /// PEs after it, or the first lane's where the lanes fill the ring): its `soft` first PEs
    /// take the rows' softmax, the others its outputs, cut by outputs (see [`next_outputs`]).
    /// Every word then flows forward from one arc into the next, and every PE does phase 1 of
    /// its own head besides the softmax or phase 3 of the head before it, where the lanes with
    /// parts apart leave each PE one phase. `taper` makes the output PEs' shares fall along the
    /// arc (0: even).
    pub(crate) next: bool,
    pub(crate) taper: u32,
    /// With `local_v` and `keep_v > 0`: every softmax PE is followed by `helper` PEs of its
    /// own (the softmax PEs are every `helper + 1`-th PE after the q/k PEs) that accumulate
    /// columns `c ≥ keep_v` of its rows' outputs, cut evenly between them, so that a row's
    /// `n·d` products after its softmax are split and its weights cross only the links to its
    /// helpers (see `schedule_cols::helper_lanes`). 0: none.
    pub(crate) helper: u32,
    /// Row groups laid along the ring from the last: the lane of the last rows first, where
    /// the k and v rows are then preloaded (their first reader), so that under a causal mask
    /// each link carries only the rows of the lanes after it (see `schedule_cols`'s
    /// `reversed_pair_lanes`).
    pub(crate) rows_from_last: bool,
    /// Rows dealt to the softmax PEs in the order they finish, the first to the last softmax
    /// PE and on backwards, so that the first weights leave by a link no score crosses (see
    /// `schedule_cols`'s `soft_from_last`).
    pub(crate) soft_from_last: bool,
    /// With `r3 = 0` (one row group, not `local_v`, `next`, `near` or `on_soft`): the
    /// lane's softmax PEs come before its q/k PEs, so the scores go on round the ring to them
    /// and the weights cross one link into the q/k PEs, where the lanes above send the weights
    /// round the ring. With q = k and no mask a head sends `n(n+1)/2` scores round instead of
    /// `n²` weights, so every link carries about half the words of the other heads (see
    /// `schedule_cols`'s `scores_round_lanes`).
    pub(crate) soft_before: bool,
    /// With `cut3`, the outputs of the `qk_rows` rows with the fewest keys (ties to the lower
    /// row) accumulate on their column's q/k PE instead of a v PE, the weights going on round
    /// the ring to it, and every v word is preloaded on its first reader from the v part on
    /// (so the v words those outputs read go round the ring too, rather than all of a column's
    /// crossing the softmax PEs). The q/k PEs otherwise idle once phase 1 is done; these
    /// outputs give them part of phase 3. 0: none.
    pub(crate) qk_rows: u32,
    /// The softmax part starts on the last q/k PE rather than after it (and the v part one PE
    /// earlier with it): the row dealt to the first softmax PE takes its softmax where its
    /// scores' chains end, no hop, and the ring's PEs after the lane stay free. With
    /// `soft_from_last` that row is the last to finish, whose softmax is the layer's critical
    /// path on few tokens (see `schedule_cols`'s `tucked_lanes`).
    pub(crate) tuck: bool,
    /// The v part starts this many PEs before the softmax part's end, so that the softmax PEs
    /// (idle once their rows are divided) take a share of phase 3 and the weights reach the
    /// v PEs in fewer hops (`r3` counts those PEs too). 0: the parts apart.
    pub(crate) v_back: u32,
    /// With `cut3` (no `qk_rows`), the outputs cut row by row rather than column by column,
    /// the rows in the reverse of the order they finish: the last row's outputs on the first
    /// v PEs, which its weights reach first, the earlier rows' (whose weights have slack) on
    /// the PEs further on (see [`late_rows_near`]).
    pub(crate) late_near: bool,
    /// Every PE holds its own preload copy (see `ValInfo::Input`) of each input word it reads,
    /// where the layer allows copies: no input word crosses a link, from one lane to another
    /// or within one.
    pub(crate) copies: bool,
    /// With `copies`, each score's `d` products all on one of the `r1` q/k PEs, the keys
    /// dealt over them in turn, rather than its chain crossing them column by column: the q/k
    /// part then does `r1` scores at once however small `d` is.
    pub(crate) whole_scores: bool,
    /// With `next`, the softmax PEs take a share of the arc's outputs too, smaller than the
    /// other PEs' by their softmax work, so that every PE of the next arc does about as many
    /// operations (see [`next_outputs`]). With arcs of two PEs per row the one output PE
    /// otherwise does all `n·d` products of its row's outputs while the softmax PE does three
    /// operations per weight.
    pub(crate) soft_outputs: bool,
    /// With `soft_outputs` and `whole_scores`, how much lighter (in percent of its softmax
    /// work) a softmax PE's share of its own arc's scores is than the other PEs' (see
    /// [`arc_deal`]): it builds the previous arc's row maxima while their scores arrive, so
    /// its own scores would hold those back. 0: scores dealt evenly.
    pub(crate) soft_light: u32,
    /// With `soft_light`, a softmax PE's share of the outputs grows by the work its lighter
    /// share of scores spared it (see [`balanced_shares`]); otherwise the shares are those of
    /// an even deal.
    pub(crate) soft_repaid: bool,
}

impl Apart {
    /// A lane of `r1` q/k PEs, `soft` softmax PEs and `r3` v PEs holding whole columns, one
    /// row group, nothing else set: the other kinds of lane change a field or two of it.
    pub(crate) fn columns(r1: u32, soft: u32, r3: u32) -> Apart {
        Apart {
            r1,
            soft,
            r3,
            spread: false,
            local_v: false,
            near: 0,
            frac: false,
            cut3: false,
            keep_v: 0,
            smaller_row: false,
            on_soft: 0,
            next: false,
            taper: 0,
            helper: 0,
            rows_from_last: false,
            soft_from_last: false,
            soft_before: false,
            qk_rows: 0,
            tuck: false,
            v_back: 0,
            late_near: false,
            copies: false,
            whole_scores: false,
            soft_outputs: false,
            soft_light: 0,
            soft_repaid: false,
        }
    }

    /// How much lighter, in percent of its softmax work, a softmax PE's share of its arc's
    /// whole scores is ([`Apart::soft_light`] where it applies: arcs with copies and whole
    /// scores whose softmax PEs take outputs), else 0.
    fn light(&self, p: &Problem) -> u64 {
        if self.next && self.soft_outputs && self.whole_scores && self.copies && p.copies {
            u64::from(self.soft_light.min(100))
        } else {
            0
        }
    }

    /// PEs of one lane (with `next` its q/k PEs alone: its softmax and outputs are the next
    /// lane's PEs).
    pub(crate) fn len(&self) -> u32 {
        if self.next {
            return self.r1;
        }
        // Each softmax PE with its helpers (none: one PE a softmax PE).
        let soft_end = self.soft_at() + (1 + self.helper) * self.soft;
        soft_end.max(self.v_at() + self.r3)
    }

    /// The first v PE's offset from the first q/k PE.
    pub(crate) fn v_at(&self) -> u32 {
        (self.soft_at() + (1 + self.helper) * self.soft).saturating_sub(self.v_back)
    }

    /// The first softmax PE's offset from the first q/k PE.
    pub(crate) fn soft_at(&self) -> u32 {
        self.r1.saturating_sub(self.tucked())
    }

    /// PEs the softmax part is moved back by ([`Apart::tuck`]).
    fn tucked(&self) -> u32 {
        u32::from(self.tuck && self.r1 > 0)
    }
}

/// Tries the layouts and, on small layers, perturbed priorities; keeps the shortest.
pub fn run(p: &Problem, pes: u32) -> Result<RingSchedule, Vec<ScheduleError>> {
    run_with(p, pes, false)
}

/// The same search with every score of a q = k layer computed by its own row (`mirror`).
pub(crate) fn run_mirrored(p: &Problem, pes: u32) -> Result<RingSchedule, Vec<ScheduleError>> {
    run_with(p, pes, true)
}

fn run_with(p: &Problem, pes: u32, mirror: bool) -> Result<RingSchedule, Vec<ScheduleError>> {
    let m = pes.max(1);
    let mut shapes: Vec<(u32, bool, u32)> = candidate_groups(p, m)
        .into_iter()
        .map(|g| (g, false, 1))
        .collect();
    if p.heads > 1 && p.dim >= m {
        shapes.push((1, true, 1));
    }
    // With two or more tokens per PE the row dataflow is near the bound: one plain run each.
    // Large layers (each run costs about a second per 100 000 operations) get the ring-spanning
    // lane and the two largest lane counts, one variant each.
    let few_tokens = p.tokens < 2 * m;
    let large = p.necessary_ops() > LARGE_OPS;
    // One head spanning the ring beyond every search's range keeps its best plain run, so it
    // gets the small layers' three variants (32 tokens, d = 64, causal on 64 PEs: 1243 cycles
    // with one, 1215 with three); without a search after them, more runs can only shorten it.
    let unsearched_ring = p.heads == 1
        && p.dim >= m
        && p.necessary_ops() > SEARCH_RING_MAX_OPS.max(SEARCH_SHORT_RING_MAX_OPS);
    let variants = if few_tokens && (!large || unsearched_ring) {
        &ROW_WEIGHTS[..3]
    } else {
        &ROW_WEIGHTS[..1]
    };
    if large && shapes.len() > 3 {
        let tail = shapes.split_off(shapes.len() - 2);
        shapes.truncate(1);
        shapes.extend(tail);
    }
    // Where lanes leave PEs idle, one softmax PE per lane serialises the exponentials and
    // divisions of all the lane's rows: spare PEs can share them.
    let mut more = Vec::new();
    // Large layers try it only on the first lane count, with a softmax PE per row where the
    // ring has room.
    let soft_shapes = if large { &shapes[..1] } else { &shapes[..] };
    for &(g, _, _) in soft_shapes {
        let lanes = p.heads * g;
        let spare = (m / lanes.max(1)).saturating_sub(p.dim + 1);
        if spare == 0 || (lanes == 1 && p.dim >= m) {
            continue;
        }
        let rows = p.tokens.div_ceil(g);
        let mut softs = vec![rows.min(spare + 1)];
        if !large {
            softs.insert(0, 2.min(rows));
        }
        softs.dedup();
        more.extend(softs.into_iter().filter(|&s| s > 1).map(|s| (g, false, s)));
    }
    shapes.extend(more);
    let bases: Vec<Layout> = shapes
        .into_iter()
        .map(|(groups, all_heads_on_ring, soft)| Layout {
            groups,
            all_heads_on_ring,
            row_weight: 0,
            softmax_first: false,
            soft,
            mirror,
            apart: None,
            forward: 0,
            keys_first: false,
            smaller_row: false,
            copies: false,
        })
        .collect();
    let usual = explore_kept(p, m, &bases, variants);
    // The ring-spanning lane with a safe softmax is also tried with its rows' softmax laid
    // forward (see `Layout::forward`), in a search of its own with its own budget: the usual
    // one above runs exactly as it would alone, and the shorter of the two is kept, so no layer
    // gets slower.
    let forward: Vec<Layout> = bases
        .iter()
        .filter(|b| {
            p.safe()
                && b.apart.is_none()
                && p.dim >= m
                && (p.heads == 1 || b.all_heads_on_ring)
                && (b.groups == 1 || b.all_heads_on_ring)
        })
        .flat_map(|b| [1, 2].map(|forward| Layout { forward, ..*b }))
        .collect();
    let kept = if forward.is_empty() {
        usual
    } else {
        match (usual, explore_kept(p, m, &forward, variants)) {
            (Ok(u), Ok(f)) if f.0.cycles() < u.0.cycles() => Ok(f),
            (Err(_), Ok(f)) => Ok(f),
            (usual, _) => usual,
        }
    };
    let (s, layout) = kept?;
    let s = by_smaller_row(p, m, s, layout, variants);
    // The same lanes with a preload copy of every input word on each PE that reads it, in a
    // search of their own (the runs above keep their budgets) that abandons a run once it
    // cannot come below the schedule above, kept where shorter.
    if !copies_tried(p, m) {
        return Ok(s);
    }
    let copied: Vec<Layout> = bases
        .iter()
        .map(|b| Layout { copies: true, ..*b })
        .collect();
    match explore_below(p, m, &copied, variants, s.cycles()) {
        Ok((c, _)) if c.cycles() < s.cycles() => Ok(c),
        _ => Ok(s),
    }
}

/// `s`, or where shorter the schedule of its layout with each q = k pair computed with its
/// smaller row, in a run of its own (so that the runs above keep their budgets and no layer
/// gets slower). With its larger row, as above, row 0's last score is computed in row
/// `n − 1`'s turn, so no row's softmax starts before phase 1 ends; with its smaller row, row
/// `a` computes the `n − a` pairs from `a` on and rows complete one after another (8 tokens,
/// `d = 64`, 4 heads on 64 PEs: 596 → 485 cycles).
fn by_smaller_row(
    p: &Problem,
    m: u32,
    s: RingSchedule,
    layout: Layout,
    variants: &[(i64, bool)],
) -> RingSchedule {
    if !p.symmetric || p.causal || layout.mirror || layout.apart.is_some() {
        return s;
    }
    let base = Layout {
        row_weight: 0,
        softmax_first: false,
        smaller_row: true,
        ..layout
    };
    match explore(p, m, &[base], variants) {
        Ok(o) if o.cycles() < s.cycles() => o,
        _ => s,
    }
}

/// Lays the layer out on the ring in the cols dataflow's ways (`schedule-cols`): every base
/// given is one lane per head and row group of phase-1 PEs, softmax PEs and phase-3 PEs apart.
/// Plain runs, retries and the local search are those of the split dataflow. Returns the
/// schedule with the lane (and its row groups) it came from.
pub(crate) fn run_apart(
    p: &Problem,
    pes: u32,
    parts: &[(u32, Apart)],
) -> Result<(RingSchedule, (u32, Apart)), Vec<ScheduleError>> {
    apart_explored(p, pes, parts, false)
}

/// The cols dataflow's bases explored, the inputs in a fixed order or not (`Layout::keys_first`).
fn apart_explored(
    p: &Problem,
    pes: u32,
    parts: &[(u32, Apart)],
    keys_first: bool,
) -> Result<(RingSchedule, (u32, Apart)), Vec<ScheduleError>> {
    apart_below(p, pes, parts, keys_first, usize::MAX, false)
}

/// [`run_apart`] with every score of a q = k layer computed by its own row (`mirror`): each
/// lane then needs no other lane's scores, for the recomputed products (the wide dataflow's).
pub(crate) fn run_apart_mirrored(
    p: &Problem,
    pes: u32,
    parts: &[(u32, Apart)],
) -> Result<(RingSchedule, (u32, Apart)), Vec<ScheduleError>> {
    apart_below(p, pes, parts, false, usize::MAX, true)
}

/// [`apart_explored`] wanting a schedule shorter than `beat` cycles (see [`explore_below`]).
fn apart_below(
    p: &Problem,
    pes: u32,
    parts: &[(u32, Apart)],
    keys_first: bool,
    beat: usize,
    mirror: bool,
) -> Result<(RingSchedule, (u32, Apart)), Vec<ScheduleError>> {
    let m = pes.max(1);
    let few_tokens = p.tokens < 2 * m;
    let large = p.necessary_ops() > LARGE_OPS;
    // Rows that finish one after another let a row's phase 3 run while later rows are still in
    // phase 1, the parts of a lane being separate PEs: a strong row order is tried first.
    let variants: &[(i64, bool)] = if few_tokens && !large {
        &[(64, false), (4, false), (0, false)]
    } else {
        &[(64, false)]
    };
    let bases: Vec<Layout> = parts
        .iter()
        .map(|&(groups, apart)| Layout {
            groups,
            all_heads_on_ring: false,
            row_weight: 0,
            softmax_first: false,
            soft: apart.soft,
            mirror,
            apart: Some(apart),
            forward: 0,
            keys_first,
            smaller_row: false,
            copies: false,
        })
        .collect();
    let (s, layout) = explore_below(p, m, &bases, variants, beat)?;
    match layout.apart {
        Some(a) => Ok((s, (layout.groups, a))),
        None => Err(vec![ScheduleError::Internal {
            pass: NAME,
            what: "a cols layout without its lane".into(),
        }]),
    }
}

/// [`run_apart`] for a schedule shorter than `beat` cycles (see [`explore_below`]): layouts
/// that cannot beat the schedule a layer already has cost only the cycles they run before
/// that is sure.
pub(crate) fn run_apart_below(
    p: &Problem,
    pes: u32,
    parts: &[(u32, Apart)],
    beat: usize,
) -> Result<(RingSchedule, (u32, Apart)), Vec<ScheduleError>> {
    apart_below(p, pes, parts, false, beat, false)
}

/// [`run_apart`] with the inputs streamed in order (`Layout::keys_first`): every link sends
/// the preloaded words other than v in row-major order, below every computed word, and the v
/// words, likewise ordered, below those. For lanes whose k and v rows
/// flow one way through a head's lanes (`schedule_cols::pair_lanes`): by urgency alone a link
/// sent the words in a shuffled order and filled every gap with v words, so a lane's scores,
/// sent on the same links, pushed the k rows behind them back lane after lane (32 tokens,
/// `d = 8`, 4 heads on 256 PEs: 762 cycles, the last lanes' scores done near cycle 465). In
/// order, a lane's score leaves the stream at its softmax PE and the next lane's takes its slot,
/// so the k rows pass at 8 words in 9 and the v rows follow (670 cycles; 676 when a link also
/// held its v words back until it had sent every other input).
pub(crate) fn run_apart_keys_first(
    p: &Problem,
    pes: u32,
    parts: &[(u32, Apart)],
) -> Result<(RingSchedule, (u32, Apart)), Vec<ScheduleError>> {
    apart_explored(p, pes, parts, true)
}

/// Runs every base layout with each priority variant, then perturbed retries and the local
/// search on the best (small layers), and returns the shortest emittable schedule.
fn explore(
    p: &Problem,
    m: u32,
    bases: &[Layout],
    variants: &[(i64, bool)],
) -> Result<RingSchedule, Vec<ScheduleError>> {
    explore_kept(p, m, bases, variants).map(|(s, _)| s)
}

/// [`explore`], with the layout (its priority variant aside) the schedule came from.
fn explore_kept(
    p: &Problem,
    m: u32,
    bases: &[Layout],
    variants: &[(i64, bool)],
) -> Result<(RingSchedule, Layout), Vec<ScheduleError>> {
    explore_below(p, m, bases, variants, usize::MAX)
}

/// [`explore_kept`] wanting a schedule shorter than `beat` cycles: a run that cannot come below
/// it is abandoned as soon as that is sure, as runs that cannot beat the best so far are (the
/// plain runs of a layer that gets retries still finish, so what comes back may be longer).
fn explore_below(
    p: &Problem,
    m: u32,
    bases: &[Layout],
    variants: &[(i64, bool)],
    beat: usize,
) -> Result<(RingSchedule, Layout), Vec<ScheduleError>> {
    let few_tokens = p.tokens < 2 * m;
    let mut best: Option<Best> = None;
    // Only a schedule that can be emitted is kept (see `emittable`).
    let keep = |r: Run, layout: Layout, tweaks: Tweaks, best: &mut Option<Best>| {
        if best
            .as_ref()
            .is_none_or(|b| r.schedule.cycles() < b.run.schedule.cycles())
            && emittable(&r.schedule)
        {
            *best = Some(Best {
                run: r,
                layout,
                tweaks,
            });
        }
    };
    // A run that cannot beat the best so far is abandoned as soon as that is sure.
    let limit = |best: &Option<Best>| match best {
        Some(b) => b.run.schedule.cycles().min(beat).saturating_sub(1),
        None if beat == usize::MAX => usize::MAX,
        None => beat.saturating_sub(1),
    };
    let mut layouts: Vec<(Layout, usize)> = Vec::new();
    let mut plans = Plans::default();
    let mut spent = 0u64;
    // A layout whose plan the pass finds inconsistent is skipped (its errors are reported only if
    // no layout works), so one bad corner cannot cost a layer its schedule.
    let mut errors: Vec<ScheduleError> = Vec::new();
    let ops = p.necessary_ops().max(1);
    let retries = if few_tokens {
        (RETRY_BUDGET / ops).min(MAX_RETRIES)
    } else {
        0
    };
    for &base in bases {
        // Fewer priority variants for the extra softmax PEs: they multiply the runs.
        let variants = if base.soft > 1 {
            &variants[..variants.len().min(2)]
        } else {
            variants
        };
        for &(row_weight, softmax_first) in variants {
            let layout = Layout {
                row_weight,
                softmax_first,
                ..base
            };
            // With retries to come, every plain run finishes: the best few seed them (those
            // that come below `beat`, when given: the others cannot seed a schedule wanted).
            let cap = if retries > 0 && beat == usize::MAX {
                usize::MAX
            } else {
                limit(&best)
            };
            let mut tweaks = Tweaks::seeded(0);
            match build(p, m, layout, &mut tweaks, cap, &mut spent, &mut plans) {
                Ok(Some(r)) => {
                    layouts.push((layout, r.schedule.cycles()));
                    keep(r, layout, tweaks, &mut best);
                }
                Ok(None) => {}
                Err(e) => errors.extend(e),
            }
        }
    }
    // Perturbed retries on the best layouts, while the budget lasts.
    layouts.sort_by_key(|&(_, c)| c);
    // Retries keep the lane count of one of the three best layouts and draw the priority variant.
    let mut draw = Noise(0x2545_F491_4F6C_DD1D);
    // No layout to seed them when every plain run was abandoned (see `beat`).
    let retries = if layouts.is_empty() { 0 } else { retries };
    for seed in 1..=retries {
        let Some(&(base, _)) = layouts.get((seed as usize - 1) % layouts.len().min(3)) else {
            break;
        };
        let (row_weight, softmax_first) = ROW_WEIGHTS[draw.next(ROW_WEIGHTS.len() as i64) as usize];
        let layout = Layout {
            row_weight,
            softmax_first,
            ..base
        };
        let mut tweaks = Tweaks::seeded(seed);
        let cap = limit(&best);
        // Tried without booking; booked again only where the schedule is wanted: to keep it,
        // or for its errors.
        let again = match trial(p, m, layout, &mut tweaks, cap, &mut spent, &mut plans) {
            Trial::Over => false,
            Trial::Done(cycles, _) => best
                .as_ref()
                .is_none_or(|b| cycles < b.run.schedule.cycles()),
            Trial::Refused => true,
        };
        if again {
            let mut replay = tweaks.replaying();
            match build(p, m, layout, &mut replay, cap, &mut 0, &mut plans) {
                Ok(Some(r)) => keep(r, layout, tweaks, &mut best),
                Ok(None) => {}
                Err(e) => errors.extend(e),
            }
        }
    }
    if let Some(b) = best.as_mut() {
        // The plain runs and retries count against the search's budget, so a layer whose runs
        // are already slow gets no search.
        let ring_causal = p.causal && p.heads == 1 && p.dim == m && ops >= SEARCH_RING_MIN_OPS;
        let spans_ring = b.layout.apart.is_none() && b.layout.groups == 1 && p.dim >= m;
        let short_ring = !ring_causal
            && p.heads == 1
            && spans_ring
            && p.tokens < m
            && ops > SEARCH_MAX_OPS
            && ops <= SEARCH_SHORT_RING_MAX_OPS;
        let max_ops = if ring_causal {
            SEARCH_RING_MAX_OPS
        } else if short_ring {
            SEARCH_SHORT_RING_MAX_OPS
        } else {
            SEARCH_MAX_OPS
        };
        if few_tokens && ops <= max_ops {
            let allowance = if ring_causal || short_ring {
                let f = if ring_causal && ops >= SEARCH_LONG_RING_OPS {
                    SEARCH_LONG_RING_FACTOR
                } else {
                    1
                };
                Allowance {
                    budget: (f * SEARCH_RING_BUDGET).min(f * SEARCH_RING_PER_OP * ops),
                    max_steps: f * SEARCH_RING_STEPS,
                }
            } else {
                Allowance {
                    budget: SEARCH_BUDGET.min(SEARCH_PER_OP * ops),
                    max_steps: MAX_SEARCH,
                }
            };
            let allowance = Allowance {
                budget: allowance.budget.saturating_sub(spent),
                ..allowance
            };
            search(p, m, b, allowance, &mut plans);
        }
    }
    match best {
        Some(b) => Ok((b.run.schedule, b.layout)),
        None if !errors.is_empty() => Err(errors),
        None => Err(vec![ScheduleError::Internal {
            pass: NAME,
            what: "no layout to schedule".into(),
        }]),
    }
}

/// Whether codegen takes the schedule. Perturbed landings can leave a word sent to a PE that
/// never reads it, which the contract with codegen refuses (found by the shapes grid): such a
/// run is dropped rather than returned.
fn emittable(s: &RingSchedule) -> bool {
    crate::validate::validate(s).is_ok()
        && crate::passes::codegen::run(s, crate::passes::codegen::Packing::Tight).is_ok()
}

/// How long the local search may go: work units and steps.
struct Allowance {
    budget: u64,
    max_steps: u64,
}

/// The shortest schedule so far and what made it.
struct Best {
    run: Run,
    layout: Layout,
    tweaks: Tweaks,
}

/// Local search from the best schedule: change a few landings or task priorities at a time and
/// keep the change when the schedule is no longer, and among equally long ones when its PEs
/// finish no later in total. Plateaus are walked, not just descended: the cycle count alone
/// rarely moves with one change.
fn search(p: &Problem, m: u32, best: &mut Best, allowance: Allowance, plans: &mut Plans) {
    // No program is shorter than the layer's bound (the operations spread evenly, the critical
    // path, the links; docs/scheduling.md): stop there.
    let floor = p
        .shape()
        .bound(m, runtime::layer::Normalisation::PerWeight)
        .map_or(0, |b| b.value)
        .max(p.necessary_ops().div_ceil(u64::from(m.max(1))));
    let mut draw = Noise(0x9E6C_63D0_676A_9A99);
    let mut cur = best.tweaks.replaying();
    let mut cur_score = (best.run.schedule.cycles(), best.run.spread);
    let tasks = cur.prio.len().max(1) as i64;
    let bumps = cur.bump.len() as i64;
    let mut spent = 0u64;
    let mut steps = 0u64;
    let Allowance { budget, max_steps } = allowance;
    while spent < budget && steps < max_steps && best.run.schedule.cycles() as u64 > floor {
        steps += 1;
        let mut t = cur.replaying();
        if t.prio.len() < tasks as usize {
            t.prio.resize(tasks as usize, 0);
        }
        for _ in 0..=draw.next(3) {
            // One change in four moves a landing, the rest shift a priority.
            if bumps > 0 && draw.next(4) == 0 {
                let i = draw.next(bumps) as usize;
                t.bump[i] = [0, 1, 2, m.saturating_sub(1)][draw.next(4) as usize];
            } else {
                let i = draw.next(tasks) as usize;
                // Up to 8 cycles of longest path either way (priorities are in eighths).
                t.prio[i] = draw.next(2 * 64) - 64;
            }
        }
        let mut run_t = t.replaying();
        let cap = cur_score.0;
        // A change whose plan the pass finds inconsistent is dropped like a longer one; one
        // that cannot be emitted is walked through but never kept. Only a run that shortens
        // the best is booked (again) into a schedule.
        if let Trial::Done(cycles, spread) =
            trial(p, m, best.layout, &mut run_t, cap, &mut spent, plans)
        {
            let score = (cycles, spread);
            if score <= cur_score {
                cur = t;
                cur_score = score;
                if score.0 < best.run.schedule.cycles() {
                    let mut replay = cur.replaying();
                    if let Ok(Some(r)) = build(p, m, best.layout, &mut replay, cap, &mut 0, plans) {
                        if emittable(&r.schedule) {
                            best.run = r;
                            best.tweaks = cur.replaying();
                        }
                    }
                }
            }
        }
    }
}

/// Row-group counts worth trying: one lane per head and ring-filling splits of the rows, for
/// lanes of about `d + 1` PEs (one per column plus the softmax) or fewer. Where lanes of `d + 1`
/// PEs leave part of the ring idle, the count of lanes trades rows per lane against the k and v
/// rows every lane needs, so a ladder of such counts is tried too.
fn candidate_groups(p: &Problem, m: u32) -> Vec<u32> {
    let mut out = vec![1];
    let cols = p.dim + 1;
    let r_of = |g: u32| (m / (p.heads * g)).clamp(1, cols);
    let ladder = |g: u32| {
        let odd = g >> g.trailing_zeros();
        odd == 1 || odd == 3
    };
    for g in 2..=p.tokens {
        let lanes = p.heads * g;
        if lanes > m {
            break;
        }
        let idle = r_of(g) == cols && lanes * cols < m;
        if out.iter().all(|&o| r_of(o) != r_of(g)) || (idle && ladder(g)) {
            out.push(g);
        }
    }
    // Keep the count bounded: the largest splits, which fill the ring, are the interesting ones.
    if out.len() > 8 {
        let tail = out.split_off(out.len() - 7);
        out.truncate(1);
        out.extend(tail);
    }
    out
}

/// An operand: a fixed value, or the result of a chain (known once the chain finishes).
#[derive(Clone, Copy, Debug)]
enum Opnd {
    V(Val),
    Chain(usize),
}

impl Opnd {
    /// As the gates and the simulation's steps hold it: a value's index, or a chain's with
    /// [`CHAIN`] set.
    #[inline]
    fn code(self) -> u32 {
        match self {
            Opnd::V(v) => v.as_u32(),
            Opnd::Chain(c) => CHAIN | c as u32,
        }
    }

    #[inline]
    fn from_code(o: u32) -> Opnd {
        if o & CHAIN != 0 {
            Opnd::Chain((o & !CHAIN) as usize)
        } else {
            Opnd::V(Val::from_u32(o))
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum ChainKind {
    /// Phase-1 or phase-3 partial sum of products.
    Mac(u8),
    /// Row sum of exponentials; `bias` is the row's maximum chain (safe softmax).
    Exp { bias: Option<usize> },
    /// Row maximum.
    Max,
}

struct Chain {
    kind: ChainKind,
    /// `(pe, tasks)` in the order the partial sum visits them.
    segs: Vec<(u32, Vec<usize>)>,
    /// Where the result is read (every PE that reads it).
    readers: Vec<u32>,
    output: Option<Element>,
}

#[derive(Clone, Copy, Debug)]
enum TaskKind {
    /// A term of a chain: `x·y` (Mac), `exp(x − bias)` kept as `e` (Exp), `max(·, x)` (Max).
    Term {
        chain: usize,
        seg: usize,
        x: Opnd,
        y: Option<Opnd>,
        e: Option<Val>,
    },
    Div {
        num: Val,
        den: usize,
        out: Val,
    },
}

#[derive(Clone, Copy, Debug)]
struct Task {
    pe: u32,
    kind: TaskKind,
    /// Larger runs first.
    prio: i64,
}

/// Ring distance forward from `a` to `b`.
fn dist(a: u32, b: u32, m: u32) -> u32 {
    // The simulation asks this for every hop it books: PEs on the ring (below `m`) need no
    // division.
    let x = b + m - a;
    if x < m {
        x
    } else if x - m < m {
        x - m
    } else {
        x % m
    }
}

/// Cycles from an op on `a` to a reader on `b`: an accumulate result (or a division's or a
/// maximum's result, through the idle acc slot) rides `send acc` in its own cycle, anything else
/// is sent the cycle after.
fn lat(a: u32, b: u32, m: u32, acc: bool) -> i64 {
    let h = i64::from(dist(a, b, m));
    if h == 0 {
        1
    } else if acc {
        h
    } else {
        h + 1
    }
}

/// Which PEs hold what in one layout.
struct Geometry {
    m: u32,
    d: u32,
    lanes: u32,
    r: u32,
    groups: u32,
    n: u32,
    /// Lane of `(head, row)`.
    lane_of: Vec<u32>,
    /// One lane spanning the ring: scores start anywhere and land evenly.
    ring: bool,
    /// Softmax PEs at the end of each lane (1: the softmax shares the block split as a column).
    soft: u32,
    /// Phase 1, softmax and phase 3 on separate PEs of each lane (see [`Apart`]).
    apart: Option<Apart>,
    /// With fractional columns (`Apart::frac`), the lane offset of phase-1 and phase-3 column
    /// `c` of row `a`, at `c·n + a`.
    frac: Option<(Vec<u32>, Vec<u32>)>,
    /// With `Apart::cut3`, the v PE (offset within the v part) of output `(head, row, col)`,
    /// at `(head·n + row)·d + col`.
    cut3: Vec<u32>,
}

impl Geometry {
    fn new(p: &Problem, m: u32, layout: Layout) -> Geometry {
        let (groups, all_heads_on_ring) = (layout.groups, layout.all_heads_on_ring);
        let lanes = if all_heads_on_ring {
            1
        } else {
            (p.heads * groups).max(1)
        };
        // One lane over the whole ring when the columns cover it; otherwise lanes of at most one
        // PE per column plus the softmax, packed from PE 0 (a longer lane only adds hops).
        let ring = lanes == 1 && p.dim >= m && layout.apart.is_none();
        let soft_wanted = if ring { 1 } else { layout.soft.max(1) };
        let r = if let Some(a) = layout.apart {
            a.len()
        } else if ring {
            m
        } else {
            (m / lanes).clamp(1, p.dim + soft_wanted)
        };
        // At least one PE of the lane holds columns (the cols lanes count theirs apart).
        let soft = if layout.apart.is_some() || (soft_wanted > 1 && r > soft_wanted) {
            soft_wanted
        } else {
            1
        };
        let n = p.tokens;
        // Rows cut into groups of about equal weight count (row a has a + 1 under a mask, or
        // when q = k pairs are counted once, by their larger row).
        let per_row = |a: u32| -> u64 {
            if p.symmetric && !p.causal && !layout.mirror && pairs_by_smaller(layout) {
                u64::from(n - a)
            } else if p.causal || (p.symmetric && !layout.mirror) {
                u64::from(a) + 1
            } else {
                u64::from(n)
            }
        };
        let total: u64 = (0..n).map(per_row).sum();
        let mut lane_of = Vec::with_capacity((p.heads * n) as usize);
        for h in 0..p.heads {
            let mut acc = 0u64;
            for a in 0..n {
                let mid = acc + per_row(a) / 2;
                acc += per_row(a);
                let mut g = ((mid * u64::from(groups)) / total.max(1)).min(u64::from(groups) - 1);
                if layout.apart.is_some_and(|ap| ap.rows_from_last) {
                    g = u64::from(groups) - 1 - g;
                }
                lane_of.push(if all_heads_on_ring {
                    0
                } else {
                    h * groups + g as u32
                });
            }
        }
        let frac = layout.apart.filter(|a| a.frac).map(|a| frac_offsets(p, a));
        let cut3 = match layout.apart {
            Some(a) if a.next => {
                // A row's group is the same in every head: head 0's lanes are the groups.
                let group_of: Vec<u32> = lane_of.iter().take(n as usize).copied().collect();
                next_outputs(p, a, groups, &group_of)
            }
            Some(a) if a.cut3 && a.late_near && a.r3 > 0 && groups == 1 => late_rows_near(p, a.r3),
            Some(a) if a.cut3 && a.r3 > 0 && groups == 1 => cut_outputs(p, a.r3, a.qk_rows),
            _ => Vec::new(),
        };
        Geometry {
            m,
            d: p.dim,
            lanes,
            r,
            groups,
            n,
            lane_of,
            ring,
            soft,
            apart: layout.apart,
            frac,
            cut3,
        }
    }

    fn lane(&self, h: u32, a: u32) -> u32 {
        self.lane_of
            .get((h * self.n + a) as usize)
            .copied()
            .unwrap_or(0)
    }

    /// First PE of `lane`; `lane = lanes` is where the last lane's phase 3 goes: the PEs after
    /// the last lane if the ring has room, else lane 0.
    fn start(&self, lane: u32) -> u32 {
        if let Some(a) = self.apart {
            // The softmax PEs before the q/k PEs: the lane's start is its first q/k PE.
            let before = if a.soft_before { a.soft } else { 0 };
            return ((lane % self.lanes) * self.r + before) % self.m;
        }
        if lane == self.lanes && (lane + 1) * self.r <= self.m {
            return lane * self.r;
        }
        ((lane % self.lanes) * self.r) % self.m
    }

    /// Columns counted for the block split: the softmax is one more with several lanes.
    fn cols(&self) -> u32 {
        if self.ring {
            self.d
        } else {
            self.d + 1
        }
    }

    /// PE offset within a lane of column `c` (`c = d` is the softmax with several lanes).
    fn offset(&self, c: u32) -> u32 {
        if let Some(a) = self.apart {
            let held = self.d.saturating_sub(a.on_soft);
            if c >= held {
                return a.soft_at();
            }
            return ((u64::from(c) * u64::from(a.r1)) / u64::from(held.max(1))) as u32;
        }
        if self.soft > 1 {
            let held = self.r - self.soft;
            return ((u64::from(c) * u64::from(held)) / u64::from(self.d.max(1))) as u32;
        }
        ((u64::from(c) * u64::from(self.r)) / u64::from(self.cols().max(1))) as u32
    }

    /// Where the scores of the lane's `i`-th row land for the softmax, on a lane of its own.
    fn land(&self, lane: u32, i: u32) -> u32 {
        if let Some(a) = self.apart {
            // Softmax PEs are every `helper + 1`-th PE after the q/k PEs.
            let step = 1 + a.helper;
            if a.soft_before {
                let first = self.start(lane) + self.m - a.soft;
                return (first + i % a.soft.max(1)) % self.m;
            }
            return (self.start(lane) + a.soft_at() + step * (i % a.soft.max(1))) % self.m;
        }
        if self.soft > 1 {
            return (self.start(lane) + self.r - self.soft + i % self.soft) % self.m;
        }
        self.p1(lane, self.d)
    }

    /// PE of phase-1 column `c` of `lane`.
    fn p1(&self, lane: u32, c: u32) -> u32 {
        (self.start(lane) + self.offset(c)) % self.m
    }

    /// PE of output `y[a][c]` of head `h` on `lane`: its column's phase-3 PE, or with
    /// `Apart::cut3` the v PE its run of outputs was cut to.
    fn p3_out(&self, lane: u32, h: u32, a: u32, c: u32) -> u32 {
        if let Some(ap) = self.apart {
            let i = (u64::from(h * self.n + a) * u64::from(self.d) + u64::from(c)) as usize;
            if let Some(&off) = self.cut3.get(i) {
                if off == ON_QK {
                    return self.p1_row(lane, c, a);
                }
                if ap.next {
                    return (self.start(lane) + ap.r1 + off) % self.m;
                }
                return (self.start(lane) + ap.v_at() + off) % self.m;
            }
        }
        self.p3_row(lane, c, a)
    }

    /// PE of phase-3 column `c` for rows of `lane` (the next lane when there are several).
    fn p3(&self, lane: u32, c: u32) -> u32 {
        if let Some(a) = self.apart {
            if a.r3 == 0 || c < a.near || c >= self.d.saturating_sub(a.on_soft) {
                return self.p1(lane, c);
            }
            let far = u64::from(self.d.saturating_sub(a.near + a.on_soft).max(1));
            let off = (u64::from(c - a.near) * u64::from(a.r3)) / far;
            return (self.start(lane) + a.v_at() + off as u32) % self.m;
        }
        let l = if self.ring { lane } else { lane + 1 };
        (self.start(l) + self.offset(c)) % self.m
    }

    /// PE of phase-1 column `c` of row `a` (of `lane`): [`Geometry::p1`] but with fractional
    /// columns.
    fn p1_row(&self, lane: u32, c: u32, a: u32) -> u32 {
        match &self.frac {
            Some((one, _)) => self.frac_pe(one, lane, c, a),
            None => self.p1(lane, c),
        }
    }

    /// PE of phase-3 column `c` of row `a` (of `lane`): [`Geometry::p3`] but with fractional
    /// columns.
    fn p3_row(&self, lane: u32, c: u32, a: u32) -> u32 {
        match &self.frac {
            Some((_, three)) => self.frac_pe(three, lane, c, a),
            None => self.p3(lane, c),
        }
    }

    /// The PE a fractional table (of [`frac_offsets`]) gives `(c, a)` in `lane`.
    fn frac_pe(&self, table: &[u32], lane: u32, c: u32, a: u32) -> u32 {
        let off = table.get((c * self.n + a) as usize).copied().unwrap_or(0);
        (self.start(lane) + off) % self.m
    }

    /// PEs holding phase-1 columns of `lane`, in ring order, with their columns.
    fn blocks(&self, lane: u32) -> Vec<(u32, Vec<u32>)> {
        self.blocks_row(lane, None)
    }

    /// The same for row `a` with fractional columns, where a PE may hold a column for some
    /// rows only.
    fn blocks_row(&self, lane: u32, a: Option<u32>) -> Vec<(u32, Vec<u32>)> {
        let mut out: Vec<(u32, Vec<u32>)> = Vec::new();
        for c in 0..self.d {
            let pe = match a {
                Some(a) => self.p1_row(lane, c, a),
                None => self.p1(lane, c),
            };
            match out.last_mut() {
                Some((q, cs)) if *q == pe => cs.push(c),
                _ => out.push((pe, vec![c])),
            }
        }
        out
    }
}

/// Whether a q = k layer's pairs go with their smaller row ([`Layout::smaller_row`],
/// [`Apart::smaller_row`]); never on fractional lanes, whose cut counts a row's scores by its
/// larger row.
fn pairs_by_smaller(layout: Layout) -> bool {
    layout.smaller_row || layout.apart.is_some_and(|a| a.smaller_row && !a.frac)
}

/// Lane offsets of every phase-1 and phase-3 `(column, row)` with fractional columns (see
/// [`Apart::frac`]), at `c·n + a`: each part's products in column-major order cut into equal
/// runs, one per PE, a row's products going to the PE its middle falls on. With `r3 = 0` the
/// q/k PEs take both phases, cut together.
fn frac_offsets(p: &Problem, a: Apart) -> (Vec<u32>, Vec<u32>) {
    let (n, d) = (p.tokens, p.dim);
    // Products per column of each row: its scores (q = k without a mask computes each pair
    // once, on the larger row) and its weights.
    let scores = |r: u32| -> u64 {
        if p.causal || p.symmetric {
            u64::from(r) + 1
        } else {
            u64::from(n)
        }
    };
    let weights = |r: u32| u64::from(p.keys_in_row(r));
    // Rows run in the order of `plan`'s rank (longest first, then by index), and a score's
    // partial sum visits the PEs in ring order, so the q/k PEs are a flow shop: a PE holding
    // two columns of a row passes that row's sums on at half pace. Cut in the rank order, the
    // rows a PE holds twice would move on with the PEs, and the rows' order would meet every
    // one of them in turn (32 tokens, d = 128 on 120 q/k PEs: 2400 cycles); cut against it,
    // a row meets about one such PE.
    let mut rows: Vec<u32> = (0..n).collect();
    rows.sort_by_key(|&r| std::cmp::Reverse((n as usize - weights(r) as usize, r)));
    let cut = |w: &dyn Fn(u32) -> u64, pes: u32, base: u32| -> Vec<u32> {
        let per_col: u64 = (0..n).map(w).sum();
        let total = (per_col * u64::from(d)).max(1);
        let mut out = vec![0u32; (n * d) as usize];
        let mut acc = 0u64;
        for c in 0..d {
            for &r in &rows {
                let mid = acc + w(r) / 2;
                acc += w(r);
                let pe = ((mid * u64::from(pes)) / total).min(u64::from(pes.max(1) - 1));
                out[(c * n + r) as usize] = base + pe as u32;
            }
        }
        out
    };
    if a.r3 == 0 {
        let both = cut(&|r| scores(r) + weights(r), a.r1, 0);
        return (both.clone(), both);
    }
    (cut(&scores, a.r1, 0), cut(&weights, a.r3, a.v_at()))
}

/// Softmax PE (of `soft`) of each row `(head·n + row)` of a lane per head: rows from the
/// heaviest (most unmasked scores, its softmax operations; ties to the earlier row) each to
/// the PE with the fewest weights so far (ties to the lower one). Rows of equal weight are
/// dealt in turn.
pub(crate) fn deal_by_weight(p: &Problem, soft: u32) -> Vec<u32> {
    let n = p.tokens;
    let mut out = vec![0u32; (p.heads * n) as usize];
    let mut rows: Vec<(u64, u32)> = (0..n).map(|a| (u64::from(p.keys_in_row(a)), a)).collect();
    rows.sort_by_key(|&(len, a)| (std::cmp::Reverse(len), a));
    let mut load = vec![0u64; soft.max(1) as usize];
    for &(len, a) in &rows {
        let Some((pe, _)) = load.iter().enumerate().min_by_key(|&(pe, l)| (*l, pe)) else {
            break;
        };
        load[pe] += len;
        for h in 0..p.heads {
            if let Some(slot) = out.get_mut((h * n + a) as usize) {
                *slot = pe as u32;
            }
        }
    }
    out
}

/// [`Geometry::cut3`]: per head, the outputs column by column (rows in order within a column),
/// each weighing its row's unmasked scores (its products), cut into `r3` runs of about equal
/// weight; an output goes to the run holding the middle of its weight.
fn cut_outputs(p: &Problem, r3: u32, qk_rows: u32) -> Vec<u32> {
    if qk_rows == 0 {
        return outputs_by_weight(p, &vec![1; r3 as usize]);
    }
    // The rows left to the v PEs are cut as a layer of their own rows would be: the shares
    // are laid over their outputs alone.
    let mut rows: Vec<u32> = (0..p.tokens).collect();
    rows.sort_by_key(|&a| (p.keys_in_row(a), a));
    let mut on_qk = vec![false; p.tokens as usize];
    for &a in rows.iter().take(qk_rows as usize) {
        if let Some(x) = on_qk.get_mut(a as usize) {
            *x = true;
        }
    }
    let (n, d) = (p.tokens, p.dim);
    let len: Vec<u64> = (0..n)
        .map(|a| {
            if on_qk.get(a as usize).copied().unwrap_or(false) {
                0
            } else {
                u64::from(p.keys_in_row(a))
            }
        })
        .collect();
    let mut out = outputs_by_weight_of(p, &len, &vec![1; r3 as usize]);
    for h in 0..p.heads {
        for a in (0..n).filter(|&a| on_qk.get(a as usize).copied().unwrap_or(false)) {
            for c in 0..d {
                let i = (u64::from(h * n + a) * u64::from(d) + u64::from(c)) as usize;
                if let Some(slot) = out.get_mut(i) {
                    *slot = ON_QK;
                }
            }
        }
    }
    out
}

/// [`Apart::late_near`]'s cut: per head, the outputs row by row, the rows from the last to
/// finish (`plan`'s rank: the longest rows first, then by index) to the first, each output
/// weighing its row's products, cut into `r3` runs of about equal weight. A row's outputs then
/// sit on one or two neighbouring v PEs, the last row's nearest the softmax PEs.
fn late_rows_near(p: &Problem, r3: u32) -> Vec<u32> {
    let (n, d) = (p.tokens, p.dim);
    let len: Vec<u64> = (0..n).map(|a| u64::from(p.keys_in_row(a))).collect();
    let mut rows: Vec<u32> = (0..n).collect();
    // The reverse of `plan`'s rank within a head.
    rows.sort_by_key(|&a| std::cmp::Reverse((u64::from(n) - len[a as usize], a)));
    let order: Vec<(u32, u32)> = rows
        .iter()
        .flat_map(|&r| (0..d).map(move |c| (r, c)))
        .collect();
    outputs_laid(p, &len, &vec![1; r3 as usize], &order)
}

/// [`Geometry::cut3`]'s mark of an output kept on its column's q/k PE (`Apart::qk_rows`).
const ON_QK: u32 = u32::MAX;

/// Per output `(head, row, col)`, at `(head·n + row)·d + col`, the index of the share it falls
/// in: the outputs of a head, column by column and row by row within a column, each weighing
/// its row's unmasked scores, laid along shares of the given sizes; an output goes to the share
/// holding the middle of its weight.
fn outputs_by_weight(p: &Problem, shares: &[u64]) -> Vec<u32> {
    let len: Vec<u64> = (0..p.tokens).map(|r| u64::from(p.keys_in_row(r))).collect();
    outputs_by_weight_of(p, &len, shares)
}

/// [`outputs_by_weight`] with each row weighing `len[row]` (0: a row whose outputs go
/// elsewhere, which then takes no share).
fn outputs_by_weight_of(p: &Problem, len: &[u64], shares: &[u64]) -> Vec<u32> {
    let (n, d) = (p.tokens, p.dim);
    let order: Vec<(u32, u32)> = (0..d).flat_map(|c| (0..n).map(move |r| (r, c))).collect();
    outputs_laid(p, len, shares, &order)
}

/// Per output `(head, row, col)`, at `(head·n + row)·d + col`, the index of the share it falls
/// in: each head's outputs laid in `order` (`(row, col)` pairs), each weighing `len[row]`, along
/// shares of the given sizes; an output goes to the share holding the middle of its weight.
fn outputs_laid(p: &Problem, len: &[u64], shares: &[u64], order: &[(u32, u32)]) -> Vec<u32> {
    let (n, d) = (p.tokens, p.dim);
    let total: u64 = len.iter().sum::<u64>() * u64::from(d);
    let cap: u64 = shares.iter().sum::<u64>().max(1);
    // Cumulative capacity at the end of each share, in units of output weight.
    let ends: Vec<u64> = shares
        .iter()
        .scan(0u64, |acc, &s| {
            *acc += s;
            Some(*acc)
        })
        .collect();
    let mut out = vec![0u32; (u64::from(p.heads) * u64::from(n) * u64::from(d)) as usize];
    for h in 0..p.heads {
        let mut acc = 0u64;
        for &(r, c) in order {
            let w = len.get(r as usize).copied().unwrap_or(0);
            let mid = (acc + w / 2) as u128 * u128::from(cap) / u128::from(total.max(1));
            acc += w;
            let k = ends
                .partition_point(|&e| u128::from(e) <= mid)
                .min(ends.len().saturating_sub(1));
            let i = (u64::from(h * n + r) * u64::from(d) + u64::from(c)) as usize;
            if let Some(slot) = out.get_mut(i) {
                *slot = k as u32;
            }
        }
    }
    out
}

/// [`Apart::next`]'s outputs: per head, the PE (offset from the next lane's first) of output
/// `(head, row, col)`, at `(head·n + row)·d + col`. The outputs, column by column and row by
/// row within a column, each weighing its row's products, are cut over the next lane's PEs
/// after its `soft` softmax PEs, PE `j` taking a share that falls with `j` when `taper > 0`
/// (as `r1 + taper − j`): the weights reach the PEs one after another, and the later ones also
/// begin their own phase 1 later, so equal shares leave the arc's last PEs working after its
/// first are done. With several row groups (`group_of[row]`, the same in every head) each
/// group's rows are cut over the PEs after its own lane.
fn next_outputs(p: &Problem, a: Apart, groups: u32, group_of: &[u32]) -> Vec<u32> {
    let first = if a.soft_outputs {
        0
    } else {
        a.soft.min(a.r1.saturating_sub(1))
    };
    let pes: Vec<u32> = (first..a.r1.max(1)).collect();
    let shares: Vec<u64> = pes
        .iter()
        .map(|&j| {
            if a.taper == 0 {
                1
            } else {
                u64::from(a.r1 + a.taper - j)
            }
        })
        .collect();
    let (n, d) = (p.tokens as usize, p.dim as usize);
    let len: Vec<u64> = (0..p.tokens).map(|r| u64::from(p.keys_in_row(r))).collect();
    let mut out = vec![0u32; p.heads as usize * n * d];
    for g in 0..groups.max(1) {
        let in_group = |r: usize| group_of.get(r).is_none_or(|&x| x == g);
        let own: Vec<u64> = len
            .iter()
            .enumerate()
            .map(|(r, &l)| if in_group(r) { l } else { 0 })
            .collect();
        let table = if a.soft_outputs {
            outputs_by_weight_of(p, &own, &balanced_shares(p, a, &own))
        } else {
            outputs_by_weight_of(p, &own, &shares)
        };
        for (i, slot) in out.iter_mut().enumerate() {
            if in_group((i / d) % n.max(1)) {
                let k = table.get(i).copied().unwrap_or(0);
                *slot = pes.get(k as usize).copied().unwrap_or(0);
            }
        }
    }
    out
}

/// [`Apart::soft_outputs`]' shares of one row group's outputs over all `r1` PEs of the next
/// arc, so that each PE does about as many operations: a softmax PE's share is the others' less
/// its softmax work (a maximum, an exponential and a division per weight of the rows dealt to
/// it, two without the maximum), in products, plus what its own arc's scores spared it
/// ([`arc_deal`]); none when that is more than its share.
fn balanced_shares(p: &Problem, a: Apart, rows_len: &[u64]) -> Vec<u64> {
    let (r1, soft) = (u64::from(a.r1.max(1)), u64::from(a.soft.min(a.r1).max(1)));
    let weights: u64 = rows_len.iter().sum();
    let light = if a.soft_repaid { a.light(p) } else { 0 };
    // Its softmax work less what its scores spared it, in hundredths of an operation.
    let less = softmax_work(p, weights, soft) * (100 - light);
    softmax_lighter(r1, soft, weights * u64::from(p.dim) * 100, less)
}

/// Softmax operations of `weights` weights on each of `soft` PEs: an exponential and a division
/// per weight, and with a safe softmax a maximum (one per weight, counted roughly).
fn softmax_work(p: &Problem, weights: u64, soft: u64) -> u64 {
    let per_weight = if p.safe() { 3 } else { 2 };
    (weights * per_weight).div_ceil(soft.max(1))
}

/// Shares of `r1` PEs in `total` work, the first `soft` of them `less` lighter than the others,
/// times `r1` (none below 0): `total + soft·less` for the others, `r1·less` lighter for those.
fn softmax_lighter(r1: u64, soft: u64, total: u64, less: u64) -> Vec<u64> {
    let others = total + soft * less;
    (0..r1)
        .map(|j| {
            if j < soft {
                others.saturating_sub(r1 * less)
            } else {
                others
            }
        })
        .collect()
}

/// Weights of an arc's q/k PEs in dealing its whole scores: equal, or with
/// [`Apart::soft_light`] a softmax PE's lighter by that share of its softmax work, so that the
/// maximum it builds while the previous arc's scores arrive does not wait on its own.
fn arc_deal(p: &Problem, ap: Apart, g: &Geometry, pairs_of: &dyn Fn(u32) -> Vec<u32>) -> Vec<u64> {
    let (r1, soft) = (
        u64::from(ap.r1.max(1)),
        u64::from(ap.soft.min(ap.r1).max(1)),
    );
    let light = ap.light(p);
    if light == 0 {
        return vec![1; r1 as usize];
    }
    // Per arc its whole scores and its rows' weights (whose softmax the next arc's softmax
    // PEs take); the busiest arc of each sets the shares.
    let mut scores = vec![0u64; g.lanes as usize];
    let mut weights = vec![0u64; g.lanes as usize];
    for h in 0..p.heads {
        for a in 0..p.tokens {
            let lane = g.lane(h, a) as usize;
            if let (Some(s), Some(w)) = (scores.get_mut(lane), weights.get_mut(lane)) {
                *s += pairs_of(a).len() as u64;
                *w += u64::from(p.keys_in_row(a));
            }
        }
    }
    let products = scores.iter().copied().max().unwrap_or(0) * u64::from(p.dim);
    let softmax = softmax_work(p, weights.iter().copied().max().unwrap_or(0), soft);
    // `light` percent of its softmax work, in hundredths of an operation.
    softmax_lighter(r1, soft, products * 100, light * softmax)
}

/// The PE whose count of dealt scores is furthest below its weight (ties to the first): the
/// one with the least `(count + 1/2) / weight`; a PE of weight 0 takes none while another can.
fn least_loaded(counts: &[u64], weights: &[u64]) -> usize {
    let key = |j: usize| {
        let c = counts.get(j).copied().unwrap_or(u64::MAX / 4);
        let w = weights.get(j).copied().unwrap_or(0);
        (u128::from(2 * c + 1), u128::from(w))
    };
    let mut best = 0;
    for j in 1..counts.len() {
        let ((cj, wj), (cb, wb)) = (key(j), key(best));
        // cj / wj < cb / wb, cross-multiplied (a weight of 0 is never less).
        if wj > 0 && (wb == 0 || cj * wb < cb * wj) {
            best = j;
        }
    }
    best
}

/// Tiny deterministic generator for the perturbed retries (no dependence on the clock).
#[derive(Clone, Copy, Default)]
struct Noise(u64);

impl Noise {
    fn next(&mut self, span: i64) -> i64 {
        if self.0 == 0 || span <= 0 {
            return 0;
        }
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % span as u64) as i64
    }
}

/// The perturbations of one run: landings moved by some PEs and priority offsets per task. A run
/// either draws them from a seeded [`Noise`] (and records them) or replays given ones, so the
/// local search can change a few of them at a time.
#[derive(Clone, Default)]
struct Tweaks {
    noise: Noise,
    replay: bool,
    bump: Vec<u32>,
    prio: Vec<i64>,
    next_bump: usize,
}

impl Tweaks {
    fn seeded(seed: u64) -> Tweaks {
        Tweaks {
            noise: Noise(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | u64::from(seed != 0)),
            ..Tweaks::default()
        }
    }

    /// The same perturbations again, for a run whose plan is built from the start.
    fn replaying(&self) -> Tweaks {
        Tweaks {
            noise: Noise(0),
            replay: true,
            bump: self.bump.clone(),
            prio: self.prio.clone(),
            next_bump: 0,
        }
    }

    /// PEs a landing moves on (a seeded run moves about one in six by one PE).
    fn bump(&mut self) -> u32 {
        let i = self.next_bump;
        self.next_bump += 1;
        if self.replay {
            return self.bump.get(i).copied().unwrap_or(0);
        }
        let v = self.noise.next(2) as u32 * u32::from(self.noise.next(3) == 0);
        self.bump.push(v);
        v
    }

    /// Priority offset of task `i`.
    #[inline]
    fn prio(&mut self, i: usize, span: i64) -> i64 {
        if self.replay {
            return self.prio.get(i).copied().unwrap_or(0);
        }
        let v = self.noise.next(span);
        if self.prio.len() <= i {
            self.prio.resize(i + 1, 0);
        }
        self.prio[i] = v;
        v
    }
}

/// The plan (tasks and chains) for one layout, then its simulation booked into a schedule;
/// nothing if that takes more than `limit` cycles.
fn build(
    p: &Problem,
    m: u32,
    layout: Layout,
    tweaks: &mut Tweaks,
    limit: usize,
    work: &mut u64,
    plans: &mut Plans,
) -> Result<Option<Run>, Vec<ScheduleError>> {
    // Room for as many cycles as the last run of the plan took, and a value per task.
    let (out, mut b) = simulate(p, m, layout, tweaks, limit, work, plans, |plan| {
        plan.b
            .fork(plan.cycles.min(limit.saturating_add(1)), plan.tasks.len())
    });
    let spread = match out {
        Ok(Some((_, spread))) => spread,
        Ok(None) => return Ok(None),
        Err(why) => {
            b.bug(NAME, why);
            0
        }
    };
    b.finish().map(|schedule| Some(Run { schedule, spread }))
}

/// How a run [`trial`] did not book went.
enum Trial {
    /// Finished within the limit: cycles, and the spread of the PEs' last operations.
    Done(usize, u64),
    /// Took more than the limit.
    Over,
    /// [`build`] would have returned errors.
    Refused,
}

/// The same run as [`build`], with the same work counted, but booked into a [`Tally`]: its
/// length without its schedule. [`build`] with the same arguments (and a replay of `tweaks`
/// as they stand after this) makes the schedule of this very run.
fn trial(
    p: &Problem,
    m: u32,
    layout: Layout,
    tweaks: &mut Tweaks,
    limit: usize,
    work: &mut u64,
    plans: &mut Plans,
) -> Trial {
    let (out, tally) = simulate(p, m, layout, tweaks, limit, work, plans, |plan| {
        Tally::new(&plan.b)
    });
    // As in `build`: a run over the limit is just that, whatever was reported on the way.
    match out {
        Ok(None) => Trial::Over,
        Ok(Some((cycles, spread))) if !tally.failed => Trial::Done(cycles, spread),
        _ => Trial::Refused,
    }
}

/// The plan for one layout, then its simulation, booked into what `book` makes of the plan.
#[allow(clippy::too_many_arguments)]
fn simulate<B: Book>(
    p: &Problem,
    m: u32,
    layout: Layout,
    tweaks: &mut Tweaks,
    limit: usize,
    work: &mut u64,
    plans: &mut Plans,
    book: impl FnOnce(&Plan) -> B,
) -> (Result<Option<(usize, u64)>, String>, B) {
    // Only the ring-spanning lane moves landings. They are drawn before any priority offset,
    // one per phase-2 operation, so drawing them all up front keeps a seeded run's sequence.
    let ring = Geometry::new(p, m, layout).ring;
    let bumps: Vec<u32> = if ring {
        let per_row: usize = (0..p.tokens)
            .map(|a| (0..p.tokens).filter(|&c| p.unmasked(a, c)).count())
            .sum();
        let per_weight = if layout.forward > 0 { 3 } else { 2 };
        (0..per_weight * per_row * p.heads as usize)
            .map(|_| tweaks.bump())
            .collect()
    } else {
        Vec::new()
    };
    let Plans { recent, scratch } = plans;
    let plan = plan_for(recent, p, m, layout, bumps);
    let mut b = book(plan);
    let span = if tweaks.noise.0 == 0 { 0 } else { 4 };
    plan.base_prio(layout.row_weight, layout.softmax_first);
    // The run's buffers are the scratch's, taken for the run and given back after it.
    let mut prio = std::mem::take(&mut scratch.prio);
    prio.clear();
    prio.extend(
        plan.base
            .iter()
            .enumerate()
            .map(|(i, &base)| base + tweaks.prio(i, span * 8)),
    );
    // A preloaded word goes on the link as urgently as its most urgent reader (a term: a
    // division reads only words made by exponentials).
    let mut preloaded = std::mem::take(&mut scratch.preloaded);
    preloaded.clear();
    // With fractional columns a `k` or `v` word read on both sides of a cut waits on its
    // first PE's link, which that PE's partial sums, sent every cycle, would hold until its
    // work ends, its neighbour idle the while (see `frac_offsets`): such a word (one hop) goes
    // first, before partial sums in flight. They are few, a column's rows per cut.
    let neighbours_first = layout.apart.is_some_and(|a| a.frac);
    let first = (plan.tasks.len() as i64 + 1) * 8;
    preloaded.extend(plan.preloaded.iter().enumerate().map(|(i, &(pe, v))| {
        if neighbours_first && plan.reach.get(v.index()) == Some(&1) {
            return (pe, v, first);
        }
        // Below every other word (priorities stay within `±first`), most urgent first among
        // themselves.
        // With `keys_first` the inputs go in a fixed order, row by row (a key's words
        // together), below every computed word, so that a lane's scores fill the gaps the
        // previous lane's left in the stream; the v words below all of them.
        if layout.keys_first {
            let seq = i64::try_from(plan.seq.get(i).copied().unwrap_or(0)).unwrap_or(first);
            let late = plan.late.get(i) == Some(&true);
            return (pe, v, if late { -4 * first } else { -2 * first } - seq);
        }

        let u = plan
            .readers
            .of_word(v)
            .filter(|&i| plan.gates[i].chain != NONE)
            .map(|i| prio[i])
            .max()
            .unwrap_or(i64::MIN);
        (pe, v, if u == i64::MIN { 0 } else { u })
    }));
    plan.sort(&prio);
    // The simulation takes each PE's tasks about in this order: laid out in it, they are read
    // from nearby memory.
    let sim = Sim {
        m,
        scale: p.scale as f32,
        tasks: &plan.steps,
        order: &plan.order,
        chains: &plan.chains,
        reach: &plan.reach,
        gates: &plan.gates,
        absorbs: &plan.absorbs_at,
        readers: &plan.readers,
    };
    // Charged per run even where the plan is reused: the search's length is counted in these
    // units, and the same units end it at the same step.
    *work += PLAN_WORK * plan.steps.len() as u64 + PLAN_FIXED;
    let out = sim.run(&mut b, &preloaded, limit, work, scratch);
    if let Ok(Some((cycles, _))) = out {
        plan.cycles = cycles;
    }
    scratch.prio = prio;
    scratch.preloaded = preloaded;
    (out, b)
}

/// What a run needs that its priority offsets and variant do not change: the tasks and chains of
/// a layout with its landings, the builder holding their values, and each task's longest path.
/// The local search rebuilds a schedule per step, mostly with the same layout and landings.
struct Plan {
    /// The layout without its priority variant, and the landings moved.
    layout: Layout,
    bumps: Vec<u32>,
    b: Builder,
    chains: Vec<Chain>,
    /// `prio` is the row's rank.
    tasks: Vec<Task>,
    /// Hops each value travels from where it appears, by value index.
    reach: Vec<u32>,
    preloaded: Vec<(u32, Val)>,
    /// Which of `preloaded` are v words (`Layout::keys_first` sends them last).
    late: Vec<bool>,
    /// Each of `preloaded`'s place in a row-major order of its tensor (`Layout::keys_first`).
    seq: Vec<u64>,
    /// Longest path from each task to the end.
    tail: Vec<i64>,
    /// Softmax work, which a `softmax_first` variant runs before any product.
    eager: Vec<bool>,
    /// What each task waits for, by task index.
    gates: Vec<Gate>,
    /// Terms of maximum chains, which may be absorbed (see [`Sim::absorb`]).
    absorbs: Vec<bool>,
    readers: ready::Readers,
    /// The last run's tasks by PE, then priority (highest first), then index, and the priorities
    /// they were sorted by: a search step changes only a few of them.
    order: Vec<u32>,
    order_prio: Vec<i64>,
    /// By position in `order`: the task as the simulation reads it, with its priority in
    /// `order_prio`, and its `absorbs`. Patched with `order`: gathering them from `tasks` for
    /// every run took about 5 % of the local search.
    steps: Vec<Step>,
    absorbs_at: Vec<bool>,
    /// Each task's priority before its run's offset, for the variant `base_key` (row weight,
    /// softmax first): the same for every run of the variant, which the search keeps.
    base: Vec<i64>,
    base_key: Option<(i64, bool)>,
    /// Cycles of the last run that finished.
    cycles: usize,
}

/// Most changed priorities the task order is patched for rather than sorted again.
const RESORT: usize = 8;

impl Plan {
    /// Makes `base` the priorities of the variant `(row_weight, softmax_first)`.
    fn base_prio(&mut self, row_weight: i64, softmax_first: bool) {
        if self.base_key == Some((row_weight, softmax_first)) {
            return;
        }
        self.base_key = Some((row_weight, softmax_first));
        self.base.clear();
        self.base
            .extend(self.tasks.iter().enumerate().map(|(i, t)| {
                // The plan's `prio` is the row's rank.
                let boost = if softmax_first && self.eager[i] {
                    1 << 40
                } else {
                    0
                };
                boost + (self.tail[i] - t.prio * row_weight) * 8
            }));
    }

    /// Brings `order` up to date with the tasks' priorities `run_prio`.
    fn sort(&mut self, run_prio: &[i64]) {
        let tasks = &self.tasks;
        let n = tasks.len();
        let changed: Vec<u32> = (0..n as u32)
            .filter(|&i| self.order_prio.get(i as usize) != run_prio.get(i as usize))
            .take(RESORT + 1)
            .collect();
        if changed.is_empty() && self.order.len() == n {
            return;
        }
        let patch = self.order.len() == n && self.order_prio.len() == n && changed.len() <= RESORT;
        if patch {
            // Each changed task leaves from where its old priority put it.
            let old = &self.order_prio;
            let key = |i: u32| (tasks[i as usize].pe, std::cmp::Reverse(old[i as usize]), i);
            for &i in &changed {
                let at = self.order.partition_point(|&j| key(j) < key(i));
                let at = if self.order.get(at) == Some(&i) {
                    Some(at)
                } else {
                    self.order.iter().position(|&j| j == i)
                };
                if let Some(at) = at {
                    self.order.remove(at);
                    self.steps.remove(at);
                    self.absorbs_at.remove(at);
                }
            }
        }
        self.order_prio.clear();
        self.order_prio.extend_from_slice(run_prio);
        let prio = &self.order_prio;
        let key = |i: u32| (tasks[i as usize].pe, std::cmp::Reverse(prio[i as usize]), i);
        if !patch {
            // The same order as sorting by `key`, each key packed into one integer.
            let mut packed: Vec<u128> = (0..n)
                .map(|i| {
                    let descending = !((prio[i] as u64) ^ (1 << 63));
                    (u128::from(tasks[i].pe) << 96) | (u128::from(descending) << 32) | i as u128
                })
                .collect();
            packed.sort_unstable();
            self.order.clear();
            self.order.extend(packed.iter().map(|&k| k as u32));
            self.steps.clear();
            self.steps.extend(
                self.order
                    .iter()
                    .map(|&i| Step::new(&tasks[i as usize], prio[i as usize])),
            );
            self.absorbs_at.clear();
            let absorbs = &self.absorbs;
            self.absorbs_at
                .extend(self.order.iter().map(|&i| absorbs[i as usize]));
            return;
        }
        for &i in &changed {
            let at = self.order.partition_point(|&j| key(j) < key(i));
            self.order.insert(at, i);
            self.steps
                .insert(at, Step::new(&tasks[i as usize], prio[i as usize]));
            self.absorbs_at.insert(at, self.absorbs[i as usize]);
        }
    }
}

/// The last few plans made (most recently used last), and the simulation's buffers.
#[derive(Default)]
struct Plans {
    recent: Vec<Plan>,
    scratch: Scratch,
}

/// Buffers a simulation leaves to the next: each step would otherwise allocate, and fault in,
/// the same memory again.
#[derive(Default)]
struct Scratch {
    avail: Avail,
    links: Vec<Link>,
    ready: ready::Ready,
    prio: Vec<i64>,
    preloaded: Vec<(u32, Val, i64)>,
    run: RunBuffers,
}

/// What [`Sim::run`] keeps per PE and per chain.
#[derive(Default)]
struct RunBuffers {
    last_op: Vec<usize>,
    state: Vec<ChainState>,
    ops_left: Vec<usize>,
    wake: Vec<usize>,
    arrivals: Vec<(usize, Val)>,
}

/// Plans kept: the retries go round three layouts, and the search keeps coming back to its
/// current landings.
const PLANS_KEPT: usize = 4;

/// The plan of `layout` (its priority variant aside) with `bumps`, made if none of `recent` is.
fn plan_for<'a>(
    recent: &'a mut Vec<Plan>,
    p: &Problem,
    m: u32,
    layout: Layout,
    bumps: Vec<u32>,
) -> &'a mut Plan {
    let key = Layout {
        row_weight: 0,
        softmax_first: false,
        ..layout
    };
    let found = recent
        .iter()
        .position(|q| q.layout == key && q.bumps == bumps);
    let hit = match found {
        Some(i) => recent.remove(i),
        None => {
            if recent.len() >= PLANS_KEPT {
                recent.remove(0);
            }
            plan(p, m, key, bumps)
        }
    };
    // The newest plan goes last, so the oldest is the one dropped.
    recent.push(hit);
    let newest = recent.len() - 1;
    &mut recent[newest]
}

/// The tasks and chains for one layout, with `bumps` moving landings on the ring-spanning lane.
fn plan(p: &Problem, m: u32, layout: Layout, bumps: Vec<u32>) -> Plan {
    let g = Geometry::new(p, m, layout);
    let (n, d) = (p.tokens, p.dim);
    let mut b = Builder::new(NAME, m);
    // About one task per necessary operation (a maximum's first terms are tasks too): the
    // local search on the ring-spanning lane makes a plan per landing it moves, and growing
    // these step by step showed in its profile.
    let ops = usize::try_from(p.necessary_ops()).unwrap_or(0).min(1 << 24);
    let mut chains: Vec<Chain> = Vec::new();
    let mut tasks: Vec<Task> = Vec::with_capacity(ops + ops / 8);
    // Input uses: (role, head, row, col) → reading PEs; created after all readers are known.
    let mut uses: HashMap<Element, Vec<u32>> = HashMap::default();
    let mut want = |t: Tensor, h: u32, row: u32, col: u32, pe: u32| -> Element {
        let e = Element {
            tensor: p.tensor_for(t),
            head: h,
            row,
            col,
        };
        uses.entry(e).or_default().push(pe);
        e
    };
    // Input operands are patched from elements to values once homes are known.
    let mut input_of: Vec<(usize, bool, Element)> = Vec::with_capacity(2 * ops);

    // Scores: one chain per distinct score, landing balanced over the ring (one lane) or on the
    // lane's softmax PE.
    let pairs = p.symmetric && !p.causal && !layout.mirror;
    let by_smaller = pairs && pairs_by_smaller(layout);
    let pairs_of = |a: u32| -> Vec<u32> {
        if by_smaller {
            (a..n).collect()
        } else if p.causal || pairs {
            (0..=a).collect()
        } else {
            (0..n).collect()
        }
    };
    let mut score: HashMap<(u32, u32, u32), (usize, u32)> = HashMap::default();
    // Rows in the order they should finish: longest first, so the last to finish is short.
    let rank = |h: u32, a: u32| -> i64 {
        let len = (0..n).filter(|&c| p.unmasked(a, c)).count() as i64;
        (i64::from(n) - len) * i64::from(p.heads) * i64::from(n) + i64::from(a * p.heads + h)
    };
    // On the ring-spanning lane, where each weight's exponential and division go: an even cut of
    // the row-major sequence of phase-2 operations (a row's exponentials, with its maxima, then its
    // divisions) over the PEs, so phase-2 work is balanced to about one operation and a row's
    // divisions sit on or just after its exponentials. A score lands where its exponential is;
    // retries move some of them one PE on.
    let mut phase2: HashMap<(u32, u32, u32), (u32, u32)> = HashMap::default();
    // With `forward`, where each score lands (its maximum's term), when not on its exponential.
    let mut lands: HashMap<(u32, u32, u32), u32> = HashMap::default();
    let forward = g.ring && layout.forward > 0 && p.safe();
    if g.ring {
        let ring_pes: Vec<u32> = g.blocks(0).iter().map(|b| b.0).collect();
        let nb = ring_pes.len().max(1) as u64;
        let unit = if p.safe() { 2 } else { 1 };
        let len = |a: u32| u64::from(p.keys_in_row(a));
        let total: u64 =
            u64::from(p.heads) * (0..n).map(|a| len(a) * (unit + 1)).sum::<u64>().max(1);
        let mut acc = 0u64;
        let mut next_bump = 0usize;
        let weights = u64::from(p.heads) * (0..n).map(len).sum::<u64>().max(1);
        let mut k = 0u64;
        let mut at_index = |i: u64| -> u32 {
            let bump = bumps.get(next_bump).copied().unwrap_or(0);
            next_bump += 1;
            ring_pes[((i + u64::from(bump)) % nb) as usize]
        };
        let cut = |mid: u64| ((mid * nb) / total).min(nb - 1);
        for (h, a) in (0..p.heads).flat_map(|h| (0..n).map(move |a| (h, a))) {
            let cols: Vec<u32> = (0..n).filter(|&c| p.unmasked(a, c)).collect();
            let mut exp_at = Vec::with_capacity(cols.len());
            if forward && layout.forward == 2 {
                // Landings cut evenly from the sequence of all weights; the row's exponentials
                // as wide again from its last landing PE, its divisions from its last
                // exponential's.
                let k0 = k;
                let last = cols.len().saturating_sub(1) as u64;
                let rel = |j: u64| (j * nb) / weights;
                let land_end = ((k0 + last) * nb) / weights;
                let exp_end = land_end + rel(last);
                for (j, &c) in cols.iter().enumerate() {
                    let j = j as u64;
                    lands.insert((h, a, c), at_index((k0 + j) * nb / weights));
                    exp_at.push(at_index(land_end + rel(j)));
                }
                for (j, &c) in cols.iter().enumerate() {
                    let div_at = at_index(exp_end + rel(j as u64));
                    phase2.insert((h, a, c), (exp_at[j], div_at));
                }
                k += cols.len() as u64;
                continue;
            }
            if forward {
                // The row's maximum terms, then its exponentials, each one unit of the cut.
                for &c in &cols {
                    lands.insert((h, a, c), at_index(cut(acc)));
                    acc += 1;
                }
                for _ in &cols {
                    exp_at.push(at_index(cut(acc)));
                    acc += 1;
                }
            } else {
                for _ in &cols {
                    exp_at.push(at_index(cut(acc + unit / 2)));
                    acc += unit;
                }
            }
            for (j, &c) in cols.iter().enumerate() {
                let div_at = at_index(cut(acc));
                acc += 1;
                phase2.insert((h, a, c), (exp_at[j], div_at));
            }
        }
    }
    // Each row's place among its lane's rows, which deals the rows to the softmax PEs.
    let mut lane_row: Vec<u32> = Vec::with_capacity((p.heads * n) as usize);
    let mut lane_rows: HashMap<u32, u32> = HashMap::default();
    for h in 0..p.heads {
        for a in 0..n {
            let k = lane_rows.entry(g.lane(h, a)).or_insert(0);
            lane_row.push(*k);
            *k += 1;
        }
    }
    // Dealt from the last softmax PE back in the order the rows finish (`rank`), the first
    // rows' weights leave the softmax PEs by a link that no later row's score crosses.
    if let Some(ap) = g.apart.filter(|ap| ap.soft_from_last && ap.soft > 1) {
        let mut by_lane: HashMap<u32, Vec<(i64, usize)>> = HashMap::default();
        for h in 0..p.heads {
            for a in 0..n {
                let i = (h * n + a) as usize;
                by_lane
                    .entry(g.lane(h, a))
                    .or_default()
                    .push((rank(h, a), i));
            }
        }
        for rows in by_lane.values_mut() {
            rows.sort_unstable();
            for (pos, &(_, i)) in rows.iter().enumerate() {
                if let Some(slot) = lane_row.get_mut(i) {
                    *slot = ap.soft - 1 - (pos as u32 % ap.soft);
                }
            }
        }
    }
    // The lanes cut by outputs deal rows by weight: their softmax PEs are then as busy as the
    // v PEs, and in turn the odd rows of a causal head would load the second of two more.
    if let Some(ap) = g
        .apart
        .filter(|ap| !g.cut3.is_empty() && ap.soft > 1 && !(ap.tuck && ap.soft_from_last))
    {
        for (i, pe) in deal_by_weight(p, ap.soft).into_iter().enumerate() {
            if let Some(slot) = lane_row.get_mut(i) {
                *slot = pe;
            }
        }
    }
    // On arcs, the whole scores dealt so far to each PE of each arc, and the PEs' weights.
    let deal = g
        .apart
        .filter(|ap| ap.next)
        .map(|ap| arc_deal(p, ap, &g, &pairs_of));
    let mut dealt: Vec<Vec<u64>> =
        vec![vec![0; deal.as_ref().map_or(0, Vec::len)]; g.lanes as usize];
    for h in 0..p.heads {
        for a in 0..n {
            let lane = g.lane(h, a);
            let blocks = g.blocks_row(lane, Some(a));
            let whole = g
                .apart
                .filter(|ap| ap.copies && ap.whole_scores && p.copies && ap.r1 > 0);
            for bcol in pairs_of(a) {
                // With q = k (no mask) the pair {bcol, a} is computed once, as (a, bcol), with
                // bcol ≤ a (bcol ≥ a by the smaller row).
                let (qa, kb) = (a, bcol);
                let order: Vec<(u32, Vec<u32>)> = if g.ring {
                    // Land where the exponential is (or the maximum's term, laid forward):
                    // start on the block after it.
                    let exp_pe = lands
                        .get(&(h, a, bcol))
                        .copied()
                        .unwrap_or_else(|| phase2.get(&(h, a, bcol)).map_or(0, |x| x.0));
                    let land = blocks.iter().position(|b| b.0 == exp_pe).unwrap_or(0);
                    let first = (land + 1) % blocks.len();
                    blocks[first..]
                        .iter()
                        .chain(&blocks[..first])
                        .cloned()
                        .collect()
                } else if let Some(ap) = whole {
                    // On arcs, dealt over the arc's q/k PEs by their weights (equal ones: in
                    // turn), so that each does its share of the arc's scores however many each
                    // row has (each PE's phase 3 follows its share); elsewhere by key and row,
                    // so that a row's last scores end on different PEs.
                    let k = match (&deal, dealt.get_mut(lane as usize)) {
                        (Some(w), Some(counts)) => {
                            let j = least_loaded(counts, w);
                            if let Some(c) = counts.get_mut(j) {
                                *c += 1;
                            }
                            j as u32
                        }
                        _ => bcol + a,
                    };
                    let pe = (g.start(lane) + k % ap.r1) % m;
                    vec![(pe, (0..d).collect())]
                } else {
                    blocks.clone()
                };
                let id = chains.len();
                let mut segs = Vec::with_capacity(order.len());
                for (si, (pe, cols)) in order.iter().enumerate() {
                    let mut ts = Vec::with_capacity(cols.len());
                    for &c in cols {
                        let eq = want(Tensor::Q, h, qa, c, *pe);
                        let ek = want(Tensor::K, h, kb, c, *pe);
                        let t = tasks.len();
                        tasks.push(Task {
                            pe: *pe,
                            kind: TaskKind::Term {
                                chain: id,
                                seg: si,
                                x: Opnd::V(Val::from_u32(0)),
                                y: Some(Opnd::V(Val::from_u32(0))),
                                e: None,
                            },
                            prio: rank(h, a),
                        });
                        input_of.push((t, false, eq));
                        input_of.push((t, true, ek));
                        ts.push(t);
                    }
                    segs.push((*pe, ts));
                }
                let land = if g.ring {
                    segs.last().map_or(0, |s| s.0)
                } else {
                    g.land(lane, lane_row[(h * n + a) as usize])
                };
                chains.push(Chain {
                    kind: ChainKind::Mac(1),
                    segs,
                    readers: Vec::new(),
                    output: None,
                });
                score.insert((h, a, bcol), (id, land));
                if pairs && bcol != a {
                    score.insert((h, bcol, a), (id, land));
                }
            }
        }
    }

    // Phase 2 per row, then phase 3.
    let mut moved: Vec<(Val, u32)> = Vec::new();
    let mut weights: HashMap<(u32, u32, u32), (Val, u32)> = HashMap::default();
    for h in 0..p.heads {
        for a in 0..n {
            let cols: Vec<u32> = (0..n).filter(|&c| p.unmasked(a, c)).collect();
            // Exponential PEs of the row (and, laid forward, landing PEs apart), visited in ring
            // order after the largest gap.
            let mut by_pe: Vec<(u32, Vec<u32>)> = Vec::new();
            let mut by_land: Vec<(u32, Vec<u32>)> = Vec::new();
            for &c in &cols {
                let Some(&(_, land)) = score.get(&(h, a, c)) else {
                    b.bug(NAME, "a score with no chain");
                    continue;
                };
                // In the cols dataflow a row's softmax is all on its own softmax PE: a score
                // computed once for two rows (q = k) goes on from the last column PE to both.
                let pe = if g.apart.is_some() {
                    g.land(g.lane(h, a), lane_row[(h * n + a) as usize])
                } else {
                    phase2.get(&(h, a, c)).map_or(land, |x| x.0)
                };
                for (list, pe) in [(&mut by_pe, pe), (&mut by_land, land)] {
                    match list.iter_mut().find(|(q, _)| *q == pe) {
                        Some((_, cs)) => cs.push(c),
                        None => list.push((pe, vec![c])),
                    }
                }
            }
            for list in [&mut by_pe, &mut by_land] {
                list.sort_by_key(|&(pe, _)| pe);
                if list.len() > 1 {
                    let k = list.len();
                    let gap = |i: usize| dist(list[i].0, list[(i + 1) % k].0, m);
                    let widest = (0..k).max_by_key(|&i| gap(i)).unwrap_or(0);
                    list.rotate_left((widest + 1) % k);
                }
            }
            // Laid forward, the maximum runs over the landing PEs and reaches the exponentials
            // ahead of it; otherwise both run over the same PEs.
            let max_parts = if forward { &by_land } else { &by_pe };
            let term = |tasks: &mut Vec<Task>,
                        chain: usize,
                        seg: usize,
                        pe: u32,
                        x: Opnd,
                        e: Option<Val>| {
                let t = tasks.len();
                tasks.push(Task {
                    pe,
                    kind: TaskKind::Term {
                        chain,
                        seg,
                        x,
                        y: None,
                        e,
                    },
                    prio: rank(h, a),
                });
                t
            };
            let sc = |c: u32| score.get(&(h, a, c)).map_or(0, |s| s.0);
            let bias = if p.safe() {
                let id = chains.len();
                let segs = max_parts
                    .iter()
                    .enumerate()
                    .map(|(si, (pe, cs))| {
                        let ts = cs
                            .iter()
                            .map(|&c| term(&mut tasks, id, si, *pe, Opnd::Chain(sc(c)), None))
                            .collect();
                        (*pe, ts)
                    })
                    .collect();
                chains.push(Chain {
                    kind: ChainKind::Max,
                    segs,
                    readers: by_pe.iter().map(|s| s.0).collect(),
                    output: None,
                });
                if forward {
                    for (pe, cs) in max_parts {
                        for &c in cs {
                            chains[sc(c)].readers.push(*pe);
                        }
                    }
                }
                Some(id)
            } else {
                None
            };
            // The safe sum starts on the last part, which has the maximum first.
            let mut order = by_pe.clone();
            if p.safe() && !forward && order.len() > 1 {
                order.rotate_right(1);
            }
            let id = chains.len();
            let mut exps: Vec<(u32, u32, Val)> = Vec::new();
            let mut segs = Vec::new();
            for (si, (pe, cs)) in order.iter().enumerate() {
                let mut ts = Vec::new();
                for &c in cs {
                    let e = b.computed();
                    ts.push(term(&mut tasks, id, si, *pe, Opnd::Chain(sc(c)), Some(e)));
                    exps.push((*pe, c, e));
                    chains[sc(c)].readers.push(*pe);
                }
                segs.push((*pe, ts));
            }
            let div_pe = |pe: u32, c: u32| phase2.get(&(h, a, c)).map_or(pe, |x| x.1);
            let mut readers: Vec<u32> = exps.iter().map(|&(pe, c, _)| div_pe(pe, c)).collect();
            readers.sort_unstable();
            readers.dedup();
            chains.push(Chain {
                kind: ChainKind::Exp { bias },
                segs,
                readers,
                output: None,
            });
            for (exp_pe, c, e) in exps {
                let pe = div_pe(exp_pe, c);
                if pe != exp_pe {
                    moved.push((e, dist(exp_pe, pe, m)));
                }
                let out = b.computed();
                tasks.push(Task {
                    pe,
                    kind: TaskKind::Div {
                        num: e,
                        den: id,
                        out,
                    },
                    prio: rank(h, a),
                });
                weights.insert((h, a, c), (out, pe));
            }
        }
    }
    // Phase 3: y[a][c] on column c's phase-3 PE, over the row's weights in any order.
    let mut weight_readers: HashMap<Val, Vec<u32>> = HashMap::default();
    for h in 0..p.heads {
        for a in 0..n {
            let lane = g.lane(h, a);
            for c in 0..d {
                let pe = match g.apart {
                    Some(ap) if ap.local_v && ap.helper > 0 && ap.keep_v > 0 && c >= ap.keep_v => {
                        let rest = u64::from(d.saturating_sub(ap.keep_v).max(1));
                        let k = (u64::from(c - ap.keep_v) * u64::from(ap.helper)) / rest;
                        (g.land(lane, lane_row[(h * n + a) as usize]) + 1 + k as u32) % m
                    }
                    Some(ap) if ap.local_v && ap.keep_v > 0 && c >= ap.keep_v => {
                        (g.start(lane) + ap.len()) % m
                    }
                    Some(ap) if ap.local_v => g.land(lane, lane_row[(h * n + a) as usize]),
                    _ => g.p3_out(lane, h, a, c),
                };
                let id = chains.len();
                let mut ts = Vec::new();
                for bcol in (0..n).filter(|&bc| p.unmasked(a, bc)) {
                    let Some(&(w, _)) = weights.get(&(h, a, bcol)) else {
                        b.bug(NAME, "a weight with no division");
                        continue;
                    };
                    weight_readers.entry(w).or_default().push(pe);
                    let ev = want(Tensor::V, h, bcol, c, pe);
                    let t = tasks.len();
                    tasks.push(Task {
                        pe,
                        kind: TaskKind::Term {
                            chain: id,
                            seg: 0,
                            x: Opnd::V(w),
                            y: Some(Opnd::V(Val::from_u32(0))),
                            e: None,
                        },
                        prio: rank(h, a),
                    });
                    input_of.push((t, true, ev));
                    ts.push(t);
                }
                chains.push(Chain {
                    kind: ChainKind::Mac(3),
                    segs: vec![(pe, ts)],
                    readers: Vec::new(),
                    output: Some(Element {
                        tensor: Tensor::Y,
                        head: h,
                        row: a,
                        col: c,
                    }),
                });
            }
        }
    }

    // Inputs: each element preloaded on the reader first in ring order from its head's first
    // lane, so every other reader is ahead of it.
    let mut inputs = Inputs::new(*p);
    let mut reach: HashMap<Val, u32> = HashMap::default();
    let mut preloaded: Vec<(u32, Val)> = Vec::new();
    let mut late: Vec<bool> = Vec::new();
    let mut seq: Vec<u64> = Vec::new();
    let mut elems: Vec<(&Element, &Vec<u32>)> = uses.iter().collect();
    elems.sort_by_key(|(e, _)| (e.tensor as u8, e.head, e.row, e.col));
    let mut val_of: HashMap<Element, Val> = HashMap::default();
    // Row-major position of an input word, the order links send inputs in.
    let seq_of = |e: &Element| {
        (u64::from(e.head) * u64::from(n) + u64::from(e.row)) * u64::from(d) + u64::from(e.col)
    };
    // With preload copies, every PE that reads a word holds its own copy: none is forwarded.
    let copies = p.copies && (layout.copies || layout.apart.is_some_and(|a| a.copies));
    let mut copy_of: HashMap<(Element, u32), Val> = HashMap::default();
    if copies {
        for (e, readers) in &elems {
            let mut at: Vec<u32> = readers.to_vec();
            at.sort_unstable();
            at.dedup();
            for pe in at {
                let v = b.input(**e, pe);
                copy_of.insert((**e, pe), v);
                reach.insert(v, 0);
                preloaded.push((pe, v));
                late.push(e.tensor == Tensor::V);
                seq.push(seq_of(e));
            }
        }
    }
    for (e, readers) in elems.into_iter().filter(|_| !copies) {
        let spread =
            layout.apart.is_some_and(|a| a.spread) && matches!(e.tensor, Tensor::K | Tensor::V);
        let group = if spread {
            e.row * g.groups / g.n.max(1)
        } else {
            0
        };
        let lane_start = g.start(e.head * g.groups + group);
        // Outputs on the q/k PEs (`Apart::qk_rows`): the v words start in the v part.
        let from = match layout.apart {
            Some(a) if a.qk_rows > 0 && e.tensor == Tensor::V => (lane_start + a.v_at()) % m,
            _ => lane_start,
        };
        // Mirrored rows: an x row starts where its own row's scores read it as the query, so
        // every lane starts on its own row and the others reach it as keys.
        let own = (layout.mirror && e.tensor == Tensor::X)
            .then(|| g.p1(g.lane(e.head, e.row), e.col))
            .filter(|pe| readers.contains(pe));
        let home = own.unwrap_or_else(|| {
            readers
                .iter()
                .copied()
                .min_by_key(|&pe| dist(from, pe, m))
                .unwrap_or(from)
        });
        let far = readers
            .iter()
            .map(|&pe| dist(home, pe, m))
            .max()
            .unwrap_or(0);
        let role = match e.tensor {
            Tensor::X if p.symmetric => Tensor::Q,
            Tensor::X => Tensor::V,
            t => t,
        };
        let v = inputs.get(&mut b, role, e.head, e.row, e.col, home);
        val_of.insert(*e, v);
        reach.insert(v, far);
        preloaded.push((home, v));
        late.push(e.tensor == Tensor::V);
        seq.push(seq_of(e));
    }
    for (t, second, e) in input_of {
        let found = if copies {
            copy_of.get(&(e, tasks[t].pe))
        } else {
            val_of.get(&e)
        };
        let Some(&v) = found else {
            b.bug(NAME, "an input with no value");
            continue;
        };
        if let TaskKind::Term { x, y, .. } = &mut tasks[t].kind {
            if second {
                *y = Some(Opnd::V(v));
            } else {
                *x = Opnd::V(v);
            }
        }
    }
    reach.extend(moved);
    let div_pe: HashMap<Val, u32> = weights.values().map(|&(w, pe)| (w, pe)).collect();
    for (w, readers) in &weight_readers {
        let from = div_pe.get(w).copied().unwrap_or(0);
        reach.insert(
            *w,
            readers
                .iter()
                .map(|&pe| dist(from, pe, m))
                .max()
                .unwrap_or(0),
        );
    }

    let tail = tails(p, &g, &tasks, &chains, &weight_readers);
    let eager = tasks
        .iter()
        .map(|t| match t.kind {
            TaskKind::Div { .. } => true,
            TaskKind::Term { chain, .. } => !matches!(chains[chain].kind, ChainKind::Mac(_)),
        })
        .collect();
    let vals = b.vals();
    let gates: Vec<Gate> = tasks.iter().map(|t| gate(t, &chains)).collect();
    let readers = ready::Readers::new(&tasks, &gates, &chains, vals);
    let absorbs = tasks
        .iter()
        .map(|t| match t.kind {
            TaskKind::Term { chain, .. } => chains[chain].kind == ChainKind::Max,
            TaskKind::Div { .. } => false,
        })
        .collect();
    let mut dense_reach = vec![0u32; vals];
    for (v, &hops) in &reach {
        if let Some(r) = dense_reach.get_mut(v.index()) {
            *r = hops;
        }
    }
    Plan {
        layout,
        bumps,
        b,
        chains,
        tasks,
        reach: dense_reach,
        preloaded,
        late,
        seq,
        tail,
        eager,
        gates,
        absorbs,
        readers,
        order: Vec::new(),
        order_prio: Vec::new(),
        steps: Vec::new(),
        absorbs_at: Vec::new(),
        base: Vec::new(),
        base_key: None,
        cycles: 0,
    }
}

/// One run's schedule and how far its PEs' last operations spread before the end (the local
/// search prefers, among equally long schedules, one whose PEs finish earlier: a cycle is then
/// closer to being saved).
struct Run {
    schedule: RingSchedule,
    spread: u64,
}

/// Static priorities: the longest path from a task to the end, ring hops included. Chains are
/// costed as a whole: every term of a chain gets the chain's figure.
fn tails(
    p: &Problem,
    g: &Geometry,
    tasks: &[Task],
    chains: &[Chain],
    weight_readers: &HashMap<Val, Vec<u32>>,
) -> Vec<i64> {
    let m = g.m;
    let len = |c: &Chain| c.segs.iter().map(|s| s.1.len()).sum::<usize>() as i64;
    let last_pe = |c: &Chain| c.segs.last().map_or(0, |s| s.0);
    // Tail of each chain (cycles from its first term to the end), filled phase 3 → 1.
    let mut tail: Vec<i64> = vec![0; chains.len()];
    let mut div_tail: HashMap<Val, i64> = HashMap::default();
    for (i, c) in chains.iter().enumerate() {
        if c.kind == ChainKind::Mac(3) {
            tail[i] = len(c);
        }
    }
    let y_tail = 1 + i64::from(p.tokens);
    for t in tasks.iter() {
        if let TaskKind::Div { out, .. } = t.kind {
            let far = weight_readers.get(&out).map_or(0, |rs| {
                rs.iter().map(|&q| lat(t.pe, q, m, true)).max().unwrap_or(0)
            });
            div_tail.insert(out, far + y_tail);
        }
    }
    // Row sums, then the maxima they wait for.
    let mut sum_after: Vec<i64> = vec![0; chains.len()];
    for t in tasks.iter() {
        if let TaskKind::Div { den, out, .. } = t.kind {
            let dt = div_tail.get(&out).copied().unwrap_or(0);
            sum_after[den] = sum_after[den].max(dt);
        }
    }
    // Hops from a chain's last PE to its farthest reader.
    let farthest = |c: &Chain, exp: bool| {
        c.readers
            .iter()
            .map(|&q| lat(last_pe(c), q, m, exp))
            .max()
            .unwrap_or(1)
    };
    for (i, c) in chains.iter().enumerate() {
        if let ChainKind::Exp { bias } = c.kind {
            tail[i] = len(c) + farthest(c, true) + sum_after[i];
            if let Some(mx) = bias {
                let mc = &chains[mx];
                tail[mx] = tail[mx].max(len(mc) + farthest(mc, true) + tail[i]);
            }
        }
    }
    // Scores: their reading row chain's tail.
    let mut score_tail: Vec<i64> = vec![0; chains.len()];
    for t in tasks.iter() {
        if let TaskKind::Term {
            chain,
            x: Opnd::Chain(s),
            ..
        } = t.kind
        {
            let c = &chains[s];
            let after = tail[chain] + lat(last_pe(c), t.pe, m, true);
            score_tail[s] = score_tail[s].max(len(c) + after);
        }
    }
    for (i, c) in chains.iter().enumerate() {
        if c.kind == ChainKind::Mac(1) {
            tail[i] = score_tail[i];
        }
    }
    tasks
        .iter()
        .map(|t| match t.kind {
            TaskKind::Term { chain, .. } => tail[chain],
            TaskKind::Div { out, .. } => div_tail.get(&out).copied().unwrap_or(0) + 1,
        })
        .collect()
}

/// Words on the PEs and the cycle from which each can be read on each. The simulation asks this
/// for every operand of every task it looks at, and for every word waiting on a link.
///
/// A word appears on one PE (made there, or preloaded) and spreads only over links, one PE
/// onward at a time, so the PEs holding it are a run from where it appeared. Each word keeps its
/// first PE and the cycles along its run, so a run of the local search touches a few words of
/// memory per value rather than a vector per PE indexed by value (which on 64 PEs or more missed
/// the cache on most writes, and had to be cleared again after every run). A write that does not
/// extend its word's run (none is known) is kept aside, so every write is kept whatever its PE.
#[derive(Default)]
struct Avail {
    m: u32,
    /// By value index.
    held: Vec<Held>,
    /// The cycles on the PEs after the first of each run longer than one PE, each run's in one
    /// block of `hops` (moved to the end, twice the size, when it outgrows it).
    hops: Vec<usize>,
    /// Value indices with a run: clearing only those keeps a run from filling `held` again.
    written: Vec<u32>,
    /// Writes off their word's run, by value and PE.
    stray: HashMap<(Val, u32), usize>,
}

/// Where a word appeared (`NONE`: nowhere yet) and when, and its run's other PEs.
#[derive(Clone, Copy)]
struct Held {
    first: u32,
    len: u32,
    at: usize,
    block: u32,
    cap: u32,
}

const NOT_HELD: Held = Held {
    first: NONE,
    len: 0,
    at: 0,
    block: 0,
    cap: 0,
};

impl Avail {
    /// Empty, for a ring of `m` PEs.
    fn reset(&mut self, m: u32) {
        self.m = m;
        for &i in &self.written {
            self.held[i as usize] = NOT_HELD;
        }
        self.written.clear();
        self.hops.clear();
        self.stray.clear();
    }

    /// The cycle from which `v` can be read on `pe`, if it is there.
    #[inline]
    fn get(&self, v: &Val, pe: u32) -> Option<usize> {
        if pe >= self.m {
            return None;
        }
        if let Some(h) = self.held.get(v.index()).filter(|h| h.first != NONE) {
            let j = self.hop(h, pe);
            if j == 0 {
                return Some(h.at);
            }
            if j < h.len {
                return self.hops.get((h.block + j - 1) as usize).copied();
            }
        }
        if self.stray.is_empty() {
            return None;
        }
        self.stray.get(&(*v, pe)).copied()
    }

    /// PEs from `h`'s first to `pe`, going round the ring.
    #[inline]
    fn hop(&self, h: &Held, pe: u32) -> u32 {
        if pe >= h.first {
            pe - h.first
        } else {
            pe + self.m - h.first
        }
    }

    #[inline]
    fn contains_key(&self, v: &Val, pe: u32) -> bool {
        self.get(v, pe).is_some()
    }

    /// Writes `v` readable on `pe` from `cycle`; whether it was not there before.
    #[inline]
    fn insert(&mut self, v: Val, pe: u32, cycle: usize) -> bool {
        let i = v.index();
        if self.held.len() <= i {
            self.held.resize(i + 1, NOT_HELD);
        }
        let m = self.m;
        let h = self.held[i];
        if h.first == NONE {
            if !self.stray.is_empty() && self.stray.contains_key(&(v, pe)) {
                return self.stray.insert((v, pe), cycle).is_none();
            }
            self.held[i] = Held {
                first: pe,
                len: 1,
                at: cycle,
                block: 0,
                cap: 0,
            };
            self.written.push(i as u32);
            return true;
        }
        let j = self.hop(&h, pe);
        if j == 0 {
            self.held[i].at = cycle;
            return false;
        }
        if j < h.len {
            self.hops[(h.block + j - 1) as usize] = cycle;
            return false;
        }
        if j > h.len || pe >= m || (!self.stray.is_empty() && self.stray.contains_key(&(v, pe))) {
            return self.stray.insert((v, pe), cycle).is_none();
        }
        let mut h = h;
        if h.len - 1 == h.cap {
            let start = self.hops.len();
            let (from, cap) = (h.block as usize, h.cap as usize);
            self.hops.extend_from_within(from..from + cap);
            let cap = (2 * cap).max(2).min(m as usize);
            self.hops.resize(start + cap, 0);
            h.block = start as u32;
            h.cap = cap as u32;
        }
        self.hops[(h.block + h.len - 1) as usize] = cycle;
        h.len += 1;
        self.held[i] = h;
        true
    }
}

/// When a task can run: its chain at its segment with the partial sum here (`chain` is [`NONE`]
/// for a division), and each operand here. An operand is a value's index, [`CHAIN`] plus a
/// chain's (its result), or [`NONE`].
#[derive(Clone, Copy)]
struct Gate {
    chain: u32,
    seg: u32,
    bias: u32,
    x: u32,
    y: u32,
}

const NONE: u32 = u32::MAX;
const CHAIN: u32 = 1 << 31;

/// Whether a task can run on its PE in cycle `t`.
fn open(g: &Gate, t: usize, pe: u32, avail: &Avail, state: &[ChainState]) -> bool {
    let here = |v: Val| avail.get(&v, pe).is_some_and(|at| at <= t);
    let opnd = |o: u32| {
        if o == NONE {
            true
        } else if o & CHAIN != 0 {
            state[(o & !CHAIN) as usize].result.is_some_and(here)
        } else {
            here(Val::from_u32(o))
        }
    };
    if g.chain != NONE {
        let s = &state[g.chain as usize];
        if s.seg != g.seg as usize || s.partial.is_some_and(|v| !here(v)) {
            return false;
        }
    }
    opnd(g.bias) && opnd(g.x) && opnd(g.y)
}

/// What [`open`] needs of `task`.
fn gate(task: &Task, chains: &[Chain]) -> Gate {
    match task.kind {
        TaskKind::Term {
            chain, seg, x, y, ..
        } => Gate {
            chain: chain as u32,
            seg: seg as u32,
            bias: match chains.get(chain).map(|c| c.kind) {
                Some(ChainKind::Exp { bias: Some(mx) }) => CHAIN | mx as u32,
                _ => NONE,
            },
            x: x.code(),
            y: y.map_or(NONE, Opnd::code),
        },
        TaskKind::Div { num, den, .. } => Gate {
            chain: NONE,
            seg: 0,
            bias: NONE,
            x: num.as_u32(),
            y: CHAIN | den as u32,
        },
    }
}

/// A task as the simulation reads it, with its run's priority: the operands encoded as in a
/// [`Gate`], so that it takes half the bytes of a [`Task`] (the simulation reads one per
/// operation, from each PE's part of the list in turn). A division keeps its denominator's chain
/// in `chain`, its numerator in `x` and its quotient in `e`.
#[derive(Clone, Copy)]
struct Step {
    prio: i64,
    pe: u32,
    chain: u32,
    x: u32,
    y: u32,
    e: u32,
    div: bool,
}

impl Step {
    fn new(t: &Task, prio: i64) -> Step {
        match t.kind {
            TaskKind::Term { chain, x, y, e, .. } => Step {
                prio,
                pe: t.pe,
                chain: chain as u32,
                x: x.code(),
                y: y.map_or(NONE, Opnd::code),
                e: e.map_or(NONE, |v| v.as_u32()),
                div: false,
            },
            TaskKind::Div { num, den, out } => Step {
                prio,
                pe: t.pe,
                chain: den as u32,
                x: num.as_u32(),
                y: NONE,
                e: out.as_u32(),
                div: true,
            },
        }
    }

    /// The task's kind again (a term's segment aside, which the simulation does not read).
    #[inline]
    fn kind(&self) -> TaskKind {
        if self.div {
            TaskKind::Div {
                num: Val::from_u32(self.x),
                den: self.chain as usize,
                out: Val::from_u32(self.e),
            }
        } else {
            TaskKind::Term {
                chain: self.chain as usize,
                seg: 0,
                x: Opnd::from_code(self.x),
                y: (self.y != NONE).then(|| Opnd::from_code(self.y)),
                e: (self.e != NONE).then(|| Val::from_u32(self.e)),
            }
        }
    }
}

/// The cycle-by-cycle list scheduler over pinned tasks.
struct Sim<'a> {
    m: u32,
    scale: f32,
    /// The tasks by PE, then priority (highest first), then index: by position in `order`.
    tasks: &'a [Step],
    /// Task indices by position.
    order: &'a [u32],
    chains: &'a [Chain],
    /// Hops each fixed value travels from where it appears.
    reach: &'a [u32],
    /// What each task waits for, by task index.
    gates: &'a [Gate],
    /// By position.
    absorbs: &'a [bool],
    readers: &'a ready::Readers,
}

/// Words waiting to go over one PE's link. A word can be queued twice (a score that is also a
/// row's first partial maximum); the two are merged (farthest reach, most urgent) so no word goes
/// over one link twice.
#[derive(Clone)]
struct Link {
    words: Vec<Pending>,
    queued: Queued,
}

/// Most words (PEs × values) for which every link keeps a bit per value ([`Queued::Dense`]).
const DENSE_LINKS: u64 = 1 << 24;

/// Which values a link has waiting: a bit per value on small layers (it is asked on every
/// push), hashed otherwise.
#[derive(Clone)]
enum Queued {
    Dense(Vec<u64>),
    Sparse(rustc_hash::FxHashSet<Val>),
}

impl Queued {
    /// Marks `v`; false if it was marked already.
    #[inline]
    fn insert(&mut self, v: Val) -> bool {
        match self {
            Queued::Dense(bits) => {
                let (i, bit) = (v.index() / 64, 1u64 << (v.index() % 64));
                if bits.len() <= i {
                    bits.resize(i + 1, 0);
                }
                let fresh = bits[i] & bit == 0;
                bits[i] |= bit;
                fresh
            }
            Queued::Sparse(set) => set.insert(v),
        }
    }

    #[inline]
    fn remove(&mut self, v: Val) {
        match self {
            Queued::Dense(bits) => {
                if let Some(w) = bits.get_mut(v.index() / 64) {
                    *w &= !(1u64 << (v.index() % 64));
                }
            }
            Queued::Sparse(set) => {
                set.remove(&v);
            }
        }
    }
}

impl Link {
    fn new(dense: bool) -> Link {
        Link {
            words: Vec::new(),
            queued: if dense {
                Queued::Dense(Vec::new())
            } else {
                Queued::Sparse(Default::default())
            },
        }
    }

    fn dense(&self) -> bool {
        matches!(self.queued, Queued::Dense(_))
    }

    fn clear(&mut self) {
        // Every word waiting is marked, and only those: unmarking them clears the bits without
        // filling them all again in the next run.
        for w in &self.words {
            self.queued.remove(w.val);
        }
        self.words.clear();
        if let Queued::Sparse(set) = &mut self.queued {
            set.clear();
        }
    }

    #[inline]
    fn push(&mut self, w: Pending) {
        if !self.queued.insert(w.val) {
            if let Some(p) = self.words.iter_mut().find(|p| p.val == w.val) {
                p.hops = p.hops.max(w.hops);
                p.prio = p.prio.max(w.prio);
                p.acc_at = p.acc_at.or(w.acc_at);
                return;
            }
        }
        self.words.push(w);
    }

    fn take(&mut self, k: usize) -> Pending {
        let w = self.words.swap_remove(k);
        self.queued.remove(w.val);
        w
    }
}

/// A word waiting to go over a PE's link: value, hops still to go, urgency, and the cycle in which
/// it may ride `send acc` (the cycle it is made).
#[derive(Clone, Copy)]
struct Pending {
    val: Val,
    hops: u32,
    prio: i64,
    acc_at: Option<usize>,
}

#[derive(Clone, Copy, Default)]
struct ChainState {
    seg: usize,
    left: usize,
    partial: Option<Val>,
    result: Option<Val>,
}

impl Sim<'_> {
    /// Queues `v` on `link` when a later PE reads it (`reach` says how many hops away);
    /// `acc_at` is the cycle it is made in when it may leave through the acc slot then.
    fn forward(&self, v: Val, prio: i64, link: &mut Link, acc_at: Option<usize>) {
        let hops = self.reach.get(v.index()).copied().unwrap_or(0);
        if hops > 0 {
            link.push(Pending {
                val: v,
                hops,
                prio,
                acc_at,
            });
        }
    }

    fn run<B: Book>(
        &self,
        b: &mut B,
        preloaded: &[(u32, Val, i64)],
        limit: usize,
        work: &mut u64,
        scratch: &mut Scratch,
    ) -> Result<Option<(usize, u64)>, String> {
        let m = self.m as usize;
        let dense = (m as u64) * 3 * (self.tasks.len() as u64) <= DENSE_LINKS;
        let Scratch {
            avail,
            links,
            ready,
            run: bufs,
            ..
        } = scratch;
        let RunBuffers {
            last_op,
            state,
            ops_left,
            wake,
            arrivals,
        } = bufs;
        last_op.clear();
        last_op.resize(m, 0);
        if links.len() != m || links.first().is_some_and(|l| l.dense() != dense) {
            *links = vec![Link::new(dense); m];
        }
        avail.reset(self.m);
        links.iter_mut().for_each(Link::clear);
        // Per PE, pending tasks by priority (highest first): positions in `order`, which holds
        // them by PE.
        let order = self.order;
        ready.reset(order, m, self.readers);
        for &(pe, v, prio) in preloaded {
            ready.write(avail, pe, v, 0);
            self.forward(v, prio, &mut links[pe as usize], None);
        }
        state.clear();
        state.extend(self.chains.iter().map(|c| ChainState {
            left: c.segs.first().map_or(0, |s| s.1.len()),
            ..Default::default()
        }));
        for (chain, c) in self.chains.iter().enumerate() {
            if !c.segs.is_empty() {
                ready.enter(self.readers, self.chains, state, chain, avail, 0);
            }
        }
        ops_left.clear();
        ops_left.extend((0..m).map(|pe| ready.count(pe) as usize));
        let mut left: usize = self.tasks.len();
        // Per PE, the operations still to run: its tasks but the first term of each maximum
        // chain that starts on it (absorbed, no operation).
        for c in self.chains.iter().filter(|c| c.kind == ChainKind::Max) {
            if let Some((pe, _)) = c.segs.first().filter(|s| !s.1.is_empty()) {
                ops_left[*pe as usize] = ops_left[*pe as usize].saturating_sub(1);
            }
        }
        // Per PE, the first cycle its task list needs looking at again.
        wake.clear();
        wake.resize(m, 0);
        arrivals.clear();
        let mut t = 0usize;
        let mut idle = 0usize;
        while left > 0 || links.iter().any(|l| !l.words.is_empty()) {
            // Work left for cycle `t` means at least `t + 1` cycles, and a PE with `k`
            // operations to go needs `t + k`: a run that cannot finish within `limit` is
            // abandoned as soon as that is sure. It returns what the run would have returned, in
            // fewer steps, so the search's budget pays for a few more runs (about 9 % on
            // n = m = d = 20 causal, whose runs mostly fall behind only near their end).
            if t >= limit || ops_left.iter().any(|&k| t.saturating_add(k) > limit) {
                return Ok(None);
            }
            ready.arrivals(self.readers);
            let mut progressed = false;
            arrivals.clear();
            *work += m as u64;
            for pe in 0..m {
                // Operation slot: the most urgent ready task (absorbing a maximum chain's first
                // terms costs nothing and does not use the slot). A PE that found nothing ready
                // waits for a word to reach it or for its own work to finish: nothing else can
                // make one of its tasks ready. The budget counts the pending tasks a scan of the
                // PE's whole list, most urgent first, would have looked at.
                let scan = wake[pe] <= t;
                wake[pe] = usize::MAX;
                if scan {
                    loop {
                        // Candidates are exactly the tasks that can run (see `ready`): the first is
                        // the task the scan would have found.
                        let found = ready.first(pe);
                        debug_assert!(found.is_none_or(|k| open(
                            &self.gates[order[k] as usize],
                            t,
                            pe as u32,
                            avail,
                            state
                        )));
                        let Some(k) = found else {
                            *work += ready.count(pe);
                            break;
                        };
                        *work += ready.rank(pe, k);
                        ready.take(pe, k);
                        left -= 1;
                        progressed = true;
                        let absorbed = if self.absorbs[k] {
                            self.absorb(k, t, state, &mut links[pe])
                        } else {
                            None
                        };
                        if let Some(moved) = absorbed {
                            self.moved(moved, state, avail, ready, t);
                            continue;
                        }
                        let moved = self.execute(b, k, t, pe, state, avail, &mut links[pe], ready);
                        self.moved(moved, state, avail, ready, t);
                        ops_left[pe] = ops_left[pe].saturating_sub(1);
                        last_op[pe] = t;
                        wake[pe] = t + 1;
                        break;
                    }
                }
                // Link slot: the most urgent word that is here (or made now by the accumulator),
                // the first in the queue among equally urgent ones.
                *work += links[pe].words.len() as u64;
                let here = |p: &Pending| {
                    p.acc_at == Some(t) || avail.get(&p.val, pe as u32).is_some_and(|at| at <= t)
                };
                let mut pick: Option<(i64, usize)> = None;
                for (k, w) in links[pe].words.iter().enumerate() {
                    if pick.is_none_or(|(prio, _)| w.prio > prio) && here(w) {
                        pick = Some((w.prio, k));
                    }
                }
                if let Some((_, k)) = pick {
                    let w = links[pe].take(k);
                    let to = if pe + 1 == m { 0 } else { pe + 1 };
                    // A word can reach a PE by two routes (a score that is also a row's first
                    // partial maximum): the second is not sent again, only its onward hops kept.
                    if !avail.contains_key(&w.val, to as u32) && !arrivals.contains(&(to, w.val)) {
                        b.send(pe as u32, t, w.val);
                        arrivals.push((to, w.val));
                    }
                    progressed = true;
                    if w.hops > 1 {
                        links[to].push(Pending {
                            hops: w.hops - 1,
                            acc_at: None,
                            ..w
                        });
                    }
                }
            }
            for &(to, v) in arrivals.iter() {
                ready.write(avail, to as u32, v, t + 1);
                wake[to] = wake[to].min(t + 1);
            }
            t += 1;
            idle = if progressed { 0 } else { idle + 1 };
            if idle > m + 2 {
                return Err(format!(
                    "list scheduling stalled at cycle {t} with {left} tasks left"
                ));
            }
        }
        // PEs busy in the last cycle weigh most, then those busy in the one before, and so on.
        let busy = last_op
            .iter()
            .map(|&l| 1u64 << (2 * (8 - (t - 1 - l).min(8))))
            .sum::<u64>();
        Ok(Some((t, busy)))
    }

    /// Tells `ready` how a chain moved on in cycle `t`.
    fn moved(
        &self,
        moved: Moved,
        state: &[ChainState],
        avail: &Avail,
        ready: &mut ready::Ready,
        t: usize,
    ) {
        match moved {
            Moved::Not => {}
            Moved::Seg(chain) => {
                let pe = self.chains[chain]
                    .segs
                    .get(state[chain].seg)
                    .map_or(0, |s| s.0 as usize);
                if pe < self.m as usize {
                    ready.enter(self.readers, self.chains, state, chain, avail, t);
                }
            }
            Moved::Result(chain, v) => {
                ready.result(self.readers, chain, v, avail, t);
            }
        }
    }

    /// The first term of a maximum chain is the partial maximum itself: no operation.
    /// Nothing if the task at position `k` is not such a term, else how its chain moved on.
    fn absorb(
        &self,
        k: usize,
        t: usize,
        state: &mut [ChainState],
        link: &mut Link,
    ) -> Option<Moved> {
        let TaskKind::Term { chain, x, .. } = self.tasks[k].kind() else {
            return None;
        };
        if self.chains[chain].kind != ChainKind::Max || state[chain].partial.is_some() {
            return None;
        }
        let v = match x {
            Opnd::V(v) => v,
            Opnd::Chain(c) => state[c].result?,
        };
        state[chain].partial = Some(v);
        Some(self.advance(chain, self.tasks[k].pe, t, state, link, false))
    }

    /// Runs the task at position `k` on `pe` in cycle `t`; says how its chain moved on.
    #[allow(clippy::too_many_arguments)]
    fn execute<B: Book>(
        &self,
        b: &mut B,
        k: usize,
        t: usize,
        pe: usize,
        state: &mut [ChainState],
        avail: &mut Avail,
        link: &mut Link,
        ready: &mut ready::Ready,
    ) -> Moved {
        let task = self.tasks[k];
        let val = |o: Opnd, state: &[ChainState]| match o {
            Opnd::V(v) => Some(v),
            Opnd::Chain(c) => state[c].result,
        };
        match task.kind() {
            TaskKind::Div { num, den, out } => {
                let Some(den) = state[den].result else {
                    b.bug(NAME, "a division before its sum".into());
                    return Moved::Not;
                };
                b.work(pe as u32, t, 2, Work::Div { num, den, out });
                ready.write(avail, pe as u32, out, t + 1);
                self.forward(out, task.prio, link, Some(t));
                Moved::Not
            }
            TaskKind::Term { chain, x, y, e, .. } => {
                let (Some(xv), acc) = (val(x, state), state[chain].partial) else {
                    b.bug(NAME, "a term before its operand".into());
                    return Moved::Not;
                };
                let out = b.computed();
                let (phase, work, is_acc) = match self.chains[chain].kind {
                    ChainKind::Mac(ph) => {
                        let Some(yv) = y.and_then(|y| val(y, state)) else {
                            b.bug(NAME, "a product with one operand".into());
                            return Moved::Not;
                        };
                        (
                            ph,
                            Work::Mac {
                                a: xv,
                                b: yv,
                                acc,
                                out,
                            },
                            true,
                        )
                    }
                    ChainKind::Exp { bias } => {
                        let Some(e) = e else {
                            b.bug(NAME, "an exponential with nowhere to keep it".into());
                            return Moved::Not;
                        };
                        ready.write(avail, pe as u32, e, t + 1);
                        // An exponential divided on a later PE goes there.
                        self.forward(e, task.prio, link, None);
                        let bias = bias.and_then(|mx| state[mx].result);
                        let w = Work::Exp {
                            x: xv,
                            bias,
                            scale: self.scale,
                            acc,
                            e,
                            sum: out,
                        };
                        (2, w, true)
                    }
                    ChainKind::Max => {
                        let Some(a) = acc else {
                            b.bug(NAME, "a maximum with nothing to compare".into());
                            return Moved::Not;
                        };
                        (2, Work::Max { a, b: xv, out }, true)
                    }
                };
                b.work(pe as u32, t, phase, work);
                ready.write(avail, pe as u32, out, t + 1);
                state[chain].partial = Some(out);
                if let Some(el) = self.chains[chain].output {
                    if state[chain].left == 1
                        && state[chain].seg + 1 == self.chains[chain].segs.len()
                    {
                        b.output(el, pe as u32, out);
                    }
                }
                self.advance(chain, task.pe, t, state, link, is_acc)
            }
        }
    }

    /// One term of `chain` done on `pe` in cycle `t`: moves the partial on at a segment's end,
    /// and sends the result to its readers at the chain's end.
    fn advance(
        &self,
        chain: usize,
        pe: u32,
        t: usize,
        state: &mut [ChainState],
        link: &mut Link,
        acc: bool,
    ) -> Moved {
        let c = &self.chains[chain];
        let s = &mut state[chain];
        s.left = s.left.saturating_sub(1);
        if s.left > 0 {
            return Moved::Not;
        }
        let Some(v) = s.partial else {
            return Moved::Not;
        };
        let acc_at = acc.then_some(t);
        let prio = self.tasks.iter().len() as i64; // partial sums of a chain in flight go first
        if let Some((next, ts)) = c.segs.get(s.seg + 1) {
            s.seg += 1;
            s.left = ts.len();
            let hops = dist(pe, *next, self.m);
            if hops > 0 {
                link.push(Pending {
                    val: v,
                    hops,
                    prio: prio * 8,
                    acc_at,
                });
            }
            return Moved::Seg(chain);
        }
        s.result = Some(v);
        let hops = c
            .readers
            .iter()
            .map(|&q| dist(pe, q, self.m))
            .max()
            .unwrap_or(0);
        if hops > 0 {
            link.push(Pending {
                val: v,
                hops,
                prio: prio * 8,
                acc_at,
            });
        }
        Moved::Result(chain, v)
    }
}

/// How a chain moved on after one of its terms.
#[derive(Clone, Copy)]
enum Moved {
    Not,
    /// Into its next segment.
    Seg(usize),
    /// To its end, with this result.
    Result(usize, Val),
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A write: value, PE, cycle; `travel` writes it on the PE after the value's last one
    /// instead (how words spread over links), so runs grow, wrap and outgrow their blocks.
    fn writes() -> impl Strategy<Value = Vec<(u32, u32, usize, bool)>> {
        prop::collection::vec((0u32..24, 0u32..64, 0usize..1000, any::<bool>()), 0..400)
    }

    proptest! {
        /// `Avail` answers every read as one map per PE and value would, after each write and
        /// across resets to rings of other sizes.
        #[test]
        fn avail_behaves_as_one_map_per_pe_and_value(
            rings in prop::collection::vec((1u32..40, writes()), 1..4),
        ) {
            let mut avail = Avail::default();
            for (m, ws) in rings {
                avail.reset(m);
                let mut plain: HashMap<(Val, u32), usize> = HashMap::default();
                let mut last: HashMap<u32, u32> = HashMap::default();
                for (x, pe, cycle, travel) in ws {
                    let v = Val::from_u32(x);
                    let pe = match (travel, last.get(&x)) {
                        (true, Some(&p)) => (p + 1) % m,
                        _ => pe % m,
                    };
                    last.insert(x, pe);
                    prop_assert_eq!(avail.insert(v, pe, cycle), plain.insert((v, pe), cycle).is_none());
                    for q in 0..m + 1 {
                        prop_assert_eq!(avail.get(&v, q), plain.get(&(v, q)).copied());
                        prop_assert_eq!(avail.contains_key(&v, q), plain.contains_key(&(v, q)));
                    }
                }
            }
        }
    }
}
