//! The operations, values and chains of one layer, with the cycle windows in which each can
//! happen under a budget of `T` cycles. This is the part of the exact scheduler that knows about
//! attention; the encoder only sees ops that read values, chains that thread a partial sum
//! through their ops, and windows.

use crate::ir::Tensor;
use crate::problem::Problem;
use crate::schedule::Element;
use std::collections::HashMap;

/// Index into [`Model::values`].
pub type ValueId = usize;
/// Index into [`Model::ops`].
pub type OpId = usize;
/// Index into [`Model::chains`].
pub type ChainId = usize;

/// What an immutable value stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ValueKind {
    /// A preloaded input element.
    Input(Element),
    /// Finished score `w'[a][b]` (for a shared unmasked layer, `a ≤ b` names the pair).
    Score { head: u32, a: u32, b: u32 },
    /// `exp(s·w'[a][b])`, kept by the EXP of row `a` for the division.
    Exp { head: u32, a: u32, b: u32 },
    /// Finished softmax denominator of row `a`.
    Sum { head: u32, a: u32 },
    /// Weight `w[a][b]`.
    Weight { head: u32, a: u32, b: u32 },
}

/// Where an immutable value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Producer {
    /// Preloaded on one PE before cycle 0.
    Input,
    /// The op result of an EXP, its exponent: stored, never sent in the same cycle (the link
    /// carries a memory word or the accumulate result, and the EXP's acc slot makes the sum).
    Op(OpId),
    /// A DIV's quotient: stored, and also sent in the cycle it is made if need be, through the
    /// DIV's otherwise idle acc slot (`add 0 | send acc`).
    Quotient(OpId),
    /// The last accumulate of a chain: may be stored and also sent in the cycle it is made.
    Chain(ChainId),
}

impl Producer {
    /// Whether the value can be sent in the cycle it is made: an accumulate result, or a
    /// quotient riding the DIV's acc slot.
    pub fn leaves_when_made(self) -> bool {
        matches!(self, Producer::Chain(_) | Producer::Quotient(_))
    }
}

#[derive(Clone, Debug)]
pub struct Value {
    pub kind: ValueKind,
    pub producer: Producer,
    /// First cycle the value can be resident anywhere.
    pub lo: i64,
    /// Last cycle anything can read it.
    pub hi: i64,
}

impl Value {
    /// First cycle the value can be sent: the cycle it is made, if it can leave through an acc
    /// slot.
    pub fn send_lo(&self) -> i64 {
        if self.producer.leaves_when_made() {
            self.lo - 1
        } else {
            self.lo
        }
    }
}

/// Which phase an op belongs to (and so which `Work` it becomes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Phase 1: `acc + q[a][c]·k[b][c]`.
    Mac1,
    /// Phase 2: `e = exp(s·w'[a][b])`, `acc + e`.
    Exp,
    /// Phase 2: `w[a][b] = e / sum_a`.
    Div,
    /// Phase 3: `acc + w[a][b]·v[b][c]`.
    Mac3,
}

#[derive(Clone, Debug)]
pub struct Op {
    pub kind: OpKind,
    pub head: u32,
    /// Row `a` (phases 2 and 3) or score row (phase 1).
    pub a: u32,
    /// Column `b` of the score/weight matrix (phase 1: the score's `b`).
    pub b: u32,
    /// Feature index `c` (phases 1 and 3).
    pub c: u32,
    /// Immutable values read, in operand order (`Mac1` on a diagonal reads one value twice).
    pub reads: Vec<ValueId>,
    /// The op result kept as a value of its own (EXP's exponent, DIV's weight).
    pub produces: Option<ValueId>,
    /// The chain whose partial sum this op consumes and replaces.
    pub chain: Option<ChainId>,
    pub lo: i64,
    pub hi: i64,
}

/// A sum built by a sequence of accumulating ops in any order: one partial sum that each op
/// consumes and replaces.
#[derive(Clone, Debug)]
pub struct Chain {
    pub ops: Vec<OpId>,
    /// The finished sum as an immutable value (scores and softmax denominators).
    pub result: Option<ValueId>,
    /// The finished sum is this output element (phase 3).
    pub output: Option<Element>,
    pub lo: i64,
    pub hi: i64,
}

/// Everything the encoder needs for one budget.
#[derive(Clone, Debug)]
pub struct Model {
    pub problem: Problem,
    pub pes: u32,
    pub cycles: i64,
    pub values: Vec<Value>,
    pub ops: Vec<Op>,
    pub chains: Vec<Chain>,
    /// Phase-1 chain of score `(head, a, b)` (normalised pair for shared unmasked layers).
    pub score_chain: HashMap<(u32, u32, u32), ChainId>,
    /// Phase-3 chain of `y[head][a][c]`.
    pub output_chain: HashMap<(u32, u32, u32), ChainId>,
}

impl Model {
    /// Does a score serve both row `a` and row `b` (q = k, no mask)?
    fn paired(p: &Problem) -> bool {
        p.symmetric && !p.causal
    }

    /// The name of score `(a, b)`: shared unmasked layers compute `w'[a][b]` once for both rows.
    pub fn score_key(p: &Problem, head: u32, a: u32, b: u32) -> (u32, u32, u32) {
        if Self::paired(p) {
            (head, a.min(b), a.max(b))
        } else {
            (head, a, b)
        }
    }

    /// Columns `b` that row `a` uses.
    pub fn row(p: &Problem, a: u32) -> impl Iterator<Item = u32> + '_ {
        (0..p.tokens).filter(move |&b| p.unmasked(a, b))
    }

    /// The operations, values and chains of `p` with their windows for a budget of `cycles`.
    ///
    /// Windows come from unit-latency critical paths: a score is finished at the earliest at
    /// cycle `d − 1` (d MACs, one per cycle) and readable from `d`; row `a`'s denominator takes
    /// `n_a` EXPs after that; a weight is readable the cycle after its division; and backwards
    /// from the end, the `n_a` phase-3 MACs of one output need `n_a` distinct cycles, so row
    /// `a`'s first weight is needed by `T − n_a`, its denominator by `T − n_a − 1`, and every EXP
    /// of the row runs by `T − n_a − 2`.
    pub fn build(p: &Problem, pes: u32, cycles: i64) -> Model {
        let (n, d, h) = (p.tokens, p.dim, p.heads);
        let di = i64::from(d);
        let t = cycles;
        let n_row = |a: u32| Self::row(p, a).count() as i64;
        let mut m = Model {
            problem: *p,
            pes,
            cycles,
            values: Vec::new(),
            ops: Vec::new(),
            chains: Vec::new(),
            score_chain: HashMap::new(),
            output_chain: HashMap::new(),
        };
        let mut inputs: HashMap<Element, ValueId> = HashMap::new();
        let mut input = |m: &mut Model, role: Tensor, head: u32, row: u32, col: u32| -> ValueId {
            let element = Element {
                tensor: p.tensor_for(role),
                head,
                row,
                col,
            };
            *inputs.entry(element).or_insert_with(|| {
                m.values.push(Value {
                    kind: ValueKind::Input(element),
                    producer: Producer::Input,
                    lo: 0,
                    hi: -1,
                });
                m.values.len() - 1
            })
        };
        let new_value = |m: &mut Model, kind, producer, lo| -> ValueId {
            m.values.push(Value {
                kind,
                producer,
                lo,
                hi: -1,
            });
            m.values.len() - 1
        };
        let new_chain = |m: &mut Model| -> ChainId {
            m.chains.push(Chain {
                ops: Vec::new(),
                result: None,
                output: None,
                lo: i64::MAX,
                hi: i64::MIN,
            });
            m.chains.len() - 1
        };
        #[allow(clippy::too_many_arguments)]
        let new_op = |m: &mut Model,
                      kind,
                      (head, a, b, c): (u32, u32, u32, u32),
                      reads: Vec<ValueId>,
                      produces,
                      chain: Option<ChainId>,
                      lo: i64,
                      hi: i64|
         -> OpId {
            let id = m.ops.len();
            m.ops.push(Op {
                kind,
                head,
                a,
                b,
                c,
                reads,
                produces,
                chain,
                lo,
                hi,
            });
            if let Some(ch) = chain {
                let ch = &mut m.chains[ch];
                ch.ops.push(id);
                ch.lo = ch.lo.min(lo);
                ch.hi = ch.hi.max(hi);
            }
            id
        };

        let mut weights: HashMap<(u32, u32, u32), ValueId> = HashMap::new();
        for head in 0..h {
            // Phase 1: one chain per distinct score; its result value by score key, for phase 2.
            let mut score_value: HashMap<(u32, u32, u32), usize> = HashMap::new();
            for a in 0..n {
                for b in Self::row(p, a) {
                    let key = Self::score_key(p, head, a, b);
                    if m.score_chain.contains_key(&key) {
                        continue;
                    }
                    let (_, ka, kb) = key;
                    // Rows that need this score: the last of their EXPs bounds the chain.
                    let widest = if Self::paired(p) {
                        n_row(ka).max(n_row(kb))
                    } else {
                        n_row(ka)
                    };
                    let hi = t - widest - 3;
                    let ch = new_chain(&mut m);
                    let score = new_value(
                        &mut m,
                        ValueKind::Score { head, a: ka, b: kb },
                        Producer::Chain(ch),
                        di,
                    );
                    m.chains[ch].result = Some(score);
                    for c in 0..d {
                        let q = input(&mut m, Tensor::Q, head, ka, c);
                        let k = input(&mut m, Tensor::K, head, kb, c);
                        new_op(
                            &mut m,
                            OpKind::Mac1,
                            (head, ka, kb, c),
                            vec![q, k],
                            None,
                            Some(ch),
                            0,
                            hi,
                        );
                    }
                    m.score_chain.insert(key, ch);
                    score_value.insert(key, score);
                }
            }
            // Phase 2: one EXP chain per row, then a division per weight.
            for a in 0..n {
                let na = n_row(a);
                let ch = new_chain(&mut m);
                let sum = new_value(
                    &mut m,
                    ValueKind::Sum { head, a },
                    Producer::Chain(ch),
                    di + na,
                );
                m.chains[ch].result = Some(sum);
                for b in Self::row(p, a) {
                    let score = score_value[&Self::score_key(p, head, a, b)];
                    let op = new_op(
                        &mut m,
                        OpKind::Exp,
                        (head, a, b, 0),
                        vec![score],
                        None,
                        Some(ch),
                        di,
                        t - na - 2,
                    );
                    let e = new_value(
                        &mut m,
                        ValueKind::Exp { head, a, b },
                        Producer::Op(op),
                        di + 1,
                    );
                    m.ops[op].produces = Some(e);
                    let div = new_op(
                        &mut m,
                        OpKind::Div,
                        (head, a, b, 0),
                        vec![e, sum],
                        None,
                        None,
                        di + na,
                        t - 2,
                    );
                    let w = new_value(
                        &mut m,
                        ValueKind::Weight { head, a, b },
                        Producer::Quotient(div),
                        di + na + 1,
                    );
                    m.ops[div].produces = Some(w);
                    weights.insert((head, a, b), w);
                }
            }
            // Phase 3: one chain per output element.
            for a in 0..n {
                let na = n_row(a);
                for c in 0..d {
                    let ch = new_chain(&mut m);
                    m.chains[ch].output = Some(Element {
                        tensor: Tensor::Y,
                        head,
                        row: a,
                        col: c,
                    });
                    for b in Self::row(p, a) {
                        let w = weights[&(head, a, b)];
                        let v = input(&mut m, Tensor::V, head, b, c);
                        new_op(
                            &mut m,
                            OpKind::Mac3,
                            (head, a, b, c),
                            vec![w, v],
                            None,
                            Some(ch),
                            di + na + 1,
                            t - 1,
                        );
                    }
                    m.output_chain.insert((head, a, c), ch);
                }
            }
        }
        // A value is needed until its last reader's last cycle.
        for op in &m.ops {
            for &v in &op.reads {
                m.values[v].hi = m.values[v].hi.max(op.hi);
            }
        }
        m
    }

    /// Is some op's window empty (the budget is below a critical path)?
    pub fn trivially_infeasible(&self) -> bool {
        self.ops.iter().any(|o| o.hi < o.lo) || self.cycles <= 0
    }

    /// The number of `(op, PE, cycle)` and `(value, PE, cycle)` triples the encoding would
    /// create; a guard against encodings that cannot fit in memory.
    pub fn size_estimate(p: &Problem, pes: u32, cycles: u64) -> u128 {
        let n = u128::from(p.tokens);
        let d = u128::from(p.dim);
        let h = u128::from(p.heads);
        // Ops, values and chains are each O(h·n²·d); count them generously.
        let ops = h * (n * n * d * 2 + 2 * n * n);
        let values = h * (3 * n * d + 4 * n * n + n);
        let chains = h * (n * n + n + n * d);
        (ops + 2 * values + 3 * chains) * u128::from(pes) * u128::from(cycles)
    }
}
