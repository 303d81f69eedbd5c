//! The specification: the expected expression of every output element, built in the same interner
//! the programs' execution uses, plus the work a causal mask removes.

use crate::expr::{ExprId, FxMap, Interner, Node, Tensor, MASKED, NEEDED};
use runtime::layer::Normalisation;
use std::collections::BTreeMap;

/// The layer as the verifier reads it from the manifest.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    pub heads: u32,
    pub tokens: u32,
    pub dim: u32,
    /// q = k = v = x.
    pub shared: bool,
    pub causal: bool,
    /// The `exp` immediate every exponential must carry.
    pub scale: f32,
    pub softmax: runtime::layer::Softmax,
}

pub use runtime::layer::Necessary;

impl Shape {
    /// The layer as the shared counting sees it.
    pub fn counting(&self) -> runtime::layer::Shape {
        runtime::layer::Shape {
            heads: self.heads,
            tokens: self.tokens,
            dim: self.dim,
            shared: self.shared,
            causal: self.causal,
            softmax: self.softmax,
        }
    }

    fn safe(&self) -> bool {
        self.softmax == runtime::layer::Softmax::Safe
    }

    /// Elements of one tensor; `None` on overflow.
    pub fn tensor_len(&self) -> Option<usize> {
        self.counting().tensor_len()
    }

    /// The necessary operations (one definition for compiler, manifest and verifier); `None` on
    /// overflow, which no real layer reaches.
    pub fn necessary(&self) -> Option<Necessary> {
        self.counting().necessary()
    }

    fn unmasked(&self, i: u32, j: u32) -> bool {
        self.counting().unmasked(i, j)
    }
}

pub struct Spec {
    /// Expected `y`, flat in C order over `[heads, tokens, dim]`.
    pub outputs: Vec<ExprId>,
    /// The atoms to preload, per input tensor name, flat in C order.
    pub inputs: BTreeMap<String, Vec<ExprId>>,
    /// How often each needed node may be computed, where more than once. A shared layer's
    /// `exp(s·x_i·x_j)` serves rows `i` and `j`, so it may be computed once per row; with
    /// `per_score_products`, a phase-1 product may be computed once per score that sums it.
    pub uses: FxMap<ExprId, u32>,
    /// Safe softmax: for every unmasked score, the rows' maxima it belongs to (two in a shared
    /// layer, where `x_i·x_j` is a score of rows `i` and `j`). A partial maximum a program builds
    /// on the way is legitimate exactly when its arguments all belong to one of these.
    pub row_maxima: FxMap<ExprId, Vec<ExprId>>,
    /// Online formulation, safe softmax: `(score, its row's maximum) → (head, key)`, the value
    /// row a weighted term of that score must multiply. A streamed program builds such terms
    /// with a partial maximum before rescaling them; this says which value is the right one.
    pub keys: FxMap<(ExprId, ExprId), (u32, u32)>,
}

/// Builds the specification into `ex`, marks every node it needs [`NEEDED`], and under a causal
/// mask interns the masked scores, exponentials, denominators and weights and marks them
/// [`MASKED`], so that any expression a program builds from them inherits the taint.
///
/// The deferred-normalisation formulation of a streamed softmax is, per row, one
/// denominator `l_i = Σ_j e_ij` and `y_i[c] = (Σ_j e_ij·v_j[c]) / l_i`, with `e_ij` as in the
/// per-weight formulation (`exp(s·S_ij)`, or `exp(s·(S_ij − M_i))` with `M_i` exactly the row's
/// maximum). The interner must already have its online identities on, so that the expected
/// nodes are the ones a program's rescaled sums reach.
///
/// `norm` says which rows take it: every row (deferred), none (per weight), or each row whose
/// unmasked scores are at least `d` (per row; the others divide each weight).
pub fn build(
    ex: &mut Interner,
    shape: &Shape,
    per_score_products: bool,
    norm: Normalisation,
) -> Spec {
    let (h, n, d) = (shape.heads, shape.tokens, shape.dim);
    let roles = if shape.shared {
        [Tensor::X; 3]
    } else {
        [Tensor::Q, Tensor::K, Tensor::V]
    };
    let mut inputs = BTreeMap::new();
    let mut atoms: FxMap<Tensor, Vec<ExprId>> = FxMap::default();
    for t in roles {
        if atoms.contains_key(&t) {
            continue;
        }
        let mut v = Vec::new();
        for head in 0..h {
            for row in 0..n {
                for col in 0..d {
                    v.push(ex.input(t, head, row, col));
                }
            }
        }
        inputs.insert(t.name().to_string(), v.clone());
        atoms.insert(t, v);
    }
    let at = |t: Tensor, head: u32, row: u32, col: u32| {
        atoms[&t][((head as usize * n as usize) + row as usize) * d as usize + col as usize]
    };
    let [tq, tk, tv] = roles;

    let mut outputs = Vec::with_capacity(shape.tensor_len().unwrap_or(0));
    let mut uses: FxMap<ExprId, u32> = FxMap::default();
    let mut row_maxima: FxMap<ExprId, Vec<ExprId>> = FxMap::default();
    let mut keys: FxMap<(ExprId, ExprId), (u32, u32)> = FxMap::default();
    let mut terms = Vec::new();
    let score = |ex: &mut Interner, terms: &mut Vec<ExprId>, head: u32, i: u32, j: u32| {
        terms.clear();
        for c in 0..d {
            let p = ex.mul(at(tq, head, i, c), at(tk, head, j, c));
            terms.push(p);
        }
        ex.sum(terms)
    };
    let count_products = |uses: &mut FxMap<ExprId, u32>, ex: &Interner, s: ExprId| {
        if !per_score_products {
            return;
        }
        match ex.node(s) {
            Node::Sum { .. } => {
                for &p in ex.sum_terms(s) {
                    *uses.entry(p).or_default() += 1;
                }
            }
            _ => *uses.entry(s).or_default() += 1,
        }
    };
    for head in 0..h {
        for i in 0..n {
            let js: Vec<u32> = (0..n).filter(|&j| shape.unmasked(i, j)).collect();
            let scores: Vec<ExprId> = js
                .iter()
                .map(|&j| {
                    let s = score(ex, &mut terms, head, i, j);
                    count_products(&mut uses, ex, s);
                    s
                })
                .collect();
            // Safe: exp(s·(w' − M)) with M exactly the row's maximum. Over the reals any M gives
            // the same weights; requiring this one is what keeps every exponent at most 0.
            let exps: Vec<ExprId> = if shape.safe() {
                let top = ex.max_of(&scores);
                for (&s, &j) in scores.iter().zip(&js) {
                    row_maxima.entry(s).or_default().push(top);
                    keys.insert((s, top), (head, j));
                }
                scores
                    .iter()
                    .map(|&s| ex.expd(s, top, shape.scale))
                    .collect()
            } else {
                scores.iter().map(|&s| ex.exp(s, shape.scale)).collect()
            };
            let z = ex.sum(&exps);
            if norm.defers(js.len() as u32, d) {
                for &e in &exps {
                    *uses.entry(e).or_default() += 1;
                }
                for c in 0..d {
                    terms.clear();
                    for (&j, &e) in js.iter().zip(&exps) {
                        let p = ex.mul(e, at(tv, head, j, c));
                        terms.push(p);
                    }
                    let num = ex.sum(&terms);
                    outputs.push(ex.div(num, z));
                }
                continue;
            }
            let weights: Vec<ExprId> = exps
                .iter()
                .map(|&e| {
                    *uses.entry(e).or_default() += 1;
                    ex.div(e, z)
                })
                .collect();
            for c in 0..d {
                terms.clear();
                for (&j, &w) in js.iter().zip(&weights) {
                    let p = ex.mul(w, at(tv, head, j, c));
                    terms.push(p);
                }
                outputs.push(ex.sum(&terms));
            }
        }
    }
    mark_needed(ex, &outputs);

    if shape.causal {
        let first_masked = ex.len() as ExprId;
        for head in 0..h {
            for i in 0..n {
                let mut all = Vec::with_capacity(n as usize);
                let mut masked = Vec::new();
                let row: Vec<ExprId> = (0..n).map(|j| score(ex, &mut terms, head, i, j)).collect();
                // Safe: the true maximum (unmasked scores); a maximum over the whole row is built
                // too, so that it is marked as masked work.
                let top = shape.safe().then(|| {
                    ex.max_of(&row);
                    ex.max_of(&row[..=i as usize])
                });
                for j in 0..n {
                    let s = row[j as usize];
                    let e = match top {
                        Some(top) => ex.expd(s, top, shape.scale),
                        None => ex.exp(s, shape.scale),
                    };
                    all.push(e);
                    if !shape.unmasked(i, j) {
                        masked.push(e);
                    }
                }
                if norm.defers(i + 1, d) {
                    // A masked key's weighted value, in any column, and a sum over the whole
                    // row; in a shared layer the exponential itself may be row j's.
                    for (j, &e) in all.iter().enumerate().skip(i as usize + 1) {
                        for c in 0..d {
                            ex.mul(e, at(tv, head, j as u32, c));
                        }
                    }
                    ex.sum(&all);
                    continue;
                }
                let zc = ex.sum(&all[..=i as usize]);
                for e in masked {
                    // In a shared layer e = exp(s·x_i·x_j) is needed by row j, so only the
                    // quotient says it is used in the wrong row.
                    ex.div(e, zc);
                }
                ex.sum(&all);
            }
        }
        for id in first_masked..ex.len() as ExprId {
            if ex.flags(id) & NEEDED == 0 {
                ex.set_flag(id, MASKED);
            }
        }
    }
    Spec {
        outputs,
        inputs,
        uses,
        row_maxima,
        keys,
    }
}

fn mark_needed(ex: &mut Interner, roots: &[ExprId]) {
    let mut stack: Vec<ExprId> = roots.to_vec();
    while let Some(id) = stack.pop() {
        if ex.flags(id) & NEEDED != 0 {
            continue;
        }
        ex.set_flag(id, NEEDED);
        match ex.node(id) {
            Node::Mul(a, b) | Node::Div(a, b) | Node::Expd(a, b, _) => stack.extend([a, b]),
            Node::Exp(a, _) => stack.push(a),
            Node::Sum { .. } => stack.extend_from_slice(ex.sum_terms(id)),
            Node::Max { .. } => stack.extend_from_slice(ex.max_terms(id)),
            Node::Input { .. } | Node::Chain { .. } => {}
        }
    }
}
