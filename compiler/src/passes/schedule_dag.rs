//! `schedule-dag`: few tokens on a large ring, every operation placed where it finishes first.
//!
//! The other dataflows fix a layout (which PEs hold which columns, which take the softmax, which
//! the outputs) and list-schedule within it. On a ring with far more PEs than the work needs, a
//! layout is what costs: 2 tokens, `d = 8` on 16 PEs took 21 cycles where the longest chain of
//! dependent operations allows 16, because the lanes put both scores of a row through the same
//! four PEs and its 16 outputs on three. With preload copies no input word ever has to move, so
//! the only placement that matters is that of computed values, and this pass decides it one
//! operation at a time: it builds the layer's operation graph (score chains, the row maximum as
//! a tree, the exponentials' running sum, the divisions, the output chains), orders it by the
//! longest path to the end, and books each operation on the PE and cycle where it can start
//! first, routing each computed operand forward over the free link slots from the nearest PE
//! that holds it (a result may leave in the cycle it is made, like `send acc`). Several
//! tie-break rules and seeded perturbations of the order are tried; the shortest schedule is kept.
//! With two PEs per row or more, a systolic layout ([`Systolic`]) is tried too: it names the PE
//! of every operation (each row on an arc of its own, its outputs on the next arc), and the same
//! booking decides only the cycles and the routes.
//!
//! It needs preload copies (every input is loaded where it is read), so it refuses
//! `--single-placement`; `auto` tries it on rings of 16 PEs or more for layers up to
//! [`AUTO_OPS`] necessary operations, and up to [`MAX_OPS`] where the systolic layout applies
//! (then that layout alone).

use crate::ir::Tensor;
use crate::passes::schedule_split::COPIES_MIN_PES;
use crate::passes::select::{Culprit, Refusal};
use crate::problem::Problem;
use crate::schedule::{Builder, Element, RingSchedule, ScheduleError, Val, Work};
use crate::scheduler::Scheduler;
use rustc_hash::FxHashMap as HashMap;

pub const NAME: &str = "schedule-dag";
pub const DESCRIPTION: &str =
    "operation graph list-scheduled op by op onto the PE where each finishes first, inputs preloaded where read (few tokens on large rings)";

/// The pass refuses layers above this many necessary operations: each operation looks at every
/// PE, and larger layers have enough rows for the layouts of the other dataflows.
pub const MAX_OPS: u64 = 200_000;
/// `auto` tries it up to this many necessary operations.
pub const AUTO_OPS: u64 = 40_000;
/// `schedule-wide` runs it with near pairs shared ([`Pairs::Near`]) up to this many necessary
/// operations: that run places only fractional arcs, six layouts. On 16 tokens, `d = 128`, four
/// heads on 256 PEs (203 712 operations) it took `auto` from 20.6 to 25.3 s (user), where
/// raising [`MAX_OPS`] instead, so that the pass's own runs were made too, took it to 52.7 s.
pub const NEAR_MAX_OPS: u64 = 250_000;
/// Perturbed orders tried on top of the plain ones, for layers up to [`RETRY_MAX_OPS`].
const RETRIES: u64 = 12;
const RETRY_MAX_OPS: u64 = 4_000;

/// The registry's handle on this pass.
pub struct Dag;

impl Scheduler for Dag {
    fn name(&self) -> &'static str {
        "dag"
    }
    fn pass(&self) -> &'static str {
        NAME
    }
    fn description(&self) -> &'static str {
        DESCRIPTION
    }
    fn title(&self) -> &'static str {
        "dag (operations placed one by one, inputs copied where read)"
    }
    fn refusal(&self, p: &Problem, _pes: u32) -> Option<Refusal> {
        if !p.copies {
            return Some(Refusal {
                culprit: Culprit::Pes,
                message: "the dag scheduler preloads each input on every PE that reads it".into(),
                note: "drop `--single-placement`, or use `--schedule auto`".into(),
            });
        }
        (p.necessary_ops() > MAX_OPS).then(|| Refusal {
            culprit: Culprit::Tokens,
            message: format!(
                "the dag scheduler places at most {MAX_OPS} operations ({} here)",
                p.necessary_ops()
            ),
            note: "use `--schedule auto`".into(),
        })
    }
    fn tried_by_auto(&self, p: &Problem, pes: u32) -> bool {
        let ops = p.necessary_ops();
        p.copies
            && pes >= COPIES_MIN_PES
            && (ops <= AUTO_OPS || (systolic_applies(p, pes) && ops <= MAX_OPS))
    }
    fn schedule(&self, p: &Problem, pes: u32) -> Result<RingSchedule, Vec<ScheduleError>> {
        run(p, pes)
    }
}

/// An operand of an operation: an input element (a copy on whichever PE reads it), or a result
/// of an earlier operation (its op result, or an exponential's running sum).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Src {
    In(Element),
    Out(u32),
    Sum(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Mac,
    Exp,
    Div,
    Max,
}

/// One operation of the graph. `a`, `b` are its operands in the order its work item takes them
/// (`b` is an exponential's bias), `acc` the partial sum it adds to.
#[derive(Clone, Copy, Debug)]
struct Node {
    kind: Kind,
    phase: u8,
    a: Src,
    b: Option<Src>,
    acc: Option<Src>,
    /// `head · tokens + row` of the row the operation serves (a score shared by two rows: the
    /// larger), for tie-breaks.
    unit: u32,
    /// The key the operation serves (a maximum: the last of its scores' keys).
    key: u32,
    /// An output product's column.
    col: u32,
    output: Option<Element>,
}

/// How the graph is built: which of its equivalent forms.
#[derive(Clone, Copy, Debug)]
struct Form {
    /// With q = k and no mask, which scores serve both of their rows and which each row
    /// computes itself.
    pairs: Pairs,
    /// Column `c`'s output chain starts at key `c mod k` (else at key 0).
    rotate: bool,
    /// With shared scores, each row's maximum takes the scores its own arc computes in a
    /// balanced tree and then the others one at a time, nearest first, in the order they
    /// arrive from the arcs upstream ([`pair_arc`]), so the farthest is one `max` from the
    /// end (else one balanced tree in key order).
    arrival: bool,
}

impl Form {
    /// Whether some score serves both of its rows (q = k, no mask, not every pair mirrored).
    fn shares_scores(self, p: &Problem) -> bool {
        shares_scores(p, self.pairs)
    }
}

/// Whether, under `pairs`, some score serves both of its rows: q = k, no mask, and not every
/// pair computed by both.
fn shares_scores(p: &Problem, pairs: Pairs) -> bool {
    p.symmetric && !p.causal && pairs != Pairs::Mirrored
}

/// With q = k = v and no mask, which scores a head computes once, for both of its rows, and
/// where; the others each of their rows computes itself (recomputed products, which only
/// `schedule-wide` declares).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pairs {
    /// Every score once, round the head's rows cyclically ([`pair_arc`]).
    Shared,
    /// Every row computes all of its own scores, both halves of each pair, so no score serves
    /// two rows.
    Mirrored,
    /// The pairs at most `reach` rows apart once, the rest by both rows. Cyclically
    /// ([`pair_arc`]), or with `cyclic` false in index order: on the earlier row's arc, so no
    /// score wraps round from a head's last rows to its first, which lie a whole ring apart
    /// when the head has only its part of it.
    Near { reach: usize, cyclic: bool },
}

impl Pairs {
    fn is_near(self) -> bool {
        matches!(self, Pairs::Near { .. })
    }
}

/// Where each score of a head is computed under a [`Pairs`] choice, by rows counted within
/// the head.
#[derive(Debug)]
struct Pairing {
    n: usize,
    /// Per row `i` and key `j` (at `i·n + j`): the row whose arc computes the score `i` reads,
    /// how many rows round it travels to reach its other row, and whether it serves both.
    at: Vec<(usize, usize, bool)>,
    /// Per row and key: the score's place among those its arc computes, farthest-travelling
    /// first.
    rank: Vec<usize>,
    /// Per row: how many scores its arc computes.
    own: Vec<usize>,
}

impl Pairing {
    fn new(n: usize, pairs: Pairs) -> Pairing {
        let place = |i: usize, j: usize| {
            let (hi, lo) = (i.max(j), i.min(j));
            let near = match pairs {
                _ if i == j => Some((i, 0)),
                Pairs::Mirrored => None,
                Pairs::Shared => Some(pair_arc(hi, lo, n)),
                Pairs::Near {
                    reach,
                    cyclic: true,
                } => Some(pair_arc(hi, lo, n)).filter(|&(_, t)| t <= reach),
                Pairs::Near {
                    reach,
                    cyclic: false,
                } => (hi - lo <= reach).then_some((lo, hi - lo)),
            };
            near.map_or((i, 0, false), |(a, t)| (a, t, true))
        };
        let at: Vec<(usize, usize, bool)> = (0..n * n).map(|x| place(x / n, x % n)).collect();
        // What each arc computes: each shared score once (as row `i ≥ j` reads it), and its own
        // row's others.
        let mut on: Vec<Vec<(usize, usize, usize)>> = vec![Vec::new(); n];
        for i in 0..n {
            for j in 0..n {
                let (a, t, shared) = at[i * n + j];
                if !shared || j <= i {
                    on[a].push((t, i, j));
                }
            }
        }
        let mut rank = vec![0; n * n];
        for list in &mut on {
            list.sort_by_key(|&(t, i, j)| (std::cmp::Reverse(t), i, j));
            for (r, &(_, i, j)) in list.iter().enumerate() {
                rank[i * n + j] = r;
                if at[i * n + j].2 {
                    rank[j * n + i] = r;
                }
            }
        }
        Pairing {
            n,
            at,
            rank,
            own: on.iter().map(Vec::len).collect(),
        }
    }

    /// The score row `i` reads for key `j`: where it is computed, how far it travels, whether
    /// it serves both rows.
    fn of(&self, i: usize, j: usize) -> (usize, usize, bool) {
        self.at
            .get(i * self.n + j)
            .copied()
            .unwrap_or((i, 0, false))
    }

    /// Whether row `i` computes the score of key `j` in its own chain of products: its own
    /// score, or one it shares whose other row is not later (`j ≤ i`), or one it mirrors.
    fn builds(&self, i: usize, j: usize) -> bool {
        let (_, _, shared) = self.of(i, j);
        !shared || j <= i
    }
}

/// The layer's operations in an order where every operand comes first.
fn graph(p: &Problem, form: Form) -> Vec<Node> {
    let n = p.tokens;
    let d = p.dim;
    let (tq, tk, tv) = (
        p.tensor_for(Tensor::Q),
        p.tensor_for(Tensor::K),
        p.tensor_for(Tensor::V),
    );
    let el = |tensor, head, row, col| Element {
        tensor,
        head,
        row,
        col,
    };
    let mut g = Vec::new();
    let push = |g: &mut Vec<Node>, node: Node| {
        g.push(node);
        (g.len() - 1) as u32
    };
    let shares = form.shares_scores(p);
    let pairing = shares.then(|| Pairing::new(n as usize, form.pairs));
    let builds = |i: u32, j: u32| {
        pairing
            .as_ref()
            .is_none_or(|pr| pr.builds(i as usize, j as usize))
    };
    for h in 0..p.heads {
        let mut score: HashMap<(u32, u32), Src> = HashMap::default();
        for i in 0..n {
            for j in (0..n).filter(|&j| p.unmasked(i, j) && builds(i, j)) {
                let mut acc = None;
                for c in 0..d {
                    let id = push(
                        &mut g,
                        Node {
                            kind: Kind::Mac,
                            phase: 1,
                            a: Src::In(el(tq, h, i, c)),
                            b: Some(Src::In(el(tk, h, j, c))),
                            acc,
                            unit: h * n + i,
                            key: j,
                            col: c,
                            output: None,
                        },
                    );
                    acc = Some(Src::Out(id));
                }
                if let Some(s) = acc {
                    score.insert((i, j), s);
                    if pairing
                        .as_ref()
                        .is_some_and(|pr| pr.of(i as usize, j as usize).2)
                    {
                        score.insert((j, i), s);
                    }
                }
            }
        }
        for i in 0..n {
            let unit = h * n + i;
            let keys: Vec<u32> = (0..n).filter(|&j| p.unmasked(i, j)).collect();
            let row: Vec<(Src, u32)> = keys
                .iter()
                .filter_map(|&j| score.get(&(i, j)).map(|&s| (s, j)))
                .collect();
            let node = |kind, phase, a, b, acc, key, col| Node {
                kind,
                phase,
                a,
                b,
                acc,
                unit,
                key,
                col,
                output: None,
            };
            // The maximum as a balanced tree (depth ⌈log2 k⌉), or with shared scores in arrival
            // order (`Form::arrival`): a balanced tree of the local ones, then one at a time.
            let bias = if p.safe() {
                let mut level = row.clone();
                let remote = if let Some(pr) = pairing.as_ref().filter(|_| form.arrival) {
                    // How far upstream a score is computed: 0 on the row's own arc.
                    let upstream = |j: u32| {
                        let (at, t, _) = pr.of(i as usize, j as usize);
                        if at == i as usize {
                            0
                        } else {
                            t
                        }
                    };
                    level.sort_by_key(|&(_, j)| upstream(j));
                    let local = level.iter().filter(|&&(_, j)| upstream(j) == 0).count();
                    level.split_off(local.max(1))
                } else {
                    Vec::new()
                };
                while level.len() > 1 {
                    let mut next = Vec::with_capacity(level.len().div_ceil(2));
                    for pair in level.chunks(2) {
                        match *pair {
                            [(x, kx), (y, ky)] => {
                                let key = kx.max(ky);
                                next.push((
                                    Src::Out(push(
                                        &mut g,
                                        node(Kind::Max, 2, x, Some(y), None, key, 0),
                                    )),
                                    key,
                                ));
                            }
                            [x] => next.push(x),
                            _ => {}
                        }
                    }
                    level = next;
                }
                for (y, ky) in remote {
                    if let Some(&(x, kx)) = level.first() {
                        let key = kx.max(ky);
                        level = vec![(
                            Src::Out(push(&mut g, node(Kind::Max, 2, x, Some(y), None, key, 0))),
                            key,
                        )];
                    }
                }
                level.first().map(|&(x, _)| x)
            } else {
                None
            };
            let mut sum = None;
            let mut exps = Vec::with_capacity(row.len());
            for &(s, j) in &row {
                let id = push(&mut g, node(Kind::Exp, 2, s, bias, sum, j, 0));
                exps.push((Src::Out(id), j));
                sum = Some(Src::Sum(id));
            }
            let Some(z) = sum else { continue };
            let weights: Vec<Src> = exps
                .iter()
                .map(|&(e, j)| Src::Out(push(&mut g, node(Kind::Div, 2, e, Some(z), None, j, 0))))
                .collect();
            // Rotated, column `c`'s chain starts at key `c mod k`: the chains then wait for
            // different weights first, which spread from their own PEs at once; in key order
            // every chain waits for the first weight, but the weights can come one by one.
            let k = keys.len();
            let turn = |c: u32| if form.rotate { c as usize } else { 0 };
            for c in 0..d {
                let mut acc = None;
                for x in 0..k {
                    let at = (x + turn(c)) % k;
                    let (j, w) = (keys[at], weights[at]);
                    let v = Src::In(el(tv, h, j, c));
                    acc = Some(Src::Out(push(
                        &mut g,
                        node(Kind::Mac, 3, w, Some(v), acc, j, c),
                    )));
                }
                if let Some(Src::Out(last)) = acc {
                    if let Some(nd) = g.get_mut(last as usize) {
                        nd.output = Some(el(Tensor::Y, h, i, c));
                    }
                }
            }
        }
    }
    g
}

fn operands(nd: &Node) -> impl Iterator<Item = Src> {
    [Some(nd.a), nd.b, nd.acc].into_iter().flatten()
}

/// Each operation's longest path to the end, in operations (itself included).
fn bottom_levels(g: &[Node]) -> Vec<u32> {
    let mut bl = vec![1u32; g.len()];
    for i in (0..g.len()).rev() {
        let here = bl[i];
        for s in operands(&g[i]) {
            if let Src::Out(x) | Src::Sum(x) = s {
                let x = x as usize;
                bl[x] = bl[x].max(here + 1);
            }
        }
    }
    bl
}

/// How ties between PEs where an operation would start equally early are broken.
#[derive(Clone, Copy, Debug)]
struct Rules {
    /// Each row's operations start their search at its own anchor PE, rows spread evenly
    /// round the ring (else every row from PE 0).
    anchors: bool,
    /// Among equally early PEs, the one needing fewer link hops (else the one nearest the
    /// anchor).
    fewer_hops: bool,
    /// Seed of the perturbation of the order (0: none).
    seed: u64,
    /// Every operation on the PE the [`Systolic`] layout names, its arcs sized this way.
    systolic: Option<Layout>,
}

/// Where a computed value is: from which cycle it can be read on a PE, and from which cycle it
/// can leave it (the cycle it is made, for an accumulate result that may ride its own bundle's
/// send).
#[derive(Clone, Copy, Debug)]
struct Held {
    pe: u32,
    ready: usize,
    leave: usize,
}

/// The ring's op and link slots as booked so far.
struct Slots {
    op: Vec<Vec<bool>>,
    link: Vec<Vec<bool>>,
}

fn first_free(row: &[bool], from: usize) -> usize {
    row.iter()
        .skip(from)
        .position(|&b| !b)
        .map_or(row.len().max(from), |i| from + i)
}

fn book(row: &mut Vec<bool>, at: usize) {
    if row.len() <= at {
        row.resize(at + 1 + 64, false);
    }
    row[at] = true;
}

const FAR: usize = usize::MAX / 4;

/// A computed operand's earliest arrival on every PE, and the holder each arrival starts from.
/// A walk stops at a PE that already holds the value: that holder's own walk goes on from there.
fn arrivals(
    held: &[Held],
    slots: &Slots,
    m: usize,
    at: &mut [usize],
    from: &mut [u32],
    holds: &mut [bool],
) {
    at.fill(FAR);
    holds.fill(false);
    for (hi, h) in held.iter().enumerate() {
        let pe = h.pe as usize;
        holds[pe] = true;
        if h.ready < at[pe] {
            at[pe] = h.ready;
            from[pe] = hi as u32;
        }
    }
    for (hi, h) in held.iter().enumerate() {
        let mut q = h.pe as usize;
        let mut t = h.leave;
        for _ in 1..m {
            let c = first_free(&slots.link[q], t);
            let next = (q + 1) % m;
            if holds[next] {
                break;
            }
            if c + 1 < at[next] {
                at[next] = c + 1;
                from[next] = hi as u32;
            }
            q = next;
            t = c + 1;
        }
    }
}

struct Placer<'a> {
    p: &'a Problem,
    m: usize,
    g: &'a [Node],
    slots: Slots,
    b: Builder,
    /// Per node: its op result's value and holders, and (exponentials) its sum's.
    out: Vec<Option<(Val, Vec<Held>)>>,
    sum: Vec<Option<(Val, Vec<Held>)>>,
    copies: HashMap<(Element, u32), Val>,
    scratch: Vec<(Vec<usize>, Vec<u32>)>,
    /// Per PE, whether it holds the operand whose arrivals are being found.
    holds: Vec<bool>,
    systolic: Option<&'a Systolic>,
}

impl Placer<'_> {
    fn value(&self, s: Src) -> Option<&(Val, Vec<Held>)> {
        match s {
            Src::In(_) => None,
            Src::Out(i) => self.out.get(i as usize).and_then(Option::as_ref),
            Src::Sum(i) => self.sum.get(i as usize).and_then(Option::as_ref),
        }
    }

    fn holders_mut(&mut self, s: Src) -> Option<&mut Vec<Held>> {
        let v = match s {
            Src::In(_) => None,
            Src::Out(i) => self.out.get_mut(i as usize),
            Src::Sum(i) => self.sum.get_mut(i as usize),
        }?;
        v.as_mut().map(|(_, h)| h)
    }

    fn input(&mut self, e: Element, pe: u32) -> Val {
        let b = &mut self.b;
        *self.copies.entry((e, pe)).or_insert_with(|| b.input(e, pe))
    }

    /// Books the sends that bring `s` to `to` from the holder its arrivals named, adding every
    /// PE passed as a holder; returns the cycle it can be read on `to`.
    fn route(&mut self, s: Src, to: usize, start: &Held) -> usize {
        let m = self.m;
        let Some(val) = self.value(s).map(|v| v.0) else {
            return 0;
        };
        // Already brought here (an operation reading one value twice).
        if let Some(h) = self
            .value(s)
            .and_then(|v| v.1.iter().find(|h| h.pe as usize == to))
        {
            return h.ready;
        }
        let mut q = start.pe as usize;
        let mut t = start.leave;
        let mut ready = start.ready;
        while q != to {
            let c = first_free(&self.slots.link[q], t);
            book(&mut self.slots.link[q], c);
            self.b.send(q as u32, c, val);
            q = (q + 1) % m;
            t = c + 1;
            ready = c + 1;
            if let Some(h) = self.holders_mut(s) {
                h.push(Held {
                    pe: q as u32,
                    ready,
                    leave: ready,
                });
            }
        }
        ready
    }

    /// Places node `i`; `anchor` is where the search for its PE starts.
    fn place(&mut self, i: usize, anchor: usize, rules: Rules) {
        let m = self.m;
        let nd = self.g[i];
        let computed: Vec<Src> = operands(&nd).filter(|s| !matches!(s, Src::In(_))).collect();
        // Taken out for the walks, which read the holders in `self`.
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut holds = std::mem::take(&mut self.holds);
        let mut missing = false;
        for (&s, (at, from)) in computed.iter().zip(scratch.iter_mut()) {
            match self.value(s) {
                Some((_, held)) => arrivals(held, &self.slots, m, at, from, &mut holds),
                None => missing = true,
            }
        }
        self.scratch = scratch;
        self.holds = holds;
        if missing {
            self.b.bug(NAME, "an operand placed after its reader");
            return;
        }
        // Each operand's holders, looked up once rather than for every PE.
        let held: Vec<&[Held]> = computed
            .iter()
            .map(|&s| self.value(s).map_or(&[][..], |v| &v.1[..]))
            .collect();
        let mut best: Option<(usize, usize, usize, usize)> = None;
        // The systolic layout names one PE; otherwise every PE is a candidate.
        let (lo, count) = match self.systolic {
            Some(sy) => ((sy.pe(self.p, m, &nd) + m - anchor) % m, 1),
            None => (0, m),
        };
        for off in lo..lo + count {
            let pe = (anchor + off) % m;
            let mut ready = 0;
            let mut hops = 0;
            for (hs, (at, from)) in held.iter().zip(&self.scratch) {
                ready = ready.max(at[pe]);
                if let Some(h) = hs.get(from[pe] as usize) {
                    hops += (pe + m - h.pe as usize) % m;
                }
            }
            if ready >= FAR {
                continue;
            }
            let start = first_free(&self.slots.op[pe], ready);
            let key = if rules.fewer_hops {
                (start, hops, off)
            } else {
                (start, off, hops)
            };
            if best.is_none_or(|b| (key.0, key.1, key.2) < (b.0, b.1, b.2)) {
                best = Some((key.0, key.1, key.2, pe));
            }
        }
        let Some((_, _, _, pe)) = best else {
            self.b.bug(NAME, "no PE can receive an operand");
            return;
        };
        let mut ready = 0;
        for (k, &s) in computed.iter().enumerate() {
            let start = {
                let from = self.scratch[k].1[pe] as usize;
                self.value(s).and_then(|v| v.1.get(from)).copied()
            };
            let Some(start) = start else { continue };
            ready = ready.max(self.route(s, pe, &start));
        }
        let t = first_free(&self.slots.op[pe], ready);
        book(&mut self.slots.op[pe], t);
        self.book_work(i, nd, pe, t);
    }

    fn operand(&mut self, s: Src, pe: u32) -> Option<Val> {
        match s {
            Src::In(e) => Some(self.input(e, pe)),
            other => self.value(other).map(|v| v.0),
        }
    }

    fn book_work(&mut self, i: usize, nd: Node, pe: usize, t: usize) {
        let pe32 = pe as u32;
        let (Some(a), b, acc) = (
            self.operand(nd.a, pe32),
            nd.b.and_then(|s| self.operand(s, pe32)),
            nd.acc.and_then(|s| self.operand(s, pe32)),
        ) else {
            self.b.bug(NAME, "an operand with no value");
            return;
        };
        let out = self.b.computed();
        let made = Held {
            pe: pe32,
            ready: t + 1,
            leave: t,
        };
        let work = match (nd.kind, b) {
            (Kind::Mac, Some(b)) => Work::Mac { a, b, acc, out },
            (Kind::Div, Some(den)) => Work::Div { num: a, den, out },
            (Kind::Max, Some(b)) => Work::Max { a, b, out },
            (Kind::Exp, bias) => {
                let sum = self.b.computed();
                self.sum[i] = Some((sum, vec![made]));
                Work::Exp {
                    x: a,
                    bias,
                    scale: self.p.scale as f32,
                    acc,
                    e: out,
                    sum,
                }
            }
            _ => {
                self.b.bug(NAME, "a two-operand operation with one operand");
                return;
            }
        };
        // An exponential's own result cannot leave in its bundle: the acc slot makes the sum.
        let leave = if nd.kind == Kind::Exp { t + 1 } else { t };
        self.out[i] = Some((out, vec![Held { leave, ..made }]));
        self.b.work(pe32, t, nd.phase, work);
        if let Some(e) = nd.output {
            self.b.output(e, pe32, out);
        }
    }
}

/// How the systolic layout sizes its arcs. None wins everywhere under the causal mask, where rows
/// differ in length; with every row alike the first three give equal arcs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sizing {
    /// By the work done on the arc: its row's scores and softmax, and the previous row's
    /// outputs.
    Arc,
    /// By the work of its own row, scores and outputs.
    Row,
    /// By the larger of the two phases an arc runs at different times, its own row's scores
    /// and the previous row's outputs, plus its softmax.
    Peak,
    /// From [`Sizing::Peak`], PEs moved one at a time to the arcs that hold back the row
    /// estimated to end last ([`refine`]).
    Estimated,
}

/// The order in which a head's rows go round its part of the ring in the systolic layout
/// (heads one after another). With q = k = v and shared scores, rows stay in index order
/// ([`pair_arc`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Order {
    /// Longest first, so that each row's outputs land on an arc about as long as its own.
    LongestFirst,
    /// Every other row longest first, then the rows between them back: each arc's neighbours
    /// hold rows about as long as its own, the wrap-around included. Longest first leaves the
    /// longest row's arc only the shortest row's outputs after its scores.
    Zigzag,
}

/// A variant of the systolic layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    sizing: Sizing,
    order: Order,
    /// Whether an arc's last PE, once it has divided its own row, also takes a share of the
    /// previous row's outputs (the tails of the last chains).
    last_takes_outputs: bool,
    /// Whether arcs take two rows each (the two longest left, one after the other), so that
    /// the first row's softmax runs while the arc computes the second row's scores.
    two_rows: bool,
    /// Whether a row's outputs run on its own arc instead of the next one. Tried only with one
    /// PE to a row, where the PE then does its row's whole work: nothing waits for another
    /// PE's weights, and with the scores mirrored nothing crosses a link at all.
    outputs_here: bool,
    /// With shared scores, whether an arc lays the scores that travel farthest at its end,
    /// nearest their other rows (else at its start, its own row's scores at its end).
    far_last: bool,
    /// With shared scores, whether the arcs are cut fractionally ([`Continuous`]) rather than
    /// in whole PEs.
    continuous: bool,
    /// With shared scores, whether the scores that travel farther are computed earlier: a
    /// score's products are placed ahead by `d` levels per row of distance to its other row.
    far_first: bool,
    /// On fractional arcs with [`Layout::far_first`], whether the scores whose products cross
    /// from one PE into the next are placed ahead of all others. Farthest first alone puts a
    /// chain that starts on a PE after that PE's farther scores, and the next PE, which holds
    /// the chain's end, waits for it: on 12 tokens, `d = 64`, 4 heads on 256 PEs with near
    /// pairs, one PE computed the last 55 products of such a chain after cycle 93, where every
    /// PE's share of phase 1 ends.
    cross_first: bool,
}

/// The systolic layout: each row (per head) owns an arc of consecutive PEs, sized by its share
/// of the work (or, in a variant, two rows share one, one after the other). Its score products
/// are cut evenly over the arc in key order; its maximum's tree follows them to the arc's last
/// PE, which also computes the row's exponentials and divisions; the weights then stream into
/// the next arc, whose PEs take the row's output products, column by column in contiguous runs,
/// so every output chain runs forward (the arc's last PE only in the variant where it takes a
/// share). Heads take parts of the ring one after another, their rows in one of two orders
/// ([`Order`]). With one PE to a row, its outputs stay on it; with shared scores the arcs may
/// be fractional ([`Continuous`]).
struct Systolic {
    /// First PE of each arc, and one past the last arc.
    starts: Vec<usize>,
    /// The arc of each unit (`head · tokens + row`).
    arc_of: Vec<usize>,
    /// Each unit's number of keys.
    keys: Vec<usize>,
    /// Each unit's number of scores computed on its arc: its keys, or with q = k = v in the
    /// form where a score serves both of its rows, its share of the pairs ([`pair_arc`]).
    own: Vec<usize>,
    /// Where each score is computed, when some serve two rows.
    pairing: Option<Pairing>,
    /// Per unit, where each PE's share of the row's output products ends, counted in products
    /// over the next arc's PEs (see [`share_ends`]).
    shares: Vec<Vec<f64>>,
    /// Per unit, whether it is the first of two rows on its arc: its scores and softmax are
    /// placed ahead of the other row's ([`Systolic::ahead`]).
    first: Vec<bool>,
    /// Per unit, whether it is the second of two rows on its arc: its scores keep off the
    /// arc's last PE, which runs the first row's softmax meanwhile.
    second: Vec<bool>,
    /// The variant it was built as.
    layout: Layout,
    /// [`Layout::continuous`].
    continuous: Option<Continuous>,
    /// The layer's `d`.
    dim: usize,
}

/// The systolic layout with shared scores cut fractionally. With whole PEs, arcs of 64 PEs for
/// 12 rows are 5 or 6 PEs long, so the arcs that compute 7 scores on 5 PEs end their scores
/// last and the arcs of 5 PEs take longest over the previous row's outputs (12 tokens,
/// `d = 64` on 64 PEs: scores ending at cycles 64 to 90, outputs taking 128 to 155 cycles).
/// Here the rows' scores, in arc order, are laid end to end round the ring and cut into equal
/// shares of products, so a PE may compute the end of one row's scores and the start of the
/// next's; each row's softmax runs on the PE where its scores end; its outputs are laid from
/// there on, each row taking an equal share of the ring's capacity for outputs, where the PE
/// that runs a softmax counts for less by that softmax's operations.
#[derive(Debug)]
struct Continuous {
    /// Per arc, where its scores start on the ring, in PEs (fractional); one more entry for
    /// the end of the last.
    p1: Vec<f64>,
    /// Per arc, the PE of its row's softmax.
    soft: Vec<usize>,
    /// Per PE, the end of its capacity for outputs, cumulative.
    cap_end: Vec<f64>,
    /// Where the first row's outputs start, in capacity, and how much each row takes.
    p3_origin: f64,
    p3_width: f64,
}

impl Continuous {
    fn new(own: &[usize], keys: &[usize], d: usize, m: usize) -> Continuous {
        let arcs = own.len().max(1);
        let total = own.iter().sum::<usize>().max(1) as f64;
        let mut p1 = Vec::with_capacity(arcs + 1);
        let mut at = 0.0;
        for &o in own {
            p1.push(at);
            at += o as f64 * m as f64 / total;
        }
        p1.push(m as f64);
        // The PE holding each row's last score product.
        let soft: Vec<usize> = (0..arcs)
            .map(|a| ((p1[a + 1] - 1e-9).floor().max(p1[a].floor()) as usize).min(m - 1))
            .collect();
        // A softmax PE does its maximum's tree, exponentials and divisions (about 3k) where the
        // others do outputs: it counts for that much less of the average PE's outputs.
        let outputs: f64 = keys.iter().map(|&k| (k * d) as f64).sum::<f64>() / m as f64;
        let mut cap = vec![1.0f64; m];
        for (a, &pe) in soft.iter().enumerate() {
            let k = keys.get(a).copied().unwrap_or(0) as f64;
            cap[pe] = (cap[pe] - 3.0 * k / outputs.max(1.0)).max(0.1);
        }
        let mut cap_end = Vec::with_capacity(m);
        let mut sum = 0.0;
        for c in &cap {
            sum += c;
            cap_end.push(sum);
        }
        let p3_width = sum / arcs as f64;
        let cap_at = |pe: usize, frac: f64| -> f64 {
            let before = if pe == 0 { 0.0 } else { cap_end[pe - 1] };
            before + frac * cap[pe]
        };
        // Every row's outputs start at or after the point where its scores end, so no weight
        // goes round the ring.
        let p3_origin = (0..arcs)
            .map(|a| {
                let end = p1[a + 1];
                let pe = soft[a];
                cap_at(pe, (end - pe as f64).clamp(0.0, 1.0)) - a as f64 * p3_width
            })
            .fold(f64::MIN, f64::max);
        Continuous {
            p1,
            soft,
            cap_end,
            p3_origin,
            p3_width,
        }
    }

    /// The PE of score product `c` of rank `rank` among the `own` scores of arc `a`.
    fn p1_pe(&self, a: usize, rank: usize, c: usize, own: usize, d: usize) -> usize {
        let (lo, hi) = (self.p1[a], self.p1[a + 1]);
        let x = lo + (rank * d + c) as f64 / (own * d).max(1) as f64 * (hi - lo);
        (x.floor() as usize).min(self.soft[a])
    }

    /// The PE of output product `idx` (of `total`) of the row of arc `a`.
    fn p3_pe(&self, a: usize, idx: usize, total: usize) -> usize {
        let m = self.cap_end.len();
        let full = self.cap_end.last().copied().unwrap_or(1.0);
        let y = (self.p3_origin
            + a as f64 * self.p3_width
            + idx as f64 / total.max(1) as f64 * self.p3_width)
            .rem_euclid(full);
        self.cap_end.partition_point(|&e| e <= y).min(m - 1)
    }
}

impl Systolic {
    fn new(p: &Problem, m: usize, layout: Layout, pairs: Pairs) -> Systolic {
        let pairing = shares_scores(p, pairs).then(|| Pairing::new(p.tokens as usize, pairs));
        let triangular = pairing.is_some();
        let n = p.tokens as usize;
        let units = p.heads as usize * n;
        let keys: Vec<usize> = (0..units)
            .map(|u| {
                let i = (u % n) as u32;
                (0..n as u32).filter(|&j| p.unmasked(i, j)).count()
            })
            .collect();
        let own: Vec<usize> = (0..units)
            .map(|u| match &pairing {
                Some(pr) => pr.own.get(u % n).copied().unwrap_or(0),
                None => keys[u],
            })
            .collect();
        // Shared scores flow forward from the arc that computes them, so rows stay in order,
        // one to an arc.
        let arcs: Vec<Vec<usize>> = if triangular {
            (0..units).map(|u| vec![u]).collect()
        } else {
            ring_order(n, p.heads as usize, layout, |u| own[u])
        };
        let mut arc_of = vec![0; units];
        let mut first = vec![false; units];
        let mut second = vec![false; units];
        for (a, rows) in arcs.iter().enumerate() {
            for &u in rows {
                arc_of[u] = a;
            }
            if let [u, v] = rows[..] {
                first[u] = true;
                second[v] = true;
            }
        }
        let sum = |of: &[usize]| -> Vec<usize> {
            arcs.iter()
                .map(|rows| rows.iter().map(|&u| of[u]).sum())
                .collect()
        };
        let (arc_keys, arc_own) = (sum(&keys), sum(&own));
        let d = p.dim as usize;
        // Each head's rows lie together on a part of the ring of their own, sized alike.
        let parts = (p.heads as usize).max(1);
        let per = arcs.len() / parts;
        let mut sizes = Vec::with_capacity(arcs.len());
        for part in 0..parts {
            let pes = (part + 1) * m / parts - part * m / parts;
            let span = part * per..(part + 1) * per;
            sizes.extend(arc_sizes(
                &arc_keys[span.clone()],
                &arc_own[span],
                d,
                pes,
                layout,
            ));
        }
        let mut starts = Vec::with_capacity(arcs.len() + 1);
        let mut at = 0;
        for &a in &sizes {
            starts.push(at);
            at += a;
        }
        starts.push(m);
        let size = |a: usize| (starts[a + 1]).max(starts[a] + 1) - starts[a];
        let shares = (0..units)
            .map(|u| {
                let next = if layout.outputs_here {
                    arc_of[u]
                } else {
                    (arc_of[u] + 1) % arcs.len()
                };
                let lanes = lane_starts(size(next), arc_keys[next], layout.last_takes_outputs);
                share_ends(d * keys[u].max(1), &lanes)
            })
            .collect();
        Systolic {
            starts,
            arc_of,
            keys,
            own,
            pairing,
            shares,
            first,
            second,
            layout,
            continuous: (layout.continuous && triangular)
                .then(|| Continuous::new(&arc_own, &arc_keys, d, m)),
            dim: d,
        }
    }

    /// Levels added to an operation's priority: the first of two rows on an arc has its
    /// scores and softmax placed before anything else (`top` is above every level), so it
    /// takes the arc's first cycles and its softmax runs while the arc computes the other
    /// row's scores; on fractional arcs every row's scores and softmax are, so that a softmax
    /// PE divides before it takes outputs. Every operation it adds to gets the same, so
    /// operands still come first. With [`Layout::far_first`] a shared score's products get
    /// more by its distance: a chain's products alike and more than their readers, so that
    /// order holds too.
    fn ahead(&self, nd: &Node, top: u64) -> u64 {
        let base = if nd.phase < 3 && (self.first[nd.unit as usize] || self.continuous.is_some()) {
            top
        } else {
            0
        };
        match self.scored_at(nd) {
            Some((at, t, rank)) if nd.kind == Kind::Mac && nd.phase == 1 => {
                base + t as u64 * self.far_boost() + self.cross_boost(at, rank)
            }
            _ => base,
        }
    }

    /// Levels added to every product of the score of place `rank` on the arc of unit `at`
    /// whose chain crosses from one PE into the next ([`Layout::cross_first`]): above every
    /// distance's, so those chains go first.
    fn cross_boost(&self, at: usize, rank: usize) -> u64 {
        let Some(co) = self.continuous.as_ref().filter(|_| self.layout.cross_first) else {
            return 0;
        };
        let own = self.own[at].max(1);
        let place = self.shared_rank(rank, own);
        let d = self.dim.max(1);
        let a = self.arc_of[at];
        if co.p1_pe(a, place, 0, own, d) == co.p1_pe(a, place, d - 1, own, d) {
            return 0;
        }
        self.far_boost() * (self.keys.len() as u64 + 1)
    }

    /// Levels a shared score's products are placed ahead per row of distance to its other row
    /// ([`Layout::far_first`]; 0 without).
    fn far_boost(&self) -> u64 {
        if self.layout.far_first {
            self.dim as u64
        } else {
            0
        }
    }

    /// With shared scores, the unit whose arc computes the score `nd` serves, how far round
    /// the rows its other row is (0 for a score its row computes for itself), and its place
    /// among its arc's scores, farthest-travelling first ([`Pairing`]).
    fn scored_at(&self, nd: &Node) -> Option<(usize, usize, usize)> {
        let pr = self.pairing.as_ref()?;
        let u = nd.unit as usize;
        let (row, key) = (u % pr.n, nd.key as usize);
        let (at, t, _) = pr.of(row, key);
        let rank = pr.rank.get(row * pr.n + key).copied().unwrap_or(0);
        Some((u - row + at, t, rank))
    }

    /// Where a score of place `rank` (farthest-travelling first) goes among the `own` scores
    /// of the arc that computes it: the farthest first or last ([`Layout::far_last`]).
    fn shared_rank(&self, rank: usize, own: usize) -> usize {
        if self.layout.far_last {
            own.saturating_sub(1 + rank)
        } else {
            rank.min(own - 1)
        }
    }

    /// Whether this layout places every operation as `other` does: the same arcs and every
    /// choice but the sizing that put them there.
    fn places_as(&self, other: &Systolic) -> bool {
        let choices = |l: Layout| Layout {
            sizing: Sizing::Arc,
            ..l
        };
        self.starts == other.starts && choices(self.layout) == choices(other.layout)
    }

    /// The PE of operation `nd`. A row's keys are `0 … k − 1` (the causal mask hides the later
    /// ones), so a key is also its position in the row.
    fn pe(&self, p: &Problem, m: usize, nd: &Node) -> usize {
        let u = nd.unit as usize;
        let a = self.arc_of[u];
        let keys = self.keys[u].max(1);
        let nth = (nd.key as usize).min(keys - 1);
        let own = self.own[u].max(1);
        let mine = (nd.key as usize).min(own - 1);
        let arc = |a: usize| (self.starts[a], self.starts[a + 1].max(self.starts[a] + 1));
        let (lo, hi) = arc(a);
        let d = p.dim as usize;
        let scoring = if self.second[u] && hi - lo > 1 {
            hi - lo - 1
        } else {
            hi - lo
        };
        if let Some(co) = &self.continuous {
            return match (nd.kind, self.scored_at(nd)) {
                (Kind::Mac, _) if nd.phase == 3 => {
                    co.p3_pe(a, nd.col as usize * keys + nth, keys * d)
                }
                (Kind::Mac, Some((at, _, rank))) => {
                    let own = self.own[at].max(1);
                    let rank = self.shared_rank(rank, own);
                    co.p1_pe(self.arc_of[at], rank, nd.col as usize, own, d)
                }
                _ => co.soft[a],
            };
        }
        let pe = match nd.kind {
            Kind::Mac if nd.phase == 3 => {
                let next = if self.layout.outputs_here {
                    lo
                } else {
                    self.starts[(a + 1) % (self.starts.len() - 1)]
                };
                let idx = (nd.col as usize * keys + nth) as f64;
                let ends = &self.shares[u];
                next + ends
                    .iter()
                    .position(|&end| idx < end)
                    .unwrap_or(ends.len() - 1)
            }
            // Phase 1 in contiguous runs of products, a score's chain crossing at most into
            // the next PE; a maximum where the last of its scores ends. With shared scores,
            // each on the arc that computes it, at its rank there.
            Kind::Mac => match self.scored_at(nd) {
                Some((at, _, rank)) => {
                    let (lo, hi) = arc(self.arc_of[at]);
                    let own = self.own[at].max(1);
                    lo + p1_offset(
                        self.shared_rank(rank, own),
                        nd.col as usize,
                        own,
                        d,
                        hi - lo,
                    )
                }
                None => lo + p1_offset(mine, nd.col as usize, own, d, scoring),
            },
            Kind::Max => match self.pairing {
                Some(_) => hi - 1,
                None => lo + p1_offset(mine, d - 1, own, d, scoring),
            },
            Kind::Exp | Kind::Div => hi - 1,
        };
        pe % m
    }
}

/// The sizes of arcs whose rows have `keys` keys and compute `own` scores between them (see
/// [`Systolic`]), laid in this order round `m` PEs, each previous to the next and the last to
/// the first.
fn arc_sizes(keys: &[usize], own: &[usize], d: usize, m: usize, layout: Layout) -> Vec<usize> {
    let units = keys.len();
    if layout.outputs_here {
        // A row's whole work on its own arc: every arc alike (one PE each where it is tried).
        return (0..units)
            .map(|s| (s + 1) * m / units - s * m / units)
            .collect();
    }
    let work = |s: usize| {
        let (k, prev) = (keys[s], keys[(s + units - 1) % units]);
        match layout.sizing {
            Sizing::Arc => own[s] * d + k * 3 + prev * d,
            Sizing::Row => own[s] * d + k * (d + 3),
            Sizing::Peak | Sizing::Estimated => own[s].max(prev) * d + k * 3,
        }
    };
    let total: usize = (0..units).map(work).sum::<usize>().max(1);
    let mut cut = Vec::with_capacity(units + 1);
    let mut sum = 0;
    for s in 0..units {
        cut.push(sum * m / total);
        sum += work(s);
    }
    cut.push(m);
    let sizes: Vec<usize> = cut.windows(2).map(|w| w[1] - w[0]).collect();
    match layout.sizing {
        Sizing::Estimated => refine(own, keys, d, sizes, layout.last_takes_outputs),
        _ => sizes,
    }
}

/// When the rows of arc `s` end in the systolic layout, roughly, with arcs of `sizes` PEs (two
/// rows on an arc counted as one of their keys together): its scores on its own arc, the maximum's tree, one exponential per cycle, then the later of the
/// last weight reaching the last lane and the lanes' skewed share of the outputs.
fn estimated_end(
    own: &[usize],
    keys: &[usize],
    d: usize,
    sizes: &[usize],
    s: usize,
    last: bool,
) -> usize {
    let k = keys[s].max(1);
    let a = sizes[s].max(1);
    let next = (s + 1) % sizes.len();
    let lanes = sizes[next].saturating_sub(1);
    let tree = k.next_power_of_two().trailing_zeros() as usize + a / 2;
    let z = (own[s].max(1) * d).div_ceil(a) + tree + k;
    let outputs = fill_level(k * d, &lane_starts(sizes[next], keys[next], last)).ceil() as usize;
    z + outputs.max(k + lanes) + 1
}

/// Moves one PE at a time into the arc of the row estimated to end last, or into the arc that
/// takes its outputs, from the arc whose loss costs least, while the latest end improves.
fn refine(
    own: &[usize],
    keys: &[usize],
    d: usize,
    mut sizes: Vec<usize>,
    last: bool,
) -> Vec<usize> {
    let units = sizes.len();
    if units < 2 || sizes.iter().sum::<usize>() < units {
        return sizes;
    }
    // Every row an arc of its own first: rounding leaves short rows none.
    while let Some(empty) = sizes.iter().position(|&a| a == 0) {
        let (largest, _) = sizes
            .iter()
            .enumerate()
            .max_by_key(|&(_, &a)| a)
            .unwrap_or((0, &0));
        sizes[largest] -= 1;
        sizes[empty] += 1;
    }
    // The latest end, how many rows end then, and one of them.
    let latest = |sizes: &[usize]| {
        let ends: Vec<usize> = (0..units)
            .map(|s| estimated_end(own, keys, d, sizes, s, last))
            .collect();
        let end = ends.iter().copied().max().unwrap_or(0);
        let at: Vec<usize> = (0..units).filter(|&s| ends[s] == end).collect();
        ((end, at.len()), at.first().copied().unwrap_or(0))
    };
    let total: usize = sizes.iter().sum();
    for _ in 0..total {
        let (now, worst) = latest(&sizes);
        let mut best: Option<((usize, usize), Vec<usize>)> = None;
        for to in [worst, (worst + 1) % units] {
            for from in (0..units).filter(|&f| f != to && sizes[f] > 1) {
                let mut next = sizes.clone();
                next[to] += 1;
                next[from] -= 1;
                let (end, _) = latest(&next);
                if end < now && best.as_ref().is_none_or(|b| end < b.0) {
                    best = Some((end, next));
                }
            }
        }
        match best {
            Some((_, next)) => sizes = next,
            None => break,
        }
    }
    sizes
}

/// With q = k = v and shared scores, the row whose arc computes the score of rows `i ≥ j` of
/// `n`, and how far round the rows the other one is from it: each row computes its own and
/// those of the next `⌈n / 2⌉ − 1` rows (cyclically), and with `n` even the pairs half-way
/// round go one way or the other by parity, so every arc computes about `(n + 1) / 2` scores
/// and each travels forward.
fn pair_arc(i: usize, j: usize, n: usize) -> (usize, usize) {
    let t = i - j;
    match (2 * t).cmp(&n) {
        _ if t == 0 => (i, 0),
        std::cmp::Ordering::Less => (j, t),
        std::cmp::Ordering::Greater => (i, n - t),
        std::cmp::Ordering::Equal if j.is_multiple_of(2) => (j, t),
        std::cmp::Ordering::Equal => (i, t),
    }
}

/// The units (`head · tokens + row`) of each arc, arcs in their order round the ring, by
/// `own`, the units' numbers of scores computed on their arcs.
fn ring_order(
    n: usize,
    heads: usize,
    layout: Layout,
    own: impl Fn(usize) -> usize,
) -> Vec<Vec<usize>> {
    let per_arc = if layout.two_rows { 2 } else { 1 };
    let mut out = Vec::new();
    for head in 0..heads {
        let mut rows: Vec<usize> = (head * n..(head + 1) * n).collect();
        rows.sort_by_key(|&u| std::cmp::Reverse(own(u)));
        let arcs: Vec<Vec<usize>> = rows.chunks(per_arc).map(<[usize]>::to_vec).collect();
        match layout.order {
            Order::LongestFirst => out.extend(arcs),
            Order::Zigzag => {
                out.extend(arcs.iter().step_by(2).cloned());
                out.extend(arcs.iter().skip(1).step_by(2).rev().cloned());
            }
        }
    }
    out
}

/// The PE, counted from its arc's first, of product `c` of score `nth` in the systolic layout:
/// the row's `keys · d` products cut evenly over `pes` PEs in key order.
fn p1_offset(nth: usize, c: usize, keys: usize, d: usize, pes: usize) -> usize {
    (nth * d + c) * pes / (keys * d)
}

/// When the lanes starting at `starts` (cycles, increasing) finish `total` products between
/// them, each working from its start on: the level `E` at which `Σ max(0, E − start)` is `total`.
fn fill_level(total: usize, starts: &[usize]) -> f64 {
    let mut sum = 0.0;
    let mut level = 0.0;
    for (j, &st) in starts.iter().enumerate() {
        sum += st as f64;
        level = (total as f64 + sum) / (j + 1) as f64;
        if starts.get(j + 1).is_none_or(|&next| level <= next as f64) {
            break;
        }
    }
    level
}

/// Where each lane's share of `total` output products ends, cumulatively, on lanes that start at
/// `starts` (a lane one hop further down the stream of weights gets them a cycle later; the
/// arc's last PE only once it has divided its own row): each takes what it can finish by the
/// common level. Product `i` goes to the first lane whose end is above `i`.
fn share_ends(total: usize, starts: &[usize]) -> Vec<f64> {
    // Too few products for every lane one hop apart to get one: cut them evenly over those.
    let lanes = starts
        .iter()
        .enumerate()
        .take_while(|&(l, &st)| l == st)
        .count();
    if total < lanes * (lanes - 1) / 2 + lanes {
        return (1..=lanes)
            .map(|l| (l * total) as f64 / lanes as f64)
            .collect();
    }
    let level = fill_level(total, starts);
    let mut end = 0.0;
    starts
        .iter()
        .map(|&st| {
            end += (level - st as f64).max(0.0);
            end
        })
        .collect()
}

/// The start of each PE of an arc of `pes` taking outputs, counted from the first weight: one
/// cycle apart, all but the arc's last PE (on an arc of one PE, that one), and with `last` the
/// last one too, after the `after` divisions of its own row.
fn lane_starts(pes: usize, after: usize, last: bool) -> Vec<usize> {
    let lanes = pes.saturating_sub(1);
    let mut starts: Vec<usize> = (0..lanes.max(1)).collect();
    if last && lanes > 0 {
        starts.push(after.max(lanes));
    }
    starts
}

/// A deterministic stream of numbers for the perturbed orders.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// One schedule of graph `g` under `rules`.
fn place_all(
    p: &Problem,
    pes: u32,
    g: &[Node],
    bl: &[u32],
    rules: Rules,
    systolic: Option<&Systolic>,
) -> Result<RingSchedule, Vec<ScheduleError>> {
    let m = pes as usize;
    let units = (p.heads * p.tokens).max(1) as usize;
    // Longest path first; a perturbed order adds up to one level of noise per operation, which
    // keeps every operand before its readers (their levels differ by at least one).
    let mut order: Vec<usize> = (0..g.len()).collect();
    let top = u64::from(bl.iter().copied().max().unwrap_or(0)) + 1;
    let key = |i: usize| {
        let noise = if rules.seed == 0 {
            0
        } else {
            mix(rules.seed ^ (i as u64).wrapping_mul(0x2545_F491)) % 1000
        };
        let ahead = systolic.map_or(0, |sy| sy.ahead(&g[i], top));
        (
            (u64::from(bl[i]) + ahead) * 1000 + noise,
            std::cmp::Reverse(i),
        )
    };
    // Each key once: the systolic layout's part of it looks up the score's arc and place.
    order.sort_by_cached_key(|&i| std::cmp::Reverse(key(i)));
    let mut pl = Placer {
        p,
        m,
        g,
        slots: Slots {
            op: vec![Vec::new(); m],
            link: vec![Vec::new(); m],
        },
        b: Builder::new(NAME, pes),
        out: vec![None; g.len()],
        sum: vec![None; g.len()],
        copies: HashMap::default(),
        scratch: vec![(vec![FAR; m], vec![0; m]); 3],
        holds: vec![false; m],
        systolic,
    };
    for i in order {
        let anchor = if rules.anchors {
            g[i].unit as usize * m / units
        } else {
            0
        };
        pl.place(i, anchor, rules);
        if pl.b.failed() {
            break;
        }
    }
    pl.b.finish()
}

/// Tries the tie-break rules and, on small layers, perturbed orders; keeps the shortest.
pub fn run(p: &Problem, pes: u32) -> Result<RingSchedule, Vec<ScheduleError>> {
    run_form(p, pes, Pairs::Shared)
}

/// [`run`] with the rows of a q = k = v layer computing scores of their own (recomputed
/// products, for `schedule-wide`, which declares them): every row all of its scores where
/// `auto` would try the pass, and where a head has a part of the ring of its own
/// ([`near_pairs`]), also each row those of the rows farther than half the head away; the
/// shorter schedule, or nothing where neither applies.
pub(crate) fn run_mirrored(
    p: &Problem,
    pes: u32,
) -> Result<Option<RingSchedule>, Vec<ScheduleError>> {
    let mut best = None;
    if Dag.tried_by_auto(p, pes) {
        best = Some(run_form(p, pes, Pairs::Mirrored)?);
    }
    if let Some(pairs) = near_pairs(p, pes) {
        let s = run_form(p, pes, pairs)?;
        if best
            .as_ref()
            .is_none_or(|b: &RingSchedule| s.cycles() < b.cycles())
        {
            best = Some(s);
        }
    }
    Ok(best)
}

/// The pairs shared when only the near ones are: with several heads on a ring with room for
/// the systolic layout, each head's rows lie on a part of the ring that is not a ring itself,
/// so a score shared round the head's rows cyclically goes round the whole ring from its last
/// rows to its first. In index order instead, the pairs at most `n / 2` rows apart are shared
/// (computed upstream, travelling at most half the head's part) and the rest computed by both
/// rows. Measured on 4 heads on 256 PEs with reaches 2, 4 to 8 and 11 (12 tokens, `d = 64`),
/// 4 to 7 (12 tokens, `d = 128`) and 4 to 6 and 8 to 10 (16 tokens, `d = 64`): `n / 2` was
/// the shortest or within 1 % of it. Cyclic near pairs on one head are not tried: against the
/// shortest of the other runs they took 283 cycles for 285 (12 tokens, `d = 64`, 64 PEs), 459
/// for 451 (16 tokens) and 558 for 545 (32 tokens on 256 PEs), for another whole run.
fn near_pairs(p: &Problem, pes: u32) -> Option<Pairs> {
    let units = p.heads * p.tokens;
    let applies = p.symmetric && !p.causal && p.heads > 1 && pes >= 2 * units && p.tokens > 2;
    let fits = p.copies && pes >= COPIES_MIN_PES && p.necessary_ops() <= NEAR_MAX_OPS;
    (applies && fits).then_some(Pairs::Near {
        reach: p.tokens as usize / 2,
        cyclic: false,
    })
}

/// Whether the systolic layout is tried: rows on arcs of their own need two PEs per row, or
/// exactly one where each row also takes its own outputs ([`Layout::outputs_here`]).
fn systolic_applies(p: &Problem, pes: u32) -> bool {
    let units = (p.heads * p.tokens) as usize;
    pes as usize >= 2 * units || pes as usize == units
}

/// The systolic layouts tried: every sizing, with and without the arcs' last PEs taking
/// outputs, one or two rows to an arc (with shared scores one, the farthest-travelling at either
/// end of it, whole or fractional arcs, and each also with the farthest computed first), and
/// under the causal mask, where rows differ in length, both orders round the ring. With exactly
/// one PE to a row, one layout (two with shared scores): each row takes its own outputs.
fn systolic_rules(p: &Problem, pes: u32, pairs: Pairs) -> Vec<Rules> {
    // With shared scores, each layout also with the farthest-travelling computed first.
    let firsts: &[bool] = if shares_scores(p, pairs) {
        &[false, true]
    } else {
        &[false]
    };
    let rule = |layout| Rules {
        anchors: false,
        fewer_hops: true,
        seed: 0,
        systolic: Some(layout),
    };
    if pes == p.heads * p.tokens {
        return firsts
            .iter()
            .map(|&far_first| {
                rule(Layout {
                    sizing: Sizing::Row,
                    order: Order::LongestFirst,
                    last_takes_outputs: false,
                    two_rows: false,
                    outputs_here: true,
                    far_last: false,
                    continuous: false,
                    far_first,
                    cross_first: false,
                })
            })
            .collect();
    }
    let orders: &[Order] = if p.causal {
        &[Order::LongestFirst, Order::Zigzag]
    } else {
        &[Order::LongestFirst]
    };
    // Shared scores keep one row to an arc, and lay the farthest-travelling at either end of it;
    // other rows take one or two to an arc.
    let (two, far): (&[bool], &[bool]) = if shares_scores(p, pairs) {
        (&[false], &[false, true])
    } else {
        (&[false, true], &[false])
    };
    let mut rules = Vec::new();
    // Near pairs only on fractional arcs, which every layer measured with them chose.
    let whole = !pairs.is_near();
    for &far_first in firsts {
        for &two_rows in two.iter().filter(|_| whole) {
            for &far_last in far {
                for &order in orders {
                    for last_takes_outputs in [false, true] {
                        for sizing in [Sizing::Arc, Sizing::Row, Sizing::Peak, Sizing::Estimated] {
                            rules.push(rule(Layout {
                                sizing,
                                order,
                                last_takes_outputs,
                                two_rows,
                                outputs_here: false,
                                far_last,
                                continuous: false,
                                far_first,
                                cross_first: false,
                            }));
                        }
                    }
                }
            }
        }
        // Shared scores also on fractional arcs, where sizing and the last PEs' outputs do not
        // apply; with near pairs and the farthest first, also with crossing chains first.
        let crosses: &[bool] = if !whole && far_first {
            &[false, true]
        } else {
            &[false]
        };
        for &far_last in far.iter().filter(|_| shares_scores(p, pairs)) {
            for &cross_first in crosses {
                rules.push(rule(Layout {
                    sizing: Sizing::Arc,
                    order: Order::LongestFirst,
                    last_takes_outputs: false,
                    two_rows: false,
                    outputs_here: false,
                    far_last,
                    continuous: true,
                    far_first,
                    cross_first,
                }));
            }
        }
    }
    rules
}

/// The forms of the graph tried: output chains in key order and rotated, and with shared scores
/// on layers of up to `AUTO_OPS` operations both shapes of the maximum's tree (the tree in
/// arrival order only for the systolic layout, whose arcs it follows).
fn forms(p: &Problem, pairs: Pairs) -> Vec<Form> {
    let arrivals: &[bool] = if shares_scores(p, pairs) && p.necessary_ops() <= AUTO_OPS {
        &[false, true]
    } else {
        &[false]
    };
    // Near pairs with output chains in key order only: rotated, they took 540 cycles where
    // key order took 304 (12 tokens, `d = 64`, 4 heads on 256 PEs), and lost on every layer
    // measured.
    let rotations: &[bool] = if pairs.is_near() {
        &[false]
    } else {
        &[false, true]
    };
    let mut out = Vec::new();
    for &arrival in arrivals {
        for &rotate in rotations {
            out.push(Form {
                pairs,
                rotate,
                arrival,
            });
        }
    }
    out
}

/// Every schedule of the systolic layout that [`run`] tries (every sizing, every form of the
/// graph), whether or not it is the one kept: for tests that prove them all.
pub fn systolic_layouts(p: &Problem, pes: u32) -> Result<Vec<RingSchedule>, Vec<ScheduleError>> {
    let pairs = Pairs::Shared;
    let tries: Vec<(Rules, Option<Systolic>)> = systolic_rules(p, pes, pairs)
        .into_iter()
        .map(|r| {
            let sy = r
                .systolic
                .map(|layout| Systolic::new(p, pes as usize, layout, pairs));
            (r, sy)
        })
        .collect();
    place_every(p, pes, pairs, &tries)
}

/// Every schedule of the run with near pairs shared that `schedule-wide` makes ([`near_pairs`]:
/// every layout, every form of the graph), whether or not it is the one kept; none where that
/// run does not apply. For tests that prove them all.
pub fn near_layouts(p: &Problem, pes: u32) -> Result<Vec<RingSchedule>, Vec<ScheduleError>> {
    let Some(pairs) = near_pairs(p, pes) else {
        return Ok(Vec::new());
    };
    let tries = built_layouts(p, pes, systolic_rules(p, pes, pairs), pairs);
    place_every(p, pes, pairs, &tries)
}

/// The schedule of each of `tries` under every form of the graph [`forms`] gives for `pairs`.
fn place_every(
    p: &Problem,
    pes: u32,
    pairs: Pairs,
    tries: &[(Rules, Option<Systolic>)],
) -> Result<Vec<RingSchedule>, Vec<ScheduleError>> {
    let mut out = Vec::new();
    for form in forms(p, pairs) {
        let g = graph(p, form);
        let bl = bottom_levels(&g);
        for (rules, sy) in tries {
            out.push(place_all(p, pes, &g, &bl, *rules, sy.as_ref())?);
        }
    }
    Ok(out)
}

/// `rules` with their systolic layouts built (once per run: a layout depends on neither form of
/// the graph), without those that place every operation as an earlier one does: sizings
/// differ only in where the arcs start, and where every row is alike several give the same
/// arcs, so the same schedule.
fn built_layouts(
    p: &Problem,
    pes: u32,
    rules: Vec<Rules>,
    pairs: Pairs,
) -> Vec<(Rules, Option<Systolic>)> {
    let mut out: Vec<(Rules, Option<Systolic>)> = Vec::with_capacity(rules.len());
    for r in rules {
        let sy = r
            .systolic
            .map(|layout| Systolic::new(p, pes as usize, layout, pairs));
        let repeat = sy.as_ref().is_some_and(|sy| {
            out.iter()
                .any(|(_, seen)| seen.as_ref().is_some_and(|seen| seen.places_as(sy)))
        });
        if !repeat {
            out.push((r, sy));
        }
    }
    out
}

fn run_form(p: &Problem, pes: u32, pairs: Pairs) -> Result<RingSchedule, Vec<ScheduleError>> {
    let mut tries = Vec::new();
    // Above `AUTO_OPS` the free placement takes seconds and lost to the systolic layout on
    // every large layer measured, so where that layout applies it is tried alone; so too with
    // near pairs, which are tried only for that layout and beside the mirrored run.
    let near = pairs.is_near();
    let systolic_alone = systolic_applies(p, pes) && p.necessary_ops() > AUTO_OPS;
    if !(near || systolic_alone) {
        for anchors in [true, false] {
            for fewer_hops in [true, false] {
                tries.push(Rules {
                    anchors,
                    fewer_hops,
                    seed: 0,
                    systolic: None,
                });
            }
        }
    }
    if !near && p.necessary_ops() <= RETRY_MAX_OPS {
        for seed in 1..=RETRIES {
            tries.push(Rules {
                anchors: seed % 2 == 1,
                fewer_hops: true,
                seed,
                systolic: None,
            });
        }
    }
    if systolic_applies(p, pes) {
        tries.extend(systolic_rules(p, pes, pairs));
    }
    let tries = built_layouts(p, pes, tries, pairs);
    let mut best: Option<RingSchedule> = None;
    for form in forms(p, pairs) {
        let g = graph(p, form);
        let bl = bottom_levels(&g);
        for (rules, sy) in tries
            .iter()
            .filter(|(r, _)| !form.arrival || r.systolic.is_some())
        {
            let s = place_all(p, pes, &g, &bl, *rules, sy.as_ref())?;
            if best.as_ref().is_none_or(|b| s.cycles() < b.cycles()) {
                best = Some(s);
            }
        }
    }
    best.ok_or_else(|| {
        vec![ScheduleError::Internal {
            pass: NAME,
            what: "no schedule tried".into(),
        }]
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use runtime::layer::Softmax;

    fn problem(n: u32, d: u32, heads: u32, symmetric: bool, causal: bool) -> Problem {
        Problem {
            tokens: n,
            dim: d,
            heads,
            scale: 0.5,
            symmetric,
            shared_values: symmetric,
            causal,
            softmax: Softmax::Safe,
            copies: true,
        }
    }

    /// Every score of a head is computed exactly where [`Pairing`] says: a shared one once, on
    /// one of its two rows' arcs, reaching the other forward (in index order without wrapping
    /// round the head when not cyclic, and no farther than `reach`); a mirrored one by each row
    /// for itself; each arc's places are `0 … own − 1`, farthest-travelling first.
    #[test]
    fn pairings_place_every_score_once_per_reader_or_pair() {
        for n in 1..=13usize {
            let mut options = vec![Pairs::Shared, Pairs::Mirrored];
            for reach in 0..n {
                for cyclic in [false, true] {
                    options.push(Pairs::Near { reach, cyclic });
                }
            }
            for pairs in options {
                let pr = Pairing::new(n, pairs);
                let what = format!("{n} tokens, {pairs:?}");
                let mut computed = vec![Vec::new(); n];
                let mut shared_pairs = 0;
                for i in 0..n {
                    for j in 0..n {
                        let (at, t, shared) = pr.of(i, j);
                        assert_eq!(shared, pr.of(j, i).2, "{what}: ({i}, {j})");
                        if shared {
                            assert_eq!(pr.of(j, i), (at, t, shared), "{what}: ({i}, {j})");
                            let other = if at == i { j } else { i };
                            assert!(at == i || at == j, "{what}: ({i}, {j}) on row {at}");
                            let forward = match pairs {
                                Pairs::Near { cyclic: false, .. } => other.checked_sub(at),
                                _ => Some((other + n - at) % n),
                            };
                            assert_eq!(forward, Some(t), "{what}: ({i}, {j})");
                            if let Pairs::Near { reach, .. } = pairs {
                                assert!(t <= reach, "{what}: ({i}, {j})");
                            }
                            if j < i {
                                shared_pairs += 1;
                            }
                        } else {
                            assert_eq!((at, t), (i, 0), "{what}: ({i}, {j})");
                            assert!(i != j && pairs != Pairs::Shared, "{what}: ({i}, {j})");
                        }
                        if pr.builds(i, j) {
                            computed[at].push((t, pr.rank[i * n + j]));
                        }
                    }
                }
                // Each unordered pair shared once or computed by both rows.
                let builds: usize = computed.iter().map(Vec::len).sum();
                assert_eq!(
                    builds,
                    n + shared_pairs + 2 * (n * (n - 1) / 2 - shared_pairs)
                );
                for (a, list) in computed.iter_mut().enumerate() {
                    assert_eq!(list.len(), pr.own[a], "{what}: row {a}");
                    list.sort_by_key(|&(_, rank)| rank);
                    let ranks: Vec<usize> = list.iter().map(|&(_, r)| r).collect();
                    assert_eq!(
                        ranks,
                        (0..list.len()).collect::<Vec<_>>(),
                        "{what}: row {a}"
                    );
                    assert!(list.windows(2).all(|w| w[0].0 >= w[1].0), "{what}: row {a}");
                }
                if pairs == Pairs::Shared {
                    assert_eq!(shared_pairs, n * (n - 1) / 2, "{what}");
                    // About half the pairs on each arc.
                    assert!(pr.own.iter().all(|&o| o.abs_diff(n / 2 + 1) <= 1), "{what}");
                }
            }
        }
    }

    /// Every layout [`built_layouts`] drops schedules, cycle for cycle and operation for
    /// operation, as the kept one with the same arcs and the same other choices; and it drops
    /// some (rows alike give several sizings the same arcs), so the test can fail.
    #[test]
    fn dropped_layouts_repeat_kept_ones() -> Result<(), Vec<ScheduleError>> {
        let mut dropped = 0;
        for (n, d, heads, m) in [(4, 8, 1, 16), (6, 8, 2, 36), (5, 16, 1, 20), (3, 8, 1, 3)] {
            for (symmetric, causal) in [(false, false), (true, false), (false, true)] {
                let p = problem(n, d, heads, symmetric, causal);
                // Every layout, repeats included.
                let all: Vec<(Rules, Systolic)> = systolic_rules(&p, m, Pairs::Shared)
                    .into_iter()
                    .filter_map(|r| {
                        let layout = r.systolic?;
                        Some((r, Systolic::new(&p, m as usize, layout, Pairs::Shared)))
                    })
                    .collect();
                let kept =
                    built_layouts(&p, m, systolic_rules(&p, m, Pairs::Shared), Pairs::Shared);
                dropped += all.len() - kept.len();
                let form = Form {
                    pairs: Pairs::Shared,
                    rotate: true,
                    arrival: false,
                };
                let g = graph(&p, form);
                let bl = bottom_levels(&g);
                for (r, sy) in &all {
                    let twins: Vec<_> = kept
                        .iter()
                        .filter_map(|(k, ksy)| Some((k, ksy.as_ref()?)))
                        .filter(|(_, ksy)| ksy.places_as(sy))
                        .collect();
                    assert_eq!(twins.len(), 1, "{n} tokens on {m} PEs, {r:?}");
                    for (k, ksy) in twins {
                        let theirs = place_all(&p, m, &g, &bl, *k, Some(ksy))?.to_string();
                        let ours = place_all(&p, m, &g, &bl, *r, Some(sy))?.to_string();
                        assert_eq!(ours, theirs, "{n} tokens on {m} PEs, {r:?}");
                    }
                }
            }
        }
        assert!(dropped > 0);
        Ok(())
    }
}
