//! `reroll`: turns a PE's flat program back into hardware loops (ISA format 3).
//!
//! The unrolled schedulers decide every cycle of every PE, and codegen writes one bundle per
//! cycle; a layer of a few million operations is then tens of megabytes of microcode that is
//! almost entirely repetition (the same multiply-accumulate over a row, the same row over a
//! block, the same block over the heads). This pass finds that repetition again: a run of `r`
//! consecutive blocks of `k` nodes that have the same form and whose addresses (and loop trip
//! counts) advance by a constant per block becomes one loop of `r` iterations over the first
//! block, with the advance as affine terms (and, for trip counts, a stepped count). It repeats
//! on its own result, so rows inside blocks inside heads become loop nests.
//!
//! The result is exact by construction — a fold only ever replaces blocks that its loop
//! reproduces bundle for bundle — and [`isa::LoopProgram::flatten`] of it is the input program
//! (property-tested). Nothing is assumed about the scheduler that made the program.
//!
//! Cost is near-linear: every sweep compares each node with the node `k` places on for each
//! block length `k` up to [`MAX_BLOCK`], and each sweep that folds anything shrinks the list.

use isa::looped::field;
use isa::{
    Acc, AccSrc, Bundle, CountStep, Field, LBundle, Loop, LoopProgram, Node, Op, Program, Term,
    Xfer, XferSrc, MAX_LOOP_DEPTH,
};
use rustc_hash::FxHashMap as HashMap;

pub const NAME: &str = "reroll";
pub const DESCRIPTION: &str =
    "folds each PE's flat program into loops with affine addresses (exact; see --flat)";

/// Longest block, in nodes of the current list, whose repetitions are looked for. Rows of the
/// unrolled schedules fold to a handful of nodes each, so their repetitions are short blocks;
/// a longer limit costs time on irregular stretches for little gain.
const MAX_BLOCK: usize = 24;

/// A node under construction. Levels are relative, counted outwards from the node (0: the
/// innermost loop enclosing it), so wrapping a node in a new loop never renumbers it.
#[derive(Clone, Debug)]
enum RNode {
    Bundle(RBundle),
    Loop(RLoop),
}

#[derive(Clone, Debug)]
struct RBundle {
    bundle: Bundle,
    /// `(field, relative level, stride)`.
    terms: Vec<(Field, u8, i32)>,
}

#[derive(Clone, Debug)]
struct RLoop {
    count: u32,
    /// `(relative level, per)`: the trip count is `count + per · i` of that enclosing loop.
    step: Option<(u8, i16)>,
    body: Vec<RNode>,
}

/// The form of a node with its base addresses (and variable trip counts) left out: two nodes of
/// the same shape differ only in their parameters.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
enum Key {
    Bundle {
        slots: u64,
        imm: u32,
        terms: Vec<(Field, u8, i32)>,
    },
    Loop {
        /// `None` when the count is a parameter.
        count: Option<u32>,
        step: Option<(u8, i16)>,
        body: Vec<u32>,
    },
}

/// One node of the list being folded, with what the comparisons need.
struct Item {
    node: RNode,
    shape: u32,
    /// The base addresses of its bundles and the variable trip counts of its loops, in
    /// pre-order (see [`Describer::describe`]).
    params: Vec<i64>,
    /// Loops nested in the node, counting itself.
    depth: u8,
}

#[derive(Default)]
struct Interner {
    ids: HashMap<Key, u32>,
    /// Whether folds may make stepped trip counts.
    no_steps: bool,
}

impl Interner {
    fn id(&mut self, k: Key) -> u32 {
        let next = self.ids.len() as u32;
        *self.ids.entry(k).or_insert(next)
    }
}

/// The slots of a bundle without their addresses: op kind, whether it stores, the kinds of the
/// acc and xfer slots and whether they store.
fn slot_key(b: &Bundle) -> (u64, u32) {
    let (op, imm, dst) = match b.op {
        Op::Nop => (0u64, 0u32, 0u64),
        Op::Arith(x) => (
            u64::from(x.kind.info().code),
            x.imm.to_bits(),
            u64::from(x.dst.is_some()),
        ),
    };
    let acc = match b.acc {
        Acc::Nop => 0u64,
        Acc::Add { src, dst } => {
            (match src {
                AccSrc::Zero => 1,
                AccSrc::Mem(_) => 2,
            }) | (u64::from(dst.is_some()) << 2)
        }
    };
    let xfer = match b.xfer {
        Xfer::Nop => 0u64,
        Xfer::Send { src, .. } => match src {
            XferSrc::Mem(_) => 1,
            XferSrc::Acc => 2,
        },
    };
    (op | dst << 8 | acc << 9 | xfer << 12, imm)
}

fn contains_step(nodes: &[RNode]) -> bool {
    nodes.iter().any(|n| match n {
        RNode::Bundle(_) => false,
        RNode::Loop(l) => l.step.is_some() || contains_step(&l.body),
    })
}

/// Whether a loop's trip count may vary between two nodes of one shape: only where a fold
/// could make it a stepped count the format allows (not stepped already, no stepped loop
/// inside it or around it).
fn count_is_param(l: &RLoop, in_stepped: bool, no_steps: bool) -> bool {
    !no_steps && l.step.is_none() && !in_stepped && !contains_step(&l.body)
}

struct Describer<'a> {
    interner: &'a mut Interner,
    params: Vec<i64>,
}

impl Describer<'_> {
    /// Shape id and loop depth of `n`; appends its parameters.
    fn describe(&mut self, n: &RNode, in_stepped: bool) -> (u32, u8) {
        match n {
            RNode::Bundle(b) => {
                for f in Field::ALL {
                    if let Some(a) = field(&b.bundle, f) {
                        self.params.push(i64::from(a));
                    }
                }
                let (slots, imm) = slot_key(&b.bundle);
                let key = Key::Bundle {
                    slots,
                    imm,
                    terms: b.terms.clone(),
                };
                (self.interner.id(key), 0)
            }
            RNode::Loop(l) => {
                let param = count_is_param(l, in_stepped, self.interner.no_steps);
                if param {
                    self.params.push(i64::from(l.count));
                }
                let inner = in_stepped || l.step.is_some();
                let mut body = Vec::with_capacity(l.body.len());
                let mut depth = 0;
                for c in &l.body {
                    let (s, d) = self.describe(c, inner);
                    body.push(s);
                    depth = depth.max(d);
                }
                let key = Key::Loop {
                    count: (!param).then_some(l.count),
                    step: l.step,
                    body,
                };
                (self.interner.id(key), depth + 1)
            }
        }
    }
}

fn item(node: RNode, interner: &mut Interner) -> Item {
    // A bundle has at most one parameter per field; sized for that, the first push is the
    // only allocation of the flat program's items.
    let mut d = Describer {
        interner,
        params: Vec::with_capacity(Field::ALL.len()),
    };
    let (shape, depth) = d.describe(&node, false);
    Item {
        node,
        shape,
        params: d.params,
        depth,
    }
}

/// Adds the per-iteration advance `delta` (in the order of [`Describer::describe`]) to a node
/// that becomes the body of a new loop, `within` loops inside it. Refuses (leaving `n` partly
/// changed, so callers work on a copy) an advance the format cannot express.
struct Advance<'a> {
    delta: &'a [i64],
    at: usize,
    no_steps: bool,
}

impl Advance<'_> {
    fn next(&mut self) -> Option<i64> {
        let d = self.delta.get(self.at).copied();
        self.at += 1;
        d
    }

    /// `stepping`: an enclosing loop inside the new one gets a stepped count in this fold.
    fn apply(&mut self, n: &mut RNode, within: u8, in_stepped: bool, stepping: bool) -> bool {
        match n {
            RNode::Bundle(b) => {
                for f in Field::ALL {
                    if field(&b.bundle, f).is_none() {
                        continue;
                    }
                    let Some(d) = self.next() else { return false };
                    if d != 0 {
                        let Ok(stride) = i32::try_from(d) else {
                            return false;
                        };
                        b.terms.push((f, within, stride));
                    }
                }
                // Sorted by field then level (outermost first), the order the format wants once
                // levels are absolute: a larger relative level is further out.
                b.terms.sort_by(|x, y| x.0.cmp(&y.0).then(y.1.cmp(&x.1)));
                true
            }
            RNode::Loop(l) => {
                let mut now_stepped = false;
                if count_is_param(l, in_stepped, self.no_steps) {
                    let Some(d) = self.next() else { return false };
                    if d != 0 {
                        let Ok(per) = i16::try_from(d) else {
                            return false;
                        };
                        if stepping {
                            return false;
                        }
                        l.step = Some((within, per));
                        now_stepped = true;
                    }
                }
                let inner = in_stepped || (l.step.is_some() && !now_stepped);
                for c in &mut l.body {
                    if !self.apply(c, within + 1, inner, stepping || now_stepped) {
                        return false;
                    }
                }
                true
            }
        }
    }
}

/// Tries to fold `items[i..i + r·k]` (blocks of `k`, each advancing by `delta` on the one
/// before) into one loop.
fn fold(
    items: &[Item],
    k: usize,
    r: usize,
    delta: &[i64],
    interner: &mut Interner,
) -> Option<Item> {
    let mut body = Vec::with_capacity(k);
    let mut at = 0;
    for it in &items[..k] {
        let mut n = it.node.clone();
        let len = it.params.len();
        let mut adv = Advance {
            delta: &delta[at..at + len],
            at: 0,
            no_steps: interner.no_steps,
        };
        if !adv.apply(&mut n, 0, false, false) {
            return None;
        }
        at += len;
        body.push(n);
    }
    let node = RNode::Loop(RLoop {
        count: u32::try_from(r).ok()?,
        step: None,
        body,
    });
    let it = item(node, interner);
    (usize::from(it.depth) <= MAX_LOOP_DEPTH).then_some(it)
}

/// One sweep for block length `k`: every maximal run of `min_reps` or more blocks that advance
/// affinely is folded, scanning left to right.
fn sweep(
    items: Vec<Item>,
    k: usize,
    min_reps: usize,
    interner: &mut Interner,
) -> (Vec<Item>, bool) {
    let n = items.len();
    if n < 2 * k {
        return (items, false);
    }
    let same_shape = |a: usize, b: usize| (0..k).all(|j| items[a + j].shape == items[b + j].shape);
    let mut out: Vec<Item> = Vec::with_capacity(n);
    let mut changed = false;
    let mut delta: Vec<i64> = Vec::new();
    let mut i = 0;
    // Items are moved out of `items` as they are passed; `taken` marks how far.
    let mut keep = vec![true; n];
    let mut folded: Vec<(usize, usize, Item)> = Vec::new();
    while i + 2 * k <= n {
        if items[i].shape != items[i + k].shape
            || items[i..i + k]
                .iter()
                .any(|it| usize::from(it.depth) >= MAX_LOOP_DEPTH)
            || !same_shape(i, i + k)
        {
            i += 1;
            continue;
        }
        delta.clear();
        for j in 0..k {
            let (a, b) = (&items[i + j].params, &items[i + k + j].params);
            delta.extend(a.iter().zip(b).map(|(x, y)| y - x));
        }
        let mut r = 2;
        'more: while i + (r + 1) * k <= n && same_shape(i + (r - 1) * k, i + r * k) {
            let mut at = 0;
            for j in 0..k {
                let (a, b) = (
                    &items[i + (r - 1) * k + j].params,
                    &items[i + r * k + j].params,
                );
                for (x, y) in a.iter().zip(b) {
                    if y - x != delta[at] {
                        break 'more;
                    }
                    at += 1;
                }
            }
            r += 1;
        }
        if r < min_reps {
            i += 1;
            continue;
        }
        match fold(&items[i..], k, r, &delta, interner) {
            Some(it) => {
                for f in keep.iter_mut().skip(i).take(r * k) {
                    *f = false;
                }
                folded.push((i, r * k, it));
                changed = true;
                i += r * k;
            }
            None => i += 1,
        }
    }
    if !changed {
        return (items, false);
    }
    let mut folded = folded.into_iter().peekable();
    for (j, it) in items.into_iter().enumerate() {
        if keep[j] {
            out.push(it);
        } else if folded.peek().is_some_and(|f| f.0 + f.1 - 1 == j) {
            if let Some((_, _, f)) = folded.next() {
                out.push(f);
            }
        }
    }
    (out, true)
}

fn to_node(n: RNode, depth: u8) -> Node {
    match n {
        RNode::Bundle(b) => Node::Bundle(LBundle {
            bundle: b.bundle,
            terms: b
                .terms
                .into_iter()
                .map(|(field, rel, stride)| Term {
                    field,
                    level: depth - 1 - rel,
                    stride,
                    wrap: 0,
                })
                .collect(),
            preds: Vec::new(),
        }),
        RNode::Loop(l) => Node::Loop(Loop {
            count: l.count,
            step: l.step.map(|(rel, per)| CountStep {
                level: depth - 1 - rel,
                per,
            }),
            body: l.body.into_iter().map(|c| to_node(c, depth + 1)).collect(),
        }),
    }
}

/// The loop program whose flattening is `p`.
pub fn run(p: &Program) -> LoopProgram {
    // A stepped loop can make the format's address-range check (per term, over the largest trip
    // count) stricter than the addresses actually reached; without steps every term ranges
    // over exactly the addresses the flat program uses, so the second attempt always validates.
    let stepped = reroll(p, false);
    if stepped.validate().is_ok() {
        return stepped;
    }
    let plain = reroll(p, true);
    if plain.validate().is_ok() {
        plain
    } else {
        LoopProgram::from_flat(p)
    }
}

fn reroll(p: &Program, no_steps: bool) -> LoopProgram {
    let mut interner = Interner {
        no_steps,
        ..Interner::default()
    };
    let mut items: Vec<Item> = p
        .bundles
        .iter()
        .map(|b| {
            item(
                RNode::Bundle(RBundle {
                    bundle: *b,
                    terms: Vec::new(),
                }),
                &mut interner,
            )
        })
        .collect();
    // Pairs last: folding two blocks into a loop of two can hide a longer period (`a b a' b'
    // …` paired up as `(a b) (a' b')` leaves loops whose strides differ), so runs of three or
    // more are folded to a fixed point first.
    for min_reps in [3, 2] {
        loop {
            let mut changed = false;
            for k in 1..=MAX_BLOCK {
                let (next, c) = sweep(items, k, min_reps, &mut interner);
                items = next;
                changed |= c;
            }
            if !changed {
                break;
            }
        }
    }
    LoopProgram {
        pe: p.pe,
        pes: p.pes,
        mem_words: p.mem_words,
        body: items.into_iter().map(|it| to_node(it.node, 0)).collect(),
    }
}
