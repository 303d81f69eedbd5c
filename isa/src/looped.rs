//! Format 3: programs as trees of zero-overhead hardware loops over bundles
//! whose addresses are affine in the enclosing loop indices.
//!
//! A format-3 program means exactly the flat program [`LoopProgram::flatten`]
//! produces: each cycle executes one instance of a body bundle with its
//! addresses evaluated at the current loop indices and its predicated-off
//! slots turned into `nop`. Everything about execution (reads at the start of
//! the cycle, commit order, faults) is therefore the flat semantics; this
//! module only adds how a bundle instance is obtained. Timing is static: a
//! loop of `count` iterations over a body of `k` cycles takes `count · k`
//! cycles, so [`LoopProgram::cycles`] needs no run.

use std::fmt;

use crate::inst::{Acc, AccSrc, Addr, Arith, Bundle, Op, Program, Xfer, XferSrc};

/// Version number of the loop formats' text form (`.format 3`), after the flat
/// formats 1 and 2. Their binary form is written as version 4
/// ([`crate::LOOP_BINARY_VERSION`]); binary version 3 stays readable.
pub const LOOP_FORMAT_VERSION: u16 = 3;
/// Deepest allowed loop nesting. Eight levels cover heads × ring steps ×
/// rows × blocks × columns with room to spare while keeping an index vector
/// in one cache line.
pub const MAX_LOOP_DEPTH: usize = 8;

/// An address-carrying field of a bundle, in the order the text form prints
/// them.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum Field {
    OpA,
    OpB,
    OpDst,
    AccSrc,
    AccDst,
    XferSrc,
    XferDst,
}

impl Field {
    pub const ALL: [Field; 7] = [
        Field::OpA,
        Field::OpB,
        Field::OpDst,
        Field::AccSrc,
        Field::AccDst,
        Field::XferSrc,
        Field::XferDst,
    ];

    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn from_code(c: u8) -> Option<Field> {
        Field::ALL.get(usize::from(c)).copied()
    }

    pub fn name(self) -> &'static str {
        match self {
            Field::OpA => "op a",
            Field::OpB => "op b",
            Field::OpDst => "op dst",
            Field::AccSrc => "acc src",
            Field::AccDst => "acc dst",
            Field::XferSrc => "xfer src",
            Field::XferDst => "xfer dst",
        }
    }
}

/// The address in `field` of `b`, if the bundle uses that field.
///
/// This and [`set_field`] are the only places that know which op kinds have
/// which operands.
pub fn field(b: &Bundle, f: Field) -> Option<Addr> {
    match f {
        Field::OpA => match b.op {
            Op::Nop => None,
            Op::Arith(x) => Some(x.a),
        },
        Field::OpB => match b.op {
            Op::Arith(x) if x.kind.info().reads == 2 => Some(x.b),
            _ => None,
        },
        Field::OpDst => b.op.dst(),
        Field::AccSrc => match b.acc {
            Acc::Add {
                src: AccSrc::Mem(s),
                ..
            } => Some(s),
            _ => None,
        },
        Field::AccDst => match b.acc {
            Acc::Add { dst, .. } => dst,
            Acc::Nop => None,
        },
        Field::XferSrc => match b.xfer {
            Xfer::Send {
                src: XferSrc::Mem(s),
                ..
            } => Some(s),
            _ => None,
        },
        Field::XferDst => match b.xfer {
            Xfer::Send { dst, .. } => Some(dst),
            Xfer::Nop => None,
        },
    }
}

/// Replaces the address in `field` of `b`; does nothing if the field is
/// unused.
pub fn set_field(b: &mut Bundle, f: Field, v: Addr) {
    if let Some(a) = field_mut(b, f) {
        *a = v;
    }
}

/// Adds `v` to the address in `field` of `b`, wrapped to an address: [`set_field`] of
/// [`field`] plus `v`. Does nothing if the field is unused.
#[inline]
fn add_to_field(b: &mut Bundle, f: Field, v: i64) {
    if let Some(a) = field_mut(b, f) {
        *a = (i64::from(*a) + v) as Addr;
    }
}

/// The address in `field` of `b`, to change in place; `None` where [`field`] is `None`.
#[inline]
fn field_mut(b: &mut Bundle, f: Field) -> Option<&mut Addr> {
    match f {
        Field::OpA => match &mut b.op {
            Op::Arith(x) => Some(&mut x.a),
            Op::Nop => None,
        },
        Field::OpB => match &mut b.op {
            Op::Arith(x) if x.kind.info().reads == 2 => Some(&mut x.b),
            _ => None,
        },
        Field::OpDst => match &mut b.op {
            Op::Arith(Arith { dst: Some(d), .. }) => Some(d),
            _ => None,
        },
        Field::AccSrc => match &mut b.acc {
            Acc::Add {
                src: AccSrc::Mem(s),
                ..
            } => Some(s),
            _ => None,
        },
        Field::AccDst => match &mut b.acc {
            Acc::Add { dst: Some(d), .. } => Some(d),
            _ => None,
        },
        Field::XferSrc => match &mut b.xfer {
            Xfer::Send {
                src: XferSrc::Mem(s),
                ..
            } => Some(s),
            _ => None,
        },
        Field::XferDst => match &mut b.xfer {
            Xfer::Send { dst, .. } => Some(dst),
            Xfer::Nop => None,
        },
    }
}

/// One affine term of an address: `stride · (i_level mod wrap)`, or
/// `stride · i_level` when `wrap` is 0. `level` 0 is the outermost loop.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Term {
    pub field: Field,
    pub level: u8,
    pub stride: i32,
    /// 0: no wrap; otherwise at least 2.
    pub wrap: u32,
}

impl Term {
    /// The term's contribution for loop index `i`.
    #[inline]
    pub fn value(&self, i: u32) -> i64 {
        let i = if self.wrap == 0 { i } else { i % self.wrap };
        i64::from(self.stride) * i64::from(i)
    }
}

/// The slot a predicate guards.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum Slot {
    Op,
    Acc,
    Xfer,
}

impl Slot {
    pub const ALL: [Slot; 3] = [Slot::Op, Slot::Acc, Slot::Xfer];
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum Cmp {
    Eq,
    Ne,
    Lt,
    Ge,
}

impl Cmp {
    pub const ALL: [Cmp; 4] = [Cmp::Eq, Cmp::Ne, Cmp::Lt, Cmp::Ge];

    pub fn symbol(self) -> &'static str {
        match self {
            Cmp::Eq => "==",
            Cmp::Ne => "!=",
            Cmp::Lt => "<",
            Cmp::Ge => ">=",
        }
    }

    #[inline]
    pub fn holds(self, i: u32, v: u32) -> bool {
        match self {
            Cmp::Eq => i == v,
            Cmp::Ne => i != v,
            Cmp::Lt => i < v,
            Cmp::Ge => i >= v,
        }
    }
}

/// `slot` executes in an iteration only if `i_level cmp value`; all
/// predicates of a slot must hold.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Pred {
    pub slot: Slot,
    pub level: u8,
    pub cmp: Cmp,
    pub value: u32,
}

/// A bundle template: `bundle` holds the base addresses.
#[derive(Clone, PartialEq, Debug)]
pub struct LBundle {
    pub bundle: Bundle,
    /// Sorted by `(field, level)`, at most one per pair, non-zero strides.
    pub terms: Vec<Term>,
    /// Sorted and without duplicates.
    pub preds: Vec<Pred>,
}

impl LBundle {
    /// A bundle whose addresses do not depend on any loop index.
    pub fn plain(bundle: Bundle) -> LBundle {
        LBundle {
            bundle,
            terms: Vec::new(),
            preds: Vec::new(),
        }
    }

    /// The address of `f` at loop indices `idx` (outermost first).
    #[inline]
    pub fn addr_at(&self, f: Field, base: Addr, idx: &[u32]) -> i64 {
        let mut a = i64::from(base);
        for t in self.terms.iter().filter(|t| t.field == f) {
            a += t.value(idx[usize::from(t.level)]);
        }
        a
    }

    /// The lowest and highest address `f` takes while each enclosing loop `l` runs its index
    /// over `0..bounds[l]` (every level the terms use must be in `bounds`); `None` if the
    /// bundle does not use `f`. Strided fields do not touch every address in between.
    pub fn hull(&self, f: Field, bounds: &[u32]) -> Option<(i64, i64)> {
        self.hull_within(f, |level| {
            (0, bounds.get(level).copied().unwrap_or(1).max(1))
        })
    }

    /// [`LBundle::hull`] over the iterations in which the slot of `f` executes: each level's
    /// index range narrowed by that slot's `<`, `>=` and `==` predicates (a `!=` is ignored,
    /// so the hull may still be wider than the addresses used). `None` also when the slot
    /// never executes within `bounds`.
    pub fn live_hull(&self, f: Field, bounds: &[u32]) -> Option<(i64, i64)> {
        let slot = match f {
            Field::OpA | Field::OpB | Field::OpDst => Slot::Op,
            Field::AccSrc | Field::AccDst => Slot::Acc,
            Field::XferSrc | Field::XferDst => Slot::Xfer,
        };
        let mut ranges: Vec<(u32, u32)> = bounds.iter().map(|&n| (0, n.max(1))).collect();
        for p in self.preds.iter().filter(|p| p.slot == slot) {
            let r = ranges.get_mut(usize::from(p.level))?;
            match p.cmp {
                Cmp::Lt => r.1 = r.1.min(p.value),
                Cmp::Ge => r.0 = r.0.max(p.value),
                Cmp::Eq => *r = (r.0.max(p.value), r.1.min(p.value.saturating_add(1))),
                Cmp::Ne => {}
            }
        }
        if ranges.iter().any(|&(lo, hi)| lo >= hi) {
            return None;
        }
        self.hull_within(f, |level| ranges.get(level).copied().unwrap_or((0, 1)))
    }

    /// The hull of `f` with loop level `l`'s index in `range(l)` = `[first, end)`, not empty.
    /// Each term reaches nearly ±2^63 (an i32 stride times a u32 index), so a few of them
    /// overflow i64: the sums are exact in i128 and clamped to i64, which keeps every
    /// comparison with the address space exact (a wrapped sum could look in range).
    fn hull_within(&self, f: Field, range: impl Fn(usize) -> (u32, u32)) -> Option<(i64, i64)> {
        let base = field(&self.bundle, f)?;
        let (mut lo, mut hi) = (i128::from(base), i128::from(base));
        for t in self.terms.iter().filter(|t| t.field == f) {
            let (first, end) = range(usize::from(t.level));
            let (a, b) = if t.wrap == 0 {
                (first, end - 1)
            } else if end - first >= t.wrap {
                // The index wraps within the range: every residue occurs.
                (0, t.wrap - 1)
            } else {
                let (a, b) = (first % t.wrap, (end - 1) % t.wrap);
                if a <= b {
                    (a, b)
                } else {
                    (0, t.wrap - 1)
                }
            };
            let (x, y) = (
                i128::from(t.stride) * i128::from(a),
                i128::from(t.stride) * i128::from(b),
            );
            lo += x.min(y);
            hi += x.max(y);
        }
        let clamp = |v: i128| v.clamp(i64::MIN.into(), i64::MAX.into()) as i64;
        Some((clamp(lo), clamp(hi)))
    }

    /// The flat bundle this template executes at loop indices `idx`.
    /// Addresses are in range of `Addr` for every `idx` inside the loop
    /// bounds of a validated program.
    pub fn instance(&self, idx: &[u32]) -> Bundle {
        let mut b = self.bundle;
        // Terms are sorted by field: one pass sums each field's run of terms.
        let mut i = 0;
        while i < self.terms.len() {
            let f = self.terms[i].field;
            let mut a = 0i64;
            while i < self.terms.len() && self.terms[i].field == f {
                let t = &self.terms[i];
                a += t.value(idx.get(usize::from(t.level)).copied().unwrap_or(0));
                i += 1;
            }
            add_to_field(&mut b, f, a);
        }
        for p in &self.preds {
            if !p.cmp.holds(idx[usize::from(p.level)], p.value) {
                match p.slot {
                    Slot::Op => b.op = Op::Nop,
                    Slot::Acc => b.acc = Acc::Nop,
                    Slot::Xfer => b.xfer = Xfer::Nop,
                }
            }
        }
        b
    }
}

#[derive(Clone, PartialEq, Debug)]
pub struct Loop {
    /// Iterations, at least 1; with a [`Loop::step`], the iterations when the stepped index is 0.
    pub count: u32,
    /// A trip count affine in an enclosing loop's index (a triangular nest); `None`: fixed.
    pub step: Option<CountStep>,
    /// Not empty.
    pub body: Vec<Node>,
}

/// The trip count `count + per · i_level`. Every instance must run at least once, and the
/// body may not hold a stepped loop itself, so a program's length stays a closed form of its
/// counts (sums of arithmetic series) and never needs a run or an enumeration.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CountStep {
    pub level: u8,
    /// Not 0.
    pub per: i16,
}

impl Loop {
    /// A loop of a fixed `count`.
    pub fn new(count: u32, body: Vec<Node>) -> Loop {
        Loop {
            count,
            step: None,
            body,
        }
    }

    /// The iterations of the instance entered at loop indices `idx` (outermost first). For a
    /// validated program the result is at least 1 and fits in `u32`.
    #[inline]
    pub fn trips(&self, idx: &[u32]) -> u32 {
        match self.step {
            None => self.count,
            Some(s) => {
                let i = idx.get(usize::from(s.level)).copied().unwrap_or(0);
                (i64::from(self.count) + i64::from(s.per) * i64::from(i)) as u32
            }
        }
    }
}

#[derive(Clone, PartialEq, Debug)]
pub enum Node {
    Bundle(LBundle),
    Loop(Loop),
}

/// The microcode of one PE in format 3.
#[derive(Clone, PartialEq, Debug)]
pub struct LoopProgram {
    pub pe: u32,
    pub pes: u32,
    pub mem_words: u32,
    pub body: Vec<Node>,
}

/// Why a loop program is not well formed. `node` is the index of the
/// offending node in pre-order (loops and bundles counted alike, from 0).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct LoopError {
    pub node: usize,
    pub message: String,
}

impl fmt::Display for LoopError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {}: {}", self.node, self.message)
    }
}

impl std::error::Error for LoopError {}

/// Why [`LoopProgram::flatten`] refused.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum FlattenError {
    Invalid(LoopError),
    /// The flat program would have more bundles than the caller allowed.
    TooLong {
        cycles: u64,
        limit: u64,
    },
}

impl fmt::Display for FlattenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlattenError::Invalid(e) => write!(f, "invalid loop program: {e}"),
            FlattenError::TooLong { cycles, limit } => write!(
                f,
                "flattening would produce {cycles} bundles, more than the limit of {limit}"
            ),
        }
    }
}

impl std::error::Error for FlattenError {}

impl LoopProgram {
    /// A flat program as a loop program with no loops.
    pub fn from_flat(p: &Program) -> LoopProgram {
        LoopProgram {
            pe: p.pe,
            pes: p.pes,
            mem_words: p.mem_words,
            body: p
                .bundles
                .iter()
                .map(|b| Node::Bundle(LBundle::plain(*b)))
                .collect(),
        }
    }

    /// Checks every rule of the format (see docs/isa.md, format 3) and
    /// returns the run length in cycles.
    pub fn validate(&self) -> Result<u64, LoopError> {
        let mut counter = 0usize;
        let mut bounds = Vec::with_capacity(MAX_LOOP_DEPTH);
        validate_body(&self.body, &mut bounds, false, &mut counter)?;
        body_lin(&self.body, 0)
            .and_then(|l| u64::try_from(l.c).ok())
            .ok_or_else(|| LoopError {
                node: 0,
                message: "run length overflows 64 bits".into(),
            })
    }

    /// Run length in cycles, computed from the loop structure alone. For a
    /// program that fails [`LoopProgram::validate`] on length overflow, the
    /// result saturates.
    pub fn cycles(&self) -> u64 {
        body_cycles(&self.body)
    }

    /// Number of bundle templates (program size, not run length).
    pub fn bundle_count(&self) -> usize {
        fn count(nodes: &[Node]) -> usize {
            nodes
                .iter()
                .map(|n| match n {
                    Node::Bundle(_) => 1,
                    Node::Loop(l) => count(&l.body),
                })
                .sum()
        }
        count(&self.body)
    }

    /// The equivalent flat program: one bundle per cycle. This is the
    /// definition of what a loop program means, kept deliberately naive (a
    /// recursive expansion, sharing no code with the loop interpreter) so
    /// that it can serve as a test oracle. Refuses programs longer than
    /// `limit` cycles.
    pub fn flatten(&self, limit: u64) -> Result<Program, FlattenError> {
        let cycles = self.validate().map_err(FlattenError::Invalid)?;
        if cycles > limit {
            return Err(FlattenError::TooLong { cycles, limit });
        }
        let mut bundles = Vec::with_capacity(cycles as usize);
        let mut idx = Vec::new();
        expand(&self.body, &mut idx, &mut bundles);
        Ok(Program {
            pe: self.pe,
            pes: self.pes,
            mem_words: self.mem_words,
            bundles,
        })
    }

    /// The bundles [`LoopProgram::flatten`] would give, one at a time, without holding them
    /// all: comparing or scanning a long program this way needs no memory for its expansion.
    /// Unchecked: call [`LoopProgram::validate`] first (an invalid program's instances are
    /// whatever its templates evaluate to).
    pub fn instances(&self) -> Instances<'_> {
        Instances {
            frames: vec![Frame {
                nodes: &self.body,
                pos: 0,
                trips: 1,
            }],
            idx: Vec::new(),
        }
    }
}

/// The iterator of [`LoopProgram::instances`].
pub struct Instances<'a> {
    /// The node lists being run, outermost first: the program's body, then one per loop
    /// entered, whose index is the same level of `idx`.
    frames: Vec<Frame<'a>>,
    idx: Vec<u32>,
}

struct Frame<'a> {
    nodes: &'a [Node],
    pos: usize,
    trips: u32,
}

impl Iterator for Instances<'_> {
    type Item = Bundle;

    fn next(&mut self) -> Option<Bundle> {
        loop {
            let depth = self.frames.len();
            let f = self.frames.last_mut()?;
            if let Some(n) = f.nodes.get(f.pos) {
                f.pos += 1;
                match n {
                    Node::Bundle(b) => return Some(b.instance(&self.idx)),
                    Node::Loop(l) => {
                        // As `expand`: the trip count is taken at the indices it is entered at.
                        let trips = l.trips(&self.idx);
                        if trips > 0 {
                            self.idx.push(0);
                            self.frames.push(Frame {
                                nodes: &l.body,
                                pos: 0,
                                trips,
                            });
                        }
                    }
                }
            } else if depth == 1 {
                self.frames.clear();
                return None;
            } else {
                let i = self.idx.last_mut()?;
                *i += 1;
                if *i < f.trips {
                    f.pos = 0;
                } else {
                    self.idx.pop();
                    self.frames.pop();
                }
            }
        }
    }
}

/// Cycles of a node list as `c + Σ_k a[k] · i_k` over the indices of the enclosing loops
/// (stepped loops make a body's length depend on them); `None` on overflow.
#[derive(Clone, Copy)]
struct Lin {
    c: i128,
    a: [i128; MAX_LOOP_DEPTH],
}

fn body_lin(nodes: &[Node], depth: usize) -> Option<Lin> {
    let mut t = Lin {
        c: 0,
        a: [0; MAX_LOOP_DEPTH],
    };
    for n in nodes {
        match n {
            Node::Bundle(_) => t.c = t.c.checked_add(1)?,
            Node::Loop(l) => {
                let inner = body_lin(&l.body, depth + 1)?;
                let n = i128::from(l.count);
                match l.step {
                    None => {
                        // Σ_{i<n} (c + a_depth·i + rest) = n·c + a_depth·n(n−1)/2 + n·rest.
                        let series = n.checked_mul(n - 1)? / 2;
                        let own = inner.a.get(depth).copied().unwrap_or(0);
                        t.c =
                            t.c.checked_add(n.checked_mul(inner.c)?)?
                                .checked_add(own.checked_mul(series)?)?;
                        for k in 0..depth.min(MAX_LOOP_DEPTH) {
                            t.a[k] = t.a[k].checked_add(n.checked_mul(inner.a[k])?)?;
                        }
                    }
                    Some(s) => {
                        // The body holds no stepped loop, so its length is `inner.c`.
                        t.c = t.c.checked_add(n.checked_mul(inner.c)?)?;
                        let k = usize::from(s.level).min(MAX_LOOP_DEPTH - 1);
                        t.a[k] = t.a[k].checked_add(i128::from(s.per).checked_mul(inner.c)?)?;
                    }
                }
            }
        }
    }
    Some(t)
}

fn body_cycles(nodes: &[Node]) -> u64 {
    body_lin(nodes, 0).map_or(u64::MAX, |l| u64::try_from(l.c.max(0)).unwrap_or(u64::MAX))
}

/// A loop body with its loop's index fixed: `nodes` is the body of a loop whose index is
/// level `level`, and the result is what the body runs in iteration `i`, with every deeper
/// level moved up one. For any indices `idx` of the enclosing loops (`level` of them),
/// flattening the result at `idx` gives the bundles the body gives at `idx` then `i`: terms
/// of the level are added into their base addresses (wrapped to an address as an instance
/// is), predicates on it decided (a slot they turn off is `nop`, its terms dropped), counts
/// stepped by it fixed. Lets a caller see that a loop runs exactly some given code in each
/// iteration by comparing node lists instead of their flattenings.
pub fn fix_level(nodes: &[Node], level: u8, i: u32) -> Vec<Node> {
    nodes
        .iter()
        .map(|n| match n {
            Node::Bundle(b) => Node::Bundle(fix_bundle(b, level, i)),
            Node::Loop(l) => {
                let (count, step) = match l.step {
                    Some(s) if s.level == level => {
                        let mut idx = vec![0; usize::from(level) + 1];
                        idx[usize::from(level)] = i;
                        (l.trips(&idx), None)
                    }
                    Some(s) if s.level > level => (
                        l.count,
                        Some(CountStep {
                            level: s.level - 1,
                            ..s
                        }),
                    ),
                    s => (l.count, s),
                };
                Node::Loop(Loop {
                    count,
                    step,
                    body: fix_level(&l.body, level, i),
                })
            }
        })
        .collect()
}

/// [`fix_level`] of one bundle.
fn fix_bundle(b: &LBundle, level: u8, i: u32) -> LBundle {
    let mut bundle = b.bundle;
    for t in b.terms.iter().filter(|t| t.level == level) {
        if let Some(base) = field(&bundle, t.field) {
            set_field(&mut bundle, t.field, (i64::from(base) + t.value(i)) as Addr);
        }
    }
    let mut off = Vec::new();
    for p in b.preds.iter().filter(|p| p.level == level) {
        if !p.cmp.holds(i, p.value) && !off.contains(&p.slot) {
            off.push(p.slot);
            match p.slot {
                Slot::Op => bundle.op = Op::Nop,
                Slot::Acc => bundle.acc = Acc::Nop,
                Slot::Xfer => bundle.xfer = Xfer::Nop,
            }
        }
    }
    let slot = |f: Field| match f {
        Field::OpA | Field::OpB | Field::OpDst => Slot::Op,
        Field::AccSrc | Field::AccDst => Slot::Acc,
        Field::XferSrc | Field::XferDst => Slot::Xfer,
    };
    let up = |l: u8| if l > level { l - 1 } else { l };
    LBundle {
        bundle,
        terms: b
            .terms
            .iter()
            .filter(|t| t.level != level && !off.contains(&slot(t.field)))
            .map(|t| Term {
                level: up(t.level),
                ..*t
            })
            .collect(),
        preds: b
            .preds
            .iter()
            .filter(|p| p.level != level && !off.contains(&p.slot))
            .map(|p| Pred {
                level: up(p.level),
                ..*p
            })
            .collect(),
    }
}

fn expand(nodes: &[Node], idx: &mut Vec<u32>, out: &mut Vec<Bundle>) {
    for n in nodes {
        match n {
            Node::Bundle(b) => out.push(b.instance(idx)),
            Node::Loop(l) => {
                for i in 0..l.trips(idx) {
                    idx.push(i);
                    expand(&l.body, idx, out);
                    idx.pop();
                }
            }
        }
    }
}

/// `bounds[k]` is the largest trip count of the enclosing loop at level `k`; `stepped` says
/// whether an enclosing loop is stepped (whose body may not hold another).
fn validate_body(
    nodes: &[Node],
    bounds: &mut Vec<u32>,
    stepped: bool,
    counter: &mut usize,
) -> Result<(), LoopError> {
    for n in nodes {
        let here = *counter;
        *counter += 1;
        let err = |message: String| LoopError {
            node: here,
            message,
        };
        match n {
            Node::Bundle(b) => validate_bundle(b, bounds).map_err(err)?,
            Node::Loop(l) => {
                if bounds.len() >= MAX_LOOP_DEPTH {
                    return Err(err(format!(
                        "loops nested deeper than {MAX_LOOP_DEPTH} levels"
                    )));
                }
                if l.count == 0 {
                    return Err(err("loop count must be at least 1".into()));
                }
                if l.body.is_empty() {
                    return Err(err("loop body is empty".into()));
                }
                let most = match l.step {
                    None => l.count,
                    Some(s) => {
                        if stepped {
                            return Err(err(
                                "a stepped loop inside a stepped loop (their length would not be an arithmetic series)".into(),
                            ));
                        }
                        let Some(&outer) = bounds.get(usize::from(s.level)) else {
                            return Err(err(format!(
                                "loop count steps with i{}, but only {} loop(s) enclose it",
                                s.level,
                                bounds.len()
                            )));
                        };
                        if s.per == 0 {
                            return Err(err("loop count step of 0 (omit the step)".into()));
                        }
                        let last = i64::from(l.count) + i64::from(s.per) * (i64::from(outer) - 1);
                        if last < 1 {
                            return Err(err(format!(
                                "loop count {} {:+}·i{} reaches {last} at i{} = {}; every instance must run at least once",
                                l.count,
                                s.per,
                                s.level,
                                s.level,
                                outer - 1
                            )));
                        }
                        u32::try_from(last.max(i64::from(l.count))).map_err(|_| {
                            err(format!("loop count reaches {last}, more than 32 bits"))
                        })?
                    }
                };
                bounds.push(most);
                let inner = validate_body(&l.body, bounds, stepped || l.step.is_some(), counter);
                bounds.pop();
                inner?;
            }
        }
    }
    Ok(())
}

fn validate_bundle(b: &LBundle, bounds: &[u32]) -> Result<(), String> {
    if let Op::Arith(x) = b.bundle.op {
        if x.kind.info().imm && !x.imm.is_finite() {
            return Err(format!("scale {} is not finite", x.imm));
        }
    }
    for w in b.terms.windows(2) {
        if (w[0].field, w[0].level) >= (w[1].field, w[1].level) {
            return Err(format!(
                "address terms must be sorted by field and level, one per level ({} i{} after {} i{})",
                w[1].field.name(),
                w[1].level,
                w[0].field.name(),
                w[0].level
            ));
        }
    }
    for t in &b.terms {
        if usize::from(t.level) >= bounds.len() {
            return Err(format!(
                "{} uses i{}, but only {} loop(s) enclose the bundle",
                t.field.name(),
                t.level,
                bounds.len()
            ));
        }
        if t.stride == 0 {
            return Err(format!(
                "{} has a zero stride for i{}",
                t.field.name(),
                t.level
            ));
        }
        if t.wrap == 1 {
            return Err(format!(
                "{} has wrap 1 for i{} (a term that is always 0; omit it)",
                t.field.name(),
                t.level
            ));
        }
        if field(&b.bundle, t.field).is_none() {
            return Err(format!(
                "affine term for {}, which the bundle does not use",
                t.field.name()
            ));
        }
    }
    for f in Field::ALL {
        let Some((lo, hi)) = b.hull(f, bounds) else {
            continue;
        };
        if lo < 0 || hi > i64::from(Addr::MAX) {
            return Err(format!(
                "{} ranges over {lo}..={hi}, outside the address space 0..={}",
                f.name(),
                Addr::MAX
            ));
        }
    }
    for w in b.preds.windows(2) {
        if w[0] >= w[1] {
            return Err("predicates must be sorted and distinct".into());
        }
    }
    for p in &b.preds {
        if usize::from(p.level) >= bounds.len() {
            return Err(format!(
                "predicate on i{}, but only {} loop(s) enclose the bundle",
                p.level,
                bounds.len()
            ));
        }
        let used = match p.slot {
            Slot::Op => b.bundle.op != Op::Nop,
            Slot::Acc => b.bundle.acc != Acc::Nop,
            Slot::Xfer => b.bundle.xfer != Xfer::Nop,
        };
        if !used {
            return Err(format!("predicate on the {:?} slot, which is nop", p.slot));
        }
    }
    Ok(())
}

impl LoopProgram {
    /// Executed ops by kind (indexed by `OpKind::index`), computed from the
    /// loop structure without running: a template counts once per iteration
    /// of its enclosing loops in which its op-slot predicates hold. A stepped loop whose own
    /// op predicates are not all absent costs one step per iteration of the loop it follows.
    pub fn op_counts(&self) -> [u64; crate::inst::OPS.len()] {
        let mut out = [0u64; crate::inst::OPS.len()];
        let mut loops = Vec::new();
        each_template(&self.body, &mut loops, &mut |b, loops| {
            if let Some(k) = b.bundle.op.kind() {
                out[k.index()] = out[k.index()].saturating_add(executions(b, loops, Slot::Op));
            }
        });
        out
    }

    /// Executed accumulator adds and sends, counted like [`LoopProgram::op_counts`].
    pub fn acc_and_send_counts(&self) -> (u64, u64) {
        let (mut acc, mut send) = (0u64, 0u64);
        let mut loops = Vec::new();
        each_template(&self.body, &mut loops, &mut |b, loops| {
            if b.bundle.acc != Acc::Nop {
                acc = acc.saturating_add(executions(b, loops, Slot::Acc));
            }
            if b.bundle.xfer != Xfer::Nop {
                send = send.saturating_add(executions(b, loops, Slot::Xfer));
            }
        });
        (acc, send)
    }

    /// Calls `f` on every bundle template with the most iterations each enclosing loop runs
    /// (outermost first; a stepped loop's largest trip count), the bounds
    /// [`LBundle::hull`] takes. For a validated program.
    pub fn for_each_template(&self, mut f: impl FnMut(&LBundle, &[u32])) {
        let mut loops = Vec::new();
        let mut bounds = Vec::new();
        each_template(&self.body, &mut loops, &mut |b, loops| {
            bounds.clear();
            bounds.extend(loops.iter().map(|&(count, step)| match step {
                None => count,
                Some(s) => {
                    let outer = loops.get(usize::from(s.level)).map_or(1, |l| l.0);
                    let last = i64::from(count) + i64::from(s.per) * (i64::from(outer) - 1);
                    u32::try_from(last.max(i64::from(count))).unwrap_or(u32::MAX)
                }
            }));
            f(b, &bounds);
        });
    }
}

/// Every bundle template under `nodes`, with its enclosing loops' `(count, step)`.
fn each_template(
    nodes: &[Node],
    loops: &mut Vec<(u32, Option<CountStep>)>,
    f: &mut impl FnMut(&LBundle, &[(u32, Option<CountStep>)]),
) {
    for n in nodes {
        match n {
            Node::Loop(l) => {
                loops.push((l.count, l.step));
                each_template(&l.body, loops, f);
                loops.pop();
            }
            Node::Bundle(b) => f(b, loops),
        }
    }
}

/// How many times template `b` executes its `slot` inside `loops`: once per iteration of
/// its enclosing loops in which the slot's predicates hold.
fn executions(b: &LBundle, loops: &[(u32, Option<CountStep>)], slot: Slot) -> u64 {
    let preds_at = |level: usize| -> Vec<&Pred> {
        b.preds
            .iter()
            .filter(|p| p.slot == slot && usize::from(p.level) == level)
            .collect()
    };
    // At most one enclosing loop is stepped (they do not nest); its level and the
    // level it follows are counted together.
    let stepped = loops
        .iter()
        .enumerate()
        .find_map(|(lv, (_, st))| st.map(|st| (lv, st)));
    let mut times = 1u64;
    for (level, &(count, _)) in loops.iter().enumerate() {
        if let Some((s, st)) = stepped {
            if level == s || level == usize::from(st.level) {
                continue;
            }
        }
        times = times.saturating_mul(Hits::of(u64::from(count), &preds_at(level)).len());
    }
    if let Some((s, st)) = stepped {
        let l = usize::from(st.level);
        let outer = Hits::of(u64::from(loops[l].0), &preds_at(l));
        let inner = preds_at(s);
        let base = i128::from(loops[s].0);
        let per = i128::from(st.per);
        let pairs: u64 = if inner.is_empty() {
            // Σ over the outer hits of (base + per·i), in closed form.
            let n = i128::from(outer.len());
            let sum_i = outer.index_sum();
            u64::try_from(n * base + per * sum_i).unwrap_or(u64::MAX)
        } else {
            outer
                .iter()
                .map(|i| {
                    let trips = (base + per * i128::from(i)).max(0) as u64;
                    Hits::of(trips, &inner).len()
                })
                .fold(0u64, u64::saturating_add)
        };
        times = times.saturating_mul(pairs);
    }
    times
}

/// The iterations `[lo, hi)` minus the points `nes` of a loop of `bound` iterations in which a
/// conjunction of comparisons with constants holds.
struct Hits {
    lo: u64,
    hi: u64,
    nes: Vec<u64>,
}

impl Hits {
    fn of(bound: u64, preds: &[&Pred]) -> Hits {
        let mut lo = 0u64;
        let mut hi = bound;
        let mut eqs = Vec::new();
        let mut nes = Vec::new();
        for p in preds {
            let v = u64::from(p.value);
            match p.cmp {
                Cmp::Lt => hi = hi.min(v),
                Cmp::Ge => lo = lo.max(v),
                Cmp::Eq => eqs.push(v),
                Cmp::Ne => nes.push(v),
            }
        }
        if let Some(&e) = eqs.first() {
            if eqs.iter().all(|&x| x == e) && e >= lo && e < hi {
                lo = e;
                hi = e + 1;
            } else {
                hi = lo;
            }
        }
        nes.sort_unstable();
        nes.dedup();
        nes.retain(|&x| x >= lo && x < hi);
        Hits { lo, hi, nes }
    }

    fn len(&self) -> u64 {
        self.hi.saturating_sub(self.lo) - self.nes.len() as u64
    }

    fn index_sum(&self) -> i128 {
        let (lo, hi) = (i128::from(self.lo), i128::from(self.hi));
        let all = if hi > lo {
            (lo + hi - 1) * (hi - lo) / 2
        } else {
            0
        };
        all - self.nes.iter().map(|&x| i128::from(x)).sum::<i128>()
    }

    fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        (self.lo..self.hi).filter(|x| self.nes.binary_search(x).is_err())
    }
}
