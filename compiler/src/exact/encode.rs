//! CNF for "the layer runs on `m` PEs within `T` cycles", over the [`Model`]'s ops, values and
//! chains. docs/exact.md describes the variables and constraints; the comments here say why a
//! constraint has the form it has.

// Index loops mirror the constraint formulas (literal i, PE p, cycle t) more plainly than
// iterator chains would.
#![allow(clippy::needless_range_loop)]

use super::model::{ChainId, Model, OpId, Producer, ValueId};
use std::collections::HashSet;

/// Literal that is always true (variable 1 is fixed by a unit clause); `-TRUE` is false.
pub const TRUE: i32 = 1;
pub const FALSE: i32 = -1;

/// A growing CNF: clauses flat and zero-terminated, as the solver takes them.
#[derive(Default)]
pub struct Cnf {
    pub vars: i32,
    pub clauses: Vec<i32>,
    pub count: usize,
}

impl Cnf {
    pub fn new() -> Self {
        Cnf {
            vars: 1,
            clauses: vec![TRUE, 0],
            count: 1,
        }
    }

    pub fn var(&mut self) -> i32 {
        self.vars += 1;
        self.vars
    }

    /// `k` fresh variables; returns the first.
    fn block(&mut self, k: i64) -> i32 {
        let base = self.vars + 1;
        self.vars += k as i32;
        base
    }

    /// Adds a clause, dropping false literals and skipping clauses that are already true.
    /// (Repeated literals are left to the solver, which removes them.)
    pub fn clause(&mut self, lits: &[i32]) {
        if lits.contains(&TRUE) {
            return;
        }
        let start = self.clauses.len();
        self.clauses
            .extend(lits.iter().copied().filter(|&l| l != FALSE));
        if self.clauses.len() == start {
            // Every literal was false: the formula is unsatisfiable.
            self.clauses.push(FALSE);
        }
        self.clauses.push(0);
        self.count += 1;
    }

    /// At most one of `lits`: pairwise for a handful, else a sequential counter (Sinz 2005),
    /// which needs 3k clauses and k − 1 auxiliaries instead of k²/2 clauses.
    pub fn at_most_one(&mut self, lits: &[i32]) {
        let lits: Vec<i32> = lits.iter().copied().filter(|&l| l != FALSE).collect();
        if lits.len() <= 5 {
            for i in 0..lits.len() {
                for j in i + 1..lits.len() {
                    self.clause(&[-lits[i], -lits[j]]);
                }
            }
            return;
        }
        let k = lits.len();
        let s = self.block(k as i64 - 1);
        self.clause(&[-lits[0], s]);
        for i in 1..k - 1 {
            let (prev, cur) = (s + i as i32 - 1, s + i as i32);
            self.clause(&[-lits[i], cur]);
            self.clause(&[-prev, cur]);
            self.clause(&[-lits[i], -prev]);
        }
        self.clause(&[-lits[k - 1], -(s + k as i32 - 2)]);
    }

    /// At most `k` of `lits` (sequential counter: `s[i][j]` = at least `j + 1` of the first
    /// `i + 1` are true).
    pub fn at_most(&mut self, lits: &[i32], k: usize) {
        let lits: Vec<i32> = lits.iter().copied().filter(|&l| l != FALSE).collect();
        if k >= lits.len() {
            return;
        }
        if k == 0 {
            for &l in &lits {
                self.clause(&[-l]);
            }
            return;
        }
        if k == 1 {
            self.at_most_one(&lits);
            return;
        }
        let n = lits.len();
        let s = self.block((n * k) as i64);
        let r = |i: usize, j: usize| s + (i * k + j) as i32;
        for i in 0..n {
            let x = lits[i];
            self.clause(&[-x, r(i, 0)]);
            if i > 0 {
                for j in 0..k {
                    self.clause(&[-r(i - 1, j), r(i, j)]);
                }
                for j in 1..k {
                    self.clause(&[-x, -r(i - 1, j - 1), r(i, j)]);
                }
                self.clause(&[-x, -r(i - 1, k - 1)]);
            }
        }
    }

    pub fn exactly_one(&mut self, lits: &[i32]) {
        self.clause(lits);
        self.at_most_one(lits);
    }
}

/// Variables `x[p][t]` for `t` in `lo..=hi` on every PE; constant `outside` elsewhere.
#[derive(Clone, Copy, Debug)]
pub struct Grid {
    base: i32,
    lo: i64,
    len: i64,
    pes: u32,
    outside: i32,
}

impl Grid {
    fn new(cnf: &mut Cnf, pes: u32, lo: i64, hi: i64, outside: i32) -> Grid {
        let len = (hi - lo + 1).max(0);
        let base = cnf.block(len * i64::from(pes));
        Grid {
            base,
            lo,
            len,
            pes,
            outside,
        }
    }

    fn none(outside: i32) -> Grid {
        Grid {
            base: 0,
            lo: 0,
            len: 0,
            pes: 0,
            outside,
        }
    }

    pub fn at(&self, p: u32, t: i64) -> i32 {
        if p < self.pes && t >= self.lo && t < self.lo + self.len {
            self.base + (i64::from(p) * self.len + (t - self.lo)) as i32
        } else {
            self.outside
        }
    }
}

/// Variables `x[t]` for `t` in `lo..=hi`; `below` before, `above` after.
#[derive(Clone, Copy, Debug)]
pub struct Line {
    base: i32,
    lo: i64,
    hi: i64,
    below: i32,
    above: i32,
}

impl Line {
    fn new(cnf: &mut Cnf, lo: i64, hi: i64, below: i32, above: i32) -> Line {
        let base = cnf.block((hi - lo + 1).max(0));
        Line {
            base,
            lo,
            hi,
            below,
            above,
        }
    }

    pub fn at(&self, t: i64) -> i32 {
        if t < self.lo {
            self.below
        } else if t > self.hi {
            self.above
        } else {
            self.base + (t - self.lo) as i32
        }
    }
}

/// The CNF plus where every variable is, for decoding.
pub struct Encoding {
    pub model: Model,
    pub cnf: Cnf,
    /// `on[o][p]`: op `o` runs on PE `p`.
    pub on: Vec<Vec<i32>>,
    /// `done[o][t]`: op `o` ran in a cycle before `t` (order encoding of its cycle).
    pub done: Vec<Line>,
    /// `run[o][p][t]`: op `o` runs on PE `p` in cycle `t`.
    pub run: Vec<Grid>,
    /// `have[v][p][t]`: value `v` is in PE `p`'s memory at the start of cycle `t`.
    pub have: Vec<Grid>,
    /// `send[v][p][t]`: PE `p` sends value `v` to PE `p + 1` in cycle `t`.
    pub send: Vec<Grid>,
    /// `pre[v][p]`: input `v` is preloaded on PE `p` (empty for computed values).
    pub pre: Vec<Vec<i32>>,
    /// `busy[x][p][t]`: some op of chain `x` runs on PE `p` in cycle `t`.
    pub busy: Vec<Grid>,
    /// `tok[x][p][t]`: chain `x`'s unfinished partial sum is in PE `p`'s memory at the start of `t`.
    pub tok: Vec<Grid>,
    /// `tsend[x][p][t]`: PE `p` sends chain `x`'s partial sum in cycle `t` (from memory, or the
    /// accumulate result of this cycle's op of the chain).
    pub tsend: Vec<Grid>,
    /// `started[x][t]`: some op of chain `x` ran before cycle `t`.
    pub started: Vec<Line>,
    /// `fin[x][t]`: every op of chain `x` ran before cycle `t`.
    pub fin: Vec<Line>,
    /// `last[x][p][t]`: the last op of chain `x` runs on PE `p` in cycle `t`, so its finished sum
    /// is made there then.
    pub last: Vec<Grid>,
    /// `idle[p][t]`: PE `p` runs no op in cycle `t`.
    pub idle: Grid,
}

impl Encoding {
    pub fn variables(&self) -> u64 {
        self.cnf.vars as u64
    }

    pub fn clauses(&self) -> u64 {
        self.cnf.count as u64
    }
}

/// What goes into the CNF beyond the machine's rules: each keeps at least one optimal schedule
/// (docs/exact.md), and each can be left out to check that.
#[derive(Clone, Copy, Debug)]
pub struct EncodeOptions {
    pub symmetry_breaking: bool,
    pub slack_limit: bool,
    pub dominance: bool,
}

pub fn encode(model: Model, opts: EncodeOptions) -> Encoding {
    let mut cnf = Cnf::new();
    let m = model.pes;
    let links = m > 1;
    let next = |p: u32| (p + 1) % m;
    let prev = |p: u32| (p + m - 1) % m;

    // Variables.
    let on: Vec<Vec<i32>> = model
        .ops
        .iter()
        .map(|_| {
            if m == 1 {
                vec![TRUE]
            } else {
                (0..m).map(|_| cnf.var()).collect()
            }
        })
        .collect();
    let done: Vec<Line> = model
        .ops
        .iter()
        .map(|o| Line::new(&mut cnf, o.lo + 1, o.hi, FALSE, TRUE))
        .collect();
    let run: Vec<Grid> = model
        .ops
        .iter()
        .map(|o| Grid::new(&mut cnf, m, o.lo, o.hi, FALSE))
        .collect();
    let have: Vec<Grid> = model
        .values
        .iter()
        .map(|v| Grid::new(&mut cnf, m, v.lo, v.hi, FALSE))
        .collect();
    let send: Vec<Grid> = model
        .values
        .iter()
        .map(|v| {
            if links {
                Grid::new(&mut cnf, m, v.send_lo(), v.hi - 1, FALSE)
            } else {
                Grid::none(FALSE)
            }
        })
        .collect();
    let pre: Vec<Vec<i32>> = model
        .values
        .iter()
        .map(|v| match v.producer {
            Producer::Input if m == 1 => vec![TRUE],
            Producer::Input => (0..m).map(|_| cnf.var()).collect(),
            _ => Vec::new(),
        })
        .collect();
    let busy: Vec<Grid> = model
        .chains
        .iter()
        .map(|c| Grid::new(&mut cnf, m, c.lo, c.hi, FALSE))
        .collect();
    let tok: Vec<Grid> = model
        .chains
        .iter()
        .map(|c| Grid::new(&mut cnf, m, c.lo + 1, c.hi, FALSE))
        .collect();
    let tsend: Vec<Grid> = model
        .chains
        .iter()
        .map(|c| {
            if links {
                Grid::new(&mut cnf, m, c.lo, c.hi - 1, FALSE)
            } else {
                Grid::none(FALSE)
            }
        })
        .collect();
    let started: Vec<Line> = model
        .chains
        .iter()
        .map(|c| Line::new(&mut cnf, c.lo + 1, c.hi + 1, FALSE, TRUE))
        .collect();
    let fin: Vec<Line> = model
        .chains
        .iter()
        .map(|c| Line::new(&mut cnf, c.lo + 1, c.hi + 1, FALSE, TRUE))
        .collect();
    let last: Vec<Grid> = model
        .chains
        .iter()
        .map(|c| {
            if c.result.is_some() {
                Grid::new(&mut cnf, m, c.lo, c.hi, FALSE)
            } else {
                Grid::none(FALSE)
            }
        })
        .collect();

    // Ops: one PE, one cycle, operands present.
    if model.trivially_infeasible() {
        cnf.clause(&[]);
    }
    for (o, op) in model.ops.iter().enumerate() {
        cnf.exactly_one(&on[o]);
        for t in op.lo + 1..op.hi {
            cnf.clause(&[-done[o].at(t), done[o].at(t + 1)]);
        }
        let reads: Vec<ValueId> = {
            let mut seen = HashSet::new();
            op.reads
                .iter()
                .copied()
                .filter(|v| seen.insert(*v))
                .collect()
        };
        for p in 0..m {
            for t in op.lo..=op.hi {
                let x = run[o].at(p, t);
                let (before, by) = (done[o].at(t), done[o].at(t + 1));
                cnf.clause(&[-x, on[o][p as usize]]);
                cnf.clause(&[-x, by]);
                cnf.clause(&[-x, -before]);
                cnf.clause(&[-on[o][p as usize], -by, before, x]);
                for &v in &reads {
                    cnf.clause(&[-x, have[v].at(p, t)]);
                }
            }
        }
    }

    // Immutable values: present only where preloaded, made, or received.
    let producers =
        |v: ValueId, p: u32, t: i64| -> i32 { made(model.values[v].producer, &run, &last, p, t) };
    let mut readers: Vec<Vec<OpId>> = vec![Vec::new(); model.values.len()];
    for (o, op) in model.ops.iter().enumerate() {
        for &v in &op.reads {
            if !readers[v].contains(&o) {
                readers[v].push(o);
            }
        }
    }
    // `ends[x][p]`: chain x finishes on PE p.
    let ends: Vec<Vec<i32>> = model
        .chains
        .iter()
        .enumerate()
        .map(|(x, ch)| {
            if ch.result.is_none() {
                return Vec::new();
            }
            let e: Vec<i32> = (0..m).map(|_| cnf.var()).collect();
            for p in 0..m {
                let mut c = vec![-e[p as usize]];
                for t in ch.lo..=ch.hi {
                    let l = last[x].at(p, t);
                    c.push(l);
                    cnf.clause(&[-l, e[p as usize]]);
                }
                cnf.clause(&c);
            }
            cnf.exactly_one(&e);
            e
        })
        .collect();
    for (v, val) in model.values.iter().enumerate() {
        // Implied, for propagation: a value k PEs downstream of everywhere it can come from
        // was k PEs upstream k cycles earlier.
        let home = |p: u32| -> i32 {
            match val.producer {
                Producer::Input => pre[v][p as usize],
                Producer::Op(o) | Producer::Quotient(o) => on[o][p as usize],
                Producer::Chain(x) => ends[x][p as usize],
            }
        };
        // An accumulate result (or a quotient riding the acc slot) can leave in the cycle it
        // is made, before it is in memory, so its upstream copy is only known to be there a
        // cycle later.
        let acc_sent = i64::from(val.producer.leaves_when_made());
        if links {
            for p in 0..m {
                for t in val.lo..=val.hi {
                    let mut c = vec![-have[v].at(p, t)];
                    for k in 1..m {
                        c.push(home((p + m - (k - 1)) % m));
                        let mut d = c.clone();
                        d.push(have[v].at((p + m - k) % m, t - i64::from(k) + acc_sent));
                        cnf.clause(&d);
                    }
                }
            }
        }
        // `used[p][t]`: PE p reads or forwards v in some cycle from t on.
        let used = Grid::new(&mut cnf, m, val.lo, val.hi, FALSE);
        for p in 0..m {
            for t in val.lo..=val.hi {
                let came = if links {
                    send[v].at(prev(p), t - 1)
                } else {
                    FALSE
                };
                let loaded = match val.producer {
                    Producer::Input if t == val.lo => pre[v][p as usize],
                    _ => FALSE,
                };
                let made = producers(v, p, t - 1);
                let (here, before) = (have[v].at(p, t), have[v].at(p, t - 1));
                cnf.clause(&[-here, before, came, made, loaded]);
                // Presence is exact and lasting (memory is not the constraint here), so the
                // solver reasons about arrivals rather than about which copies to forget.
                for x in [before, came, made, loaded] {
                    cnf.clause(&[-x, here]);
                }
                let mut c = vec![-used.at(p, t), used.at(p, t + 1), send[v].at(p, t)];
                c.extend(readers[v].iter().map(|&o| run[o].at(p, t)));
                cnf.clause(&c);
            }
            if links {
                for t in val.send_lo()..val.hi {
                    let acc_made = if val.producer.leaves_when_made() {
                        producers(v, p, t)
                    } else {
                        FALSE
                    };
                    let x = send[v].at(p, t);
                    cnf.clause(&[-x, have[v].at(p, t), acc_made]);
                    // Sending a word the next PE already holds, or will never use, only takes
                    // the link from a transfer that matters.
                    cnf.clause(&[-x, -have[v].at(next(p), t)]);
                    cnf.clause(&[-x, used.at(next(p), t + 1)]);
                }
            }
        }
        if val.producer == Producer::Input {
            cnf.exactly_one(&pre[v]);
            // A preload where nothing reads the element only feeds the link; preloading it at
            // the first reader instead frees those transfers, so only readers are considered.
            for p in 0..m as usize {
                let mut c = vec![-pre[v][p]];
                c.extend(readers[v].iter().map(|&o| on[o][p]));
                cnf.clause(&c);
            }
        }
    }

    // Chains: one partial sum, consumed and replaced by each op, moving only over the link.
    for (x, ch) in model.chains.iter().enumerate() {
        for p in 0..m {
            for t in ch.lo..=ch.hi {
                let b = busy[x].at(p, t);
                let ops: Vec<i32> = ch.ops.iter().map(|&o| run[o].at(p, t)).collect();
                let mut c = vec![-b];
                c.extend(&ops);
                cnf.clause(&c);
                for &r in &ops {
                    cnf.clause(&[-r, b]);
                }
            }
        }
        for t in ch.lo..=ch.hi {
            let b: Vec<i32> = (0..m).map(|p| busy[x].at(p, t)).collect();
            // Ops of one chain in one cycle would each start a partial sum of their own.
            cnf.at_most_one(&b);
            let toks: Vec<i32> = (0..m).map(|p| tok[x].at(p, t)).collect();
            cnf.at_most_one(&toks);
            cnf.clause(&[-started[x].at(t), started[x].at(t + 1)]);
            for p in 0..m {
                let (bz, tk, ts) = (busy[x].at(p, t), tok[x].at(p, t), tsend[x].at(p, t));
                let stay = tok[x].at(p, t + 1);
                cnf.clause(&[-bz, started[x].at(t + 1)]);
                // After the first op, every op continues the one partial sum, which must be here.
                cnf.clause(&[-bz, -started[x].at(t), tk]);
                // An op's result stays, leaves, or is the finished sum.
                cnf.clause(&[-bz, stay, ts, fin[x].at(t + 1)]);
                // An unconsumed partial sum stays or leaves; it never vanishes.
                cnf.clause(&[-tk, bz, stay, ts]);
                if links {
                    cnf.clause(&[-ts, tok[x].at(next(p), t + 1)]);
                    cnf.clause(&[-ts, tk, bz]);
                    // Sending a partial sum moves it: keeping a copy would let two ops extend
                    // it and count the terms before the copy twice.
                    cnf.clause(&[-ts, -stay]);
                }
                let arrived = if links {
                    tsend[x].at(prev(p), t)
                } else {
                    FALSE
                };
                cnf.clause(&[-stay, tk, bz, arrived]);
                if ch.result.is_some() {
                    let l = last[x].at(p, t);
                    cnf.clause(&[-l, fin[x].at(t + 1)]);
                    cnf.clause(&[-l, bz]);
                }
            }
        }
        for t in ch.lo + 1..=ch.hi + 1 {
            for &o in &ch.ops {
                cnf.clause(&[-fin[x].at(t), done[o].at(t)]);
            }
        }
    }

    // One op per PE per cycle, one word per link per cycle.
    let horizon = model.cycles;
    let mut slot: Vec<Vec<i32>> = vec![Vec::new(); (i64::from(m) * horizon.max(0)) as usize];
    let at = |p: u32, t: i64| (i64::from(p) * horizon + t) as usize;
    for (o, op) in model.ops.iter().enumerate() {
        for p in 0..m {
            for t in op.lo.max(0)..=op.hi.min(horizon - 1) {
                slot[at(p, t)].push(run[o].at(p, t));
            }
        }
    }
    // `idle[p][t]` / `quiet[p][t]`: PE p's op slot / link does nothing in cycle t (exactly).
    let idle = Grid::new(&mut cnf, m, 0, horizon - 1, FALSE);
    let quiet = Grid::new(&mut cnf, m, 0, horizon - 1, FALSE);
    for p in 0..m {
        for t in 0..horizon {
            let lits = &slot[at(p, t)];
            cnf.at_most_one(lits);
            let i = idle.at(p, t);
            let mut c = lits.clone();
            c.push(i);
            cnf.clause(&c);
            for &l in lits {
                cnf.clause(&[-l, -i]);
            }
        }
    }
    // Redundant but decisive for tight budgets: the op slots left empty cannot exceed the slack
    // m·T − #ops. Without it the solver learns this pigeonhole fact slowly, if at all. A counter
    // with a large bound propagates little and slows the solver down, so only tight budgets get
    // it.
    let slack = (i64::from(m) * horizon - model.ops.len() as i64).max(0) as usize;
    if opts.slack_limit && slack <= m as usize {
        let all: Vec<i32> = (0..m)
            .flat_map(|p| (0..horizon).map(move |t| (p, t)))
            .map(|(p, t)| idle.at(p, t))
            .collect();
        cnf.at_most(&all, slack);
    }
    if links {
        let mut link: Vec<Vec<i32>> = vec![Vec::new(); slot.len()];
        for (v, val) in model.values.iter().enumerate() {
            for p in 0..m {
                for t in val.send_lo().max(0)..val.hi.min(horizon) {
                    link[at(p, t)].push(send[v].at(p, t));
                }
            }
        }
        for (x, ch) in model.chains.iter().enumerate() {
            for p in 0..m {
                for t in ch.lo.max(0)..ch.hi.min(horizon) {
                    link[at(p, t)].push(tsend[x].at(p, t));
                }
            }
        }
        for p in 0..m {
            for t in 0..horizon {
                let lits = &link[at(p, t)];
                cnf.at_most_one(lits);
                let q = quiet.at(p, t);
                let mut c = lits.clone();
                c.push(q);
                cnf.clause(&c);
                for &l in lits {
                    cnf.clause(&[-l, -q]);
                }
            }
        }
    }

    let mut enc = Encoding {
        model,
        cnf,
        on,
        done,
        run,
        have,
        send,
        pre,
        busy,
        tok,
        tsend,
        started,
        fin,
        last,
        idle,
    };
    if opts.symmetry_breaking {
        break_symmetry(&mut enc);
    }
    if opts.dominance {
        dominance(&mut enc, idle, quiet);
    }
    enc
}

/// The literal "`producer` makes its value on `p` in `t`": the producing op runs there then, or
/// a chain's last op does; false for an input.
fn made(producer: Producer, run: &[Grid], last: &[Grid], p: u32, t: i64) -> i32 {
    match producer {
        Producer::Input => FALSE,
        Producer::Op(o) | Producer::Quotient(o) => run[o].at(p, t),
        Producer::Chain(x) => last[x].at(p, t),
    }
}

/// Rules out schedules that an obvious local change turns into one at least as good: an op
/// that could have run a cycle earlier on the same PE (its slot was idle and everything it
/// reads, its partial sum included, was already there), or a transfer that could have left a
/// cycle earlier (the link was quiet and the word was there). Each change moves something
/// earlier and keeps every other op and transfer, so repeating them ends; a schedule where
/// none applies exists among the optimal ones (docs/exact.md).
fn dominance(enc: &mut Encoding, idle: Grid, quiet: Grid) {
    let m = enc.model.pes;
    let prev = |p: u32| (p + m - 1) % m;
    for (o, op) in enc.model.ops.iter().enumerate() {
        for p in 0..m {
            for t in op.lo + 1..=op.hi {
                let mut base = vec![-enc.run[o].at(p, t), -idle.at(p, t - 1)];
                base.extend(op.reads.iter().map(|&v| -enc.have[v].at(p, t - 1)));
                match op.chain {
                    Some(x) => {
                        let mut c = base.clone();
                        c.push(-enc.tok[x].at(p, t - 1));
                        enc.cnf.clause(&c);
                        base.push(enc.started[x].at(t));
                        enc.cnf.clause(&base);
                    }
                    None => enc.cnf.clause(&base),
                }
            }
        }
    }
    if m == 1 {
        return;
    }
    for (v, val) in enc.model.values.iter().enumerate() {
        for p in 0..m {
            for t in val.send_lo() + 1..val.hi {
                let s = enc.send[v].at(p, t);
                let q = quiet.at(p, t - 1);
                enc.cnf.clause(&[-s, -q, -enc.have[v].at(p, t - 1)]);
                if val.producer.leaves_when_made() {
                    let made_then = made(val.producer, &enc.run, &enc.last, p, t - 1);
                    enc.cnf.clause(&[-s, -q, -made_then]);
                }
            }
        }
    }
    for (x, ch) in enc.model.chains.iter().enumerate() {
        for p in 0..m {
            for t in ch.lo + 1..ch.hi {
                enc.cnf.clause(&[
                    -enc.tsend[x].at(p, t),
                    enc.busy[x].at(p, t),
                    -quiet.at(p, t - 1),
                    enc.tsend[x].at(prev(p), t - 1),
                    -enc.tok[x].at(p, t),
                ]);
            }
        }
    }
}

/// Chain `x` starts no later than chain `y`.
fn starts_before(enc: &mut Encoding, x: ChainId, y: ChainId) {
    let lo = enc.model.chains[x].lo.min(enc.model.chains[y].lo);
    let hi = enc.model.chains[x].hi.max(enc.model.chains[y].hi) + 1;
    for t in lo..=hi {
        let (sx, sy) = (enc.started[x].at(t), enc.started[y].at(t));
        enc.cnf.clause(&[-sy, sx]);
    }
}

/// Picks one schedule out of each class of schedules that differ only by a symmetry of the
/// problem; docs/exact.md argues that the choices below can be made together.
fn break_symmetry(enc: &mut Encoding) {
    let p = enc.model.problem;
    let (n, d) = (p.tokens, p.dim);
    let paired = p.symmetric && !p.causal;
    let score = |enc: &Encoding, h: u32, a: u32, b: u32| {
        enc.model.score_chain[&Model::score_key(&p, h, a, b)]
    };
    for h in 0..p.heads {
        // Tokens: a shared unmasked layer may rename tokens freely, so rows go in the order
        // their diagonal scores start; separate q and k rows rename independently, so the
        // earliest score can be called w'[0][0].
        if paired {
            for a in 0..n.saturating_sub(1) {
                let (x, y) = (score(enc, h, a, a), score(enc, h, a + 1, a + 1));
                starts_before(enc, x, y);
            }
        } else if !p.causal {
            let first = score(enc, h, 0, 0);
            for a in 0..n {
                for b in 0..n {
                    if (a, b) != (0, 0) {
                        let y = score(enc, h, a, b);
                        starts_before(enc, first, y);
                    }
                }
            }
        }
        // Features: the columns of q and k rename together, so w'[0][0] takes them in order.
        let s00 = score(enc, h, 0, 0);
        let terms: Vec<OpId> = enc.model.chains[s00].ops.clone();
        for c in 0..terms.len().saturating_sub(1) {
            let (a, b) = (terms[c], terms[c + 1]);
            let hi = enc.model.ops[b].hi + 1;
            for t in 0..=hi {
                let (ba, bb) = (enc.done[a].at(t), enc.done[b].at(t + 1));
                enc.cnf.clause(&[-bb, ba]);
            }
        }
        // With separate v, the columns of v and y rename on their own: order row 0's outputs.
        if !p.shared_values {
            for c in 0..d.saturating_sub(1) {
                let x = enc.model.output_chain[&(h, 0, c)];
                let y = enc.model.output_chain[&(h, 0, c + 1)];
                starts_before(enc, x, y);
            }
        }
        // Heads are interchangeable.
        if h + 1 < p.heads {
            let y = score(enc, h + 1, 0, 0);
            starts_before(enc, s00, y);
        }
    }
    // The ring turns: the first op of head 0's w'[0][0] runs on PE 0.
    let first = enc.model.chains[score(enc, 0, 0, 0)].ops[0];
    let on0 = enc.on[first][0];
    enc.cnf.clause(&[on0]);
}
