//! Hash-consed symbolic expressions over the layer's input elements.
//!
//! Two expressions are the same real-valued function of the inputs (up to commutativity of `·` and
//! associativity/commutativity of `+`) exactly when their canonical ids are equal, so comparing an
//! output with its specification is one integer comparison.
//!
//! Partial sums are the bulk of what a program computes (every step of every multiply-accumulate
//! chain), yet almost none of them is ever compared with anything. They are therefore kept as
//! cheap, non-canonical [`Node::Chain`] cells (one per `add`), and turned into a canonical sorted
//! [`Node::Sum`] only when used as an operand of `mul`/`exp`/`div` or read as an output. That keeps
//! the cost of an `add` constant instead of linear in the length of the sum.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

pub type ExprId = u32;

/// Which input tensor an atom belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tensor {
    Q,
    K,
    V,
    X,
}

impl Tensor {
    pub fn name(self) -> &'static str {
        match self {
            Tensor::Q => "q",
            Tensor::K => "k",
            Tensor::V => "v",
            Tensor::X => "x",
        }
    }

    pub fn from_name(s: &str) -> Option<Tensor> {
        match s {
            "q" => Some(Tensor::Q),
            "k" => Some(Tensor::K),
            "v" => Some(Tensor::V),
            "x" => Some(Tensor::X),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Node {
    /// Element `[head][row][col]` of an input tensor.
    Input {
        tensor: Tensor,
        head: u32,
        row: u32,
        col: u32,
    },
    /// Operands sorted, so `a·b` and `b·a` are one node.
    Mul(ExprId, ExprId),
    /// `exp(scale · a)`; the scale is kept as f32 bits so that only the exact immediate matches.
    Exp(ExprId, u32),
    Div(ExprId, ExprId),
    /// The maximum of a set of at least two values: `len` sorted, distinct ids at `start` in the
    /// term pool, none itself a maximum. `max` is exact, associative, commutative and idempotent,
    /// so every order and grouping of a row maximum reaches this one node.
    Max {
        start: u32,
        len: u32,
    },
    /// `exp(scale · (a − b))`, scale as f32 bits.
    Expd(ExprId, ExprId, u32),
    /// A canonical sum of at least two terms: `len` sorted term ids at `start` in the term pool.
    /// No term is itself a sum.
    Sum {
        start: u32,
        len: u32,
    },
    /// A partial sum as the accumulator built it: `prev + term`. Never hash-consed.
    Chain {
        prev: ExprId,
        term: ExprId,
    },
}

/// A fast non-cryptographic hasher for integer keys (the FxHash mixing step); the keys are ids
/// the verifier made itself, so there is nothing adversarial to defend against.
#[derive(Default, Clone, Copy)]
pub struct FxHasher(u64);

impl Hasher for FxHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.add(u64::from(b));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
}

impl FxHasher {
    #[inline]
    fn add(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

pub type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// Bits in [`Interner::flags`].
pub const NEEDED: u8 = 1;
/// The node is, or is built from, work that the causal mask removes.
pub const MASKED: u8 = 2;

pub struct Interner {
    nodes: Vec<Node>,
    flags: Vec<u8>,
    terms: Vec<ExprId>,
    index: FxMap<Node, ExprId>,
    sums: FxMap<Box<[ExprId]>, ExprId>,
    maxes: FxMap<Box<[ExprId]>, ExprId>,
    /// Canonical form of chains already canonicalized: a denominator is used by a whole row of
    /// divisions, and walking it each time would make that quadratic.
    canon: FxMap<ExprId, ExprId>,
    scratch: Vec<ExprId>,
    /// The online formulation's identities are in force (see [`Interner::set_online`]).
    online: bool,
}

impl Default for Interner {
    fn default() -> Self {
        Self::new()
    }
}

impl Interner {
    pub fn new() -> Self {
        Interner {
            nodes: Vec::new(),
            flags: Vec::new(),
            terms: Vec::new(),
            index: FxMap::default(),
            sums: FxMap::default(),
            maxes: FxMap::default(),
            canon: FxMap::default(),
            scratch: Vec::new(),
            online: false,
        }
    }

    /// Turns on the two identities a streamed (online) softmax needs, and only it: a product
    /// `exp(s·(a − b))·exp(s·(b − c))` (same scale) is `exp(s·(a − c))`, and a product of a sum
    /// with a shifted exponential is distributed over the sum's terms. Rescaling a partial sum
    /// from an old running maximum to a new one is exactly these two steps, so a streamed row
    /// reaches the same node as the specification built with the final maximum. Both are
    /// identities over the reals, so they can only make equal things equal; they are off for
    /// every other formulation so that those keep their exact canonical forms.
    pub fn set_online(&mut self, on: bool) {
        self.online = on;
    }

    pub fn is_online(&self) -> bool {
        self.online
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Total length of all canonical sums' term lists.
    pub fn term_pool_len(&self) -> usize {
        self.terms.len()
    }

    pub fn node(&self, id: ExprId) -> Node {
        self.nodes[id as usize]
    }

    pub fn flags(&self, id: ExprId) -> u8 {
        self.flags[id as usize]
    }

    pub fn set_flag(&mut self, id: ExprId, flag: u8) {
        self.flags[id as usize] |= flag;
    }

    /// The sorted, distinct arguments of a maximum; empty for anything else.
    pub fn max_terms(&self, id: ExprId) -> &[ExprId] {
        match self.node(id) {
            Node::Max { start, len } => &self.terms[start as usize..(start + len) as usize],
            _ => &[],
        }
    }

    /// The sorted terms of a canonical sum; empty for anything else.
    pub fn sum_terms(&self, id: ExprId) -> &[ExprId] {
        match self.node(id) {
            Node::Sum { start, len } => &self.terms[start as usize..(start + len) as usize],
            _ => &[],
        }
    }

    fn push(&mut self, node: Node, flags: u8) -> ExprId {
        let id = self.nodes.len() as ExprId;
        self.nodes.push(node);
        self.flags.push(flags);
        id
    }

    /// Hash-conses a node that is neither a sum nor a chain. A new node inherits the mask taint of
    /// its operands.
    fn intern(&mut self, node: Node, operands: &[ExprId]) -> ExprId {
        // One lookup for both outcomes: a new node's insertion would otherwise hash and probe
        // again, and most of a large layer's nodes are new.
        let id = self.nodes.len() as ExprId;
        match self.index.entry(node) {
            Entry::Occupied(e) => *e.get(),
            Entry::Vacant(e) => {
                e.insert(id);
                let taint = operands
                    .iter()
                    .fold(0, |f, &o| f | (self.flags[o as usize] & MASKED));
                self.push(node, taint)
            }
        }
    }

    pub fn input(&mut self, tensor: Tensor, head: u32, row: u32, col: u32) -> ExprId {
        self.intern(
            Node::Input {
                tensor,
                head,
                row,
                col,
            },
            &[],
        )
    }

    pub fn mul(&mut self, a: ExprId, b: ExprId) -> ExprId {
        let (a, b) = (self.canonical(a), self.canonical(b));
        if self.online {
            if let Some(id) = self.mul_online(a, b) {
                return id;
            }
        }
        self.mul_pair(a, b)
    }

    fn mul_pair(&mut self, a: ExprId, b: ExprId) -> ExprId {
        let (a, b) = if a <= b { (a, b) } else { (b, a) };
        self.intern(Node::Mul(a, b), &[a, b])
    }

    /// The online identities for canonical `a·b`; `None` when neither applies.
    fn mul_online(&mut self, a: ExprId, b: ExprId) -> Option<ExprId> {
        let is_expd = |ex: &Self, x: ExprId| matches!(ex.node(x), Node::Expd(..));
        let is_sum = |ex: &Self, x: ExprId| matches!(ex.node(x), Node::Sum { .. });
        let (sum, factor) = if is_sum(self, a) && is_expd(self, b) {
            (a, b)
        } else if is_sum(self, b) && is_expd(self, a) {
            (b, a)
        } else {
            return self.combine_shifts(a, b);
        };
        let terms = self.sum_terms(sum).to_vec();
        let scaled: Vec<ExprId> = terms.into_iter().map(|t| self.mul(t, factor)).collect();
        Some(self.sum(&scaled))
    }

    /// `a·b` with every pair of shifted exponentials `exp(s·(x − y))·exp(s·(y − z))` among the
    /// factors of `a` and `b` merged into `exp(s·(x − z))`; `None` if no pair merges. The
    /// remaining factors are multiplied in sorted order, so the result does not depend on how
    /// the program grouped them.
    fn combine_shifts(&mut self, a: ExprId, b: ExprId) -> Option<ExprId> {
        if !matches!(self.node(a), Node::Expd(..)) && !matches!(self.node(b), Node::Expd(..)) {
            return None;
        }
        let mut factors = Vec::new();
        self.collect_factors(a, &mut factors);
        self.collect_factors(b, &mut factors);
        let mut merged = false;
        'again: loop {
            for i in 0..factors.len() {
                for j in 0..factors.len() {
                    if i == j {
                        continue;
                    }
                    if let (Node::Expd(x, y, s1), Node::Expd(y2, z, s2)) =
                        (self.node(factors[i]), self.node(factors[j]))
                    {
                        if y == y2 && s1 == s2 {
                            let e = self.intern(Node::Expd(x, z, s1), &[x, z]);
                            let (hi, lo) = (i.max(j), i.min(j));
                            factors.swap_remove(hi);
                            factors[lo] = e;
                            merged = true;
                            continue 'again;
                        }
                    }
                }
            }
            break;
        }
        if !merged {
            return None;
        }
        factors.sort_unstable();
        let mut it = factors.into_iter();
        let first = it.next()?;
        Some(it.fold(first, |acc, f| self.mul_pair(acc, f)))
    }

    /// The factors of a product (nested products flattened).
    fn collect_factors(&self, id: ExprId, out: &mut Vec<ExprId>) {
        match self.node(id) {
            Node::Mul(a, b) => {
                self.collect_factors(a, out);
                self.collect_factors(b, out);
            }
            _ => out.push(id),
        }
    }

    pub fn exp(&mut self, a: ExprId, scale: f32) -> ExprId {
        let a = self.canonical(a);
        self.intern(Node::Exp(a, scale.to_bits()), &[a])
    }

    pub fn div(&mut self, a: ExprId, b: ExprId) -> ExprId {
        let (a, b) = (self.canonical(a), self.canonical(b));
        self.intern(Node::Div(a, b), &[a, b])
    }

    pub fn max(&mut self, a: ExprId, b: ExprId) -> ExprId {
        let (a, b) = (self.canonical(a), self.canonical(b));
        self.max_of(&[a, b])
    }

    /// The canonical maximum of `args` (any order, nested maxima flattened, repeats dropped); a
    /// single distinct argument is itself.
    pub fn max_of(&mut self, args: &[ExprId]) -> ExprId {
        let mut all: Vec<ExprId> = Vec::with_capacity(args.len());
        for &x in args {
            match self.node(x) {
                Node::Max { .. } => all.extend_from_slice(self.max_terms(x)),
                _ => all.push(x),
            }
        }
        all.sort_unstable();
        all.dedup();
        // Online, a running maximum that so far holds one score stays a maximum: the rescale
        // factor `exp(s·(M_old − M_new))` is then told apart, by its node alone, from the
        // exponential `exp(s·(S − M_new))` of a score, which is the same real number.
        if all.len() == 1 && !self.online {
            return all[0];
        }

        if let Some(&id) = self.maxes.get(&*all) {
            return id;
        }
        let taint = all.iter().fold(0, |f, &t| f | (self.flags(t) & MASKED));
        let start = self.terms.len() as u32;
        self.terms.extend_from_slice(&all);
        let id = self.push(
            Node::Max {
                start,
                len: all.len() as u32,
            },
            taint,
        );
        self.maxes.insert(all.into_boxed_slice(), id);
        id
    }

    pub fn expd(&mut self, a: ExprId, b: ExprId, scale: f32) -> ExprId {
        let (a, b) = (self.canonical(a), self.canonical(b));
        self.intern(Node::Expd(a, b, scale.to_bits()), &[a, b])
    }

    /// `a + b` as the accumulator builds it: O(1), not canonical.
    pub fn add(&mut self, a: ExprId, b: ExprId) -> ExprId {
        if let Node::Chain { .. } | Node::Sum { .. } = self.node(b) {
            // The machine only ever adds an op result (never a sum) to a word; should a sum turn
            // up here anyway, adding its terms one by one keeps chains flat.
            let mut terms = Vec::new();
            self.collect_terms(b, &mut terms);
            return terms.into_iter().fold(a, |acc, t| self.add(acc, t));
        }
        let taint = (self.flags(a) | self.flags(b)) & MASKED;
        self.push(Node::Chain { prev: a, term: b }, taint)
    }

    /// The canonical sum of `terms` (any order); a single term is itself.
    pub fn sum(&mut self, terms: &[ExprId]) -> ExprId {
        let mut all = std::mem::take(&mut self.scratch);
        all.clear();
        for &t in terms {
            self.collect_terms(t, &mut all);
        }
        let id = self.sum_of_collected(&mut all);
        self.scratch = all;
        id
    }

    fn sum_of_collected(&mut self, all: &mut [ExprId]) -> ExprId {
        if all.len() == 1 {
            return all[0];
        }
        all.sort_unstable();
        if let Some(&id) = self.sums.get(&*all) {
            return id;
        }
        let taint = all.iter().fold(0, |f, &t| f | (self.flags(t) & MASKED));
        let start = self.terms.len() as u32;
        self.terms.extend_from_slice(all);
        let id = self.push(
            Node::Sum {
                start,
                len: all.len() as u32,
            },
            taint,
        );
        self.sums.insert(all.to_vec().into_boxed_slice(), id);
        id
    }

    /// Appends the leaves of `id` as a sum (chains and sums flattened).
    fn collect_terms(&self, mut id: ExprId, out: &mut Vec<ExprId>) {
        loop {
            match self.node(id) {
                Node::Chain { prev, term } => {
                    self.collect_terms(term, out);
                    id = prev;
                }
                Node::Sum { start, len } => {
                    out.extend_from_slice(&self.terms[start as usize..(start + len) as usize]);
                    return;
                }
                _ => {
                    out.push(id);
                    return;
                }
            }
        }
    }

    /// The canonical form of a value: chains become sums, everything else is already canonical.
    pub fn canonical(&mut self, id: ExprId) -> ExprId {
        if !matches!(self.node(id), Node::Chain { .. }) {
            return id;
        }
        if let Some(&c) = self.canon.get(&id) {
            return c;
        }
        let mut all = std::mem::take(&mut self.scratch);
        all.clear();
        self.collect_terms(id, &mut all);
        let c = self.sum_of_collected(&mut all);
        self.scratch = all;
        self.canon.insert(id, c);
        c
    }

    /// Text for `id`, abbreviated: below `depth` levels subexpressions print as `…`, and a sum
    /// shows at most `width` terms.
    pub fn pretty(&self, id: ExprId, style: &Style) -> String {
        let mut s = String::new();
        self.write(id, style, style.depth, &mut s);
        s
    }

    fn write(&self, id: ExprId, style: &Style, depth: usize, out: &mut String) {
        use std::fmt::Write;
        match self.node(id) {
            Node::Input {
                tensor,
                head,
                row,
                col,
            } => {
                if style.heads {
                    let _ = write!(out, "{}{head}:{row}.{col}", tensor.name());
                } else {
                    let _ = write!(out, "{}{row}.{col}", tensor.name());
                }
            }
            _ if depth == 0 => out.push('…'),
            Node::Mul(a, b) => {
                self.write(a, style, depth - 1, out);
                out.push('·');
                self.write(b, style, depth - 1, out);
            }
            Node::Exp(a, bits) => {
                let _ = write!(out, "exp({:?}·", f32::from_bits(bits));
                self.write(a, style, depth - 1, out);
                out.push(')');
            }
            Node::Div(a, b) => {
                out.push('(');
                self.write(a, style, depth - 1, out);
                out.push_str(" / ");
                self.write(b, style, depth - 1, out);
                out.push(')');
            }
            Node::Max { .. } => {
                let terms = self.max_terms(id);
                let _ = write!(out, "max[{}]", terms.len());
                self.write_terms(terms, style, depth, out);
            }
            Node::Expd(a, b, bits) => {
                let _ = write!(out, "exp({:?}·(", f32::from_bits(bits));
                self.write(a, style, depth - 1, out);
                out.push_str(" − ");
                self.write(b, style, depth - 1, out);
                out.push_str("))");
            }
            Node::Sum { .. } | Node::Chain { .. } => {
                let mut terms = Vec::new();
                self.collect_terms(id, &mut terms);
                if matches!(self.node(id), Node::Chain { .. }) {
                    terms.sort_unstable();
                }
                let _ = write!(out, "Σ[{} terms]", terms.len());
                self.write_terms(&terms, style, depth, out);
            }
        }
    }

    /// `(t1, t2, …)`: the first `style.width` terms of a maximum or sum, then `…`.
    fn write_terms(&self, terms: &[ExprId], style: &Style, depth: usize, out: &mut String) {
        out.push('(');
        for (i, &t) in terms.iter().take(style.width).enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            self.write(t, style, depth - 1, out);
        }
        if terms.len() > style.width {
            out.push_str(", …");
        }
        out.push(')');
    }

    /// Explains how `found` differs from `expected` by descending to the first place they part:
    /// through an operand that differs alone (or the numerator, if both do), and through sums
    /// whose differing terms pair up (same shape, a shared operand).
    pub fn explain(&self, expected: ExprId, found: ExprId, style: &Style) -> String {
        let (mut e, mut f) = (expected, found);
        let mut path: Vec<String> = Vec::new();
        loop {
            match (self.node(e), self.node(f)) {
                (Node::Mul(a1, b1), Node::Mul(a2, b2)) => {
                    let (prev_e, prev_f) = (e, f);
                    if a1 == a2 && b1 != b2 {
                        (e, f) = (b1, b2);
                    } else if b1 == b2 && a1 != a2 {
                        (e, f) = (a1, a2);
                    } else if a1 == b2 && b1 != a2 {
                        (e, f) = (b1, a2);
                    } else if b1 == a2 && a1 != b2 {
                        (e, f) = (a1, b2);
                    } else {
                        break;
                    }
                    // A wrong input element reads best inside its product.
                    if matches!(
                        (self.node(e), self.node(f)),
                        (Node::Input { .. }, Node::Input { .. })
                    ) {
                        (e, f) = (prev_e, prev_f);
                        break;
                    }
                    path.push("in a factor".into());
                }
                (Node::Div(a1, b1), Node::Div(a2, b2)) => {
                    if a1 == a2 {
                        (e, f) = (b1, b2);
                        path.push("in the denominator".into());
                    } else if b1 == b2 {
                        (e, f) = (a1, a2);
                        path.push("in the numerator".into());
                    } else {
                        (e, f) = (a1, a2);
                        path.push("in the numerator (the denominator differs too)".into());
                    }
                }
                (Node::Exp(a1, s1), Node::Exp(a2, s2)) => {
                    if s1 != s2 {
                        path.push(format!(
                            "exp scale is {:?}, expected {:?}",
                            f32::from_bits(s2),
                            f32::from_bits(s1)
                        ));
                        if a1 == a2 {
                            return path.join(" › ");
                        }
                    }
                    (e, f) = (a1, a2);
                    path.push("in the exponent".into());
                }
                (Node::Expd(a1, b1, s1), Node::Expd(a2, b2, s2)) => {
                    if s1 != s2 {
                        path.push(format!(
                            "exp scale is {:?}, expected {:?}",
                            f32::from_bits(s2),
                            f32::from_bits(s1)
                        ));
                    }
                    if b1 != b2 {
                        (e, f) = (b1, b2);
                        path.push("in the subtracted row maximum".into());
                    } else if a1 != a2 {
                        (e, f) = (a1, a2);
                        path.push("in the exponent".into());
                    } else {
                        return path.join(" › ");
                    }
                }
                (Node::Expd(..), Node::Exp(..)) => {
                    path.push("the exponential lacks the subtracted row maximum (exp where expd is expected)".into());
                    break;
                }
                (Node::Max { .. }, Node::Max { .. }) => {
                    let (missing, extra) = multiset_diff(self.max_terms(e), self.max_terms(f));
                    let short = Style {
                        depth: style.depth.saturating_sub(1).max(1),
                        ..*style
                    };
                    let list = |ts: &[ExprId]| {
                        ts.iter()
                            .take(style.width)
                            .map(|&t| self.pretty(t, &short))
                            .collect::<Vec<_>>()
                            .join(", ")
                    };
                    path.push(format!(
                        "the maximum misses {} score(s) ({}) and has {} extra ({})",
                        missing.len(),
                        list(&missing),
                        extra.len(),
                        list(&extra)
                    ));
                    return path.join(" › ");
                }
                (Node::Sum { .. }, Node::Sum { .. }) => {
                    let (missing, extra) = multiset_diff(self.sum_terms(e), self.sum_terms(f));
                    if missing.len() == 1 && extra.len() == 1 {
                        (e, f) = (missing[0], extra[0]);
                        path.push("in one term of a sum".into());
                        continue;
                    }
                    if missing.len() == extra.len() {
                        if let Some(&x) = extra.iter().find(|&&x| self.similar(missing[0], x)) {
                            path.push(format!(
                                "in {} of {} terms of a sum, e.g. one",
                                missing.len(),
                                self.sum_terms(e).len()
                            ));
                            (e, f) = (missing[0], x);
                            continue;
                        }
                    }
                    let short = Style {
                        depth: style.depth.saturating_sub(1).max(1),
                        ..*style
                    };
                    let list = |ts: &[ExprId]| {
                        let mut s: Vec<String> = ts
                            .iter()
                            .take(style.width)
                            .map(|&t| self.pretty(t, &short))
                            .collect();
                        if ts.len() > style.width {
                            s.push(format!("… {} more", ts.len() - style.width));
                        }
                        s.join(", ")
                    };
                    let mut parts = Vec::new();
                    if !missing.is_empty() {
                        parts.push(format!(
                            "missing {} term(s): {}",
                            missing.len(),
                            list(&missing)
                        ));
                    }
                    if !extra.is_empty() {
                        parts.push(format!("extra {} term(s): {}", extra.len(), list(&extra)));
                    }
                    path.push(parts.join("; "));
                    return path.join(" › ");
                }
                _ => break,
            }
        }
        path.push(format!(
            "expected {}, found {}",
            self.pretty(e, style),
            self.pretty(f, style)
        ));
        path.join(" › ")
    }

    /// Whether two different expressions look like versions of one another: the same operation
    /// with an operand in common.
    fn similar(&self, a: ExprId, b: ExprId) -> bool {
        match (self.node(a), self.node(b)) {
            (Node::Mul(a1, b1), Node::Mul(a2, b2)) => a1 == a2 || a1 == b2 || b1 == a2 || b1 == b2,
            (Node::Div(a1, b1), Node::Div(a2, b2)) => a1 == a2 || b1 == b2,
            (Node::Exp(..), Node::Exp(..)) => true,
            (Node::Sum { .. }, Node::Sum { .. }) => {
                let (x, y) = (self.sum_terms(a), self.sum_terms(b));
                multiset_diff(x, y).0.len() < x.len()
            }
            _ => false,
        }
    }
}

/// Terms of sorted `a` not in `b` and of sorted `b` not in `a`, with multiplicity.
fn multiset_diff(a: &[ExprId], b: &[ExprId]) -> (Vec<ExprId>, Vec<ExprId>) {
    let (mut i, mut j) = (0, 0);
    let (mut only_a, mut only_b) = (Vec::new(), Vec::new());
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => {
                only_a.push(a[i]);
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                only_b.push(b[j]);
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                i += 1;
                j += 1;
            }
        }
    }
    only_a.extend_from_slice(&a[i..]);
    only_b.extend_from_slice(&b[j..]);
    (only_a, only_b)
}

/// How [`Interner::pretty`] abbreviates.
#[derive(Clone, Copy, Debug)]
pub struct Style {
    pub depth: usize,
    pub width: usize,
    /// Print the head in atoms (`q1:2.0`); off for single-head layers (`q2.0`).
    pub heads: bool,
}

impl Default for Style {
    fn default() -> Self {
        Style {
            depth: 4,
            width: 3,
            heads: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_are_multisets_and_products_commute() {
        let mut ex = Interner::new();
        let a = ex.input(Tensor::Q, 0, 0, 0);
        let b = ex.input(Tensor::K, 0, 1, 0);
        let c = ex.input(Tensor::V, 0, 2, 0);
        assert_eq!(ex.mul(a, b), ex.mul(b, a));
        let ab = ex.add(a, b);
        let abc = ex.add(ab, c);
        let cb = ex.add(c, b);
        let cba = ex.add(cb, a);
        assert_ne!(abc, cba);
        assert_eq!(ex.canonical(abc), ex.canonical(cba));
        assert_eq!(ex.canonical(abc), ex.sum(&[b, c, a]));
        // Multiplicity counts: a + a + b is not a + b.
        let aa = ex.add(a, a);
        let aab = ex.add(aa, b);
        assert_ne!(ex.canonical(aab), ex.canonical(ab));
        assert_eq!(ex.sum(&[a]), a);
        // Scale bits matter.
        assert_ne!(ex.exp(a, 0.5), ex.exp(a, 0.25));
    }

    #[test]
    fn maxima_are_flat_sets() {
        let mut ex = Interner::new();
        let v: Vec<_> = (0..4).map(|c| ex.input(Tensor::Q, 0, 0, c)).collect();
        // Every grouping and order of the same arguments is one node.
        let left = {
            let ab = ex.max(v[0], v[1]);
            let abc = ex.max(ab, v[2]);
            ex.max(abc, v[3])
        };
        let right = {
            let dc = ex.max(v[3], v[2]);
            let ba = ex.max(v[1], v[0]);
            ex.max(dc, ba)
        };
        assert_eq!(left, right);
        assert_eq!(left, ex.max_of(&v));
        assert_eq!(ex.max_terms(left), &v[..]);
        // A missing argument is a different node; a repeated one is not.
        let three = ex.max_of(&v[..3]);
        assert_ne!(three, left);
        assert_eq!(ex.max(three, v[2]), three);
        assert_eq!(ex.max_of(&[v[1]]), v[1]);
        // The bias is an operand of its own: exp(s·(a − M)) is neither exp(s·a) nor another M.
        assert_ne!(ex.expd(v[0], left, 0.5), ex.expd(v[0], three, 0.5));
        assert_ne!(ex.expd(v[0], left, 0.5), ex.exp(v[0], 0.5));
    }

    #[test]
    fn online_rescaling_reaches_the_final_maximum_and_only_online() {
        let mut on = Interner::new();
        on.set_online(true);
        let mut off = Interner::new();
        for ex in [&mut on, &mut off] {
            let s: Vec<_> = (0..3).map(|j| ex.input(Tensor::Q, 0, 0, j)).collect();
            let v: Vec<_> = (0..3).map(|j| ex.input(Tensor::V, 0, j, 0)).collect();
            let m1 = ex.max_of(&s[..2]);
            let m2 = ex.max_of(&s);
            let f = ex.expd(m1, m2, 0.5);
            // (Σ_j e_j·v_j)·f over the first block, then the second block added.
            let old: Vec<_> = (0..2)
                .map(|j| {
                    let e = ex.expd(s[j], m1, 0.5);
                    ex.mul(e, v[j])
                })
                .collect();
            let y = ex.sum(&old);
            let rescaled = ex.mul(f, y);
            let e2 = ex.expd(s[2], m2, 0.5);
            let t2 = ex.mul(e2, v[2]);
            let streamed = ex.sum(&[rescaled, t2]);
            let want: Vec<_> = (0..3)
                .map(|j| {
                    let e = ex.expd(s[j], m2, 0.5);
                    ex.mul(e, v[j])
                })
                .collect();
            let want = ex.sum(&want);
            assert_eq!(streamed == want, ex.is_online());
            // The product rule needs the same scale and a matching middle term.
            let e0 = ex.expd(s[0], m1, 0.5);
            let other_scale = ex.expd(m1, m2, 0.25);
            let e0_m2 = ex.expd(s[0], m2, 0.5);
            assert_ne!(ex.mul(e0, other_scale), e0_m2);
            let backwards = ex.expd(m2, m1, 0.5);
            assert_ne!(ex.mul(e0, backwards), e0_m2);
            assert_eq!(ex.mul(e0, f) == e0_m2, ex.is_online());
            // A maximum of one score stays a maximum online, so that a factor with it as the
            // old maximum is not the score's own exponential.
            let one = ex.max_of(&s[..1]);
            assert_eq!(one == s[0], !ex.is_online());
        }
    }

    #[test]
    fn explain_finds_the_differing_term() {
        let mut ex = Interner::new();
        let q: Vec<_> = (0..3).map(|c| ex.input(Tensor::Q, 0, 0, c)).collect();
        let k: Vec<_> = (0..3).map(|c| ex.input(Tensor::K, 0, 1, c)).collect();
        let p: Vec<_> = (0..3).map(|c| ex.mul(q[c], k[c])).collect();
        let wrong = ex.mul(q[2], k[1]);
        let good = ex.sum(&p);
        let bad = ex.sum(&[p[0], p[1], wrong]);
        let (eg, eb) = (ex.exp(good, 0.5), ex.exp(bad, 0.5));
        let msg = ex.explain(eg, eb, &Style::default());
        assert!(msg.contains("in the exponent"), "{msg}");
        assert!(
            msg.ends_with("expected q0.2·k1.2, found q0.2·k1.1"),
            "{msg}"
        );
    }
}
