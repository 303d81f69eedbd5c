//! Expressions with symbolic indices, for the proof without unrolling: input atoms indexed by
//! affine functions of index variables, the operations of the ISA, and sums and maxima over an
//! index range (`Σ_{b ∈ [lo, hi)} body(b)`, `max_{b ∈ [lo, hi)} body(b)`), hash-consed so that
//! equal expressions are equal ids.
//!
//! Canonical forms extend those of the flattened proof (docs/verifier.md): products of two
//! factors with operands sorted, sums as sorted multisets, maxima as sorted sets, and, online,
//! the product rule of shifted exponentials with distribution over sums. A range binds a
//! variable chosen by the body's structure (one above every variable bound inside it) and is
//! shifted so that the smallest offset at which the body uses it is 0; so the same range built
//! in two ways is one id. Adjacent ranges of one body merge, and a term that is the body at the
//! index just below or above a range extends it.

use super::aff::{Aff, Var};
use crate::expr::{FxHasher, FxMap as HashMap};
use hashbrown::HashTable;
use std::hash::{BuildHasher, BuildHasherDefault};

pub type Id = u32;

fn var_bit(v: Var) -> u64 {
    1 << (v % 64)
}

/// The variable a seeded range is built over before `range` renames it (never a loop's).
const SEED: Var = u32::MAX - 1;

/// The variable a range of ranges is re-indexed over before `range` renames it (never a
/// loop's, never [`SEED`]).
const NEST: Var = u32::MAX - 2;

/// Substitutions [`Terms::subst`] remembers at most.
const MAX_SUBSTITUTED: usize = 1 << 18;

/// Candidate bodies [`Terms::seed`] tries in one proof.
const MAX_SEED_TRIES: u32 = 20_000;

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum T {
    /// `tensor[head][row][col]`; tensor 0 = q, 1 = k, 2 = v.
    Atom(u8, Aff, Aff, Aff),
    Mul(Id, Id),
    Exp(Id, u32),
    Expd(Id, Id, u32),
    Div(Id, Id),
    /// A sorted set of at least one argument, none itself a `Max`.
    Max(Vec<Id>),
    /// A sorted multiset of at least two terms, none itself a `Sum`.
    Sum(Vec<Id>),
    RSum(Var, i64, i64, Id),
    RMax(Var, i64, i64, Id),
    /// The value a loop's previous iteration left at an address (loop id, address).
    Carry(u32, Aff),
}

#[derive(Default)]
pub struct Terms {
    nodes: Vec<T>,
    /// The ids of `nodes`, found by the node's hash: each node is stored once, in `nodes`.
    ids: HashTable<Id>,
    /// Per node, its hash (so that growing `ids` rehashes nothing, and a probe compares
    /// nodes only when the hashes agree).
    hashes: Vec<u64>,
    /// One above every binder bound inside (0: none); free variables do not count.
    depth: Vec<u32>,
    /// Whether a `Carry` occurs inside.
    carries: Vec<bool>,
    /// The variables occurring inside, as a filter: bit `v mod 64` for each (a clear bit means
    /// `v` does not occur, so substituting it changes nothing).
    vars: Vec<u64>,
    /// Inside [`Terms::seed`]: the terms it builds to compare are not seeded themselves (that
    /// would nest attempts without bound).
    seeding: bool,
    /// Candidate bodies tried so far: seeding only merges (it never changes what a term
    /// means), so past a budget it stops, and terms it would have merged stay apart.
    seed_tries: u32,
    /// Budgets of [`MAX_SEED_TRIES`] granted (one per PE evaluated).
    seed_budgets: u32,
    /// What [`Terms::subst`] gave before, by term, variable and replacement: a fact's value
    /// is substituted at the same coordinates by many reads (the row loops of every ring
    /// step), and the result depends only on the three (the store only grows).
    substituted: HashMap<(Id, Var, Aff), Id>,
    /// Emptied memo tables of [`Terms::subst`], kept for the next one (each substitution
    /// starts from an empty table; only the allocation is reused).
    memos: Vec<HashMap<Id, Id>>,
}

impl Terms {
    pub fn node(&self, id: Id) -> &T {
        &self.nodes[id as usize]
    }

    /// `x` as text, `depth` levels deep (for messages).
    pub fn show(&self, x: Id, depth: u32) -> String {
        if depth == 0 {
            return "…".into();
        }
        let aff = |a: &Aff| {
            let mut s = a.c.to_string();
            for &(v, k) in &a.t {
                s += &format!("{k:+}·v{v}");
            }
            s
        };
        let d = depth - 1;
        match self.node(x) {
            T::Atom(t, h, r, c) => format!(
                "{}[{}][{}][{}]",
                ["q", "k", "v"].get(*t as usize).unwrap_or(&"?"),
                aff(h),
                aff(r),
                aff(c)
            ),
            T::Mul(a, b) => format!("({}·{})", self.show(*a, d), self.show(*b, d)),
            T::Div(a, b) => format!("({} / {})", self.show(*a, d), self.show(*b, d)),
            T::Exp(a, _) => format!("exp({})", self.show(*a, d)),
            T::Expd(a, b, _) => format!("exp({} − {})", self.show(*a, d), self.show(*b, d)),
            T::Max(xs) => format!(
                "max({})",
                xs.iter()
                    .map(|&y| self.show(y, d))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            T::Sum(xs) => format!(
                "Σ({})",
                xs.iter()
                    .map(|&y| self.show(y, d))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            T::RSum(b, lo, hi, body) => format!("Σ_{{v{b}∈[{lo},{hi})}}{}", self.show(*body, d)),
            T::RMax(b, lo, hi, body) => format!("max_{{v{b}∈[{lo},{hi})}}{}", self.show(*body, d)),
            T::Carry(l, a) => format!("carry{l}@{a:?}"),
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Back to the empty store, keeping the memory: evaluating the next PE in it is the same
    /// as in a new store (every field reset, ids handed out from 0 again), without growing
    /// and faulting in the tables afresh.
    pub fn clear(&mut self) {
        let Terms {
            nodes,
            ids,
            hashes,
            depth,
            carries,
            vars,
            seeding,
            seed_tries,
            seed_budgets,
            substituted,
            memos,
        } = self;
        nodes.clear();
        ids.clear();
        hashes.clear();
        depth.clear();
        carries.clear();
        vars.clear();
        *seeding = false;
        *seed_tries = 0;
        *seed_budgets = 0;
        substituted.clear();
        memos.clear();
    }

    fn memo(&mut self) -> HashMap<Id, Id> {
        self.memos.pop().unwrap_or_default()
    }

    /// Returns a memo table to the pool, empty; a large one is dropped (emptying it would
    /// cost as much as its capacity at every later use).
    fn done_with(&mut self, mut memo: HashMap<Id, Id>) {
        if memo.capacity() <= 1024 && self.memos.len() < 16 {
            memo.clear();
            self.memos.push(memo);
        }
    }

    pub fn has_carry(&self, id: Id) -> bool {
        self.carries[id as usize]
    }

    fn hash(t: &T) -> u64 {
        BuildHasherDefault::<FxHasher>::default().hash_one(t)
    }

    fn intern(&mut self, t: T) -> Id {
        let hash = Self::hash(&t);
        let (nodes, hashes) = (&self.nodes, &self.hashes);
        if let Some(&id) = self.ids.find(hash, |&id| {
            hashes[id as usize] == hash && nodes[id as usize] == t
        }) {
            return id;
        }
        let (depth, carries) = match &t {
            T::Atom(..) => (0, false),
            T::Carry(..) => (0, true),
            T::Mul(a, b) | T::Div(a, b) | T::Expd(a, b, _) => (
                self.depth[*a as usize].max(self.depth[*b as usize]),
                self.carries[*a as usize] || self.carries[*b as usize],
            ),
            T::Exp(a, _) => (self.depth[*a as usize], self.carries[*a as usize]),
            T::Max(xs) | T::Sum(xs) => (
                xs.iter()
                    .map(|&x| self.depth[x as usize])
                    .max()
                    .unwrap_or(0),
                xs.iter().any(|&x| self.carries[x as usize]),
            ),
            T::RSum(b, _, _, body) | T::RMax(b, _, _, body) => (
                self.depth[*body as usize].max(b + 1),
                self.carries[*body as usize],
            ),
        };
        let bits = |a: &Aff| a.t.iter().fold(0u64, |m, &(v, _)| m | var_bit(v));
        let vars = match &t {
            T::Atom(_, h, r, c) => bits(h) | bits(r) | bits(c),
            T::Carry(_, a) => bits(a),
            T::Mul(a, b) | T::Div(a, b) | T::Expd(a, b, _) => {
                self.vars[*a as usize] | self.vars[*b as usize]
            }
            T::Exp(a, _) => self.vars[*a as usize],
            T::Max(xs) | T::Sum(xs) => xs.iter().fold(0, |m, &x| m | self.vars[x as usize]),
            T::RSum(_, _, _, body) | T::RMax(_, _, _, body) => self.vars[*body as usize],
        };
        let id = self.nodes.len() as Id;
        self.nodes.push(t);
        self.depth.push(depth);
        self.carries.push(carries);
        self.vars.push(vars);
        self.hashes.push(hash);
        let hashes = &self.hashes;
        self.ids.insert_unique(hash, id, |&id| hashes[id as usize]);
        id
    }

    /// Grants `n` budgets of seeding tries in all (a proof evaluating `n` PEs).
    pub fn seed_budgets(&mut self, n: u32) {
        self.seed_budgets = n;
    }

    fn seed_limit(&self) -> u32 {
        MAX_SEED_TRIES.saturating_mul(self.seed_budgets.max(1))
    }

    pub fn atom(&mut self, tensor: u8, head: Aff, row: Aff, col: Aff) -> Id {
        self.intern(T::Atom(tensor, head, row, col))
    }

    /// The value word `addr` held when an iteration of loop `lp` began; the address's
    /// variables are renamed with the expression's (a word per row, carried per row).
    pub fn carry(&mut self, lp: u32, addr: Aff) -> Id {
        self.intern(T::Carry(lp, addr))
    }

    /// A one-element range sum as the term it stands for; anything else unchanged.
    pub fn norm(&mut self, x: Id) -> Id {
        if let T::RSum(b, lo, hi, body) = *self.node(x) {
            if hi - lo == 1 {
                return self.subst(body, b, &Aff::cst(lo));
            }
        }
        x
    }

    fn pair(&mut self, a: Id, b: Id) -> Id {
        let (a, b) = if a <= b { (a, b) } else { (b, a) };
        self.intern(T::Mul(a, b))
    }

    fn is_expd(&self, x: Id) -> bool {
        matches!(self.node(x), T::Expd(..))
    }

    /// `a·b` with the online identities when `online`.
    pub fn mul(&mut self, a: Id, b: Id, online: bool) -> Id {
        let (a, b) = (self.norm(a), self.norm(b));
        if online {
            for (s, f) in [(a, b), (b, a)] {
                if !self.is_expd(f) {
                    continue;
                }
                match self.node(s).clone() {
                    T::Sum(ts) => {
                        let scaled: Vec<Id> = ts.iter().map(|&t| self.mul(t, f, true)).collect();
                        return self.sum(&scaled);
                    }
                    T::RSum(bv, lo, hi, body) => {
                        let inner = self.mul(body, f, true);
                        return self.range(true, bv, lo, hi, inner);
                    }
                    _ => {}
                }
            }
            if self.is_expd(a) || self.is_expd(b) {
                let mut fs = Vec::new();
                self.factors(a, &mut fs);
                self.factors(b, &mut fs);
                let mut merged = false;
                let mut i = 0;
                while i < fs.len() {
                    let mut j = 0;
                    let mut hit = None;
                    while j < fs.len() {
                        if i != j {
                            if let (T::Expd(x, y, s1), T::Expd(y2, z, s2)) =
                                (self.node(fs[i]).clone(), self.node(fs[j]).clone())
                            {
                                if y == y2 && s1 == s2 {
                                    hit = Some((j, self.intern(T::Expd(x, z, s1))));
                                }
                            }
                        }
                        if hit.is_some() {
                            break;
                        }
                        j += 1;
                    }
                    if let Some((j, e)) = hit {
                        fs[i] = e;
                        fs.remove(j);
                        merged = true;
                        i = 0;
                    } else {
                        i += 1;
                    }
                }
                if merged {
                    fs.sort_unstable();
                    let mut acc = fs[0];
                    for &f in &fs[1..] {
                        acc = self.pair(acc, f);
                    }
                    return acc;
                }
            }
        }
        self.pair(a, b)
    }

    fn factors(&self, x: Id, out: &mut Vec<Id>) {
        match *self.node(x) {
            T::Mul(a, b) => {
                self.factors(a, out);
                self.factors(b, out);
            }
            _ => out.push(x),
        }
    }

    pub fn exp(&mut self, a: Id, scale: f32) -> Id {
        let a = self.norm(a);
        self.intern(T::Exp(a, scale.to_bits()))
    }

    pub fn expd(&mut self, a: Id, b: Id, scale: f32) -> Id {
        let (a, b) = (self.norm(a), self.norm(b));
        self.intern(T::Expd(a, b, scale.to_bits()))
    }

    pub fn div(&mut self, a: Id, b: Id) -> Id {
        let (a, b) = (self.norm(a), self.norm(b));
        self.intern(T::Div(a, b))
    }

    /// Whether `x` is a maximum node (a partial or whole row maximum).
    pub fn is_max(&self, x: Id) -> bool {
        matches!(self.node(x), T::Max(_) | T::RMax(..))
    }

    pub fn max(&mut self, a: Id, b: Id) -> Id {
        let mut all = Vec::new();
        for x in [a, b] {
            let x = self.norm(x);
            match self.node(x) {
                T::Max(xs) => all.extend(xs.iter().copied()),
                _ => all.push(x),
            }
        }
        self.collect(false, all)
    }

    pub fn sum(&mut self, terms: &[Id]) -> Id {
        let mut all = Vec::new();
        for &x in terms {
            match self.node(x) {
                T::Sum(xs) => all.extend(xs.iter().copied()),
                _ => all.push(x),
            }
        }
        self.collect(true, all)
    }

    /// `x` with every atom index at `pos` (0 head, 1 row, 2 column) that is the constant
    /// `val` replaced by `val + b`.
    fn shift_index(&mut self, x: Id, pos: usize, val: i64, b: Var) -> Id {
        let mut memo = HashMap::default();
        self.shift_in(x, pos, val, b, &mut memo)
    }

    fn shift_in(&mut self, x: Id, pos: usize, val: i64, b: Var, memo: &mut HashMap<Id, Id>) -> Id {
        if let Some(&y) = memo.get(&x) {
            return y;
        }
        let mut go = |tm: &mut Self, y: Id| tm.shift_in(y, pos, val, b, memo);
        let y = match self.node(x).clone() {
            T::Atom(t, h, r, c) => {
                let mut ix = [h, r, c];
                if ix[pos].as_const() == Some(val) {
                    ix[pos] = Aff::var(b).add_const(val);
                    let [h, r, c] = ix;
                    self.atom(t, h, r, c)
                } else {
                    x
                }
            }
            T::Carry(..) => x,
            T::Mul(a, c) => {
                let (a, c) = (go(self, a), go(self, c));
                self.pair(a, c)
            }
            T::Div(a, c) => {
                let (a, c) = (go(self, a), go(self, c));
                self.div(a, c)
            }
            T::Expd(a, c, sc) => {
                let (a, c) = (go(self, a), go(self, c));
                self.intern(T::Expd(a, c, sc))
            }
            T::Exp(a, sc) => {
                let a = go(self, a);
                self.intern(T::Exp(a, sc))
            }
            T::Max(xs) => {
                let ys: Vec<Id> = xs.iter().map(|&y| go(self, y)).collect();
                if ys.len() == 1 {
                    self.intern(T::Max(ys))
                } else {
                    self.collect(false, ys)
                }
            }
            T::Sum(xs) => {
                let ys: Vec<Id> = xs.iter().map(|&y| go(self, y)).collect();
                self.sum(&ys)
            }
            T::RSum(v, lo, hi, body) => {
                let body = go(self, body);
                self.range(true, v, lo, hi, body)
            }
            T::RMax(v, lo, hi, body) => {
                let body = go(self, body);
                self.range(false, v, lo, hi, body)
            }
        };
        memo.insert(x, y);
        y
    }

    /// Whether `x` has at most `cap` distinct nodes (those already counted in `seen`).
    fn small(&self, x: Id, cap: usize, seen: &mut HashMap<Id, ()>) -> bool {
        if seen.insert(x, ()).is_some() {
            return true;
        }
        if seen.len() > cap {
            return false;
        }
        match self.node(x) {
            T::Atom(..) | T::Carry(..) => true,
            T::Mul(a, b) | T::Div(a, b) | T::Expd(a, b, _) => {
                let (a, b) = (*a, *b);
                self.small(a, cap, seen) && self.small(b, cap, seen)
            }
            T::Exp(a, _) => self.small(*a, cap, seen),
            T::Max(xs) | T::Sum(xs) => xs.clone().iter().all(|&y| self.small(y, cap, seen)),
            T::RSum(_, _, _, body) | T::RMax(_, _, _, body) => self.small(*body, cap, seen),
        }
    }

    /// Constant atom indices inside `x`, `(position, value)`, at most `cap`.
    fn constants(
        &self,
        x: Id,
        out: &mut Vec<(usize, i64)>,
        cap: usize,
        seen: &mut HashMap<Id, ()>,
    ) {
        if out.len() >= cap || seen.insert(x, ()).is_some() {
            return;
        }
        match self.node(x) {
            T::Atom(_, h, r, c) => {
                for (p, a) in [h, r, c].into_iter().enumerate() {
                    if let Some(k) = a.as_const() {
                        if !out.contains(&(p, k)) && out.len() < cap {
                            out.push((p, k));
                        }
                    }
                }
            }
            T::Carry(..) => {}
            T::Mul(a, b) | T::Div(a, b) | T::Expd(a, b, _) => {
                let (a, b) = (*a, *b);
                self.constants(a, out, cap, seen);
                self.constants(b, out, cap, seen);
            }
            T::Exp(a, _) => self.constants(*a, out, cap, seen),
            T::Max(xs) | T::Sum(xs) => {
                for &y in xs.clone().iter() {
                    self.constants(y, out, cap, seen);
                }
            }
            T::RSum(_, _, _, body) | T::RMax(_, _, _, body) => {
                self.constants(*body, out, cap, seen)
            }
        }
    }

    /// Three terms of `all` that are one body at three consecutive values of an atom index
    /// (terms written out one by one, e.g. keys of a row iterated one at a time) as one
    /// range, so that they meet the range the specification builds; `None` if there are none.
    fn seed(&mut self, add: bool, all: &[Id]) -> Option<(Vec<usize>, Id)> {
        if self.seeding || self.seed_tries >= self.seed_limit() {
            return None;
        }
        self.seeding = true;
        let found = self.seed_in(add, all);
        self.seeding = false;
        found
    }

    fn seed_in(&mut self, add: bool, all: &[Id]) -> Option<(Vec<usize>, Id)> {
        let plain: Vec<usize> = (0..all.len())
            .filter(|&i| match self.node(all[i]) {
                T::RSum(..) => !add,
                T::RMax(..) => add,
                _ => true,
            })
            .collect();
        // Few written-out terms only: what rows of a few keys and short loops iterated one by
        // one leave (a long list of unrelated terms would be tried over and over).
        if plain.len() < 3 || plain.len() > 12 {
            return None;
        }
        let at: HashMap<Id, usize> = plain.iter().map(|&i| (all[i], i)).collect();
        for &i in &plain {
            let x = all[i];
            // Small terms only: rebuilding a large one per candidate costs more than seeding
            // saves (canonical rows stay small, their long sums and maxima being ranges).
            if !self.small(x, 96, &mut HashMap::default()) {
                continue;
            }
            let mut cands = Vec::new();
            self.constants(x, &mut cands, 8, &mut HashMap::default());
            for (pos, val) in cands {
                self.seed_tries += 1;
                if self.seed_tries > self.seed_limit() {
                    return None;
                }
                let body = self.shift_index(x, pos, val, SEED);
                // The body must give back `x` itself at 0, the other two at 1 and 2.
                if self.subst(body, SEED, &Aff::cst(0)) != x {
                    continue;
                }
                let one = self.subst(body, SEED, &Aff::cst(1));

                let Some(&j) = at.get(&one) else { continue };
                let two = self.subst(body, SEED, &Aff::cst(2));
                let Some(&k) = at.get(&two) else { continue };
                if i == j || j == k || i == k {
                    continue;
                }
                let r = self.range(add, SEED, 0, 3, body);
                if matches!(
                    (add, self.node(r)),
                    (true, T::RSum(..)) | (false, T::RMax(..))
                ) {
                    return Some((vec![i, j, k], r));
                }
            }
        }
        None
    }

    /// The sum (`add`) or maximum of `all`, with ranges merged.
    fn collect(&mut self, add: bool, mut all: Vec<Id>) -> Id {
        if !add {
            all.sort_unstable();
            all.dedup();
        }
        while let Some((used, r)) = self.seed(add, &all) {
            let mut used = used;
            used.sort_unstable();
            for &u in used.iter().rev() {
                all.remove(u);
            }
            all.push(r);
        }
        loop {
            let mut changed = false;
            'outer: for i in 0..all.len() {
                let (bv, lo, hi, body) = match (add, self.node(all[i]).clone()) {
                    (true, T::RSum(b, l, h, body)) | (false, T::RMax(b, l, h, body)) => {
                        (b, l, h, body)
                    }
                    _ => continue,
                };
                // The body just below and just above the range, built once for every `j`.
                let mut ends: Option<(Id, Id)> = None;
                for j in 0..all.len() {
                    if i == j {
                        continue;
                    }
                    let other = self.node(all[j]).clone();
                    let grown = match other {
                        T::RSum(b2, l2, h2, body2) | T::RMax(b2, l2, h2, body2)
                            if add == matches!(other, T::RSum(..))
                                && b2 == bv
                                && body2 == body
                                && (h2 == lo || l2 == hi) =>
                        {
                            Some((lo.min(l2), hi.max(h2)))
                        }
                        // Only a term of the body's kind can be the body at one index.
                        _ if std::mem::discriminant(self.node(all[j]))
                            != std::mem::discriminant(self.node(body)) =>
                        {
                            None
                        }
                        _ => {
                            let (below, above) = *ends.get_or_insert_with(|| {
                                (
                                    self.subst(body, bv, &Aff::cst(lo - 1)),
                                    self.subst(body, bv, &Aff::cst(hi)),
                                )
                            });
                            if all[j] == below {
                                Some((lo - 1, hi))
                            } else if all[j] == above {
                                Some((lo, hi + 1))
                            } else {
                                None
                            }
                        }
                    };
                    if let Some((l, h)) = grown {
                        let node = if add {
                            T::RSum(bv, l, h, body)
                        } else {
                            T::RMax(bv, l, h, body)
                        };
                        let merged = self.intern(node);
                        let (a, b) = (i.min(j), i.max(j));
                        all.remove(b);
                        all[a] = merged;
                        changed = true;
                        break 'outer;
                    }
                }
            }
            if !changed {
                break;
            }
        }
        all.sort_unstable();
        if !add {
            all.dedup();
        }
        if all.len() == 1 {
            let x = all[0];
            if add {
                return self.norm(x);
            }
            if matches!(self.node(x), T::RMax(..)) {
                return x;
            }
        }
        self.intern(if add { T::Sum(all) } else { T::Max(all) })
    }

    /// `Σ` (`add`) or `max` of `body` over `v ∈ [lo, hi)`, canonical: `v` shifted so that its
    /// smallest offset in the body's atoms is 0, and renamed to the binder one above every
    /// binder inside.
    pub fn range(&mut self, add: bool, v: Var, lo: i64, hi: i64, body: Id) -> Id {
        // A range of a sum is the sum of the terms' ranges (and likewise for maxima): the
        // same multiset of terms, or set of arguments, regrouped. Each term may then meet a
        // range of its own kind (a run of ring steps, two blocks of keys per step).
        if hi > lo {
            let terms = match (self.node(body), add) {
                (T::Sum(xs), true) | (T::Max(xs), false) => Some(xs.clone()),
                _ => None,
            };
            if let Some(xs) = terms {
                let parts: Vec<Id> = xs
                    .into_iter()
                    .map(|x| self.range(add, v, lo, hi, x))
                    .collect();
                return if add {
                    self.sum(&parts)
                } else {
                    let mut m = parts[0];
                    for &x in &parts[1..] {
                        m = self.max(m, x);
                    }
                    m
                };
            }
        }
        if let Some(id) = self.blocks(add, v, lo, hi, body) {
            return id;
        }
        let mut offsets = Vec::new();
        self.offsets(body, v, &mut offsets, &mut HashMap::default());
        let shift = if offsets.iter().all(|&(coef, _)| coef == 1) {
            offsets.iter().map(|&(_, c)| c).min().unwrap_or(0)
        } else {
            0
        };
        // v = v' − shift, v' ∈ [lo + shift, hi + shift).
        // Shifting `v` binds nothing, so the binder is one above those bound in `body`, and
        // the shift and the renaming are one substitution. It stands only if nothing in the
        // result binds the new name (else it could capture it): then the two steps as written.
        let binder = self.depth[body as usize];
        let once = (binder != v)
            .then(|| self.subst(body, v, &Aff::var(binder).add_const(-shift)))
            .filter(|&b| self.depth[b as usize] <= binder);
        let (binder, body) = match once {
            Some(b) => (binder, b),
            None => {
                let moved = self.subst(body, v, &Aff::var(v).add_const(-shift));
                let binder = self.depth[moved as usize];
                if binder == v {
                    (binder, moved)
                } else {
                    (binder, self.subst(moved, v, &Aff::var(binder)))
                }
            }
        };
        let (lo, hi) = (lo + shift, hi + shift);
        let node = if add {
            T::RSum(binder, lo, hi, body)
        } else {
            T::RMax(binder, lo, hi, body)
        };
        // Two values as the two terms they are: a loop of two iterations and two bundles
        // written out (a row with two keys) then meet in one form.
        if hi - lo == 2 {
            let a = self.subst(body, binder, &Aff::cst(lo));
            let b = self.subst(body, binder, &Aff::cst(lo + 1));
            return if add {
                self.sum(&[a, b])
            } else {
                self.max(a, b)
            };
        }
        // One value of a sum is the term it stands for.
        if add && hi - lo == 1 {
            return self.subst(body, binder, &Aff::cst(lo));
        }
        let id = self.intern(node);
        if !add && hi - lo == 1 {
            let one = self.subst(body, binder, &Aff::cst(lo));
            return self.intern(T::Max(vec![one]));
        }
        id
    }

    /// A range over `v` of a range over `c ∈ [a, a + w)` whose body depends on `v` and `c`
    /// only through `j = k·v + c` with `|k| = w`, as one range over `j`: consecutive blocks
    /// of `w` (a running sum or maximum carried over ring steps, each step one block of keys)
    /// are the keys of all the blocks. `(v, c) ↦ (v, j)` is a bijection and each `j` is
    /// reached by exactly one `(v, c)` of the box, so the sum (maximum) is the same.
    fn blocks(&mut self, add: bool, v: Var, lo: i64, hi: i64, body: Id) -> Option<Id> {
        let (c, a, z, inner) = match *self.node(body) {
            T::RSum(c, a, z, inner) if add => (c, a, z, inner),
            T::RMax(c, a, z, inner) if !add => (c, a, z, inner),
            _ => return None,
        };
        if hi - lo < 2 || v == c {
            return None;
        }
        let mut offsets = Vec::new();
        self.offsets(inner, v, &mut offsets, &mut HashMap::default());
        let k = offsets.first()?.0;
        let w = z - a;
        if k.abs() != w || offsets.iter().any(|&(kk, _)| kk != k) {
            return None;
        }
        let g = self.subst(inner, c, &Aff::var(NEST).add_term(v, -k));
        let mut left = Vec::new();
        self.offsets(g, v, &mut left, &mut HashMap::default());
        if !left.is_empty() {
            return None;
        }
        // j = k·v + c over v ∈ [lo, hi), c ∈ [a, z).
        let (jlo, jhi) = if k > 0 {
            (k * lo + a, k * hi + a)
        } else {
            (k * (hi - 1) + a, k * (lo - 1) + a)
        };
        Some(self.range(add, NEST, jlo, jhi, g))
    }

    /// `(coefficient, constant)` of every atom index that uses `v`.
    fn offsets(&self, x: Id, v: Var, out: &mut Vec<(i64, i64)>, seen: &mut HashMap<Id, ()>) {
        if seen.insert(x, ()).is_some() {
            return;
        }
        match self.node(x) {
            T::Atom(_, a, b, c) => {
                for aff in [a, b, c] {
                    let k = aff.coef(v);
                    if k != 0 {
                        out.push((k, aff.c));
                    }
                }
            }
            T::Carry(..) => {}
            T::Mul(a, b) | T::Div(a, b) | T::Expd(a, b, _) => {
                let (a, b) = (*a, *b);
                self.offsets(a, v, out, seen);
                self.offsets(b, v, out, seen);
            }
            T::Exp(a, _) => self.offsets(*a, v, out, seen),
            T::Max(xs) | T::Sum(xs) => {
                for &y in xs.clone().iter() {
                    self.offsets(y, v, out, seen);
                }
            }
            T::RSum(b, _, _, body) | T::RMax(b, _, _, body) => {
                if *b != v {
                    self.offsets(*body, v, out, seen);
                }
            }
        }
    }

    /// A body over `w` meant to be `a` at `w = 0` and `b` at `w = 1`, when the two are input
    /// elements whose indices differ by constants (the caller checks both ends).
    pub fn interpolate(&mut self, a: Id, b: Id, w: Var) -> Option<Id> {
        if a == b {
            return Some(a);
        }
        let (T::Atom(t, h, r, c), T::Atom(u, h2, r2, c2)) = (self.node(a), self.node(b)) else {
            return None;
        };
        if t != u {
            return None;
        }
        let step = |x: &Aff, y: &Aff| y.minus(x).as_const().map(|k| x.clone().add_term(w, k));
        let (t, h, r, c) = (*t, step(h, h2)?, step(r, r2)?, step(c, c2)?);
        Some(self.atom(t, h, r, c))
    }

    /// `x` with variable `v` replaced by `by`, rebuilt through the canonical constructors.
    pub fn subst(&mut self, x: Id, v: Var, by: &Aff) -> Id {
        if self.vars[x as usize] & var_bit(v) == 0 || matches!(self.node(x), T::Atom(..)) {
            return self.subst_in(x, v, by, &mut HashMap::default());
        }
        let key = (x, v, by.clone());
        if let Some(&y) = self.substituted.get(&key) {
            return y;
        }
        let mut memo = self.memo();
        let y = self.subst_in(x, v, by, &mut memo);
        self.done_with(memo);
        // Forgetting costs only recomputation: one store shared by a whole ring (the lockstep
        // proof) would otherwise keep every substitution it ever made.
        if self.substituted.len() >= MAX_SUBSTITUTED {
            self.substituted.clear();
        }
        self.substituted.insert(key, y);
        y
    }

    /// The maximum of substituted arguments `ys`, as substitution rebuilds it.
    fn max_of(&mut self, ys: Vec<Id>) -> Id {
        let mut all = Vec::new();
        for y in ys {
            let y = self.norm(y);
            match self.node(y) {
                T::Max(zs) => all.extend(zs.iter().copied()),
                _ => all.push(y),
            }
        }
        if all.len() == 1 && !matches!(self.node(all[0]), T::RMax(..)) {
            self.intern(T::Max(all))
        } else {
            self.collect(false, all)
        }
    }

    fn subst_in(&mut self, x: Id, v: Var, by: &Aff, memo: &mut HashMap<Id, Id>) -> Id {
        if self.vars[x as usize] & var_bit(v) == 0 {
            return x;
        }
        // An atom's forms are substituted in place (no copy of the node first), and not
        // remembered: interning the same forms again gives the same atom, and a read of an
        // input region substitutes into a lone atom, for which a memo would be allocated.
        if let T::Atom(t, a, b, c) = self.node(x) {
            if a.coef(v) == 0 && b.coef(v) == 0 && c.coef(v) == 0 {
                return x;
            }
            let (t, a, b, c) = (*t, a.subst(v, by), b.subst(v, by), c.subst(v, by));
            return self.atom(t, a, b, c);
        }
        if let Some(&y) = memo.get(&x) {
            return y;
        }
        // Sums and maxima: their arguments copied to the stack, not the node cloned.
        if let T::Max(xs) | T::Sum(xs) = self.node(x) {
            let add = matches!(self.node(x), T::Sum(_));
            let xs: smallvec::SmallVec<[Id; 16]> = xs.iter().copied().collect();
            let ys: Vec<Id> = xs.iter().map(|&y| self.subst_in(y, v, by, memo)).collect();
            let y = if add { self.sum(&ys) } else { self.max_of(ys) };
            memo.insert(x, y);
            return y;
        }
        let y = match self.node(x).clone() {
            // Atoms take the in-place path above; this arm only keeps the match total.
            T::Atom(t, a, b, c) => self.atom(t, a.subst(v, by), b.subst(v, by), c.subst(v, by)),
            T::Carry(l, a) => self.carry(l, a.subst(v, by)),
            // Substitution never enters products' online rules: it maps each factor and
            // multiplies them back as they were.
            T::Mul(a, b) => {
                let (a, b) = (self.subst_in(a, v, by, memo), self.subst_in(b, v, by, memo));
                self.pair(a, b)
            }
            T::Div(a, b) => {
                let (a, b) = (self.subst_in(a, v, by, memo), self.subst_in(b, v, by, memo));
                self.div(a, b)
            }
            T::Expd(a, b, s) => {
                let (a, b) = (self.subst_in(a, v, by, memo), self.subst_in(b, v, by, memo));
                let (a, b) = (self.norm(a), self.norm(b));
                self.intern(T::Expd(a, b, s))
            }
            T::Exp(a, s) => {
                let a = self.subst_in(a, v, by, memo);
                let a = self.norm(a);
                self.intern(T::Exp(a, s))
            }
            // Sums and maxima take the path above; these arms only keep the match total.
            T::Max(xs) => {
                let ys: Vec<Id> = xs.iter().map(|&y| self.subst_in(y, v, by, memo)).collect();
                self.max_of(ys)
            }
            T::Sum(xs) => {
                let ys: Vec<Id> = xs.iter().map(|&y| self.subst_in(y, v, by, memo)).collect();
                self.sum(&ys)
            }
            T::RSum(b, lo, hi, body) | T::RMax(b, lo, hi, body) if b == v => {
                let _ = (lo, hi, body);
                x
            }
            T::RSum(b, lo, hi, body) | T::RMax(b, lo, hi, body) => {
                let add = matches!(self.node(x), T::RSum(..));
                let mut inner = self.memo();
                let body = self.subst_in(body, v, by, &mut inner);
                self.done_with(inner);
                self.range(add, b, lo, hi, body)
            }
        };
        memo.insert(x, y);
        y
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `k[0][row][0]` with the row affine in loop variables.
    fn key(tm: &mut Terms, row: Aff) -> Id {
        tm.atom(1, Aff::cst(0), row, Aff::cst(0))
    }

    // Loop variables as the proof allocates them: above every binder.
    const S: Var = super::super::aff::BINDERS + 1;
    const C: Var = super::super::aff::BINDERS + 2;
    const J: Var = super::super::aff::BINDERS + 3;

    /// `Σ` or `max` over `s ∈ [0, steps)` of the same over `c ∈ [0, w)` of `k[row(s, c)]`.
    fn nested(tm: &mut Terms, add: bool, steps: i64, w: i64, row: Aff) -> Id {
        let body = key(tm, row);
        let inner = tm.range(add, C, 0, w, body);
        tm.range(add, S, 0, steps, inner)
    }

    fn flat(tm: &mut Terms, add: bool, lo: i64, hi: i64) -> Id {
        let body = key(tm, Aff::var(J));
        tm.range(add, J, lo, hi, body)
    }

    #[test]
    fn blocks_of_keys_over_steps_are_one_range_of_keys() {
        let mut tm = Terms::default();
        for add in [true, false] {
            // Blocks of 8 forward (8·s + c) and backward (24 − 8·s + c): keys 0..32 both ways.
            let forward = nested(
                &mut tm,
                add,
                4,
                8,
                Aff::cst(0).add_term(S, 8).add_term(C, 1),
            );
            let backward = nested(
                &mut tm,
                add,
                4,
                8,
                Aff::cst(24).add_term(S, -8).add_term(C, 1),
            );
            let keys = flat(&mut tm, add, 0, 32);
            assert_eq!(forward, keys, "{}", tm.show(forward, 4));
            assert_eq!(backward, keys, "{}", tm.show(backward, 4));
            // Offset blocks: keys 5..37.
            let moved = nested(
                &mut tm,
                add,
                4,
                8,
                Aff::cst(5).add_term(S, 8).add_term(C, 1),
            );
            let keys = flat(&mut tm, add, 5, 37);
            assert_eq!(moved, keys, "{}", tm.show(moved, 4));
        }
    }

    #[test]
    fn blocks_that_skip_or_overlap_keys_stay_apart() {
        let mut tm = Terms::default();
        for add in [true, false] {
            // Stride 16 over blocks of 8 skips keys; stride 4 counts keys twice; a key index
            // 2·c is not a block of consecutive keys.
            let skips = nested(
                &mut tm,
                add,
                4,
                8,
                Aff::cst(0).add_term(S, 16).add_term(C, 1),
            );
            let twice = nested(
                &mut tm,
                add,
                4,
                8,
                Aff::cst(0).add_term(S, 4).add_term(C, 1),
            );
            let every_other = nested(
                &mut tm,
                add,
                4,
                8,
                Aff::cst(0).add_term(S, 8).add_term(C, 2),
            );
            for (x, hi) in [(skips, 64), (skips, 32), (twice, 20), (twice, 32)] {
                let keys = flat(&mut tm, add, 0, hi);
                assert_ne!(x, keys, "{}", tm.show(x, 4));
            }
            assert!(
                matches!(tm.node(skips), T::RSum(..) | T::RMax(..)),
                "{}",
                tm.show(skips, 4)
            );
            let over = flat(&mut tm, add, 0, 64);
            assert_ne!(every_other, over);
            // A body that uses the step apart from the key (a query row per step) is not
            // one range of keys either.
            let q = tm.atom(0, Aff::cst(0), Aff::var(S), Aff::cst(0));
            let k = key(&mut tm, Aff::cst(0).add_term(S, 8).add_term(C, 1));
            let qk = tm.mul(q, k, true);
            let inner = tm.range(add, C, 0, 8, qk);
            let rows = tm.range(add, S, 0, 4, inner);
            assert!(
                matches!(tm.node(rows), T::RSum(_, 0, 4, _) | T::RMax(_, 0, 4, _)),
                "{}",
                tm.show(rows, 4)
            );
        }
    }
}
