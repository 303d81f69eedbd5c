//! The proof of outputs without unrolling, for rings whose PEs all run one program.
//!
//! PE 0's program is evaluated with symbolic loop indices where a loop allows it (no wrapped
//! term or count step on its index; its iterations cut into pieces where a predicate on the
//! index changes, so each predicate holds at all of a piece or none): a piece's body is
//! evaluated once for an index `x`, every read resolved to the write it sees — one made earlier in the same iteration, the
//! value a previous iteration left at the same fixed address (`Carry`), or one from before the
//! loop once every other iteration's writes are shown to miss it — and the iteration's writes are
//! summarised: a word written at an address that moves with `x` becomes a region over `x`, an
//! accumulator `w ← w + t(x)` or `w ← max(w, t(x))` becomes a range sum or maximum, any other
//! word keeps the last iteration's value. When a read or a summary cannot be decided the piece
//! is cut again where a read ran into the edge of a fact, or else evaluated iteration by
//! iteration (its inner loops again symbolically). Every step is
//! exact or refuses; nothing is approximated.
//!
//! Memory is a log of facts `{base + Σ stride·x_k : x_k < count_k} ↦ value(x)`, newest last; a
//! read takes the newest fact that certainly holds its address, and refuses when a newer one
//! might.
//!
//! The ring: every PE runs the same program (only `.pe` differs) with one layout that deals
//! `rows_per_pe` consecutive tokens to each PE, so the machine commutes with rotating the ring
//! by one PE and the tokens by `rows_per_pe`: PE `p − 1`'s memory is always PE `p`'s with every
//! token index moved back by `rows_per_pe` (mod `tokens`). A word arriving at PE 0 is sent by
//! PE `pes − 1` executing the same bundle instance in the same cycle, so it is PE 0's own source
//! word relabelled that way; only input words (atoms) are relabelled, anything else refuses.
//! Unmasked attention is unchanged by permuting keys and values together and permutes its
//! outputs with its queries, so PE 0's outputs proved for all inputs prove every PE's.

use super::aff::{Aff, Var, BINDERS};
use super::term::{Id, Terms, T};
use crate::expr::FxMap as HashMap;
use isa::looped::{field, Cmp, Field, LBundle, Slot};
use isa::{Acc, AccSrc, Loop, LoopProgram, Node, Op, OpKind, Xfer, XferSrc};
use runtime::manifest::{Layout, Manifest, RowOrder};

/// Operations by class, as the flattened proof counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub phase1_mul: u64,
    pub phase3_mul: u64,
    pub exp: u64,
    pub div: u64,
    pub max: u64,
    pub rescale: u64,
}

impl Tally {
    /// The two tallies together (PEs counted apart).
    pub(super) fn plus(&self, o: &Tally) -> Option<Tally> {
        Some(Tally {
            phase1_mul: self.phase1_mul.checked_add(o.phase1_mul)?,
            phase3_mul: self.phase3_mul.checked_add(o.phase3_mul)?,
            exp: self.exp.checked_add(o.exp)?,
            div: self.div.checked_add(o.div)?,
            max: self.max.checked_add(o.max)?,
            rescale: self.rescale.checked_add(o.rescale)?,
        })
    }

    fn scaled(&self, k: u64) -> Option<Tally> {
        Some(Tally {
            phase1_mul: self.phase1_mul.checked_mul(k)?,
            phase3_mul: self.phase3_mul.checked_mul(k)?,
            exp: self.exp.checked_mul(k)?,
            div: self.div.checked_mul(k)?,
            max: self.max.checked_mul(k)?,
            rescale: self.rescale.checked_mul(k)?,
        })
    }
}

/// What evaluating PE 0 came to.
#[derive(Debug)]
pub struct Evaluated {
    /// Ops of the whole ring by class.
    pub ops: Tally,
    /// Output elements whose expression differs from the specification (first few, described).
    pub wrong: Vec<String>,
    pub wrong_count: usize,
    /// Template evaluations performed (the proof's work).
    pub evaluations: u64,
    pub expressions: usize,
}

#[derive(Debug)]
pub(super) enum Fail {
    /// Symbolic evaluation cannot decide this; evaluating the enclosing symbolic loop iteration
    /// by iteration may.
    Retry(String),
    /// Outside what this proof covers.
    Decline(String),
}

pub(super) type R<T> = Result<T, Fail>;

#[derive(Clone, Debug)]
pub(super) struct Fact {
    pub(super) base: Aff,
    /// `(variable, stride, count)`, strides positive and decreasing.
    pub(super) dims: Vec<(Var, i64, u64)>,
    pub(super) value: Id,
    pub(super) computed: bool,
    /// A word sent to the next PE: not in this PE's memory (per-PE evaluation only).
    pub(super) remote: bool,
    /// Words whose value after an ordered loop is not tracked (a later iteration may have
    /// overwritten them): a read of one declines.
    havoc: bool,
    lo: i64,
    hi: i64,
    /// The words as one address over the coordinates, `base + Σ stride·x`.
    words: Aff,
}

/// A loop index: a known value, or `var + offset` for a loop (or a piece of one, from
/// `offset` on) evaluated symbolically.
#[derive(Clone, Copy)]
pub(super) enum Ix {
    At(u64),
    Sym(Var, i64),
}

pub(super) struct Active {
    id: u32,
    var: Var,
    other: Var,
    marker: usize,
    families: Vec<Aff>,
    /// Per family, the words it may reach over every value of its indices (`None`: an index
    /// without a range): a read outside misses the family without the alias test, whose
    /// first test (the bounds of the difference) is at least as tight.
    reach: Vec<Option<(i64, i64)>>,
    /// Where the body's sends may land on the next PE (per-PE evaluation only).
    remote_families: Vec<Aff>,
    /// For a loop whose iterations the caller evaluates in order (the head loop of a ring):
    /// variables of `c` values for every `c < count` (index `c`), to name the iterations after
    /// a given one. A read then only has to miss the writes of earlier iterations, and a
    /// region only those of later ones.
    order: Option<Vec<Var>>,
}

/// Which other iterations of a loop an alias test is against.
#[derive(Clone, Copy)]
enum Others {
    Any,
    Earlier,
    Later,
}

/// Bounds on the proof's work: symbolic evaluation that keeps falling back to iteration by
/// iteration is not going to scale, and a verifier must answer. The count bound makes the
/// verdict the same on any machine; at the 8k-token layer's 15 µs of CPU per evaluation
/// (14.8 s for 1 015 297 on the idle 2-core machine) it stands for about 30 s of CPU, 15 s on
/// two cores, inside the time bound.
pub(super) const MAX_EVALUATIONS: u64 = 2_000_000;
pub(super) const MAX_TIME: std::time::Duration = std::time::Duration::from_secs(20);

/// The most iterations regrouped into one (`unroll`).
const MAX_UNROLL: i64 = 16;

/// Facts an undecided read looks through for the edges to cut its loop at.
const MAX_CUT_FACTS: usize = 256;

pub(super) struct Eval {
    pub(super) tm: Terms,
    online: bool,
    pub(super) facts: Vec<Option<Fact>>,
    pub(super) keys: HashMap<Key, usize>,
    pub(super) counts: Counts,
    next_var: Var,
    next_loop: u32,
    pub(super) loops: Vec<Active>,
    pub(super) tally: Tally,
    pub(super) mult: u64,
    pub(super) evaluations: u64,
    /// Bundle evaluations including those of failed attempts.
    attempted: u64,
    rows: i64,
    tokens: i64,
    pub(super) deadline: std::time::Instant,
    /// Where the last undecided read suggests cutting loops (an index, the iteration).
    pub(super) hints: Vec<(Var, i64)>,
    /// Loops the last undecided read suggests regrouping (an index, iterations per group).
    regroup: Vec<(Var, u64)>,
    /// Where a piece of a loop was cut after its symbolic attempt failed, by the piece and
    /// where it was reached (`PieceAt`), with the fact whose edge the failing read ran into:
    /// the same piece in the next iteration of the innermost enclosing loop evaluated one by
    /// one is cut there at once while that fact is still in the log (`reuse_cuts` only).
    cut_before: HashMap<PieceAt, (Vec<u64>, Edge)>,
    /// Whether cuts are reused (the per-PE induction; elsewhere a reused cut the whole loop
    /// would not have needed cost more evaluations than the attempts saved).
    pub(super) reuse_cuts: bool,
    /// The fact the last undecided read ran into the edge of.
    edge_of: Option<Edge>,
    /// Sends leave facts marked remote for the caller to deliver, instead of arriving
    /// relabelled by the rotation symmetry.
    pub(super) per_pe: bool,
    /// Loop bodies whose ring steps the per-step induction marks (`super::induct`): at their
    /// step boundaries the contracts are pushed and the sends collected.
    pub(super) hooks: Vec<super::induct::Hook>,
    pub(super) induct: Option<Box<super::induct::State>>,
    /// Limits shared with evaluations running beside this one (the per-PE induction's
    /// workers), and this evaluation's PE among them.
    pub(super) shared: Option<(std::sync::Arc<super::workers::Shared>, usize)>,
}

/// A fact in the log: its index, first and last word, and value.
type Edge = (usize, i64, i64, Id);

/// A piece `a..b` of a loop (its body's address and length) and the enclosing indices it was
/// reached at (a known value, or a symbolic index's offset).
#[derive(Clone, PartialEq, Eq, Hash)]
struct PieceAt {
    body: (usize, usize),
    a: u64,
    b: u64,
    env: Vec<(bool, i64)>,
}

impl PieceAt {
    fn new(l: &Loop, env: &[Ix], a: u64, b: u64) -> PieceAt {
        let env = env
            .iter()
            .map(|ix| match *ix {
                Ix::At(k) => (false, k as i64),
                Ix::Sym(_, off) => (true, off),
            })
            .collect();
        PieceAt {
            body: (l.body.as_ptr() as usize, l.body.len()),
            a,
            b,
            env,
        }
    }

    /// The same piece one iteration earlier of the innermost enclosing loop whose index is
    /// known (inside which every loop is symbolic).
    fn previous(&self) -> Option<PieceAt> {
        let i = self.env.iter().rposition(|&(sym, _)| !sym)?;
        if self.env[i].1 == 0 {
            return None;
        }
        let mut p = self.clone();
        p.env[i].1 -= 1;
        Some(p)
    }
}

/// The range of every index variable (`count` values from 0), by variable: they are handed out
/// in order from [`BINDERS`], so a vector holds them (range bounds are looked up for every
/// address a read compares).
#[derive(Default)]
pub(super) struct Counts {
    by_var: Vec<Option<u64>>,
}

impl Counts {
    pub(super) fn get(&self, v: &Var) -> Option<&u64> {
        let i = v.checked_sub(BINDERS)? as usize;
        self.by_var.get(i)?.as_ref()
    }

    /// Variables are handed out from [`BINDERS`] up; a binder has no range here.
    fn insert(&mut self, v: Var, count: u64) {
        let Some(i) = v.checked_sub(BINDERS) else {
            return;
        };
        let i = i as usize;
        if self.by_var.len() <= i {
            self.by_var.resize(i + 1, None);
        }
        self.by_var[i] = Some(count);
    }
}

/// A fact's place in the log, for replacing it: base, strides and counts, remote.
pub(super) type Key = (Aff, Vec<(i64, u64)>, bool);

pub(super) fn key_of(f: &Fact) -> Key {
    (
        f.base.clone(),
        f.dims.iter().map(|&(_, s, n)| (s, n)).collect(),
        f.remote,
    )
}

fn sorted_dims(mut d: Vec<(Var, i64, u64)>) -> Vec<(Var, i64, u64)> {
    d.retain(|&(_, _, n)| n > 1);
    d.sort_by_key(|x| std::cmp::Reverse(x.1));
    d
}

impl Eval {
    pub(super) fn new(rows: i64, tokens: i64, per_pe: bool) -> Eval {
        Eval {
            tm: Terms::default(),
            online: true,
            facts: Vec::new(),
            keys: HashMap::default(),
            counts: Counts::default(),
            next_var: BINDERS,
            next_loop: 0,
            loops: Vec::new(),
            tally: Tally::default(),
            mult: 1,
            evaluations: 0,
            attempted: 0,
            rows,
            tokens,
            deadline: std::time::Instant::now() + MAX_TIME,
            hints: Vec::new(),
            regroup: Vec::new(),
            cut_before: HashMap::default(),
            reuse_cuts: false,
            edge_of: None,
            per_pe,
            hooks: Vec::new(),
            induct: None,
            shared: None,
        }
    }

    /// Returns the evaluations made since the count stood at `to` (a failed attempt's).
    fn give_back(&mut self, to: u64) {
        if let Some((s, _)) = &self.shared {
            s.give_back(self.evaluations.saturating_sub(to));
        }
        self.evaluations = to;
    }

    /// The hook on `nodes`, when they are the body of a loop the per-step induction marks.
    fn hook_of(&self, nodes: &[Node]) -> Option<usize> {
        let at = nodes.as_ptr() as usize;
        self.hooks
            .iter()
            .position(|h| h.body == at && h.total == nodes.len())
    }

    /// Where the facts of the innermost active loop's current iteration start.
    pub(super) fn floor_of_iteration(&self) -> usize {
        self.floor()
    }

    /// Words whose content is not stated: a read of one declines.
    pub(super) fn unknown(&mut self, base: Aff, dims: Vec<(Var, i64, u64)>) -> R<Fact> {
        let value = self.tm.carry(u32::MAX, Aff::cst(0));
        let mut f = self.fact(base, dims, value, false)?;
        f.havoc = true;
        Ok(f)
    }

    pub(super) fn fresh(&mut self, count: u64) -> Var {
        let v = self.next_var;
        self.next_var += 1;
        self.counts.insert(v, count);
        v
    }

    /// `a` with every variable that has a single value replaced by it (0).
    pub(super) fn pin(&self, a: Aff) -> Aff {
        if a.t.iter().all(|&(v, _)| self.counts.get(&v) != Some(&1)) {
            return a;
        }
        Aff {
            c: a.c,
            t: a.t
                .into_iter()
                .filter(|&(v, _)| self.counts.get(&v) != Some(&1))
                .collect(),
        }
    }

    pub(super) fn bounds(&self, a: &Aff) -> Option<(i64, i64)> {
        a.bounds(&|v| self.counts.get(&v).copied())
    }

    pub(super) fn fact(
        &mut self,
        base: Aff,
        dims: Vec<(Var, i64, u64)>,
        value: Id,
        computed: bool,
    ) -> R<Fact> {
        // A coordinate with one value is 0 everywhere, the value included.
        let mut value = value;
        for &(v, _, n) in &dims {
            if n <= 1 {
                value = self.tm.subst(value, v, &Aff::cst(0));
            }
        }
        let base = self.pin(base);
        let dims = sorted_dims(dims);
        let (mut lo, mut hi) = self
            .bounds(&base)
            .ok_or_else(|| Fail::Decline("an address with an unbounded index".into()))?;
        for &(_, s, n) in &dims {
            if s <= 0 {
                return Err(Fail::Retry("a region with a negative stride".into()));
            }
            hi += s * (n as i64 - 1);
        }
        lo = lo.min(hi);
        let mut words = base.clone();
        for &(v, s, _) in &dims {
            words = words.add_term(v, s);
        }
        Ok(Fact {
            words,
            base,
            dims,
            value,
            computed,
            remote: false,
            havoc: false,
            lo,
            hi,
        })
    }

    fn floor(&self) -> usize {
        self.loops.last().map_or(0, |l| l.marker)
    }

    /// `region` and `slab` as one fact, when `slab` is the region's next layer below or above
    /// along one of its coordinates, holding what the region's formula gives there.
    fn fuse(&mut self, region: &Fact, slab: &Fact) -> Option<Fact> {
        if region.remote != slab.remote || region.havoc || slab.havoc {
            return None;
        }
        if region.computed == slab.computed && region.dims.len() == slab.dims.len() {
            return self.join(region, slab).or_else(|| self.stack(region, slab));
        }
        if region.computed != slab.computed || region.dims.len() != slab.dims.len() + 1 {
            return None;
        }
        for k in 0..region.dims.len() {
            let (v, s, n) = region.dims[k];
            let rest: Vec<&(Var, i64, u64)> = region
                .dims
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != k)
                .map(|(_, d)| d)
                .collect();
            if rest.len() != slab.dims.len()
                || rest
                    .iter()
                    .zip(&slab.dims)
                    .any(|(a, b)| (a.1, a.2) != (b.1, b.2))
            {
                continue;
            }
            // Where the slab lies decides first: most candidates are not adjacent, and the
            // substitutions below build terms.
            let below = slab.base == region.base.clone().add_const(-s);
            let above = slab.base == region.base.clone().add_const(s * n as i64);
            if !(below || above) {
                continue;
            }
            let mut value = slab.value;
            for (a, b) in rest.iter().zip(&slab.dims) {
                value = self.tm.subst(value, b.0, &Aff::var(a.0));
            }
            let at = if below { -1 } else { n as i64 };
            if value != self.tm.subst(region.value, v, &Aff::cst(at)) {
                continue;
            }
            // The grown coordinate gets a variable of its own, with the grown count (reads
            // bound addresses by the counts of the variables).
            let w = self.fresh(n + 1);
            let mut dims = region.dims.clone();
            dims[k] = (w, s, n + 1);
            let (base, value) = if below {
                (
                    slab.base.clone(),
                    self.tm.subst(region.value, v, &Aff::var(w).add_const(-1)),
                )
            } else {
                (
                    region.base.clone(),
                    self.tm.subst(region.value, v, &Aff::var(w)),
                )
            };
            let mut f = self.fact(base, dims, value, region.computed).ok()?;
            f.remote = region.remote;
            return Some(f);
        }
        None
    }

    /// `low` and `high` as one fact, when `high` continues `low` along one coordinate (two
    /// pieces of one loop, cut where a predicate changed): same strides and counts elsewhere,
    /// `high` starting where `low` ends and holding what `low`'s formula gives there.
    fn join(&mut self, low: &Fact, high: &Fact) -> Option<Fact> {
        // Renaming the high piece's coordinates one by one must not capture the low one's.
        if renaming_clashes(low, high) {
            return None;
        }
        for k in 0..low.dims.len() {
            let (v, s, n) = low.dims[k];
            if high.dims[k].1 != s || high.base != low.base.clone().add_const(s * n as i64) {
                continue;
            }
            let others = (0..low.dims.len()).filter(|&i| i != k);
            if others
                .clone()
                .any(|i| (low.dims[i].1, low.dims[i].2) != (high.dims[i].1, high.dims[i].2))
            {
                continue;
            }
            let mut value = high.value;
            for (a, b) in low.dims.iter().zip(&high.dims) {
                value = self.tm.subst(value, b.0, &Aff::var(a.0));
            }
            let moved = self
                .tm
                .subst(low.value, v, &Aff::var(v).add_const(n as i64));
            if value != moved {
                continue;
            }
            let grown = n + high.dims[k].2;
            let w = self.fresh(grown);
            let mut dims = low.dims.clone();
            dims[k] = (w, s, grown);
            let value = self.tm.subst(low.value, v, &Aff::var(w));
            let mut f = self
                .fact(low.base.clone(), dims, value, low.computed)
                .ok()?;
            f.remote = low.remote;
            return Some(f);
        }
        None
    }

    /// `low` and `high` as one fact with a new coordinate of two values, when they have one
    /// shape, `high` lies wholly above every word of `low` and holds what `low` holds with its
    /// input indices moved by constants: rows of a block written (or arriving) one by one, so
    /// that a later loop over the block reads one fact instead of being cut at every row.
    fn stack(&mut self, low: &Fact, high: &Fact) -> Option<Fact> {
        if low.remote != high.remote
            || low
                .dims
                .iter()
                .zip(&high.dims)
                .any(|(a, b)| (a.1, a.2) != (b.1, b.2))
        {
            return None;
        }
        let step = high.base.minus(&low.base).as_const()?;
        // Past the last word of `low`, so every word of the result has one coordinate tuple
        // (reads solve for it) and one value.
        let extent: i64 = low.dims.iter().map(|&(_, s, n)| s * (n as i64 - 1)).sum();
        if step <= extent {
            return None;
        }
        if renaming_clashes(low, high) {
            return None;
        }
        let mut value = high.value;
        for (a, b) in low.dims.iter().zip(&high.dims) {
            value = self.tm.subst(value, b.0, &Aff::var(a.0));
        }
        // Two copies of one value (a result written to its word and accumulated into another
        // far away) are not rows of a block: stacked, they made one region whose interval
        // spans every word between them, and every read in between had to be shown to miss
        // it coordinate by coordinate.
        if value == low.value {
            return None;
        }
        let w = self.fresh(2);
        let body = self.tm.interpolate(low.value, value, w)?;
        // The body means the two facts exactly: checked at both ends, not trusted.
        if self.tm.subst(body, w, &Aff::cst(0)) != low.value
            || self.tm.subst(body, w, &Aff::cst(1)) != value
        {
            return None;
        }
        let mut dims = low.dims.clone();
        dims.push((w, step, 2));
        let mut f = self.fact(low.base.clone(), dims, body, low.computed).ok()?;
        f.remote = low.remote;
        Some(f)
    }

    pub(super) fn push(&mut self, mut f: Fact) {
        // Adjacent pieces of one family (a first element written apart from the loop over the
        // rest) become one region, so that a later loop over all of it reads one fact.
        // Joining moves the older piece up to the newest place, so only a piece that no fact
        // between them may overlap (else reads there would see it instead of that fact).
        let floor = self.floor();
        let mut i = self.facts.len();
        let mut looked = 0;
        let mut between: Vec<(i64, i64)> = Vec::new();
        while i > floor && looked < 4 {
            i -= 1;
            // Taken out while it is compared (fusing reads no other fact), put back unless
            // fused.
            let Some(g) = self.facts[i].take() else {
                continue;
            };
            looked += 1;
            if between.iter().any(|&(lo, hi)| lo <= g.hi && g.lo <= hi) {
                between.push((g.lo, g.hi));
                self.facts[i] = Some(g);
                continue;
            }
            match self.fuse(&f, &g).or_else(|| self.fuse(&g, &f)) {
                None => {
                    between.push((g.lo, g.hi));
                    self.facts[i] = Some(g);
                }
                Some(h) => {
                    let key = key_of(&g);
                    if self.keys.get(&key) == Some(&i) {
                        self.keys.remove(&key);
                    }
                    f = h;
                    looked = 0;
                }
            }
        }
        let key = key_of(&f);
        // A fact wholly replaced by this one goes, unless it predates the current iteration
        // (a failed symbolic attempt must be able to restore the log by truncation).
        if let Some(&i) = self.keys.get(&key) {
            if i >= self.floor() {
                self.facts[i] = None;
            }
        }
        self.keys.insert(key, self.facts.len());
        self.facts.push(Some(f));
    }

    /// Drops every fact whose words newer facts cover word for word, and compacts the log.
    /// The memory the log stands for (at each word, the newest fact holding it) is unchanged,
    /// so no read can answer differently; only facts whose words are exactly known cover
    /// (a constant base and dense strides: the words are `lo..=hi`). Only between items, where
    /// no failed attempt will restore the log by truncation.
    pub(super) fn forget_shadowed(&mut self) {
        // Inside an ordered loop only the current iteration's facts go: those below stand
        // for the state before the loop.
        if self.loops.iter().any(|l| l.order.is_none()) {
            return;
        }
        let floor = self.floor();
        // Words covered by newer dense facts, as disjoint sorted intervals `lo -> hi`.
        let mut covered: std::collections::BTreeMap<i64, i64> = std::collections::BTreeMap::new();
        for i in (floor..self.facts.len()).rev() {
            let Some(g) = &self.facts[i] else { continue };
            if g.remote {
                continue;
            }
            let inside = covered
                .range(..=g.lo)
                .next_back()
                .is_some_and(|(_, &hi)| hi >= g.hi);
            if inside {
                self.facts[i] = None;
                continue;
            }
            if !dense(g) {
                continue;
            }
            let (mut lo, mut hi) = (g.lo, g.hi);
            // Merge with every interval it touches.
            let touching: Vec<(i64, i64)> = covered
                .range(..=hi.saturating_add(1))
                .rev()
                .take_while(|(_, &h)| h.saturating_add(1) >= lo)
                .map(|(&l, &h)| (l, h))
                .collect();
            for (l, h) in touching {
                covered.remove(&l);
                lo = lo.min(l);
                hi = hi.max(h);
            }
            covered.insert(lo, hi);
        }
        // Nothing to compact: the log and its keys stay as they are.
        if self.facts[floor..].iter().all(Option::is_some) {
            return;
        }
        let tail = self.facts.split_off(floor);
        self.facts.extend(tail.into_iter().filter(Option::is_some));
        self.keys.clear();
        for (i, g) in self.facts.iter().enumerate() {
            if let Some(g) = g {
                self.keys.insert(key_of(g), i);
            }
        }
    }

    fn truncate(&mut self, to: usize) {
        self.take_from(to);
    }

    /// The facts from `to` on, taken off the log (as [`Eval::truncate`] drops them).
    fn take_from(&mut self, to: usize) -> Vec<Fact> {
        let taken: Vec<Fact> = self.facts.drain(to..).flatten().collect();
        for f in &taken {
            let key = key_of(f);
            if self.keys.get(&key).is_some_and(|&i| i >= to) {
                self.keys.remove(&key);
            }
        }
        taken
    }

    /// Whether `d` is never 0 over the variables' ranges (with `pair = (x, x')` also assuming
    /// `x ≠ x'`), by elimination: the terms whose coefficients are multiples of a modulus `a`
    /// sum to a multiple of `a`, so if everything else (with the constant's remainder) stays
    /// strictly inside `(−a, a)`, that remainder must be 0 for `d` to be — and the test goes
    /// on with it; when the multiples are exactly `a·(x − x')`, that is a contradiction. The
    /// moduli are the coefficients' magnitudes, largest first.
    fn never_zero(&self, d: &Aff, pair: Option<(Var, Var)>) -> bool {
        fn gcd(a: i64, b: i64) -> i64 {
            if b == 0 {
                a
            } else {
                gcd(b, a % b)
            }
        }
        // Most tests end at the first bounds: no copy for those.
        match self.bounds(d) {
            Some((lo, hi)) if lo > 0 || hi < 0 => return true,
            None => return false,
            _ => {}
        }
        let mut rest = d.clone();
        let count = |v: Var| self.counts.get(&v).copied();
        loop {
            match rest.bounds(&count) {
                Some((lo, hi)) if lo > 0 || hi < 0 => return true,
                None => return false,
                _ => {}
            }
            let g = rest.t.iter().fold(0, |g, &(_, k)| gcd(g, k.abs()));
            if g == 0 {
                return rest.c != 0;
            }
            if rest.c % g != 0 {
                return true;
            }
            // A modulus `a` whose multiples (the group) leave the other terms strictly inside
            // `(−a, a)`: the largest coefficient first, then each smaller one (a block's rows
            // stacked as `128·b + 512·w` against `128·b'` leave only the columns).
            let mut moduli: smallvec::SmallVec<[i64; 8]> =
                rest.t.iter().map(|&(_, k)| k.abs()).collect();
            moduli.sort_unstable_by(|x, y| y.cmp(x));
            moduli.dedup();
            let fits = |o: &[(Var, i64)], r: i64, a: i64| matches!(Aff::bounds_from(r, o, &count), Some((lo, hi)) if lo > -a && hi < a);
            let mut found = None;
            for &a in &moduli {
                let others: smallvec::SmallVec<[(Var, i64); 8]> = rest
                    .t
                    .iter()
                    .copied()
                    .filter(|&(_, k)| k % a != 0)
                    .collect();
                let r0 = rest.c.rem_euclid(a);
                // The constant's multiple of `a` joins the group (which then sums to a
                // multiple of `a` still); what remains must stay strictly inside (−a, a).
                if fits(&others, r0, a) {
                    found = Some((a, r0));
                } else if fits(&others, r0 - a, a) {
                    found = Some((a, r0 - a));
                }
                if found.is_some() {
                    break;
                }
            }
            let Some((a, r)) = found else {
                return false;
            };
            // The group, tested in place: two terms `x − x'` when `pair` asks.
            let mut group = 0;
            let (mut has_x, mut has_xp, mut ks) = (false, false, [0i64; 2]);
            for &(v, k) in &rest.t {
                if k % a == 0 {
                    if group < 2 {
                        ks[group] = k;
                    }
                    group += 1;
                    if let Some((x, xp)) = pair {
                        has_x |= v == x;
                        has_xp |= v == xp;
                    }
                }
            }
            rest.t.retain(|&mut (_, k)| k % a != 0);
            if pair.is_some() && rest.c == r && group == 2 && has_x && has_xp && ks[0] == -ks[1] {
                return true;
            }
            rest.c = r;
        }
    }

    /// Whether fact `f` holds `addr` for every value of the variables: the coordinates, or
    /// `Err(true)` if it certainly does not, `Err(false)` if undecided.
    pub(super) fn hit(&self, f: &Fact, addr: &Aff, ab: (i64, i64)) -> Result<Coords, bool> {
        if ab.1 < f.lo || ab.0 > f.hi {
            return Err(true);
        }
        // The read's distance to the fact's words, over all their values at once: when it
        // excludes 0 the read misses every word, which is what the test below comes to then
        // (it starts with these bounds), without solving for coordinates. Only when the
        // coordinates are the fact's own (not also the read's or the base's variables): the
        // distance is then 0 wherever the coordinates equal a solution, so a fact that holds
        // the read never gets here.
        let own = |a: &Aff| f.dims.iter().all(|&(v, _, _)| a.coef(v) == 0);
        if own(addr) && own(&f.base) {
            let count = |v| self.counts.get(&v).copied();
            if let Some((lo, hi)) = addr.bounds_of_difference(&f.words, &count) {
                if lo > 0 || hi < 0 {
                    return Err(true);
                }
            }
        }
        let d = addr.minus(&f.base);
        let undecided = |e: &Self| Err(e.never_zero(&addr.minus(&f.words), None));
        let Some((sol, c)) = coords(f, &d) else {
            return undecided(self);
        };
        if c != 0 {
            return undecided(self);
        }
        for (x, &(_, _, n)) in sol.iter().zip(&f.dims) {
            match self.bounds(x) {
                Some((lo, hi)) if lo >= 0 && hi < n as i64 => {}
                _ => return undecided(self),
            }
        }
        Ok(sol)
    }

    /// Where a read of `addr` that `f` holds only in part leaves (or enters) `f` along one of
    /// its coordinates: `(x, i)`, the read's index `x` at iteration `i`. A loop cut there
    /// reads each side from one piece of `f`.
    pub(super) fn cut(&self, f: &Fact, addr: &Aff) -> Option<(Var, i64)> {
        let d = addr.minus(&f.base);
        let (sol, _) = coords(f, &d)?;
        for (x, &(_, _, n)) in sol.iter().zip(&f.dims) {
            let vars: Vec<(Var, i64)> =
                x.t.iter()
                    .copied()
                    .filter(|&(v, _)| self.counts.get(&v).is_some_and(|&m| m >= 2))
                    .collect();
            let [(v, k)] = vars[..] else {
                if let Some(c) = self.cut_striding(f, x, &vars, n as i64) {
                    return Some(c);
                }
                continue;
            };
            let count = *self.counts.get(&v)? as i64;
            let c0 = x.c;
            // First iteration at which k·i + c0 reaches `edge` (k > 0) or drops below it.
            let at = |edge: i64| {
                if k > 0 {
                    (edge - c0 + k - 1).div_euclid(k)
                } else {
                    (c0 - edge + 1 + (-k) - 1).div_euclid(-k)
                }
            };
            for i in [at(n as i64), at(0)] {
                if i > 0 && i < count {
                    return Some((v, i));
                }
            }
        }
        None
    }

    /// A coordinate `x` of several varying indices, one of which, `v`, strides over the
    /// others' whole span (a block forwarded column by column, `keys·c + b`, read against a
    /// fact of rows of `d` words): `(v, i)` where `x` leaves `0..n` cleanly, every iteration
    /// before `i` on one side of the edge and every one from `i` on the other. A loop cut
    /// there reads each side from one row; the cut piece meets the next row the same way.
    fn cut_striding(&self, f: &Fact, x: &Aff, vars: &[(Var, i64)], n: i64) -> Option<(Var, i64)> {
        let &(v, k) = vars.iter().max_by_key(|&&(_, k)| k.abs())?;
        if k <= 0 {
            return None;
        }
        let (lo, hi) = self.bounds(&x.clone().add_term(v, -k))?;
        if hi - lo >= k {
            return None;
        }
        // Where `k` divides a stride of the fact by at most `MAX_UNROLL`, regrouping (`cuts`)
        // meets the fact's coordinates in one piece; cutting would leave several.
        if f.dims
            .iter()
            .any(|&(_, s, _)| s > k && s % k == 0 && s / k <= MAX_UNROLL)
        {
            return None;
        }
        let count = *self.counts.get(&v)? as i64;
        // First iteration whose least word reaches `edge`; clean if the one before it stays
        // wholly below.
        let at = |edge: i64| (edge - lo + k - 1).div_euclid(k);
        [n, 0]
            .into_iter()
            .map(|edge| (edge, at(edge)))
            .find(|&(edge, i)| i > 0 && i < count && k * (i - 1) + hi < edge)
            .map(|(_, i)| (v, i))
    }

    /// Whether `addr` may be a word that another iteration of `l` writes through `family`:
    /// `Ok(false)` certainly not, `Ok(true)` the same fixed word, `Err` undecided.
    fn alias(&self, addr: &Aff, family: &Aff, l: &Active, others: Others) -> Result<bool, ()> {
        // Most families lie elsewhere: the bounds of the difference, which the test below
        // starts with, from the terms in place (the family's index renamed on the stack).
        let k = family.coef(l.var);
        let mut renamed: smallvec::SmallVec<[(Var, i64); 8]> = family
            .t
            .iter()
            .copied()
            .filter(|&(v, _)| v != l.var)
            .collect();
        if k != 0 {
            match renamed.binary_search_by_key(&l.other, |&(w, _)| w) {
                Ok(i) => {
                    renamed[i].1 += k;
                    if renamed[i].1 == 0 {
                        renamed.remove(i);
                    }
                }
                Err(i) => renamed.insert(i, (l.other, k)),
            }
        }
        let count = |v| self.counts.get(&v).copied();
        if let Some((lo, hi)) =
            Aff::bounds_of_difference_of(addr.c - family.c, &addr.t, &renamed, &count)
        {
            if lo > 0 || hi < 0 {
                return Ok(false);
            }
        }
        let other = family.subst(l.var, &Aff::var(l.other));
        let d = addr.minus(&other);
        if d.as_const() == Some(0) && family.coef(l.var) == 0 {
            return Ok(true);
        }
        if self.never_zero(&d, Some((l.var, l.other))) {
            return Ok(false);
        }
        let (Some(spans), Others::Earlier | Others::Later) = (&l.order, others) else {
            return Err(());
        };
        // In order: for each iteration `x0` of the write (earlier) or of the region (later),
        // the other index ranges over the iterations after it, `x0 + 1 + t`.
        let n = spans.len() as i64;
        for x0 in 0..n - 1 {
            let after = Aff::cst(x0 + 1).add_term(spans[(n - x0 - 1) as usize], 1);
            let (a, f) = match others {
                Others::Earlier => (
                    addr.subst(l.var, &after),
                    family.subst(l.var, &Aff::cst(x0)),
                ),
                _ => (
                    addr.subst(l.var, &Aff::cst(x0)),
                    family.subst(l.var, &after),
                ),
            };
            if !self.never_zero(&self.pin(a).minus(&self.pin(f)), None) {
                return Err(());
            }
        }
        Ok(false)
    }

    /// The value at `addr` and whether the programs computed it.
    pub(super) fn read(&mut self, addr: &Aff) -> R<(Id, bool)> {
        let addr = &self.pin(addr.clone());
        let ab = self
            .bounds(addr)
            .ok_or_else(|| Fail::Decline("an address with an unbounded index".into()))?;
        let mut top = self.facts.len();
        for depth in (0..=self.loops.len()).rev() {
            let bottom = if depth == 0 {
                0
            } else {
                self.loops[depth - 1].marker
            };
            for i in (bottom..top).rev() {
                let Some(f) = &self.facts[i] else { continue };
                // Most facts lie elsewhere: the interval test `hit` starts with, before a call.
                if f.remote || ab.1 < f.lo || ab.0 > f.hi {
                    continue;
                }
                match self.hit(f, addr, ab) {
                    Ok(_) if f.havoc => {
                        return Err(Fail::Decline(format!(
                            "a read of {addr:?}, a word a later head may have overwritten"
                        )))
                    }
                    Ok(sol) => {
                        let (mut v, computed) = (f.value, f.computed);
                        let dims: smallvec::SmallVec<[Var; 4]> =
                            f.dims.iter().map(|d| d.0).collect();
                        for (var, x) in dims.into_iter().zip(sol) {
                            v = self.tm.subst(v, var, &x);
                        }
                        return Ok((v, computed));
                    }
                    Err(true) => {}
                    Err(false) => {
                        // Where the read crosses the fact's edge: a piece boundary that may
                        // make both sides decidable. The older facts it runs into as well (up
                        // to one that holds it all): a block written row by row is then cut at
                        // every row at once, not one row per failed attempt.
                        let (lo, hi, dims) = (f.lo, f.hi, f.dims.len());
                        self.edge_of = Some((i, lo, hi, f.value));
                        self.hints = self.cuts(i, addr, ab);
                        return Err(Fail::Retry(format!(
                            "a read of {addr:?} may or may not see an earlier write (m{lo}..=m{hi}, {dims} dims)"
                        )));
                    }
                }
            }
            if depth > 0 {
                let l = &self.loops[depth - 1];
                let mut same = false;
                let others = if l.order.is_some() {
                    Others::Earlier
                } else {
                    Others::Any
                };
                for (fam, reach) in l.families.iter().zip(&l.reach) {
                    if reach.is_some_and(|(lo, hi)| hi < ab.0 || lo > ab.1) {
                        continue;
                    }
                    match self.alias(addr, fam, l, others) {
                        Ok(false) => {}
                        Ok(true) => same = true,
                        // Neither the read nor the write moves with the loop's index: what
                        // another iteration writes there is this very word (one word per row,
                        // say), so the read sees the value the iteration started with — the
                        // carry, whose use the summary then has to account for.
                        Err(())
                            if l.order.is_none()
                                && fam.coef(l.var) == 0
                                && addr.coef(l.var) == 0 =>
                        {
                            same = true
                        }
                        Err(()) => {
                            return Err(Fail::Retry(
                                "a read may see another iteration's write".into(),
                            ))
                        }
                    }
                }
                if same {
                    let id = l.id;
                    return Ok((self.tm.carry(id, addr.clone()), true));
                }
            }
            top = bottom;
        }
        Err(Fail::Decline(format!(
            "a read of a word never written (fault), address {addr:?} over {ab:?}"
        )))
    }

    /// Where a read of `addr` that fact `i` holds in part should be cut: the edges of that
    /// fact and of the older ones it runs into, down to one that holds the whole read.
    fn cuts(&mut self, i: usize, addr: &Aff, ab: (i64, i64)) -> Vec<(Var, i64)> {
        let mut out = Vec::new();
        let mut partial = 0;
        for j in (0..=i).rev() {
            let Some(f) = &self.facts[j] else { continue };
            if f.remote {
                continue;
            }
            match self.hit(f, addr, ab) {
                Ok(_) => break,
                Err(true) => {}
                Err(false) => {
                    out.extend(self.cut(f, addr));
                    out.extend(self.edge(addr, f.lo, f.hi));
                    // An index whose step divides one of the fact's strides meets the
                    // fact's coordinates in step when regrouped (`unroll`).
                    for &(v, k) in &addr.t {
                        if k <= 0 || self.counts.get(&v).is_none_or(|&n| n < 2) {
                            continue;
                        }
                        for &(_, s, _) in &f.dims {
                            if s > k && s % k == 0 && s / k <= MAX_UNROLL {
                                self.regroup.push((v, (s / k) as u64));
                            }
                        }
                    }
                    partial += 1;
                    if partial == MAX_CUT_FACTS {
                        break;
                    }
                }
            }
        }
        out
    }

    /// `(x, i)`: the read's only varying index `x` reaches the words `lo..=hi` from iteration
    /// `i` on, or leaves them there.
    pub(super) fn edge(&self, addr: &Aff, lo: i64, hi: i64) -> Option<(Var, i64)> {
        let mut vars = addr
            .t
            .iter()
            .filter(|&&(v, _)| self.counts.get(&v).is_some_and(|&n| n >= 2));
        let &(v, k) = vars.next()?;
        if vars.next().is_some() {
            return None;
        }
        let rest = addr.clone().add_term(v, -k);
        let c = self.bounds(&rest)?.0;
        // First x with c + k·x >= edge (k > 0) or <= edge (k < 0).
        let first = |edge: i64| {
            if k > 0 {
                (edge - c + k - 1).div_euclid(k)
            } else {
                (c - edge + (-k) - 1).div_euclid(-k)
            }
        };
        let cuts = [first(lo), first(hi + 1)];
        let n = *self.counts.get(&v)? as i64;
        cuts.into_iter().find(|&x| x > 0 && x < n).map(|x| (v, x))
    }

    fn write(&mut self, addr: Aff, value: Id, computed: bool) -> R<()> {
        let addr = self.pin(addr);
        let f = self.fact(addr, Vec::new(), value, computed)?;
        self.push(f);
        Ok(())
    }

    pub(super) fn addr(&self, b: &LBundle, f: Field, env: &[Ix]) -> R<Aff> {
        let base = field(&b.bundle, f).map_or(0, i64::from);
        let mut a = Aff::cst(base);
        for t in b.terms.iter().filter(|t| t.field == f) {
            match env.get(usize::from(t.level)) {
                Some(Ix::At(k)) => a = a.add_const(t.value(*k as u32)),
                Some(Ix::Sym(v, off)) if t.wrap == 0 => {
                    a = a
                        .add_term(*v, i64::from(t.stride))
                        .add_const(i64::from(t.stride) * off)
                }
                _ => return Err(Fail::Retry("a wrapped term on a symbolic index".into())),
            }
        }
        Ok(a)
    }

    /// Every word field `f` of `b` may address at `env`: [`Eval::addr`], with a wrapped term on
    /// a symbolic index widened to a fresh index over the whole period (more words than the
    /// writes reach, which is what a family may be).
    /// An index of the nodes' own loops (`inner` on) is narrowed to the iterations where
    /// `slot`'s predicates on it hold (a send of the first two rows only reaches two rows).
    fn family_addr(
        &mut self,
        b: &LBundle,
        f: Field,
        slot: Slot,
        env: &[Ix],
        inner: usize,
    ) -> R<Aff> {
        let base = field(&b.bundle, f).map_or(0, i64::from);
        let mut a = Aff::cst(base);
        for t in b.terms.iter().filter(|t| t.field == f) {
            let level = usize::from(t.level);
            match env.get(level) {
                Some(Ix::At(k)) => a = a.add_const(t.value(*k as u32)),
                Some(&Ix::Sym(v, off)) if t.wrap == 0 && level >= inner => {
                    let n = self.counts.get(&v).copied().unwrap_or(1) as i64;
                    let (mut lo, mut hi) = (off, off + n - 1);
                    for p in b
                        .preds
                        .iter()
                        .filter(|p| p.slot == slot && usize::from(p.level) == level)
                    {
                        let x = i64::from(p.value);
                        match p.cmp {
                            Cmp::Lt => hi = hi.min(x - 1),
                            Cmp::Ge => lo = lo.max(x),
                            Cmp::Eq => {
                                lo = lo.max(x);
                                hi = hi.min(x);
                            }
                            Cmp::Ne => {}
                        }
                    }
                    if lo > hi {
                        // Never executes here: any word stands for it.
                        lo = hi.max(off);
                        hi = lo;
                    }
                    let u = self.fresh((hi - lo + 1) as u64);
                    let s = i64::from(t.stride);
                    a = a.add_term(u, s).add_const(s * lo);
                }
                Some(Ix::Sym(v, off)) if t.wrap == 0 => {
                    a = a
                        .add_term(*v, i64::from(t.stride))
                        .add_const(i64::from(t.stride) * off)
                }
                Some(Ix::Sym(..)) => {
                    let u = self.fresh(u64::from(t.wrap));
                    a = a.add_term(u, i64::from(t.stride));
                }
                None => return Err(Fail::Decline("a term on an index out of scope".into())),
            }
        }
        Ok(a)
    }

    /// Whether `slot` of `b` executes at every index `env` stands for (`Some(true)`), at none
    /// (`Some(false)`), or at some only (`None`).
    fn decide(&self, b: &LBundle, slot: Slot, env: &[Ix]) -> Option<bool> {
        let mut all = true;
        for p in b.preds.iter().filter(|p| p.slot == slot) {
            let (lo, hi) = match env.get(usize::from(p.level)) {
                Some(Ix::At(k)) => (*k as i64, *k as i64),
                Some(Ix::Sym(v, off)) => {
                    let n = self.counts.get(v).copied()? as i64;
                    (*off, off + n - 1)
                }
                None => return None,
            };
            match holds_over(p.cmp, i64::from(p.value), lo, hi) {
                Some(true) => {}
                Some(false) => return Some(false),
                None => all = false,
            }
        }
        all.then_some(true)
    }

    pub(super) fn executes(&self, b: &LBundle, slot: Slot, env: &[Ix]) -> R<bool> {
        self.decide(b, slot, env)
            .ok_or_else(|| Fail::Retry("a predicate that holds at some indices only".into()))
    }

    /// The word PE `p − 1` holds where PE `p` holds `v`.
    fn relabel(&mut self, v: Id) -> R<Id> {
        // A word the previous iteration left (a buffer word rewritten every step): known
        // only iteration by iteration.
        if self.tm.has_carry(v) {
            return Err(Fail::Retry(
                "a sent word carried from the previous iteration".into(),
            ));
        }
        let T::Atom(t, h, row, col) = self.tm.node(v).clone() else {
            return Err(Fail::Decline(
                "a word sent over the ring is not an input element".into(),
            ));
        };
        let Some((lo, hi)) = self.bounds(&row) else {
            return Err(Fail::Decline("a token index without bounds".into()));
        };
        let row = if lo >= self.rows && hi < self.tokens {
            row.add_const(-self.rows)
        } else if lo >= 0 && hi < self.rows {
            row.add_const(self.tokens - self.rows)
        } else {
            return Err(Fail::Retry(
                "a sent word's token straddles a PE's rows".into(),
            ));
        };
        Ok(self.tm.atom(t, h, row, col))
    }

    fn is_rescale_factor(&self, x: Id) -> bool {
        matches!(self.tm.node(x), T::Expd(a, b, _) if self.tm.is_max(*a) && self.tm.is_max(*b))
    }

    fn count(&mut self, what: fn(&mut Tally) -> &mut u64) -> R<()> {
        let c = what(&mut self.tally);
        *c = c
            .checked_add(self.mult)
            .ok_or_else(|| Fail::Decline("operation count overflows".into()))?;
        Ok(())
    }

    pub(super) fn bundle(&mut self, b: &LBundle, env: &[Ix]) -> R<()> {
        self.evaluations += 1;
        // Evaluations running side by side count against one limit, not one each.
        let total = match &self.shared {
            Some((s, _)) => s.count_one(),
            None => self.evaluations,
        };
        // Attempts that fail give their evaluations back, so time is watched on all of them.
        self.attempted += 1;
        if self.attempted.is_multiple_of(256) {
            if std::time::Instant::now() > self.deadline {
                return Err(Fail::Decline(format!(
                    "more than {} s of evaluation",
                    MAX_TIME.as_secs()
                )));
            }
            if let Some((s, pe)) = &self.shared {
                if s.stopped(*pe) {
                    return Err(Fail::Decline("stopped: an earlier PE failed".into()));
                }
            }
        }
        if total > MAX_EVALUATIONS {
            return Err(Fail::Decline(format!(
                "more than {MAX_EVALUATIONS} bundle evaluations"
            )));
        }
        let op = match b.bundle.op {
            Op::Arith(x) if self.executes(b, Slot::Op, env)? => Some(x),
            _ => None,
        };
        let acc = match b.bundle.acc {
            Acc::Add { src, dst } if self.executes(b, Slot::Acc, env)? => Some((src, dst)),
            _ => None,
        };
        let send = match b.bundle.xfer {
            Xfer::Send { src, .. } if self.executes(b, Slot::Xfer, env)? => Some(src),
            _ => None,
        };
        // Reads, in the machine's order, before any write of the cycle.
        let mut operands = None;
        if let Some(x) = op {
            let a = self.read(&self.addr(b, Field::OpA, env)?)?.0;
            let bb = if x.kind.info().reads == 2 {
                Some(self.read(&self.addr(b, Field::OpB, env)?)?.0)
            } else {
                None
            };
            operands = Some((x, a, bb));
        }
        let addend = match acc {
            Some((AccSrc::Mem(_), _)) => Some(self.read(&self.addr(b, Field::AccSrc, env)?)?.0),
            _ => None,
        };
        let sent = match send {
            Some(XferSrc::Mem(_)) => Some(self.read(&self.addr(b, Field::XferSrc, env)?)?.0),
            _ => None,
        };
        let mut result = None;
        if let Some((x, a, bb)) = operands {
            let r = match (x.kind, bb) {
                (OpKind::Mul, Some(bb)) => {
                    if self.is_rescale_factor(a) || self.is_rescale_factor(bb) {
                        self.count(|t| &mut t.rescale)?;
                    } else if matches!(
                        (self.tm.node(a), self.tm.node(bb)),
                        (T::Atom(0, ..), T::Atom(1, ..)) | (T::Atom(1, ..), T::Atom(0, ..))
                    ) {
                        self.count(|t| &mut t.phase1_mul)?;
                    } else {
                        self.count(|t| &mut t.phase3_mul)?;
                    }
                    self.tm.mul(a, bb, self.online)
                }
                (OpKind::Div, Some(bb)) => {
                    self.count(|t| &mut t.div)?;
                    self.tm.div(a, bb)
                }
                (OpKind::Max, Some(bb)) => {
                    if a == bb {
                        self.count(|t| &mut t.rescale)?;
                    } else {
                        self.count(|t| &mut t.max)?;
                    }
                    self.tm.max(a, bb)
                }
                (OpKind::Exp, None) => {
                    self.count(|t| &mut t.exp)?;
                    self.tm.exp(a, x.imm)
                }
                (OpKind::Expd, Some(bb)) => {
                    let e = self.tm.expd(a, bb, x.imm);
                    if self.is_rescale_factor(e) {
                        self.count(|t| &mut t.rescale)?;
                    } else {
                        self.count(|t| &mut t.exp)?;
                    }
                    e
                }
                _ => return Err(Fail::Decline("an op kind this proof does not know".into())),
            };
            result = Some(r);
        }
        let acc_value = match (acc, result) {
            (Some(_), Some(r)) => Some(match addend {
                Some(a) => self.tm.sum(&[a, r]),
                None => r,
            }),
            _ => None,
        };
        let mut dsts = Vec::new();
        if let (Some(x), Some(r)) = (op, result) {
            if x.dst.is_some() {
                let d = self.addr(b, Field::OpDst, env)?;
                dsts.push(d.clone());
                self.write(d, r, true)?;
            }
        }
        if let (Some((_, Some(_))), Some(v)) = (acc, acc_value) {
            let d = self.addr(b, Field::AccDst, env)?;
            dsts.push(d.clone());
            self.write(d, v, true)?;
        }
        if let Some(src) = send {
            let word = match src {
                XferSrc::Mem(_) => sent,
                XferSrc::Acc => acc_value,
            }
            .ok_or_else(|| Fail::Decline("send acc without an acc".into()))?;
            let d = self.addr(b, Field::XferDst, env)?;
            if self.per_pe {
                // Where and when it lands is the caller's to check (it delivers the fact).
                let mut f = self.fact(self.pin(d), Vec::new(), word, true)?;
                f.remote = true;
                self.push(f);
                return Ok(());
            }
            let arriving = self.relabel(word)?;
            for o in &dsts {
                match self.bounds(&d.minus(o)) {
                    Some((lo, hi)) if lo > 0 || hi < 0 => {}
                    _ => {
                        return Err(Fail::Decline(
                            "an arriving word may meet a local write in one cycle".into(),
                        ))
                    }
                }
            }
            self.write(d, arriving, false)?;
        }
        Ok(())
    }

    fn body(&mut self, nodes: &[Node], env: &mut Vec<Ix>) -> R<()> {
        let hook = self.hook_of(nodes);
        for (i, n) in nodes.iter().enumerate() {
            if let Some(h) = hook {
                super::induct::fire(self, h, i, env)?;
            }
            match n {
                Node::Bundle(b) => self.bundle(b, env)?,
                Node::Loop(l) => self.lp(l, env)?,
            }
        }
        if let Some(h) = hook {
            super::induct::fire(self, h, nodes.len(), env)?;
        }
        Ok(())
    }

    pub(super) fn lp(&mut self, l: &Loop, env: &mut Vec<Ix>) -> R<()> {
        let level = env.len();
        let n = self.trips(l, env, false)?;
        if !splittable(&l.body, level) {
            return self.iterate(l, env, 0, n);
        }
        // Pieces between the thresholds of the predicates on this index: in each, every
        // predicate on it holds at all iterations or at none, so the piece may be symbolic.
        for (a, b) in pieces(&l.body, level, n) {
            self.piece(l, env, a, b)?;
        }
        Ok(())
    }

    /// Iterations `a..b` of `l`: symbolically if that decides everything; else, when a read
    /// ran into the edge of what an earlier write left (a value that changes shape inside the
    /// range, e.g. a row whose first word was written apart), each side of that edge the same
    /// way; else one by one.
    pub(super) fn piece(&mut self, l: &Loop, env: &mut Vec<Ix>, a: u64, b: u64) -> R<()> {
        if b - a < 2 {
            return self.iterate(l, env, a, b);
        }
        let level = env.len();
        let memo = self.reuse_cuts.then(|| PieceAt::new(l, env, a, b));
        if let Some(m) = &memo {
            if let Some((at, edge)) = self.reused_cut(m) {
                self.cut_before.insert(m.clone(), (at.clone(), edge));
                return self.cut_at(l, env, a, b, at);
            }
        }
        let (mark, tally, evals) = (self.facts.len(), self.tally, self.evaluations);
        self.hints.clear();
        self.regroup.clear();
        self.edge_of = None;
        let var = self.next_var;
        match self.symbolic(l, env, a, b - a) {
            Ok(()) => Ok(()),
            Err(Fail::Retry(why)) => {
                self.truncate(mark);
                self.tally = tally;
                self.give_back(evals);
                env.truncate(level);
                // At the edge a read ran into, if it was this loop's; otherwise one by one
                // (cutting blindly costs more than it finds).
                // A read undecided over an enclosing symbolic loop's index: cutting or
                // iterating this loop cannot decide it, that loop must be cut.
                let names = |v: Var| {
                    self.hints.iter().any(|h| h.0 == v) || self.regroup.iter().any(|h| h.0 == v)
                };
                if !names(var) && self.loops.iter().any(|l| names(l.var)) {
                    return Err(Fail::Retry(why));
                }
                let mut at: Vec<u64> = std::mem::take(&mut self.hints)
                    .into_iter()
                    .filter(|&(v, x)| v == var && x > 0 && (x as u64) < b - a)
                    .map(|(_, x)| a + x as u64)
                    .collect();
                at.sort_unstable();
                at.dedup();
                let regroup = std::mem::take(&mut self.regroup)
                    .into_iter()
                    .filter(|&(v, m)| {
                        v == var
                            && 2 * m <= b - a
                            && super::unroll::regroupable(&l.body, level)
                            && self.hook_of(&l.body).is_none()
                    })
                    .map(|(_, m)| m)
                    .min();
                // Regrouping by `m` evaluates the body `m` times and leaves what the loop
                // writes as `m` interleaved regions; fewer pieces, each contiguous, are
                // cheaper and read back as one region later (a block dealt as two runs of
                // rows, read by one loop over all rows, is two pieces).
                let fewer_pieces =
                    !at.is_empty() && regroup.is_some_and(|m| at.len() as u64 + 1 < m);
                if let (Some(m), false) = (regroup, fewer_pieces) {
                    let q = (b - a) / m;
                    if let Some(u) = super::unroll::unrolled(l, level, a, m, q) {
                        let r = self.lp(&u, env);
                        self.forget_cuts_in(&u);
                        r?;
                        return self.piece(l, env, a + m * q, b);
                    }
                }
                if let (Some(memo), Some(edge)) = (memo, self.edge_of.take()) {
                    self.cut_before.insert(memo, (at.clone(), edge));
                }
                self.cut_at(l, env, a, b, at)
            }
            Err(e) => Err(e),
        }
    }

    /// The cuts of the same piece one iteration earlier, if the fact whose edge made them is
    /// still where it was in the log.
    fn reused_cut(&mut self, memo: &PieceAt) -> Option<(Vec<u64>, Edge)> {
        if self.cut_before.is_empty() {
            return None;
        }
        let (at, edge) = self.cut_before.remove(&memo.previous()?)?;
        let f = self.facts.get(edge.0)?.as_ref()?;
        (f.lo == edge.1 && f.hi == edge.2 && f.value == edge.3).then_some((at, edge))
    }

    /// Forgets the cuts learnt in `l` and the loops inside it, a loop made for the evaluation
    /// (regrouped) that is about to be dropped: another such loop may later be made at the
    /// same address, and its pieces must not be cut where this one's were.
    pub(super) fn forget_cuts_in(&mut self, l: &Loop) {
        fn bodies(nodes: &[Node], out: &mut Vec<usize>) {
            out.push(nodes.as_ptr() as usize);
            for n in nodes {
                if let Node::Loop(l) = n {
                    bodies(&l.body, out);
                }
            }
        }
        if self.cut_before.is_empty() {
            return;
        }
        let mut gone = Vec::new();
        bodies(&l.body, &mut gone);
        gone.sort_unstable();
        self.cut_before
            .retain(|k, _| gone.binary_search(&k.body.0).is_err());
    }

    /// Iterations `a..b` of `l` as pieces cut at `at` (increasing, inside the range), each
    /// tried symbolically; with no cut, one by one.
    fn cut_at(&mut self, l: &Loop, env: &mut Vec<Ix>, a: u64, b: u64, at: Vec<u64>) -> R<()> {
        if at.is_empty() {
            return self.iterate(l, env, a, b);
        }
        let mut from = a;
        for x in at.into_iter().chain([b]) {
            self.piece(l, env, from, x)?;
            from = x;
        }
        Ok(())
    }

    /// Iterations `from..to` of `l`, one by one.
    pub(super) fn iterate(&mut self, l: &Loop, env: &mut Vec<Ix>, from: u64, to: u64) -> R<()> {
        for k in from..to {
            env.push(Ix::At(k));
            let r = self.body(&l.body, env);
            env.pop();
            r?;
        }
        Ok(())
    }

    /// The trip count of `l` entered at `env`: exact when the index its count steps with is
    /// known; with `most`, the largest over a symbolic one (for over-approximations only).
    pub(super) fn trips(&self, l: &Loop, env: &[Ix], most: bool) -> R<u64> {
        let Some(step) = l.step else {
            return Ok(u64::from(l.count));
        };
        let (lo, hi) = match env.get(usize::from(step.level)) {
            Some(Ix::At(k)) => (*k as i64, *k as i64),
            Some(Ix::Sym(v, off)) if most => {
                let n = self.counts.get(v).copied().unwrap_or(1) as i64;
                (*off, off + n - 1)
            }
            _ => {
                return Err(Fail::Retry(
                    "a triangular loop stepped by a symbolic index".into(),
                ))
            }
        };
        let at = |i: i64| i64::from(l.count) + i64::from(step.per) * i;
        let t = if most { at(lo).max(at(hi)) } else { at(lo) };
        u64::try_from(t)
            .ok()
            .filter(|&t| t >= 1)
            .ok_or_else(|| Fail::Decline("a loop instance without iterations".into()))
    }

    /// Loops at levels from `inner` on are the nodes' own (their indices are not the caller's).
    pub(super) fn families(
        &mut self,
        nodes: &[Node],
        env: &mut Vec<Ix>,
        inner: usize,
        out: &mut Vec<Aff>,
        remote: &mut Vec<Aff>,
    ) -> R<()> {
        // Every word a write of these nodes may reach (more is fine: a read shown to miss all
        // of them misses every real write).
        let may = |e: &Self, b: &LBundle, s: Slot, env: &[Ix]| e.decide(b, s, env) != Some(false);
        for n in nodes {
            match n {
                Node::Bundle(b) => {
                    if b.bundle.op.dst().is_some() && may(self, b, Slot::Op, env) {
                        out.push(self.family_addr(b, Field::OpDst, Slot::Op, env, inner)?);
                    }
                    if matches!(b.bundle.acc, Acc::Add { dst: Some(_), .. })
                        && may(self, b, Slot::Acc, env)
                    {
                        out.push(self.family_addr(b, Field::AccDst, Slot::Acc, env, inner)?);
                    }
                    if b.bundle.xfer != Xfer::Nop && may(self, b, Slot::Xfer, env) {
                        let d = self.family_addr(b, Field::XferDst, Slot::Xfer, env, inner)?;
                        if self.per_pe {
                            remote.push(d);
                        } else {
                            out.push(d);
                        }
                    }
                }
                Node::Loop(l) => {
                    let count = self.trips(l, env, true)?;
                    let v = self.fresh(count);
                    env.push(Ix::Sym(v, 0));
                    let r = self.families(&l.body, env, inner, out, remote);
                    env.pop();
                    r?;
                }
            }
        }
        Ok(())
    }

    /// Iterations `off..off + n` of `l` for a symbolic index (the module documentation).
    fn symbolic(&mut self, l: &Loop, env: &mut Vec<Ix>, off: u64, n: u64) -> R<()> {
        let off = off as i64;
        let var = self.fresh(n);
        let other = self.fresh(n);
        env.push(Ix::Sym(var, off));
        let (mut families, mut remote_families) = (Vec::new(), Vec::new());
        let inner = env.len();
        let r = self.families(&l.body, env, inner, &mut families, &mut remote_families);
        env.pop();
        r?;
        // A marked body also writes the contracts it pushes (its receive buffers).
        if let Some(h) = self.hook_of(&l.body) {
            families.extend(super::induct::buffer_families(self, h));
        }
        let id = self.next_loop;
        self.next_loop += 1;
        let marker = self.facts.len();
        let reach = families.iter().map(|f| self.bounds(f)).collect();
        self.loops.push(Active {
            id,
            var,
            other,
            marker,
            families,
            reach,
            remote_families,
            order: None,
        });
        let outer = self.mult;
        self.mult = outer.saturating_mul(n);
        env.push(Ix::Sym(var, off));
        let r = self.body(&l.body, env);
        env.pop();
        self.mult = outer;
        let active = self.loops.pop();
        r?;
        let Some(active) = active else {
            return Err(Fail::Decline("loop stack".into()));
        };
        let written = self.take_from(marker);
        // Every summary first, then the log: a carried word's value before the loop is read
        // from the log as the loop found it, not from another summary of the same loop (two
        // halves of a regrouped step each writing a row's running sum, say).
        let mut summaries = Vec::with_capacity(written.len());
        for f in written {
            match self.summary(f.clone(), &active, n) {
                Ok(g) => summaries.push(g),
                // A carried row of words whose values before the loop no one formula gives
                // (each a maximum over a different range, say): word by word.
                Err(Fail::Retry(why))
                    if f.dims.len() == 1
                        && f.dims[0].2 <= 64
                        && !f.remote
                        && self.carries_of(f.value, active.id) =>
                {
                    let (v, stride, count) = f.dims[0];
                    for x in 0..count as i64 {
                        let value = self.tm.subst(f.value, v, &Aff::cst(x));
                        let word = f.base.clone().add_const(x * stride);
                        let one = self.fact(word, Vec::new(), value, f.computed)?;
                        let g = self
                            .summary(one, &active, n)
                            .map_err(|_| Fail::Retry(why.clone()))?;
                        summaries.push(g);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        for g in summaries {
            self.push(g);
        }
        Ok(())
    }

    /// Enters a loop over `var` (`n` iterations) whose iterations the caller evaluates in
    /// order, as one symbolic iteration: `families` are all the words the body may write
    /// here (arrivals included), `remote_families` where its sends land.
    pub(super) fn enter_ordered(
        &mut self,
        var: Var,
        n: u64,
        families: Vec<Aff>,
        remote_families: Vec<Aff>,
    ) {
        let other = self.fresh(n);
        let spans = (0..n).map(|c| self.fresh(c.max(1))).collect();
        let id = self.next_loop;
        self.next_loop += 1;
        let reach = families.iter().map(|f| self.bounds(f)).collect();
        self.loops.push(Active {
            id,
            var,
            other,
            marker: self.facts.len(),
            families,
            reach,
            remote_families,
            order: Some(spans),
        });
    }

    /// Leaves the loop [`Eval::enter_ordered`] entered: what the iteration wrote becomes
    /// regions over the index where no later iteration may overwrite them, and words whose
    /// final value that does not settle are marked untracked.
    pub(super) fn leave_ordered(&mut self, n: u64) -> R<()> {
        self.leave_ordered_keeping(n, None)
    }

    /// [`Eval::leave_ordered`] when only the words of `keep` (inclusive intervals) are read
    /// after the loop: a fact that misses them all is left untracked (every value it may
    /// hold), not summarised — the same for what follows, and the summaries of a loop's
    /// scratch buffers are most of the work of leaving it.
    pub(super) fn leave_ordered_keeping(&mut self, n: u64, keep: Option<&[(i64, i64)]>) -> R<()> {
        let Some(active) = self.loops.pop() else {
            return Err(Fail::Decline("loop stack".into()));
        };
        let written = self.take_from(active.marker);
        // As for any symbolic loop: every summary from the log as the loop found it, then
        // the log.
        let mut summaries = Vec::with_capacity(written.len());
        for f in written {
            if f.remote {
                return Err(Fail::Decline("a send not delivered".into()));
            }
            let read_after =
                keep.is_none_or(|k| k.iter().any(|&(lo, hi)| f.lo <= hi && lo <= f.hi));
            if !read_after {
                summaries.push(self.havoc(&f)?);
                continue;
            }
            let g = match self.summary(f.clone(), &active, n) {
                Ok(g) => g,
                Err(Fail::Retry(_)) => self.havoc(&f)?,
                Err(e) => return Err(e),
            };
            summaries.push(g);
        }
        for g in summaries {
            self.push(g);
        }
        Ok(())
    }

    /// Every word `f` may hold for any value of its variables, untracked.
    fn havoc(&mut self, f: &Fact) -> R<Fact> {
        let w = self.fresh((f.hi - f.lo + 1) as u64);
        let value = self.tm.carry(u32::MAX, Aff::cst(f.lo));
        let mut g = self.fact(
            Aff::cst(f.lo),
            vec![(w, 1, (f.hi - f.lo + 1) as u64)],
            value,
            false,
        )?;
        g.havoc = true;
        Ok(g)
    }

    fn carries_of(&self, x: Id, id: u32) -> bool {
        if !self.tm.has_carry(x) {
            return false;
        }
        match self.tm.node(x) {
            T::Carry(l, _) => *l == id,
            T::Atom(..) => false,
            T::Mul(a, b) | T::Div(a, b) | T::Expd(a, b, _) => {
                self.carries_of(*a, id) || self.carries_of(*b, id)
            }
            T::Exp(a, _) => self.carries_of(*a, id),
            T::Max(xs) | T::Sum(xs) => xs.iter().any(|&y| self.carries_of(y, id)),
            T::RSum(_, _, _, b) | T::RMax(_, _, _, b) => self.carries_of(*b, id),
        }
    }

    fn summary(&mut self, f: Fact, l: &Active, n: u64) -> R<Fact> {
        let retry = |why: &str| Err(Fail::Retry(why.into()));
        let a = f.base.coef(l.var);
        // The words of `f` as an address over its coordinates.
        let mut words = f.base.clone();
        for &(v, s, _) in &f.dims {
            words = words.add_term(v, s);
        }
        let families = if f.remote {
            &l.remote_families
        } else {
            &l.families
        };
        if a != 0 {
            if a < 0 || self.carries_of(f.value, l.id) {
                return retry("a region over the loop index that carries a value");
            }
            let others = if l.order.is_some() {
                Others::Later
            } else {
                Others::Any
            };
            for fam in families {
                if !matches!(self.alias(&words, fam, l, others), Ok(false)) {
                    return retry("a region another iteration may overwrite");
                }
            }
            let base = f.base.clone().add_term(l.var, -a);
            let mut dims = f.dims.clone();
            dims.push((l.var, a, n));
            let mut g = self.fact(base, dims, f.value, f.computed)?;
            g.remote = f.remote;
            g.havoc = f.havoc;
            return Ok(g);
        }
        // The same words every iteration: no other iteration's write may land in them except
        // through the same words.
        for fam in families {
            if fam.coef(l.var) != 0 && !self.never_zero(&words.minus(fam), None) {
                return retry("a fixed word a moving write may hit");
            }
        }
        if !self.carries_of(f.value, l.id) {
            let last = Aff::cst(n as i64 - 1);
            let v = self.tm.subst(f.value, l.var, &last);
            let mut g = self.fact(f.base, f.dims, v, f.computed)?;
            g.remote = f.remote;
            g.havoc = f.havoc;
            return Ok(g);
        }
        if f.remote {
            return retry("a carried send");
        }
        // A region (a running maximum or sum per row, carried across the loop) is carried
        // word by word: its previous value was read at the address it is written at, in the
        // region's own coordinates, so each word's carry is that word's previous value.
        let own = self.pin(words.clone());
        let (add, args) = match self.tm.node(f.value).clone() {
            T::Sum(xs) => (true, xs),
            T::Max(xs) => (false, xs),
            _ => return retry("a carried value that is neither a sum nor a maximum"),
        };
        let mut rest = Vec::new();
        let mut seen = false;
        for x in args {
            match self.tm.node(x) {
                T::Carry(id, at) if *id == l.id && self.pin(at.clone()) == own && !seen => {
                    seen = true
                }
                _ => {
                    if self.carries_of(x, l.id) {
                        return retry("a carried value used otherwise");
                    }
                    rest.push(x);
                }
            }
        }
        if !seen || rest.is_empty() {
            return retry("an accumulator without its own previous value");
        }
        let t = if add {
            self.tm.sum(&rest)
        } else {
            let mut m = rest[0];
            for &x in &rest[1..] {
                m = self.tm.max(m, x);
            }
            m
        };
        let (init, computed) = self.read(&words)?;
        let range = self.tm.range(add, l.var, 0, n as i64, t);
        let v = if add {
            self.tm.sum(&[init, range])
        } else {
            self.tm.max(init, range)
        };
        self.fact(f.base, f.dims, v, computed && f.computed)
    }
}

/// Whether `f`'s words are exactly `f.lo..=f.hi`: a constant base, and strides decreasing, each
/// the span of the coordinates below it, the last 1.
fn dense(f: &Fact) -> bool {
    if !f.base.t.is_empty() {
        return false;
    }
    let mut span = 1;
    for &(_, s, n) in f.dims.iter().rev() {
        if s != span {
            return false;
        }
        span = s * n as i64;
    }
    true
}

/// Whether `i cmp v` holds for every `i` in `lo..=hi` (`Some(true)`), for none (`Some(false)`),
/// or for some only (`None`).
fn holds_over(cmp: isa::looped::Cmp, v: i64, lo: i64, hi: i64) -> Option<bool> {
    use isa::looped::Cmp;
    let (lt_all, lt_none) = (hi < v, lo >= v);
    let (eq_all, eq_none) = (lo == v && hi == v, v < lo || v > hi);
    let (all, none) = match cmp {
        Cmp::Lt => (lt_all, lt_none),
        Cmp::Ge => (lt_none, lt_all),
        Cmp::Eq => (eq_all, eq_none),
        Cmp::Ne => (eq_none, eq_all),
    };
    if all {
        Some(true)
    } else if none {
        Some(false)
    } else {
        None
    }
}

/// Whether a loop at `level` may be evaluated symbolically, piece by piece: no wrapped term
/// inside uses its index and no loop inside steps its count by it. (Predicates on it are
/// resolved per piece, [`pieces`]; inner loops decide for themselves.)
pub(super) fn splittable(nodes: &[Node], level: usize) -> bool {
    nodes.iter().all(|n| match n {
        Node::Bundle(b) => !b
            .terms
            .iter()
            .any(|t| usize::from(t.level) == level && t.wrap != 0),
        Node::Loop(l) => {
            l.step.is_none_or(|s| usize::from(s.level) != level) && splittable(&l.body, level)
        }
    })
}

/// `0..n` cut at every threshold of a predicate on the index at `level` inside `nodes`, so
/// that each predicate holds at every iteration of a piece or at none.
pub(super) fn pieces(nodes: &[Node], level: usize, n: u64) -> Vec<(u64, u64)> {
    fn cuts(nodes: &[Node], level: usize, out: &mut Vec<u64>) {
        for node in nodes {
            match node {
                Node::Bundle(b) => {
                    for p in b.preds.iter().filter(|p| usize::from(p.level) == level) {
                        let v = u64::from(p.value);
                        out.push(v);
                        if matches!(p.cmp, isa::looped::Cmp::Eq | isa::looped::Cmp::Ne) {
                            out.push(v + 1);
                        }
                    }
                }
                Node::Loop(l) => cuts(&l.body, level, out),
            }
        }
    }
    let mut at = Vec::new();
    cuts(nodes, level, &mut at);
    at.retain(|&x| x > 0 && x < n);
    at.sort_unstable();
    at.dedup();
    let mut out = Vec::with_capacity(at.len() + 1);
    let mut from = 0;
    for x in at.into_iter().chain([n]) {
        out.push((from, x));
        from = x;
    }
    out
}

/// Why `programs` and `m` are outside this proof, if they are.
pub fn applies(programs: &[LoopProgram], m: &Manifest) -> Result<(), String> {
    let l = &m.layer;
    if l.qkv != "separate" {
        return Err("covers separate q, k, v only".into());
    }
    if l.mask != "none" {
        return Err("covers layers without a mask only".into());
    }
    if m.normalisation != runtime::layer::Normalisation::Deferred {
        return Err("covers the online (deferred) formulation only".into());
    }
    let Some(first) = programs.first() else {
        return Err("no programs".into());
    };
    if programs
        .iter()
        .any(|p| p.body != first.body || p.mem_words != first.mem_words)
    {
        return Err("the PEs run different programs".into());
    }
    for (name, p) in m.inputs.iter().chain(&m.outputs) {
        let Some(layout) = &p.layout else {
            return Err(format!("`{name}` is placed element by element"));
        };
        if !p.copies.is_empty() {
            return Err(format!("`{name}` has preload copies"));
        }
        if layout.order != RowOrder::Contiguous
            || u64::from(layout.rows_per_pe) * u64::from(m.pes) != u64::from(l.tokens)
        {
            return Err(format!(
                "`{name}` is not dealt in equal contiguous blocks of rows"
            ));
        }
    }
    Ok(())
}

/// The affine layout the manifest gives tensor `name` (an input or the output).
pub(super) fn tensor_layout(m: &Manifest, name: &str) -> Result<Layout, String> {
    m.inputs
        .get(name)
        .or_else(|| m.outputs.get(name))
        .and_then(|p| p.layout)
        .ok_or_else(|| format!("no layout for `{name}`"))
}

/// Evaluates PE 0 (see the module documentation) and compares its outputs with the
/// specification. `Err` says why the proof does not cover the programs.
pub fn evaluate(programs: &[LoopProgram], m: &Manifest) -> Result<Evaluated, String> {
    applies(programs, m)?;
    let l = &m.layer;
    let (heads, tokens, dim) = (i64::from(l.heads), i64::from(l.tokens), i64::from(l.dim));
    let layout = |name: &str| tensor_layout(m, name);
    let rows = i64::from(layout("y")?.rows_per_pe);
    let mut e = Eval::new(rows, tokens, false);
    for (t, name) in ["q", "k", "v"].iter().enumerate() {
        let lay = layout(name)?;
        let (h, r, c) = (
            e.fresh(heads as u64),
            e.fresh(rows as u64),
            e.fresh(dim as u64),
        );
        let value = e.tm.atom(t as u8, Aff::var(h), Aff::var(r), Aff::var(c));
        let f = e
            .fact(
                Aff::cst(i64::from(lay.base)),
                vec![
                    (h, i64::from(lay.head_stride), heads as u64),
                    (r, i64::from(lay.row_stride), rows as u64),
                    (c, 1, dim as u64),
                ],
                value,
                false,
            )
            .map_err(|_| "input layout".to_string())?;
        e.facts.push(Some(f));
    }
    let why = |f: Fail| match f {
        Fail::Retry(why) | Fail::Decline(why) => why,
    };
    e.body(&programs[0].body, &mut Vec::new()).map_err(why)?;
    let scale = l.scale as f32;
    let safe = l.softmax == "safe";
    let y = layout("y")?;
    let mut wrong = Vec::new();
    let mut wrong_count = 0;
    for h in 0..heads {
        for r in 0..rows {
            let differs =
                row_difference(&mut e, &y, (Aff::cst(h), r, r), (tokens, dim), scale, safe)
                    .map_err(why)?;
            if let Some(how) = differs {
                wrong_count += 1;
                if wrong.len() < 5 {
                    wrong.push(format!(
                        "y[{h}][{r}][c] on PE 0 is not the specification: {how}"
                    ));
                }
            }
        }
    }
    let ops = e
        .tally
        .scaled(u64::from(m.pes))
        .ok_or("operation counts overflow")?;
    Ok(Evaluated {
        ops,
        wrong,
        wrong_count,
        evaluations: e.evaluations,
        expressions: e.tm.len(),
    })
}

/// How output row `row` of head `h` differs from the specification of token `token` over its
/// first `keys` keys, or `None` where it is that specification: read all columns at once, or,
/// where the row's words are pieces of several writes, column by column.
pub(super) fn row_difference(
    e: &mut Eval,
    y: &Layout,
    (h, row, token): (Aff, i64, i64),
    (keys, dim): (i64, i64),
    scale: f32,
    safe: bool,
) -> R<Option<String>> {
    let c = e.fresh(dim as u64);
    let mut addr = Aff::cst(i64::from(y.base) + row * i64::from(y.row_stride)).add_term(c, 1);
    for &(v, k) in &h.t {
        addr = addr.add_term(v, k * i64::from(y.head_stride));
    }
    let addr = addr.add_const(h.c * i64::from(y.head_stride));
    let cols: Vec<(Aff, Aff)> = match e.read(&addr) {
        Ok(_) => vec![(addr.clone(), e.pin(Aff::var(c)))],
        Err(Fail::Retry(_)) => (0..dim)
            .map(|k| (addr.subst(c, &Aff::cst(k)), Aff::cst(k)))
            .collect(),
        Err(f) => return Err(f),
    };
    let mut differs = None;
    for (at, cv) in cols {
        let (found, computed) = e.read(&at)?;
        let want = spec(e, h.clone(), token, cv, (keys, dim), scale, safe);
        let found = e.tm.norm(found);
        if differs.is_none() && (!computed || found != want) {
            differs = Some(if computed {
                format!(
                    "found {}, expected {}",
                    e.tm.show(found, 4),
                    e.tm.show(want, 4)
                )
            } else {
                "not written by the programs".into()
            });
        }
    }
    Ok(differs)
}

/// `y[h][r][c]` of the online formulation, `c` a column variable (or 0 for one column), `h` a
/// head or a head variable.
pub(super) fn spec(
    e: &mut Eval,
    h: Aff,
    r: i64,
    c: Aff,
    (n, d): (i64, i64),
    scale: f32,
    safe: bool,
) -> Id {
    let j = e.fresh(n as u64);
    let k = e.fresh(d as u64);
    let (hh, rr) = (h, Aff::cst(r));
    let q = e.tm.atom(0, hh.clone(), rr, Aff::var(k));
    let kk = e.tm.atom(1, hh.clone(), Aff::var(j), Aff::var(k));
    let prod = e.tm.mul(q, kk, true);
    let score = e.tm.range(true, k, 0, d, prod);
    let ex = if safe {
        let m = e.tm.range(false, j, 0, n, score);
        e.tm.expd(score, m, scale)
    } else {
        e.tm.exp(score, scale)
    };
    let l = e.tm.range(true, j, 0, n, ex);
    let v = e.tm.atom(2, hh, Aff::var(j), c);
    let term = e.tm.mul(ex, v, true);
    let y = e.tm.range(true, j, 0, n, term);
    e.tm.div(y, l)
}

/// The coordinates in `f` of the offset `d` from its base, term by term on the dimension whose
/// stride divides each coefficient, and the constant left over (0 when `d` lands on an element).
fn coords(f: &Fact, d: &Aff) -> Option<(Coords, i64)> {
    let mut sol: Coords = smallvec::smallvec![Aff::cst(0); f.dims.len()];
    for &(v, k) in &d.t {
        let i = f.dims.iter().position(|&(_, s, _)| k % s == 0)?;
        sol[i] = std::mem::take(&mut sol[i]).add_term(v, k / f.dims[i].1);
    }
    let mut c = d.c;
    for (i, &(_, s, _)) in f.dims.iter().enumerate() {
        let q = c.div_euclid(s);
        sol[i].c += q;
        c -= q * s;
    }
    Some((sol, c))
}

/// A fact's coordinates of one word (facts have a few).
pub(super) type Coords = smallvec::SmallVec<[Aff; 4]>;

/// Whether renaming `high`'s coordinates one by one to `low`'s would capture one of `low`'s
/// (a coordinate of `low` at another position has the same variable).
fn renaming_clashes(low: &Fact, high: &Fact) -> bool {
    high.dims.iter().enumerate().any(|(i, h)| {
        low.dims
            .iter()
            .enumerate()
            .any(|(j, l)| l.0 == h.0 && i != j)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use isa::looped::Cmp;

    fn body(src: &str) -> Vec<Node> {
        let text = format!(".format 3\n.pe 0\n.pes 1\n.mem 64\n{src}");
        isa::looped_text::parse_looped(&text)
            .unwrap_or_else(|e| panic!("{e:?}"))
            .body
    }

    #[test]
    fn predicates_decide_over_a_range_or_leave_it_open() {
        assert_eq!(holds_over(Cmp::Lt, 5, 0, 4), Some(true));
        assert_eq!(holds_over(Cmp::Lt, 5, 5, 9), Some(false));
        assert_eq!(holds_over(Cmp::Lt, 5, 4, 5), None);
        assert_eq!(holds_over(Cmp::Ge, 5, 5, 9), Some(true));
        assert_eq!(holds_over(Cmp::Ge, 5, 0, 4), Some(false));
        assert_eq!(holds_over(Cmp::Eq, 3, 3, 3), Some(true));
        assert_eq!(holds_over(Cmp::Eq, 3, 0, 2), Some(false));
        assert_eq!(holds_over(Cmp::Eq, 3, 0, 3), None);
        assert_eq!(holds_over(Cmp::Ne, 3, 4, 9), Some(true));
        assert_eq!(holds_over(Cmp::Ne, 3, 3, 3), Some(false));
        assert_eq!(holds_over(Cmp::Ne, 3, 2, 4), None);
    }

    /// A column `c` of a block whose key rows were written as two stacked runs of four
    /// (`128·b' + 512·w`), against another column `c'` of the same block read as eight rows
    /// (`128·b`): the rows' terms are all multiples of 128, the columns differ by less, so the
    /// words differ whenever the columns do. With 129 columns they may meet.
    #[test]
    fn words_of_other_columns_never_meet_whatever_rows_they_are_in() {
        for (columns, apart) in [(128, true), (129, false)] {
            let mut e = Eval::new(0, 8, true);
            let (c, c2) = (e.fresh(columns), e.fresh(columns));
            let (b2, w, b) = (e.fresh(4), e.fresh(2), e.fresh(8));
            let written = Aff::cst(66560)
                .add_term(c, 1)
                .add_term(b2, 128)
                .add_term(w, 512);
            let read = Aff::cst(66560).add_term(c2, 1).add_term(b, 128);
            let d = written.minus(&read);
            assert_eq!(e.never_zero(&d, Some((c, c2))), apart, "{columns} columns");
            // Without knowing the columns differ, the same word is reachable.
            assert!(!e.never_zero(&d, None), "{columns} columns, no pair");
        }
    }

    #[test]
    fn a_loop_is_cut_where_its_predicates_change() {
        // Predicates on the row loop (level 0), also inside an inner loop; one on level 1
        // does not cut level 0.
        let b = body(
            "loop 64 {\n  loop 4 {\n    mul m[0 + 1*i1], m[4 + 1*i1] -> m8 | nop | send m[0 + 1*i1] -> m[0 + 1*i1] if i0 == 63 && i1 < 2\n  }\n  mul m0, m1 -> m9 if i0 < 10\n}\n",
        );
        let Node::Loop(l) = &b[0] else {
            panic!("the body is one loop")
        };
        assert_eq!(pieces(&l.body, 0, 64), vec![(0, 10), (10, 63), (63, 64)]);
        let Node::Loop(inner) = &l.body[0] else {
            panic!("the loop's body starts with a loop")
        };
        assert_eq!(pieces(&inner.body, 1, 4), vec![(0, 2), (2, 4)]);
        assert!(splittable(&l.body, 0));
    }

    /// A running maximum per row carried across an outer loop (one word per row, read and
    /// rewritten by an inner loop over the rows): the outer loop stays symbolic, and each row's
    /// word ends as its initial value and the one range over all 32 keys the four steps of 8
    /// visited. A step that reads its keys at an offset of 7 (blocks that overlap) or a row
    /// word moving with the step are not summarised as that.
    #[test]
    fn a_running_maximum_per_row_is_carried_across_a_symbolic_loop() {
        let run = |src: &str| -> (Option<Id>, Id, u64) {
            let b = body(src);
            let Node::Loop(l) = &b[0] else {
                panic!("the body is one loop")
            };
            let mut e = Eval::new(0, 64, true);
            e.tm.seed_budgets(1);
            let (t, r) = (e.fresh(40), e.fresh(2));
            let keys = e.tm.atom(1, Aff::cst(0), Aff::var(t), Aff::cst(0));
            let f = e.fact(Aff::cst(0), vec![(t, 1, 40)], keys, false).unwrap();
            e.facts.push(Some(f));
            let rows = e.tm.atom(0, Aff::cst(0), Aff::var(r), Aff::cst(0));
            let f = e.fact(Aff::cst(100), vec![(r, 1, 2)], rows, false).unwrap();
            e.facts.push(Some(f));
            e.lp(l, &mut Vec::new()).unwrap();
            let x = e.fresh(2);
            let got = e.read(&Aff::cst(100).add_term(x, 1)).ok().map(|v| v.0);
            let k = e.fresh(32);
            let key = e.tm.atom(1, Aff::cst(0), Aff::var(k), Aff::cst(0));
            let all = e.tm.range(false, k, 0, 32, key);
            let row = e.tm.atom(0, Aff::cst(0), Aff::var(x), Aff::cst(0));
            let want = e.tm.max(row, all);
            (got, want, e.evaluations)
        };
        let (got, want, evaluations) = run(
            "loop 4 {\n  loop 2 {\n    loop 8 {\n      max m[100 + 1*i1], m[0 + 8*i0 + 1*i2] -> m[100 + 1*i1]\n    }\n  }\n}\n",
        );
        assert_eq!(got, Some(want));
        assert_eq!(evaluations, 1, "the steps, rows and keys all symbolic");
        // Two steps per iteration (a loop of steps regrouped by two), the second reading the
        // first's maxima.
        let (got, want, evaluations) = run(
            "loop 2 {\n  loop 2 {\n    loop 8 {\n      max m[100 + 1*i1], m[0 + 16*i0 + 1*i2] -> m[100 + 1*i1]\n    }\n  }\n  loop 2 {\n    loop 8 {\n      max m[100 + 1*i1], m[8 + 16*i0 + 1*i2] -> m[100 + 1*i1]\n    }\n  }\n}\n",
        );
        assert_eq!(got, Some(want), "two steps per iteration");
        assert_eq!(evaluations, 2);
        let (got, want, _) = run(
            "loop 4 {\n  loop 2 {\n    loop 8 {\n      max m[100 + 1*i1], m[0 + 7*i0 + 1*i2] -> m[100 + 1*i1]\n    }\n  }\n}\n",
        );
        assert_ne!(got, Some(want));
    }

    /// Rows evaluated one by one, each with a loop over keys that lie in runs of eight words
    /// from different places of the input: the first row's loop fails whole and is cut where
    /// its read crosses a run's edge; the next rows' loops are cut there at once, without the
    /// failed attempt. The loop of row `r` starts at word `r`, so a later row's cut from the
    /// row before is in the wrong place: its pieces fail and are cut again, and every value is
    /// still exact. A loop one key short is not the specification.
    #[test]
    fn a_cut_is_reused_by_the_next_row_and_stays_exact() -> Result<(), String> {
        type Rows = Vec<(Option<Id>, Id)>;
        let run = |src: &str, rows: u64, shift: bool| -> Result<(Rows, u64, u64), String> {
            let b = body(src);
            let Some(Node::Loop(l)) = b.first() else {
                return Err(format!("{src}: the body is not one loop"));
            };
            let mut e = Eval::new(0, 128, true);
            e.reuse_cuts = true;
            e.tm.seed_budgets(1);
            // Words 8·w + c hold key 40·w + c (three runs of eight).
            for w in 0..3 {
                let c = e.fresh(8);
                let key =
                    e.tm.atom(1, Aff::cst(0), Aff::var(c).add_const(40 * w), Aff::cst(0));
                let f = e
                    .fact(Aff::cst(8 * w), vec![(c, 1, 8)], key, false)
                    .map_err(|f| format!("block fact: {f:?}"))?;
                e.facts.push(Some(f));
            }
            let r = e.fresh(rows);
            let init = e.tm.atom(0, Aff::cst(0), Aff::var(r), Aff::cst(0));
            let f = e
                .fact(Aff::cst(100), vec![(r, 1, rows)], init, false)
                .map_err(|f| format!("row fact: {f:?}"))?;
            e.facts.push(Some(f));
            e.iterate(l, &mut Vec::new(), 0, rows)
                .map_err(|f| format!("{src}: {f:?}"))?;
            let (evaluations, attempted) = (e.evaluations, e.attempted);
            let mut out = Vec::new();
            for row in 0..rows as i64 {
                let got = e.read(&Aff::cst(100 + row)).ok().map(|v| v.0);
                // The sixteen words read (from `row` on if the read moves with the row): the
                // runs they fall in, each a range of keys.
                let start = if shift { row } else { 0 };
                let mut want = e.tm.atom(0, Aff::cst(0), Aff::cst(row), Aff::cst(0));
                for w in 0..3 {
                    let (lo, hi) = ((8 * w).max(start), (8 * w + 8).min(start + 16));
                    if lo >= hi {
                        continue;
                    }
                    let j = e.fresh(8);
                    let key = e.tm.atom(
                        1,
                        Aff::cst(0),
                        Aff::var(j).add_const(40 * w - 8 * w),
                        Aff::cst(0),
                    );
                    let keys = e.tm.range(false, j, lo, hi, key);
                    want = e.tm.max(want, keys);
                }
                out.push((got, want));
            }
            Ok((out, evaluations, attempted))
        };
        let same =
            "loop 3 {\n  loop 16 {\n    max m[100 + 1*i0], m[0 + 1*i1] -> m[100 + 1*i0]\n  }\n}\n";
        let (rows, evaluations, attempted) = run(same, 3, false)?;
        for (got, want) in rows {
            assert_eq!(got, Some(want));
        }
        // Two halves per row; only the first row's whole attempt failed (one evaluation).
        assert_eq!(evaluations, 6);
        assert_eq!(attempted, 7);
        let moving = "loop 3 {\n  loop 16 {\n    max m[100 + 1*i0], m[0 + 1*i0 + 1*i1] -> m[100 + 1*i0]\n  }\n}\n";
        let (rows, _, _) = run(moving, 3, true)?;
        for (got, want) in rows {
            assert_eq!(got, Some(want), "a cut in the wrong place is cut again");
        }
        let short = "loop 3 {\n  loop 15 {\n    max m[100 + 1*i0], m[0 + 1*i0 + 1*i1] -> m[100 + 1*i0]\n  }\n}\n";
        let (rows, _, _) = run(short, 3, true)?;
        for (got, want) in rows {
            assert_ne!(got, Some(want), "one key short");
        }
        Ok(())
    }

    /// A block dealt as two runs of eight rows (stacked into one fact, the runs 8 words apart
    /// and 40 tokens apart), read by one loop over its sixteen rows: the loop is cut at row 8
    /// into two symbolic halves rather than regrouped by 8 into eight interleaved copies, so
    /// what it writes is two contiguous regions and a later loop over all sixteen results is
    /// two pieces too, not sixteen words one by one.
    #[test]
    fn a_block_of_two_runs_is_cut_in_two_not_regrouped() {
        let b = body(
            "loop 16 {\n  mul m[0 + 1*i0], m40 -> m[16 + 1*i0]\n}\nloop 16 {\n  max m41, m[16 + 1*i0] -> m41\n}\n",
        );
        let mut e = Eval::new(0, 64, true);
        e.tm.seed_budgets(1);
        let (w, r) = (e.fresh(2), e.fresh(8));
        let keys =
            e.tm.atom(1, Aff::cst(0), Aff::var(r).add_term(w, 40), Aff::cst(0));
        let f = e
            .fact(Aff::cst(0), vec![(w, 8, 2), (r, 1, 8)], keys, false)
            .unwrap();
        e.facts.push(Some(f));
        let q = e.tm.atom(0, Aff::cst(0), Aff::cst(0), Aff::cst(0));
        let f = e.fact(Aff::cst(40), Vec::new(), q, false).unwrap();
        e.facts.push(Some(f));
        let m = e.tm.atom(2, Aff::cst(0), Aff::cst(0), Aff::cst(0));
        let f = e.fact(Aff::cst(41), Vec::new(), m, false).unwrap();
        e.facts.push(Some(f));
        e.body(&b, &mut Vec::new()).unwrap();
        // Each loop: two halves of one evaluation each (the failed whole attempts give theirs
        // back); regrouped, the products took eight and the maximum sixteen.
        assert_eq!(e.evaluations, 4);
        // The products are two regions of eight words, each the product with its own run.
        for (base, t0) in [(16, 0), (24, 40)] {
            let x = e.fresh(8);
            let got = e.read(&Aff::cst(base).add_term(x, 1)).ok().map(|v| v.0);
            let k =
                e.tm.atom(1, Aff::cst(0), Aff::var(x).add_const(t0), Aff::cst(0));
            let want = e.tm.mul(k, q, true);
            assert_eq!(got, Some(want), "the products at m{base}..");
        }
        // The maximum is the two runs' ranges and the initial word.
        let got = e.read(&Aff::cst(41)).ok().map(|v| v.0);
        let mut want = m;
        for t0 in [0, 40] {
            let j = e.fresh(8);
            let k =
                e.tm.atom(1, Aff::cst(0), Aff::var(j).add_const(t0), Aff::cst(0));
            let p = e.tm.mul(k, q, true);
            let run = e.tm.range(false, j, 0, 8, p);
            want = e.tm.max(want, run);
        }
        assert_eq!(got, Some(want));
    }

    #[test]
    fn wrapped_terms_and_count_steps_keep_a_loop_concrete() {
        let b = body("loop 4 {\n  mul m[0 + 2*(i0 % 2)], m1 -> m9\n}\n");
        let Node::Loop(l) = &b[0] else {
            panic!("the body is one loop")
        };
        assert!(!splittable(&l.body, 0));
        let b = body("loop 4 {\n  loop 1 + i0 {\n    mul m[0 + 1*i1], m1 -> m9\n  }\n}\n");
        let Node::Loop(l) = &b[0] else {
            panic!("the body is one loop")
        };
        assert!(!splittable(&l.body, 0));
        let Node::Loop(inner) = &l.body[0] else {
            panic!("the loop's body starts with a loop")
        };
        assert!(splittable(&inner.body, 1));
    }

    /// Rows of a block pushed one by one are stacked into one region; two copies of one value
    /// far apart (a result written to its word and accumulated into another) are not, so a
    /// read between them is not taken for a word of a region spanning both.
    #[test]
    fn rows_are_stacked_but_copies_of_one_value_are_not() {
        let live = |e: &Eval| e.facts.iter().flatten().count();
        let mut e = Eval::new(0, 64, true);
        let row = |e: &mut Eval, r: i64| {
            let c = e.fresh(4);
            let v = e.tm.atom(0, Aff::cst(0), Aff::cst(r), Aff::var(c));
            e.fact(Aff::cst(8 * r), vec![(c, 1, 4)], v, false).unwrap()
        };
        for r in 0..3 {
            let f = row(&mut e, r);
            e.push(f);
        }
        assert_eq!(live(&e), 1, "three rows of a block are one region");
        let x = e.fresh(3);
        let y = e.fresh(4);
        let got = e
            .read(&Aff::cst(0).add_term(x, 8).add_term(y, 1))
            .unwrap()
            .0;
        let want = e.tm.atom(0, Aff::cst(0), Aff::var(x), Aff::var(y));
        assert_eq!(got, want);

        let mut e = Eval::new(0, 64, true);
        let v = e.tm.atom(0, Aff::cst(0), Aff::cst(0), Aff::cst(0));
        for at in [0, 40] {
            let f = e.fact(Aff::cst(at), Vec::new(), v, true).unwrap();
            e.push(f);
        }
        assert_eq!(live(&e), 2, "two copies of one value stay two facts");
        for at in [0, 40] {
            assert_eq!(e.read(&Aff::cst(at)).unwrap().0, v);
        }
        // Nothing was written between them.
        assert!(e.read(&Aff::cst(20)).is_err());
    }
}
