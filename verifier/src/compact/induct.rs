//! The proof of outputs without unrolling for rings of different programs, one PE at a time:
//! assume-guarantee induction over ring steps (docs/verifier.md, "Ring steps by induction").
//!
//! [`super::ring`] evaluates every PE in lockstep phases, so its work grows with PEs × ring
//! steps. Here each PE is evaluated alone, and what it receives is not taken from its
//! predecessor's evaluation but from the ring's *contracts* ([`super::contract`]): a PE's
//! steps are found from its own reads (a step of a tensor begins at the first item that reads
//! the other receive buffer than the step before), and at a step's start its buffer is stated
//! as unknown (a read outside the contract declines) and the contract's facts for the hop are
//! pushed into its log. A loop whose iterations alternate the buffers (`i mod 2`) is regrouped
//! by two, so that each half has one buffer, and evaluated with its index symbolic: the hop is
//! affine in it, and so are the contract's tokens. The words a PE sends during its step `s`
//! are collected at the step's end and must tile exactly its successor's contract for hop
//! `s + 1` ([`super::contract::discharge`]).
//!
//! Why the contracts then hold on the machine, by induction over cycles: all PEs start the
//! step of each hop in the same cycle (checked), so PE `p`'s sends of step `s` land in PE
//! `p + 1` during its own step `s`, in the buffer of hop `s + 1`'s parity, which PE `p + 1`
//! neither reads nor writes locally during step `s` (checked on every item, for every head);
//! the buffer of hop `s` is not written by any arrival during step `s`. So at the start of step
//! `s + 1` that buffer holds exactly what PE `p` sent, which the discharge shows is the
//! contract's words with its values, provided PE `p`'s own reads in step `s` saw its contract
//! — the induction hypothesis. Every hop a PE pushes must be discharged by its predecessor and
//! every discharged hop pushed (checked), and no send is left uncollected.

use super::aff::{Aff, Var};
use super::contract::{discharge, owed, pieces, Block, Need, Piece};
use super::prove::{tensor_layout, Eval, Evaluated, Fact, Fail, Ix, Tally, R};
use super::ring::{
    compare, eval_item, extents, head_loops, runs, split, strided_extents, Ext, Item, Lengths,
};
use super::term::Terms;
use super::workers::{count, in_order, Shared};
use crate::expr::FxMap as HashMap;
use isa::{Loop, LoopProgram, Node};
use runtime::manifest::Manifest;
use std::collections::{BTreeSet, VecDeque};

/// A loop body (two iterations of a step loop, regrouped) whose halves are ring steps of one
/// tensor: at node 0 the first half's hop begins, at node `half` the second's, and at node
/// `total` (the end) the second half's sends are collected. Iteration `j` holds hops
/// `hop0 + 2j` and `hop0 + 2j + 1`.
pub(super) struct Hook {
    pub(super) body: usize,
    pub(super) total: usize,
    half: usize,
    level: usize,
    tensor: usize,
    hop0: i64,
}

/// What the induction tracks while one PE is evaluated.
pub(super) struct State {
    /// Per tensor (k, v): the contract's block, this PE's pieces and the next PE's.
    blocks: Vec<(Block, Vec<Piece>, Vec<Piece>)>,
    head: Aff,
    heads: u32,
    rows: u32,
    /// Per tensor: hops whose contract this PE pushed, and hops of the next PE's contract its
    /// sends discharged.
    pushed: Vec<BTreeSet<i64>>,
    discharged: Vec<BTreeSet<i64>>,
}

/// Every value `a` takes over its variables' ranges (a hop: a few values, over at most one
/// index).
fn values(e: &Eval, a: &Aff) -> R<Vec<i64>> {
    match a.t[..] {
        [] => Ok(vec![a.c]),
        [(v, k)] => {
            let n = e
                .counts
                .get(&v)
                .copied()
                .ok_or_else(|| Fail::Decline("a hop over an unbounded index".into()))?;
            Ok((0..n as i64).map(|x| a.c + k * x).collect())
        }
        _ => Err(Fail::Decline("a hop over two indices".into())),
    }
}

/// The piece of `ps` holding every hop `hop` takes, or a cut of its variable where the piece
/// changes (the caller's loop is then cut there and tried again).
fn piece_of<'a>(e: &mut Eval, ps: &'a [Piece], hop: &Aff) -> R<&'a Piece> {
    let all = values(e, hop)?;
    let (Some(&first), Some(&last)) = (all.first(), all.last()) else {
        return Err(Fail::Decline("a step without a hop".into()));
    };
    let (lo, hi) = (first.min(last), first.max(last));
    for p in ps {
        if i64::from(p.lo) <= lo && hi < i64::from(p.hi) {
            return Ok(p);
        }
    }
    // Cut the hop's variable at the first value that lies in another piece than the first.
    if let [(v, k)] = hop.t[..] {
        let at = |x: i64| hop.c + k * x;
        let home = ps
            .iter()
            .position(|p| i64::from(p.lo) <= at(0) && at(0) < i64::from(p.hi));
        let n = e.counts.get(&v).copied().unwrap_or(1) as i64;
        if let Some(home) = home {
            let inside = |x: i64| {
                let h = at(x);
                i64::from(ps[home].lo) <= h && h < i64::from(ps[home].hi)
            };
            if let Some(x) = (1..n).find(|&x| !inside(x)) {
                e.hints = vec![(v, x)];
                return Err(Fail::Retry(
                    "a run of steps across two contract pieces".into(),
                ));
            }
        }
    }
    Err(Fail::Decline(format!(
        "hops {lo}..={hi} in no contract piece"
    )))
}

impl State {
    /// Marks the start of `tensor`'s hop `hop` on this PE: its buffer unknown, then the
    /// contract's facts.
    fn push(&mut self, e: &mut Eval, tensor: usize, hop: &Aff) -> R<()> {
        let parity = parity(hop)?;
        let (block, mine, _) = &self.blocks[tensor];
        let block = *block;
        let piece = piece_of(e, mine, hop)?.clone();
        let at = block.at[parity];
        let (r, c) = (e.fresh(u64::from(self.rows)), e.fresh(u64::from(block.dim)));
        let base = self
            .head
            .scaled(i64::from(at.head_stride))
            .add_const(i64::from(at.base));
        let dims = vec![
            (r, i64::from(at.row_stride), u64::from(self.rows)),
            (c, 1, u64::from(block.dim)),
        ];
        let unknown = e.unknown(base, dims)?;
        e.push(unknown);
        for f in owed(e, &block, &piece, parity, hop, &self.head)? {
            e.push(f);
        }
        for h in values(e, hop)? {
            self.pushed[tensor].insert(h);
        }
        Ok(())
    }

    /// Takes the sends into `tensor`'s buffers made since the last step boundary (the step of
    /// hop `hop`) off the log and discharges them against the next PE's contract for hop
    /// `hop + 1`.
    fn collect(&mut self, e: &mut Eval, tensor: usize, hop: &Aff) -> R<()> {
        let from = e.floor_of_iteration();
        let mut sent: Vec<Fact> = Vec::new();
        for i in from..e.facts.len() {
            let take = match &e.facts[i] {
                Some(f) if f.remote => self.lands_in(e, f, tensor),
                _ => false,
            };
            if take {
                if let Some(f) = e.facts[i].take() {
                    e.keys.remove(&super::prove::key_of(&f));
                    sent.push(f);
                }
            }
        }
        let next = hop.clone().add_const(1);
        let last = values(e, &next)?;
        // The step's sends were all taken at the end of the run of steps it closed.
        if sent.is_empty() && last.iter().all(|h| self.discharged[tensor].contains(h)) {
            return Ok(());
        }
        let m = self.blocks[tensor].2.last().map_or(0, |p| i64::from(p.hi));
        if last.iter().all(|&h| h >= m) {
            if sent.is_empty() {
                return Ok(());
            }
            return Err(Fail::Decline(format!(
                "a send after the last hop of `{}`",
                name(tensor)
            )));
        }
        if last.iter().any(|&h| h >= m) {
            return Err(Fail::Decline("a run of steps past the last hop".into()));
        }
        let (block, _, theirs) = &self.blocks[tensor];
        let block = *block;
        let piece = piece_of(e, theirs, &next)?.clone();
        let want = owed(e, &block, &piece, parity(&next)?, &next, &self.head)?;
        discharge(e, &sent, &want).map_err(|why| {
            Fail::Decline(format!(
                "the sends of `{}` at hop {hop:?} do not meet the next PE's contract: {why}",
                name(tensor)
            ))
        })?;
        for h in last {
            self.discharged[tensor].insert(h);
        }
        Ok(())
    }

    /// Whether remote fact `f` lands in `tensor`'s receive buffers, judged at head 0 (the
    /// buffers of every head are one head stride apart, as the sends' heads are).
    fn lands_in(&self, e: &Eval, f: &Fact, tensor: usize) -> bool {
        let Some((lo, hi)) = span_at_head0(e, f, &self.head) else {
            return false;
        };
        let (block, _, _) = &self.blocks[tensor];
        block.at.iter().any(|at| {
            let b = i64::from(at.base);
            let end = b + i64::from(self.rows) * i64::from(at.row_stride);
            lo >= b && hi < end
        })
    }
}

fn name(tensor: usize) -> &'static str {
    ["k", "v"][tensor]
}

/// The words `f` covers with the head variable at 0.
fn span_at_head0(e: &Eval, f: &Fact, head: &Aff) -> Option<(i64, i64)> {
    let mut base = f.base.clone();
    for &(v, _) in &head.t {
        base = base.subst(v, &Aff::cst(0));
    }
    let (mut lo, mut hi) = e.bounds(&base)?;
    for &(_, s, n) in &f.dims {
        let ext = s * (n as i64 - 1);
        lo += ext.min(0);
        hi += ext.max(0);
    }
    Some((lo, hi))
}

/// The buffer parity of every value of `hop` (its variables' coefficients even).
fn parity(hop: &Aff) -> R<usize> {
    if hop.t.iter().any(|&(_, k)| k % 2 != 0) {
        return Err(Fail::Decline("a hop of changing parity".into()));
    }
    Ok(hop.c.rem_euclid(2) as usize)
}

/// Called by the evaluation at node `at` of a marked body (`Eval::body`).
pub(super) fn fire(e: &mut Eval, h: usize, at: usize, env: &[Ix]) -> R<()> {
    let (half, total, level, tensor, hop0) = {
        let k = &e.hooks[h];
        (k.half, k.total, k.level, k.tensor, k.hop0)
    };
    if at != 0 && at != half && at != total {
        return Ok(());
    }
    let j = match env.get(level) {
        Some(Ix::At(k)) => Aff::cst(*k as i64),
        Some(Ix::Sym(v, off)) => Aff::var(*v).add_const(*off),
        None => return Err(Fail::Decline("a marked body outside its loop".into())),
    };
    let first = j.scaled(2).add_const(hop0);
    let Some(mut st) = e.induct.take() else {
        return Err(Fail::Decline("a marked body without its induction".into()));
    };
    let r = (|| {
        if at == 0 {
            st.push(e, tensor, &first)
        } else if at == half {
            st.collect(e, tensor, &first)?;
            st.push(e, tensor, &first.clone().add_const(1))
        } else {
            st.collect(e, tensor, &first.clone().add_const(1))
        }
    })();
    e.induct = Some(st);
    r
}

/// Every word a marked body's pushes may write: both receive buffers of its tensor.
pub(super) fn buffer_families(e: &mut Eval, h: usize) -> Vec<Aff> {
    let tensor = e.hooks[h].tensor;
    let Some(st) = e.induct.take() else {
        return Vec::new();
    };
    let out = st.buffers(e, tensor);
    e.induct = Some(st);
    out
}

impl State {
    /// The words of `tensor`'s two receive buffers in the current head, as address forms over
    /// fresh row and column variables.
    fn buffers(&self, e: &mut Eval, tensor: usize) -> Vec<Aff> {
        let block = &self.blocks[tensor].0;
        let mut out = Vec::new();
        for at in block.at {
            let (r, c) = (e.fresh(u64::from(self.rows)), e.fresh(u64::from(block.dim)));
            out.push(
                self.head
                    .scaled(i64::from(at.head_stride))
                    .add_const(i64::from(at.base))
                    .add_term(r, i64::from(at.row_stride))
                    .add_term(c, 1),
            );
        }
        out
    }
}

/// Why the per-step induction does not cover `programs` and `m`, if it does not.
pub fn applies(programs: &[LoopProgram], m: &Manifest) -> Result<(), String> {
    super::ring::applies(programs, m)?;
    if head_loops(programs).is_none() {
        return Err("covers programs that are one head loop of one shape".into());
    }
    for name in ["k", "v"] {
        let block = Block::from_manifest(m, name)?;
        pieces(&block.at[0], m.pes, m.layer.tokens, 0, &Need::All)?;
    }
    Ok(())
}

/// Per tensor, per hop, the cycle (within a head) at which a PE's step of that hop starts.
type Starts = Vec<HashMap<i64, u64>>;

/// Evaluates every PE alone with its steps proved by induction (the module documentation), and
/// compares every output row with the specification, on as many workers as the machine has.
/// `Err` says why the proof does not cover the programs; it claims nothing either way.
pub fn evaluate(programs: &[LoopProgram], m: &Manifest) -> Result<Evaluated, String> {
    evaluate_until(programs, m, None, 0)
}

/// As [`evaluate`] on `workers` threads (0: as many as the machine has): the result is the same
/// for any number.
pub fn evaluate_on(
    programs: &[LoopProgram],
    m: &Manifest,
    workers: usize,
) -> Result<Evaluated, String> {
    evaluate_until(programs, m, None, workers)
}

/// A tensor's layout and, per PE, the runs of rows it is dealt (local row, token, count).
type Dealt = (runtime::manifest::Layout, Vec<Vec<(i64, i64, u64)>>);

/// What the evaluation of every PE needs, the same for all.
struct Ring<'a> {
    programs: &'a [LoopProgram],
    m: &'a Manifest,
    heads: Vec<&'a Loop>,
    need: Need,
    blocks: Vec<Block>,
    rows: u32,
    y: runtime::manifest::Layout,
    outputs: Vec<Vec<(i64, i64, u64)>>,
    /// Per input tensor (q, k, v): its layout and the runs of rows each PE is dealt (found
    /// once for the ring: each is a pass over every token).
    inputs: Vec<Dealt>,
    deadline: Option<std::time::Instant>,
}

/// What one PE's evaluation came to.
struct Done {
    ops: Tally,
    wrong: Vec<String>,
    wrong_count: usize,
    evaluations: u64,
    expressions: usize,
    starts: Starts,
    pushed: Vec<BTreeSet<i64>>,
    discharged: Vec<BTreeSet<i64>>,
}

/// [`evaluate`] within the time bound `until` when given (another proof already spent part of
/// the bound), on `workers` threads (0: the machine's available parallelism). The bounds on
/// evaluations and time are those of one proof, shared by all workers.
pub(super) fn evaluate_until(
    programs: &[LoopProgram],
    m: &Manifest,
    until: Option<std::time::Instant>,
    workers: usize,
) -> Result<Evaluated, String> {
    applies(programs, m)?;
    let hs = head_loops(programs).ok_or("no head loop")?;
    let pes = programs.len();
    let mut blocks = Vec::new();
    for name in ["k", "v"] {
        blocks.push(Block::from_manifest(m, name)?);
    }
    let rows = blocks[0].at[0].rows_per_pe;
    if blocks[1].at[0].rows_per_pe != rows {
        return Err("keys and values dealt differently".into());
    }
    let y = tensor_layout(m, "y")?;
    let inputs = ["q", "k", "v"]
        .iter()
        .map(|name| {
            let lay = tensor_layout(m, name)?;
            let rs = runs(&lay, m.pes, m.layer.tokens);
            Ok((lay, rs))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let ring = Ring {
        inputs,
        programs,
        m,
        outputs: runs(&y, m.pes, m.layer.tokens),
        heads: hs,
        need: Need::from_manifest(m)?,
        blocks,
        rows,
        y,
        deadline: until,
    };
    let shared = Shared::new();
    let done = in_order(
        pes,
        count(workers, pes),
        &shared,
        <(Lengths, Terms)>::default,
        |(lengths, store), p| one_pe_proved(&ring, &shared, lengths, store, p),
    )?;
    let mut ops = Tally::default();
    let (mut wrong, mut wrong_count, mut evaluations, mut expressions) = (Vec::new(), 0, 0, 0);
    for d in &done {
        ops = ops.plus(&d.ops).ok_or("operation counts overflow")?;
        wrong_count += d.wrong_count;
        evaluations += d.evaluations;
        expressions += d.expressions;
        for x in &d.wrong {
            if wrong.len() < 5 {
                wrong.push(x.clone());
            }
        }
    }
    // Every hop a PE pushed is one its predecessor's sends discharged, and the reverse.
    for (p, d) in done.iter().enumerate() {
        let from = (p + pes - 1) % pes;
        for (t, (got, sent)) in d.pushed.iter().zip(&done[from].discharged).enumerate() {
            if got != sent {
                return Err(format!(
                    "PE {p} takes `{}` hops {got:?} as received, PE {from} sends hops {sent:?}",
                    name(t)
                ));
            }
        }
    }
    // Every PE starts the step of each hop in the same cycle.
    for (p, d) in done.iter().enumerate().skip(1) {
        for (t, (mine, first)) in d.starts.iter().zip(&done[0].starts).enumerate() {
            if mine != first {
                let mut a: Vec<_> = first.iter().collect();
                let mut b: Vec<_> = mine.iter().collect();
                a.sort_unstable();
                b.sort_unstable();
                let first = a.iter().zip(&b).find(|(x, y)| x != y);
                return Err(format!(
                    "PE {p} starts its `{}` steps in other cycles than PE 0 (first difference {first:?})",
                    name(t)
                ));
            }
        }
    }
    Ok(Evaluated {
        ops,
        wrong,
        wrong_count,
        evaluations,
        expressions,
    })
}

/// PE `p` evaluated alone from a fresh state (so that its result is the same whichever worker
/// runs it, after whichever PEs), its output rows compared with the specification.
fn one_pe_proved(
    ring: &Ring,
    shared: &std::sync::Arc<Shared>,
    lengths: &mut Lengths,
    store: &mut Terms,
    p: usize,
) -> Result<Done, String> {
    let mut e = Eval::new(0, i64::from(ring.m.layer.tokens), true);
    e.reuse_cuts = true;
    // The worker's store from its last PE, emptied: a fresh state in memory already mapped.
    store.clear();
    e.tm = std::mem::take(store);
    let r = one_pe_in(&mut e, ring, shared, lengths, p);
    *store = std::mem::take(&mut e.tm);
    r
}

fn one_pe_in(
    e: &mut Eval,
    ring: &Ring,
    shared: &std::sync::Arc<Shared>,
    lengths: &mut Lengths,
    p: usize,
) -> Result<Done, String> {
    let (m, l) = (ring.m, &ring.m.layer);
    let (heads, tokens, dim) = (i64::from(l.heads), i64::from(l.tokens), i64::from(l.dim));
    let pes = ring.programs.len();
    let why = |f: Fail| match f {
        Fail::Retry(why) | Fail::Decline(why) => format!("PE {p}: {why}"),
    };
    if let Some(t) = ring.deadline {
        e.deadline = t;
    }
    e.shared = Some((shared.clone(), p));
    let head_var = e.fresh(u64::from(l.heads));
    let st = State {
        blocks: ring
            .blocks
            .iter()
            .map(|b| {
                let mine = pieces(&b.at[0], m.pes, l.tokens, p as u32, &ring.need)?;
                let next = pieces(
                    &b.at[0],
                    m.pes,
                    l.tokens,
                    ((p + 1) % pes) as u32,
                    &ring.need,
                )?;
                Ok((*b, mine, next))
            })
            .collect::<Result<_, String>>()?,
        head: Aff::var(head_var),
        heads: l.heads,
        rows: ring.rows,
        pushed: vec![BTreeSet::new(); 2],
        discharged: vec![BTreeSet::new(); 2],
    };
    e.induct = Some(Box::new(st));
    preload(e, m, &ring.inputs, p).map_err(why)?;
    // The words the comparison below reads: this PE's output rows in every head.
    let (y, last_head) = (&ring.y, heads - 1);
    let keep: Vec<(i64, i64)> = ring.outputs[p]
        .iter()
        .map(|&(r0, _, n)| {
            let row = |r: i64, h: i64| {
                i64::from(y.base) + h * i64::from(y.head_stride) + r * i64::from(y.row_stride)
            };
            (row(r0, 0), row(r0 + n as i64 - 1, last_head) + dim - 1)
        })
        .collect();
    let starts = one_pe(e, ring.heads[p], head_var, lengths, &keep).map_err(why)?;
    let st = e.induct.take().ok_or("the induction's state")?;
    e.hooks.clear();
    let (wrong, wrong_count) = compare(
        e,
        p,
        &ring.outputs[p],
        &ring.y,
        (heads, tokens, dim),
        l.mask == "causal",
        l.scale as f32,
        l.softmax == "safe",
    )
    .map_err(why)?;
    Ok(Done {
        ops: e.tally,
        wrong,
        wrong_count,
        evaluations: e.evaluations,
        expressions: e.tm.len(),
        starts,
        pushed: st.pushed,
        discharged: st.discharged,
    })
}

/// The input rows PE `p` is dealt, as facts of input atoms over the head, row and column.
fn preload(e: &mut Eval, m: &Manifest, inputs: &[Dealt], p: usize) -> R<()> {
    let l = &m.layer;
    let (heads, dim) = (u64::from(l.heads), u64::from(l.dim));
    for (t, (lay, rs)) in inputs.iter().enumerate() {
        for &(r0, t0, n) in &rs[p] {
            let (h, r, c) = (e.fresh(heads), e.fresh(n), e.fresh(dim));
            let value =
                e.tm.atom(t as u8, Aff::var(h), Aff::var(r).add_const(t0), Aff::var(c));
            let base = i64::from(lay.base) + r0 * i64::from(lay.row_stride);
            let dims = vec![
                (h, i64::from(lay.head_stride), heads),
                (r, i64::from(lay.row_stride), n),
                (c, 1, dim),
            ];
            let f = e
                .fact(Aff::cst(base), dims, value, false)
                .map_err(|_| Fail::Decline("input layout".into()))?;
            e.facts.push(Some(f));
        }
    }
    Ok(())
}

/// Word intervals of tensor `t`'s buffer of parity `b` in head `h`.
fn buffer(st: &State, t: usize, b: usize, h: u32) -> (i64, i64) {
    let at = st.blocks[t].0.at[b];
    let lo = i64::from(at.base) + i64::from(h) * i64::from(at.head_stride);
    (lo, lo + i64::from(st.rows) * i64::from(at.row_stride) - 1)
}

/// Which parities of each tensor's buffers `ext` reads (bit 0 even, bit 1 odd), and whether
/// it writes the buffer of parity `avoid[t]` of tensor `t`, in head `h`.
fn touches(st: &State, ext: &Ext, h: u32, avoid: [usize; 2]) -> ([u8; 2], bool) {
    // One interval against a list: a word of the list's union is a word of one of its
    // intervals, so no union is needed.
    let meets = |v: &[(i64, i64)], (lo, hi): (i64, i64)| v.iter().any(|&(a, b)| a <= hi && lo <= b);
    let mut reads = [0u8; 2];
    let mut writes = false;
    for t in 0..2 {
        for b in 0..2 {
            if meets(&ext.reads, buffer(st, t, b, h)) {
                reads[t] |= 1 << b;
            }
        }
        if meets(&ext.writes, buffer(st, t, avoid[t], h)) {
            writes = true;
        }
    }
    (reads, writes)
}

/// Over every head: the parities each tensor's buffers are read in, and whether a buffer
/// named by `avoid` is written.
fn classify(st: &State, exts: &[Ext], avoid: [usize; 2]) -> ([u8; 2], bool) {
    let mut reads = [0u8; 2];
    let mut writes = false;
    for (h, x) in (0..st.heads).zip(exts) {
        let (r, w) = touches(st, x, h, avoid);
        reads[0] |= r[0];
        reads[1] |= r[1];
        writes |= w;
    }
    (reads, writes)
}

/// The word intervals `it` touches in each head, for [`classify`] (an item is classified
/// twice, against the buffers before and after its hop; its extents are the same).
fn head_extents(st: &State, it: &Item) -> Vec<Ext> {
    (0..st.heads)
        .map(|h| {
            let mut x = Ext::default();
            extents(it, Some(u64::from(h)), &mut x);
            x
        })
        .collect()
}

/// As [`classify`], over the iterations `lo, lo + 2, …, hi` of a run.
fn classify_class(
    st: &State,
    (l, env): (&Loop, &[u64]),
    (lo, hi): (u64, u64),
    avoid: [usize; 2],
) -> ([u8; 2], bool) {
    let mut reads = [0u8; 2];
    let mut writes = false;
    for h in 0..st.heads {
        let mut x = Ext::default();
        strided_extents(l, env, Some(u64::from(h)), (lo, hi, 2), &mut x);
        let (r, w) = touches(st, &x, h, avoid);
        reads[0] |= r[0];
        reads[1] |= r[1];
        writes |= w;
    }
    (reads, writes)
}

/// Runs `f` with the induction's state taken out of `e` (the marked bodies' hooks find it
/// there while the evaluation runs).
fn with<T>(e: &mut Eval, f: impl FnOnce(&mut State, &mut Eval) -> R<T>) -> R<T> {
    let mut st = e
        .induct
        .take()
        .ok_or_else(|| Fail::Decline("the induction's state".into()))?;
    let r = f(&mut st, e);
    e.induct = Some(st);
    r
}

/// One PE's head body, item by item in time, its steps found and marked (the module
/// documentation). Returns the cycle each hop's step starts at, per tensor.
fn one_pe(
    e: &mut Eval,
    heads: &Loop,
    head_var: Var,
    lengths: &mut Lengths,
    keep: &[(i64, i64)],
) -> R<Starts> {
    // The ordered head frame: every word the body may write here, its pushes included.
    let n = u64::from(heads.count);
    let mut own = Vec::new();
    let mut remote = Vec::new();
    e.families(
        &heads.body,
        &mut vec![Ix::Sym(head_var, 0)],
        1,
        &mut own,
        &mut remote,
    )?;
    let buffers = with(e, |st, e| {
        let mut both = st.buffers(e, 0);
        both.extend(st.buffers(e, 1));
        Ok(both)
    })?;
    own.extend(buffers);
    e.enter_ordered(head_var, n, own, remote);
    e.mult = n;
    let mut w = Walk {
        starts: vec![HashMap::default(), HashMap::default()],
        hop: [0, 0],
        at: 0,
        queue: heads.body.iter().map(|n| Item::Node(n, vec![0])).collect(),
    };
    while let Some(it) = w.queue.pop_front() {
        if std::time::Instant::now() > e.deadline {
            return Err(Fail::Decline(
                "past the time bound of the evaluation".into(),
            ));
        }
        step(e, &mut w, it, head_var, lengths)?;
    }
    // The last steps' sends.
    for t in 0..2 {
        let hop = Aff::cst(w.hop[t]);
        with(e, |st, e| st.collect(e, t, &hop))?;
    }
    e.mult = 1;
    e.leave_ordered_keeping(n, Some(keep))?;
    Ok(w.starts)
}

/// Where one PE's walk through its head body stands.
struct Walk<'a> {
    starts: Starts,
    /// The current hop of each tensor.
    hop: [i64; 2],
    /// The cycle within the head.
    at: u64,
    queue: VecDeque<Item<'a>>,
}

/// Takes one item of the walk: a run of steps, a step's start, or part of a step.
fn step<'a>(
    e: &mut Eval,
    w: &mut Walk<'a>,
    it: Item<'a>,
    head_var: Var,
    lengths: &mut Lengths,
) -> R<()> {
    let cur = [(w.hop[0] % 2) as usize, (w.hop[1] % 2) as usize];
    let exts = with(e, |st, _| Ok(head_extents(st, &it)))?;
    let (reads, _) = with(e, |st, _| Ok(classify(st, &exts, [1 - cur[0], 1 - cur[1]])))?;
    if let Some(t) = (0..2).find(|&t| reads[t] == 3) {
        if alternating(e, w, &it, t, head_var, lengths)? {
            return Ok(());
        }
        let parts = split(&it)
            .ok_or_else(|| Fail::Decline(format!("one bundle reads both `{}` buffers", name(t))))?;
        for x in parts.into_iter().rev() {
            w.queue.push_front(x);
        }
        return Ok(());
    }
    // A tensor read in its other buffer starts its next hop with this item.
    let mut next = w.hop;
    for t in 0..2 {
        if reads[t] != 0 && reads[t] != 1 << cur[t] {
            next[t] += 1;
        }
    }
    let avoid = [(1 - next[0] % 2) as usize, (1 - next[1] % 2) as usize];
    let (_, writes) = with(e, |st, _| Ok(classify(st, &exts, avoid)))?;
    if writes {
        let parts = split(&it).ok_or_else(|| {
            Fail::Decline("a receive buffer written locally while words arrive in it".into())
        })?;
        for x in parts.into_iter().rev() {
            w.queue.push_front(x);
        }
        return Ok(());
    }
    for (t, &hop) in next.iter().enumerate() {
        if hop != w.hop[t] {
            let (old, new) = (Aff::cst(w.hop[t]), Aff::cst(hop));
            with(e, |st, e| {
                st.collect(e, t, &old)?;
                st.push(e, t, &new)
            })?;
            w.starts[t].insert(hop, w.at);
            w.hop[t] = hop;
        }
    }
    eval_item(e, &it, Some(head_var))?;
    w.at += lengths.item(&it);
    // Between items no failed attempt restores the log: facts newer ones cover word for word
    // can go (no read can reach them), and every later read would scan past them.
    e.forget_shadowed();
    Ok(())
}

/// A run of a loop whose iterations alternate `t`'s buffers, starting with the one after the
/// current step's: regrouped by two and evaluated with the halves marked as steps. `false`
/// (nothing done) when `it` is not such a run.
fn alternating<'a>(
    e: &mut Eval,
    w: &mut Walk<'a>,
    it: &Item<'a>,
    t: usize,
    head_var: Var,
    lengths: &mut Lengths,
) -> R<bool> {
    let (l, env, a, b) = match it {
        Item::Node(Node::Loop(l), env) => (l, env.clone(), 0, super::ring::trips(l, env)),
        Item::Iters(l, env, a, b) => (*l, env.clone(), *a, *b),
        Item::Node(Node::Bundle(_), _) => return Ok(false),
    };
    if b - a < 2 {
        return Ok(false);
    }
    let level = env.len();
    let lin = lengths.body(&l.body, level + 1);
    if lin.a.get(level).copied().unwrap_or(0) != 0 {
        return Ok(false);
    }
    let Ok(len) = u64::try_from(Lengths::at(&lin, &env)) else {
        return Ok(false);
    };
    let cur = [(w.hop[0] % 2) as usize, (w.hop[1] % 2) as usize];
    let u = 1 - t;
    // Iterations `a + c + 2i` read one buffer of `t` each, the first the next step's; the other
    // tensor stays in its step; no buffer words arrive in is written.
    for c in 0..2u64 {
        let want = (cur[t] + 1 + c as usize) % 2;
        let mut avoid = [0; 2];
        avoid[t] = 1 - want;
        avoid[u] = 1 - cur[u];
        let last = a + c + (b - 1 - a - c) / 2 * 2;
        let (reads, writes) = with(e, |st, _| {
            Ok(classify_class(st, (l, &env), (a + c, last), avoid))
        })?;
        if reads[t] != 1 << want || (reads[u] != 0 && reads[u] != 1 << cur[u]) || writes {
            return Ok(false);
        }
    }
    let q = (b - a) / 2;
    let Some(pairs) = super::unroll::unrolled(l, level, a, 2, q) else {
        return Ok(false);
    };
    let hop0 = w.hop[t] + 1;
    // The current step ends here: its sends are collected.
    let old = Aff::cst(w.hop[t]);
    with(e, |st, e| st.collect(e, t, &old))?;
    e.hooks.push(Hook {
        body: pairs.body.as_ptr() as usize,
        total: pairs.body.len(),
        half: l.body.len(),
        level,
        tensor: t,
        hop0,
    });
    let mut ix: Vec<Ix> = env
        .iter()
        .enumerate()
        .map(|(i, &k)| {
            if i == 0 {
                Ix::Sym(head_var, 0)
            } else {
                Ix::At(k)
            }
        })
        .collect();

    let r = e.lp(&pairs, &mut ix);
    e.forget_cuts_in(&pairs);
    e.hooks.pop();
    r?;
    // As after any item.
    e.forget_shadowed();
    for k in 0..2 * q {
        w.starts[t].insert(hop0 + k as i64, w.at + k * len);
    }
    w.at += 2 * q * len;
    w.hop[t] = hop0 + 2 * q as i64 - 1;
    if a + 2 * q < b {
        w.queue.push_front(Item::Iters(l, env, a + 2 * q, b));
    }
    Ok(true)
}
