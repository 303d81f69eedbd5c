//! The proof of outputs without unrolling for rings whose PEs run different programs (the
//! causal stream: zigzag rows, a step-0 triangle, values trailing keys).
//!
//! Every PE is evaluated on its own, with the symbolic loops of [`super::prove`], in *phases*:
//! stretches of cycles `[T, T')` at whose ends every PE is between two items of its program (a
//! bundle, a loop, or a run of a loop's iterations; timing is static, so each item's length is
//! known in closed form). Within a phase the words PE `p − 1` sends land in PE `p`'s memory at
//! cycles this proof does not track, so the phase is accepted only if no word that may arrive
//! in it is one PE `p` may read or write in it (extents of every slot's addresses over the
//! item's indices, predicates included; over-approximated, so "apart" is certain). Then every
//! read in the phase sees what it would see without the arrivals, and the arrivals, ordered
//! among themselves by the sender's program order, can be committed at the phase's end. A
//! phase that fails this is cut finer (its longest items split: a loop into its first iteration
//! and the rest, an iteration into its body); a one-cycle phase needs only arrivals and local
//! writes apart, since a cycle's reads precede its writes. Sends are therefore evaluated as
//! facts of the receiver (`remote`), summarised over symbolic loops like any write and
//! delivered at the phase's end; no symmetry between PEs is assumed.
//!
//! Inputs are preloaded per PE as the layout deals them (runs of rows holding consecutive
//! tokens), every output row of every PE is compared with the specification of its token (keys
//! `0..=t` under a causal mask), and operations are counted over all PEs.

use super::aff::{Aff, Var};
use super::prove::{
    pieces, row_difference, splittable, tensor_layout, Active, Eval, Evaluated, Fact, Fail, Ix,
    Key, R,
};
use crate::expr::FxMap as HashMap;
use isa::looped::{field, Cmp, Field, LBundle, Slot};
use isa::{Acc, AccSrc, Loop, LoopProgram, Node, Op, Xfer, XferSrc};
use runtime::manifest::{Layout, Manifest};

/// A stretch of one PE's program: a node at known outer indices, or iterations `a..b` of a
/// loop entered at known outer indices.
#[derive(Clone)]
pub(super) enum Item<'a> {
    Node(&'a Node, Vec<u64>),
    Iters(&'a Loop, Vec<u64>, u64, u64),
}

/// A body's length as `c + Σ_k a[k]·i_k` over the enclosing indices (affine: a stepped loop
/// holds no stepped loop).
#[derive(Clone, Copy)]
pub(super) struct Lin {
    pub(super) c: i128,
    pub(super) a: [i128; isa::looped::MAX_LOOP_DEPTH],
}

#[derive(Default)]
pub(super) struct Lengths {
    memo: HashMap<usize, Lin>,
}

impl Lengths {
    pub(super) fn body(&mut self, nodes: &[Node], depth: usize) -> Lin {
        let key = nodes.as_ptr() as usize ^ (depth << 56);
        if let Some(l) = self.memo.get(&key) {
            return *l;
        }
        let mut t = Lin {
            c: 0,
            a: [0; isa::looped::MAX_LOOP_DEPTH],
        };
        for n in nodes {
            match n {
                Node::Bundle(_) => t.c += 1,
                Node::Loop(l) => {
                    let inner = self.body(&l.body, depth + 1);
                    let n = i128::from(l.count);
                    match l.step {
                        None => {
                            let own = inner.a.get(depth).copied().unwrap_or(0);
                            t.c += n * inner.c + own * (n * (n - 1) / 2);
                            for k in 0..depth.min(t.a.len()) {
                                t.a[k] += n * inner.a[k];
                            }
                        }
                        Some(s) => {
                            t.c += n * inner.c;
                            let k = usize::from(s.level).min(t.a.len() - 1);
                            t.a[k] += i128::from(s.per) * inner.c;
                        }
                    }
                }
            }
        }
        self.memo.insert(key, t);
        t
    }

    pub(super) fn at(lin: &Lin, env: &[u64]) -> i128 {
        lin.c
            + env
                .iter()
                .zip(lin.a.iter())
                .map(|(&i, &a)| a * i128::from(i))
                .sum::<i128>()
    }

    /// Cycles of iterations `a..b` of `l` entered at `env`.
    fn iters(&mut self, l: &Loop, env: &[u64], a: u64, b: u64) -> u64 {
        let lin = self.body(&l.body, env.len() + 1);
        let at0 = Self::at(&lin, env);
        let own = lin.a.get(env.len()).copied().unwrap_or(0);
        let (a, b) = (i128::from(a), i128::from(b));
        let total = (b - a) * at0 + own * ((a + b - 1) * (b - a) / 2);
        u64::try_from(total.max(0)).unwrap_or(u64::MAX)
    }

    pub(super) fn item(&mut self, it: &Item) -> u64 {
        match it {
            Item::Node(Node::Bundle(_), _) => 1,
            Item::Node(Node::Loop(l), env) => self.iters(l, env, 0, trips(l, env)),
            Item::Iters(l, env, a, b) => self.iters(l, env, *a, *b),
        }
    }
}

pub(super) fn trips(l: &Loop, env: &[u64]) -> u64 {
    let idx: Vec<u32> = env.iter().map(|&k| k as u32).collect();
    u64::from(l.trips(&idx))
}

/// An item's parts: a loop as its first iteration and the rest, one iteration as its body.
pub(super) fn split<'a>(it: &Item<'a>) -> Option<Vec<Item<'a>>> {
    let (l, env, a, b) = match it {
        Item::Node(Node::Bundle(_), _) => return None,
        Item::Node(Node::Loop(l), env) => (l, env, 0, trips(l, env)),
        Item::Iters(l, env, a, b) => (*l, env, *a, *b),
    };
    if b - a >= 2 {
        return Some(vec![
            Item::Iters(l, env.clone(), a, a + 1),
            Item::Iters(l, env.clone(), a + 1, b),
        ]);
    }
    let mut inner = env.clone();
    inner.push(a);
    Some(
        l.body
            .iter()
            .map(|n| Item::Node(n, inner.clone()))
            .collect(),
    )
}

/// Word intervals an item may read, write locally, and send to the next PE.
#[derive(Default)]
pub(super) struct Ext {
    pub(super) reads: Vec<(i64, i64)>,
    pub(super) writes: Vec<(i64, i64)>,
    pub(super) sends: Vec<(i64, i64)>,
}

/// The indices of one loop level an extent ranges over: `lo, lo + step, …, hi` (`hi − lo` a
/// multiple of `step`). A step that is a multiple of a wrapped term's period fixes its residue.
#[derive(Clone, Copy)]
pub(super) struct Range {
    lo: i64,
    hi: i64,
    step: i64,
}

impl Range {
    fn point(k: i64) -> Range {
        Range {
            lo: k,
            hi: k,
            step: 1,
        }
    }
}

/// With `head`, the index at level 0 is that head's instead of the item's.
pub(super) fn extents(it: &Item, head: Option<u64>, out: &mut Ext) {
    let point = |env: &[u64]| {
        env.iter()
            .enumerate()
            .map(|(i, &k)| {
                let k = if i == 0 { head.unwrap_or(k) } else { k };
                Range::point(k as i64)
            })
            .collect::<Vec<_>>()
    };
    match it {
        Item::Node(n, env) => ext_nodes(std::slice::from_ref(*n), &mut point(env), out),
        Item::Iters(l, env, a, b) => {
            let mut r = point(env);
            r.push(Range {
                lo: *a as i64,
                hi: *b as i64 - 1,
                step: 1,
            });
            ext_nodes(&l.body, &mut r, out);
        }
    }
}

/// Word intervals of the iterations `lo, lo + step, …, hi` of `l` entered at `env` (with
/// `head`, the index at level 0 is that head's).
pub(super) fn strided_extents(
    l: &Loop,
    env: &[u64],
    head: Option<u64>,
    (lo, hi, step): (u64, u64, u64),
    out: &mut Ext,
) {
    let mut r: Vec<Range> = env
        .iter()
        .enumerate()
        .map(|(i, &k)| Range::point(if i == 0 { head.unwrap_or(k) } else { k } as i64))
        .collect();
    r.push(Range {
        lo: lo as i64,
        hi: hi as i64,
        step: step.max(1) as i64,
    });
    ext_nodes(&l.body, &mut r, out);
}

fn ext_nodes(nodes: &[Node], rng: &mut Vec<Range>, out: &mut Ext) {
    for n in nodes {
        match n {
            Node::Bundle(b) => ext_bundle(b, rng, out),
            Node::Loop(l) => {
                let most = match l.step {
                    None => i64::from(l.count),
                    Some(s) => {
                        let r = rng[usize::from(s.level)];
                        let at = |i: i64| i64::from(l.count) + i64::from(s.per) * i;
                        at(r.lo).max(at(r.hi))
                    }
                };
                rng.push(Range {
                    lo: 0,
                    hi: most - 1,
                    step: 1,
                });
                ext_nodes(&l.body, rng, out);
                rng.pop();
            }
        }
    }
}

fn ext_bundle(b: &LBundle, rng: &[Range], out: &mut Ext) {
    for slot in [Slot::Op, Slot::Acc, Slot::Xfer] {
        // On the stack: a copy per slot of every bundle of every head.
        let mut r: smallvec::SmallVec<[Range; isa::looped::MAX_LOOP_DEPTH + 1]> =
            smallvec::SmallVec::from_slice(rng);
        let mut runs = true;
        for p in b.preds.iter().filter(|p| p.slot == slot) {
            let Range { lo, hi, step } = &mut r[usize::from(p.level)];
            let (first, step) = (*lo, *step);
            let v = i64::from(p.value);
            match p.cmp {
                Cmp::Lt => *hi = (*hi).min(v - 1),
                Cmp::Ge => *lo = (*lo).max(v),
                Cmp::Eq => {
                    *lo = (*lo).max(v);
                    *hi = (*hi).min(v);
                }
                Cmp::Ne => {
                    if *lo == v && *hi == v {
                        runs = false;
                    }
                }
            }
            // Back onto the indices the range holds, so a fixed residue stays right.
            *lo = first + (*lo - first + step - 1).div_euclid(step) * step;
            *hi = first + (*hi - first).div_euclid(step) * step;
            if lo > hi {
                runs = false;
            }
        }
        if !runs {
            continue;
        }
        let at = |f: Field| span(b, f, &r);
        match slot {
            Slot::Op => {
                if let Op::Arith(x) = b.bundle.op {
                    out.reads.push(at(Field::OpA));
                    if x.kind.info().reads == 2 {
                        out.reads.push(at(Field::OpB));
                    }
                    if x.dst.is_some() {
                        out.writes.push(at(Field::OpDst));
                    }
                }
            }
            Slot::Acc => {
                if let Acc::Add { src, dst } = b.bundle.acc {
                    if matches!(src, AccSrc::Mem(_)) {
                        out.reads.push(at(Field::AccSrc));
                    }
                    if dst.is_some() {
                        out.writes.push(at(Field::AccDst));
                    }
                }
            }
            Slot::Xfer => {
                if let Xfer::Send { src, .. } = b.bundle.xfer {
                    if matches!(src, XferSrc::Mem(_)) {
                        out.reads.push(at(Field::XferSrc));
                    }
                    out.sends.push(at(Field::XferDst));
                }
            }
        }
    }
}

/// The smallest and largest address of field `f` over the index box `rng`.
fn span(b: &LBundle, f: Field, rng: &[Range]) -> (i64, i64) {
    let base = field(&b.bundle, f).map_or(0, i64::from);
    let (mut lo, mut hi) = (base, base);
    for t in b.terms.iter().filter(|t| t.field == f) {
        let Range { lo: a, hi: z, step } = rng[usize::from(t.level)];
        let (g0, g1) = if t.wrap == 0 {
            (a, z)
        } else {
            let w = i64::from(t.wrap);
            let (ra, rz) = (a.rem_euclid(w), z.rem_euclid(w));
            if step % w == 0 {
                (ra, ra)
            } else if z - a + 1 >= w || ra > rz {
                (0, w - 1)
            } else {
                (ra, rz)
            }
        };
        let s = i64::from(t.stride);
        lo += (s * g0).min(s * g1);
        hi += (s * g0).max(s * g1);
    }
    (lo, hi)
}

/// Whether some interval of `a` meets some interval of `b`.
pub(super) fn meet(a: &[(i64, i64)], b: &[(i64, i64)]) -> bool {
    let union = |v: &[(i64, i64)]| {
        let mut v = v.to_vec();
        v.sort_unstable();
        let mut out: Vec<(i64, i64)> = Vec::new();
        for (lo, hi) in v {
            match out.last_mut() {
                Some(l) if lo <= l.1 + 1 => l.1 = l.1.max(hi),
                _ => out.push((lo, hi)),
            }
        }
        out
    };
    let (a, b) = (union(a), union(b));
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        if a[i].1 < b[j].0 {
            i += 1;
        } else if b[j].1 < a[i].0 {
            j += 1;
        } else {
            return true;
        }
    }
    false
}

/// Why the per-PE proof does not cover `programs` and `m`, if it does not.
pub fn applies(programs: &[LoopProgram], m: &Manifest) -> Result<(), String> {
    let l = &m.layer;
    if l.qkv != "separate" {
        return Err("covers separate q, k, v only".into());
    }
    if l.mask != "none" && l.mask != "causal" {
        return Err("an unknown mask".into());
    }
    if m.normalisation != runtime::layer::Normalisation::Deferred {
        return Err("covers the online (deferred) formulation only".into());
    }
    if m.pes < 2 || programs.len() != m.pes as usize {
        return Err("covers rings of two PEs or more, one program each".into());
    }
    for (name, p) in m.inputs.iter().chain(&m.outputs) {
        if p.layout.is_none() {
            return Err(format!("`{name}` is placed element by element"));
        }
        if !p.copies.is_empty() {
            return Err(format!("`{name}` has preload copies"));
        }
    }
    Ok(())
}

/// Per PE, `(first local row, first token, rows)` of every run of rows holding consecutive
/// tokens.
pub(super) fn runs(lay: &Layout, pes: u32, tokens: u32) -> Vec<Vec<(i64, i64, u64)>> {
    let mut out: Vec<Vec<(i64, i64, u64)>> = vec![Vec::new(); pes as usize];
    let mut owned: Vec<Vec<(u32, u32)>> = vec![Vec::new(); pes as usize];
    for t in 0..tokens {
        let (p, r) = lay.owner(pes, t);
        if let Some(v) = owned.get_mut(p as usize) {
            v.push((r, t));
        }
    }
    for (p, mut rows) in owned.into_iter().enumerate() {
        rows.sort_unstable();
        for (r, t) in rows {
            match out[p].last_mut() {
                Some((r0, t0, n))
                    if *r0 + *n as i64 == i64::from(r) && *t0 + *n as i64 == i64::from(t) =>
                {
                    *n += 1
                }
                _ => out[p].push((i64::from(r), i64::from(t), 1)),
            }
        }
    }
    out
}

#[derive(Default)]
pub(super) struct Pe {
    facts: Vec<Option<Fact>>,
    keys: HashMap<Key, usize>,
    loops: Vec<Active>,
}

pub(super) fn swap(e: &mut Eval, pe: &mut Pe) {
    std::mem::swap(&mut e.facts, &mut pe.facts);
    std::mem::swap(&mut e.keys, &mut pe.keys);
    std::mem::swap(&mut e.loops, &mut pe.loops);
}

/// An item's indices; with `head`, level 0 is that symbolic head index.
fn indices(env: &[u64], head: Option<Var>) -> Vec<Ix> {
    env.iter()
        .enumerate()
        .map(|(i, &k)| match head {
            Some(h) if i == 0 => Ix::Sym(h, 0),
            _ => Ix::At(k),
        })
        .collect()
}

pub(super) fn eval_item(e: &mut Eval, it: &Item, head: Option<Var>) -> R<()> {
    match it {
        Item::Node(n, env) => {
            let mut env = indices(env, head);
            match n {
                Node::Bundle(b) => e.bundle(b, &env),
                Node::Loop(l) => e.lp(l, &mut env),
            }
        }
        Item::Iters(l, env0, a, b) => {
            let level = env0.len();
            let mut env = indices(env0, head);
            if !splittable(&l.body, level) {
                return e.iterate(l, &mut env, *a, *b);
            }
            for (x, y) in pieces(&l.body, level, trips(l, env0)) {
                let (x, y) = (x.max(*a), y.min(*b));
                if x < y {
                    e.piece(l, &mut env, x, y)?;
                }
            }
            Ok(())
        }
    }
}

/// Evaluates every PE in phases (the module documentation) and compares every output row with
/// the specification. `Err` says why the proof does not cover the programs. When every PE's
/// program is one head loop, the heads are first evaluated as one symbolic head (the module
/// documentation); if that declines, head by head, within the same bounds.
pub fn evaluate(programs: &[LoopProgram], m: &Manifest) -> Result<Evaluated, String> {
    evaluate_until(programs, m, None)
}

/// [`evaluate`] within the time bound `until` when given (another proof already spent part of
/// the bound).
pub(super) fn evaluate_until(
    programs: &[LoopProgram],
    m: &Manifest,
    until: Option<std::time::Instant>,
) -> Result<Evaluated, String> {
    applies(programs, m)?;
    let mut e = Eval::new(0, i64::from(m.layer.tokens), true);
    if let Some(t) = until {
        e.deadline = t;
    }
    if let Some(heads) = head_loops(programs) {
        if let Ok(done) = run(&mut e, programs, m, Some(&heads)) {
            return Ok(done);
        }
        let mut again = Eval::new(0, i64::from(m.layer.tokens), true);
        again.deadline = e.deadline;
        again.evaluations = e.evaluations;
        e = again;
    }
    run(&mut e, programs, m, None)
}

/// Every PE's head loop, when each program is one loop of one count (at least 2) over a body
/// of one length everywhere, that no predicate, wrapped term or stepped count ties to the
/// head: then PE `p` runs head `h`'s body in the same cycles as every other PE.
pub(super) fn head_loops(programs: &[LoopProgram]) -> Option<Vec<&Loop>> {
    let mut lengths = Lengths::default();
    let mut out = Vec::new();
    let mut shape = None;
    for p in programs {
        let [Node::Loop(l)] = &p.body[..] else {
            return None;
        };
        let len = lengths.body(&l.body, 1);
        if l.step.is_some()
            || l.count < 2
            || !splittable(&l.body, 0)
            || pieces(&l.body, 0, u64::from(l.count)).len() != 1
            || len.a[0] != 0
        {
            return None;
        }
        if *shape.get_or_insert((l.count, len.c)) != (l.count, len.c) {
            return None;
        }
        out.push(l);
    }
    Some(out)
}

fn run(
    e: &mut Eval,
    programs: &[LoopProgram],
    m: &Manifest,
    head_loops: Option<&[&Loop]>,
) -> Result<Evaluated, String> {
    let l = &m.layer;
    let (heads, tokens, dim) = (i64::from(l.heads), i64::from(l.tokens), i64::from(l.dim));
    let causal = l.mask == "causal";
    let layout = |name: &str| tensor_layout(m, name);
    let why = |f: Fail| match f {
        Fail::Retry(why) | Fail::Decline(why) => why,
    };
    let pes = programs.len();
    e.tm.seed_budgets(m.pes);
    let mut state: Vec<Pe> = (0..pes).map(|_| Pe::default()).collect();
    for (t, name) in ["q", "k", "v"].iter().enumerate() {
        let lay = layout(name)?;
        for (p, rs) in runs(&lay, m.pes, l.tokens).into_iter().enumerate() {
            swap(e, &mut state[p]);
            for (r0, t0, n) in rs {
                let (h, r, c) = (e.fresh(heads as u64), e.fresh(n), e.fresh(dim as u64));
                let value =
                    e.tm.atom(t as u8, Aff::var(h), Aff::var(r).add_const(t0), Aff::var(c));
                let base = i64::from(lay.base) + r0 * i64::from(lay.row_stride);
                let dims = vec![
                    (h, i64::from(lay.head_stride), heads as u64),
                    (r, i64::from(lay.row_stride), n),
                    (c, 1, dim as u64),
                ];
                match e.fact(Aff::cst(base), dims, value, false) {
                    Ok(f) => e.facts.push(Some(f)),
                    Err(_) => {
                        swap(e, &mut state[p]);
                        return Err("input layout".into());
                    }
                }
            }
            swap(e, &mut state[p]);
        }
    }
    let mut lengths = Lengths::default();
    let mut queues: Vec<std::collections::VecDeque<Item>> = match head_loops {
        Some(hs) => hs
            .iter()
            .map(|h| h.body.iter().map(|n| Item::Node(n, vec![0])).collect())
            .collect(),
        None => programs
            .iter()
            .map(|p| p.body.iter().map(|n| Item::Node(n, Vec::new())).collect())
            .collect(),
    };
    // One head index for every PE: in head `h` PE `p` writes its own words and receives
    // what PE `p − 1` sends, in the same cycles as every other PE runs head `h`.
    let head = match head_loops {
        Some(hs) => {
            let n = u64::from(hs[0].count);
            let var = e.fresh(n);
            let (mut own, mut sends) = (Vec::new(), Vec::new());
            for (p, h) in hs.iter().enumerate() {
                let (mut f, mut r) = (Vec::new(), Vec::new());
                swap(e, &mut state[p]);
                let done = e.families(&h.body, &mut vec![Ix::Sym(var, 0)], 1, &mut f, &mut r);
                swap(e, &mut state[p]);
                done.map_err(why)?;
                own.push(f);
                sends.push(r);
            }
            for p in 0..pes {
                let mut families = own[p].clone();
                families.extend(sends[(p + pes - 1) % pes].iter().cloned());
                swap(e, &mut state[p]);
                e.enter_ordered(var, n, families, sends[p].clone());
                swap(e, &mut state[p]);
            }
            e.mult = n;
            Some((var, n))
        }
        None => None,
    };
    loop {
        // Cutting phases finer evaluates nothing, so the evaluation's own bound may not come.
        if std::time::Instant::now() > e.deadline {
            return Err("past the time bound of the evaluation".into());
        }
        // The phase: from each PE, items up to the first cycle where all are between items.
        let mut take = vec![0usize; pes];
        let mut ends = vec![0u64; pes];
        let mut live: Vec<bool> = queues.iter().map(|q| !q.is_empty()).collect();
        if !live.iter().any(|&x| x) {
            break;
        }
        for p in 0..pes {
            if live[p] {
                ends[p] = lengths.item(&queues[p][0]);
                take[p] = 1;
            }
        }
        loop {
            let end = (0..pes)
                .filter(|&p| live[p])
                .map(|p| ends[p])
                .max()
                .unwrap_or(0);
            let mut more = false;
            for p in 0..pes {
                if live[p] && ends[p] < end {
                    if take[p] < queues[p].len() {
                        ends[p] += lengths.item(&queues[p][take[p]]);
                        take[p] += 1;
                        more = true;
                    } else {
                        // Its program ends inside the phase: it idles from there.
                        live[p] = false;
                    }
                }
            }
            if !more {
                break;
            }
        }
        let len = (0..pes).map(|p| ends[p]).max().unwrap_or(0);
        // With a symbolic head, apart in every head (all PEs run one head at a time).
        let clash = (0..head.map_or(1, |h| h.1)).any(|h| {
            let ext: Vec<Ext> = (0..pes)
                .map(|p| {
                    let mut x = Ext::default();
                    for it in queues[p].iter().take(take[p]) {
                        extents(it, head.map(|_| h), &mut x);
                    }
                    x
                })
                .collect();
            (0..pes).any(|p| {
                let from = &ext[(p + pes - 1) % pes].sends;
                meet(from, &ext[p].writes) || (len > 1 && meet(from, &ext[p].reads))
            })
        });
        if clash {
            // Cut finer: split the phase's longest items.
            let mut longest = 0;
            for p in 0..pes {
                for it in queues[p].iter().take(take[p]) {
                    longest = longest.max(lengths.item(it));
                }
            }
            let mut split_any = false;
            for (q, &n) in queues.iter_mut().zip(&take) {
                let mut i = 0;
                let mut rebuilt = std::collections::VecDeque::with_capacity(n + 4);
                while let Some(it) = q.pop_front() {
                    if i < n && lengths.item(&it) == longest {
                        if let Some(parts) = split(&it) {
                            split_any = true;
                            rebuilt.extend(parts);
                            i += 1;
                            continue;
                        }
                    }
                    rebuilt.push_back(it);
                    i += 1;
                }
                *q = rebuilt;
            }
            if !split_any {
                return Err(
                    "a word arriving over the ring may meet a local write in one cycle".into(),
                );
            }
            continue;
        }
        let mut sent: Vec<Vec<Fact>> = vec![Vec::new(); pes];
        for p in 0..pes {
            swap(e, &mut state[p]);
            let mark = e.facts.len();
            let mut r = Ok(());
            for _ in 0..take[p] {
                let Some(it) = queues[p].pop_front() else {
                    break;
                };
                r = eval_item(e, &it, head.map(|h| h.0));
                if r.is_err() {
                    break;
                }
            }
            for i in mark..e.facts.len() {
                if e.facts[i].as_ref().is_some_and(|f| f.remote) {
                    if let Some(f) = e.facts[i].take() {
                        e.keys.remove(&super::prove::key_of(&f));
                        sent[p].push(f);
                    }
                }
            }
            swap(e, &mut state[p]);
            r.map_err(why)?;
        }
        for (p, words) in sent.into_iter().enumerate() {
            let to = (p + 1) % pes;
            swap(e, &mut state[to]);
            for mut f in words {
                f.remote = false;
                f.computed = false;
                e.push(f);
            }
            swap(e, &mut state[to]);
        }
        for pe in state.iter_mut() {
            swap(e, pe);
            e.forget_shadowed();
            swap(e, pe);
        }
    }
    if let Some((_, n)) = head {
        e.mult = 1;
        for pe in state.iter_mut() {
            swap(e, pe);
            let r = e.leave_ordered(n);
            swap(e, pe);
            r.map_err(why)?;
        }
    }
    let scale = l.scale as f32;
    let safe = l.softmax == "safe";
    let y = layout("y")?;
    let mut wrong = Vec::new();
    let mut wrong_count = 0;
    for (p, rs) in runs(&y, m.pes, l.tokens).into_iter().enumerate() {
        swap(e, &mut state[p]);
        let r = compare(e, p, &rs, &y, (heads, tokens, dim), causal, scale, safe);
        swap(e, &mut state[p]);
        let (w, n) = r.map_err(why)?;
        wrong_count += n;
        for x in w {
            if wrong.len() < 5 {
                wrong.push(x);
            }
        }
    }
    Ok(Evaluated {
        ops: e.tally,
        wrong,
        wrong_count,
        evaluations: e.evaluations,
        expressions: e.tm.len(),
    })
}

/// PE `p`'s output rows against the specification: descriptions of the first few that differ
/// and how many do.
#[allow(clippy::too_many_arguments)]
pub(super) fn compare(
    e: &mut Eval,
    p: usize,
    rs: &[(i64, i64, u64)],
    y: &Layout,
    (heads, tokens, dim): (i64, i64, i64),
    causal: bool,
    scale: f32,
    safe: bool,
) -> R<(Vec<String>, usize)> {
    let mut wrong = Vec::new();
    let mut count = 0;
    // All heads at once for a row held as a region over the heads (a head variable: the same
    // node for every head is the same value for every head); head by head otherwise, or when
    // the forms differ (they may still meet once the head is known).
    let every = e.fresh(heads as u64);
    for &(r0, t0, n) in rs {
        for k in 0..n as i64 {
            let (r, t) = (r0 + k, t0 + k);
            let keys = if causal { t + 1 } else { tokens };
            let at = (Aff::var(every), r, t);
            if let Ok(None) = row_difference(e, y, at, (keys, dim), scale, safe) {
                continue;
            }
            for h in 0..heads {
                let at = (Aff::cst(h), r, t);
                let differs = row_difference(e, y, at, (keys, dim), scale, safe)?;
                if let Some(how) = differs {
                    count += 1;
                    if wrong.len() < 5 {
                        wrong.push(format!(
                            "y[{h}][{t}][c] (PE {p}, row {r}) is not the specification: {how}"
                        ));
                    }
                }
            }
        }
    }
    Ok((wrong, count))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(src: &str) -> LoopProgram {
        let text = format!(".format 3\n.pe 0\n.pes 2\n.mem 4096\n{src}");
        isa::looped_text::parse_looped(&text).unwrap_or_else(|e| panic!("{e:?}"))
    }

    #[test]
    fn item_lengths_are_the_closed_form_cycles() {
        // A triangle (count stepped by the row) inside a head loop, and a plain nest.
        let p = program(
            "loop 3 {\n  loop 5 {\n    loop 1 + i1 {\n      mul m[0 + 1*i2], m[64 + 1*i2] | add 0 -> m9\n    }\n    mul m0, m1 -> m10\n  }\n  loop 4 {\n    loop 2 {\n      mul m0, m1 -> m11\n    }\n  }\n}\n",
        );
        let mut len = Lengths::default();
        let whole: u64 = p
            .body
            .iter()
            .map(|n| len.item(&Item::Node(n, Vec::new())))
            .sum();
        assert_eq!(whole, p.cycles());
        let Node::Loop(heads) = &p.body[0] else {
            panic!("expected the head loop first, found {:?}", p.body[0])
        };
        // One head is a third; its parts add up to it, split as the phases split them.
        let one = Item::Iters(heads, Vec::new(), 1, 2);
        assert_eq!(len.item(&one) * 3, p.cycles());
        let parts = split(&one).expect("an iteration splits into its body");
        assert_eq!(
            parts.iter().map(|it| len.item(it)).sum::<u64>(),
            len.item(&one)
        );
        let tri = &parts[0];
        let rows = split(tri).expect("a loop splits");
        assert_eq!(len.item(&rows[0]), 2); // row 0: one key, one bundle after it
        assert_eq!(len.item(&rows[1]), 3 + 4 + 5 + 6);
    }

    #[test]
    fn extents_follow_predicates_and_wrapped_terms() {
        let p = program(
            "loop 8 {\n  mul m[0 + 2*(i0 % 2)], m[100 + 1*i0] -> m[200 + 1*i0] | nop | send m[300 + 1*i0] -> m[400 + 1*i0] if i0 < 3\n}\n",
        );
        let mut x = Ext::default();
        extents(&Item::Node(&p.body[0], Vec::new()), None, &mut x);
        assert!(x.reads.contains(&(0, 2)));
        assert!(x.reads.contains(&(100, 107)));
        assert!(x.reads.contains(&(300, 302)));
        assert_eq!(x.writes, vec![(200, 207)]);
        assert_eq!(x.sends, vec![(400, 402)]);
        // Iterations 3.. send nothing; iteration 5 alone reads the odd wrapped word.
        let Node::Loop(l) = &p.body[0] else {
            panic!("expected the program's one loop, found {:?}", p.body[0])
        };
        let mut y = Ext::default();
        extents(&Item::Iters(l, Vec::new(), 5, 6), None, &mut y);
        assert!(y.sends.is_empty());
        assert!(y.reads.contains(&(2, 2)));
    }

    #[test]
    fn intervals_meet_only_when_they_share_a_word() {
        assert!(!meet(&[(0, 3), (10, 12)], &[(4, 9), (13, 20)]));
        assert!(meet(&[(0, 3), (10, 12)], &[(12, 12)]));
        assert!(meet(&[(5, 5)], &[(0, 2), (3, 9)]));
        assert!(!meet(&[], &[(0, 100)]));
    }
}
