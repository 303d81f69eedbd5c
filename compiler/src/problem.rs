//! What a scheduling pass needs to know about a layer, distilled from the IR's facts.

use crate::ir::Tensor;
use crate::schedule::{Builder, Element, Val};
use runtime::layer::Softmax;

/// The scheduling problem for one layer: sizes plus the facts the analysis found.
#[derive(Clone, Copy, PartialEq)]
pub struct Problem {
    pub tokens: u32,
    pub dim: u32,
    pub heads: u32,
    pub scale: f64,
    /// Both operands of every scores node are the same value (q = k), so `w'` is symmetric.
    pub symmetric: bool,
    /// The weighted sum reads the same value as the scores (v = q = k = x).
    pub shared_values: bool,
    /// Elements with `j > i` are masked out of every phase.
    pub causal: bool,
    /// How the row softmax is formed.
    pub softmax: Softmax,
    /// Schedules may preload an input element on several PEs (a copy per PE that reads it),
    /// which the manifest then lists as preload copies. A compile option, not a fact of the
    /// layer: the analysis leaves it off and [`crate::compile`] sets it from
    /// [`crate::Options::single_placement`].
    pub copies: bool,
}

// By hand so that `--emit facts` of a plain layer prints what it printed before the formulation
// existed; a safe one says so.
impl std::fmt::Debug for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = f.debug_struct("Problem");
        s.field("tokens", &self.tokens)
            .field("dim", &self.dim)
            .field("heads", &self.heads)
            .field("scale", &self.scale)
            .field("symmetric", &self.symmetric)
            .field("shared_values", &self.shared_values)
            .field("causal", &self.causal);
        if self.softmax == Softmax::Safe {
            s.field("softmax", &self.softmax);
        }
        s.finish()
    }
}

impl Problem {
    /// A layer's problem as the analysis finds it for `tokens`, `dim`, `heads` with the default
    /// scale `1/sqrt(dim)`: q = k = v when `shared` (symmetric scores, shared values).
    pub fn attention(
        tokens: u32,
        dim: u32,
        heads: u32,
        shared: bool,
        causal: bool,
        softmax: Softmax,
    ) -> Problem {
        Problem {
            tokens,
            dim,
            heads,
            scale: 1.0 / f64::from(dim).sqrt(),
            symmetric: shared,
            shared_values: shared,
            causal,
            softmax,
            copies: false,
        }
    }

    /// Tensor that plays the role of `role` (Q, K or V) in this layer.
    pub fn tensor_for(&self, role: Tensor) -> Tensor {
        match role {
            Tensor::Q | Tensor::K if self.symmetric => Tensor::X,
            Tensor::V if self.shared_values => Tensor::X,
            r => r,
        }
    }

    /// Input tensors in a stable order.
    pub fn input_tensors(&self) -> Vec<Tensor> {
        let mut ts = vec![
            self.tensor_for(Tensor::Q),
            self.tensor_for(Tensor::K),
            self.tensor_for(Tensor::V),
        ];
        ts.sort();
        ts.dedup();
        ts
    }

    /// Is score element `(i, j)` taking part?
    pub fn unmasked(&self, i: u32, j: u32) -> bool {
        !self.causal || j <= i
    }

    /// Keys row `a` attends to: its unmasked scores, weights and products per output column.
    pub fn keys_in_row(&self, a: u32) -> u32 {
        (0..self.tokens).filter(|&b| self.unmasked(a, b)).count() as u32
    }

    /// The layer as the runtime's counting sees it.
    pub fn shape(&self) -> runtime::layer::Shape {
        runtime::layer::Shape {
            heads: self.heads,
            tokens: self.tokens,
            dim: self.dim,
            shared: self.symmetric,
            causal: self.causal,
            softmax: self.softmax,
        }
    }

    /// The row maximum is subtracted before exponentiating.
    pub fn safe(&self) -> bool {
        self.softmax == Softmax::Safe
    }

    /// Chain schedules that only know the paper's formulation say so, naming `who`.
    pub fn needs_plain(&self, who: &str) -> Option<String> {
        self.safe().then(|| {
            format!("{who} computes the paper's softmax without subtracting the row maximum, so it cannot schedule `softmax = safe`")
        })
    }

    /// Operations the scheme needs (docs/scheduling.md): distinct weights in phase 1, unmasked
    /// weights everywhere, summed over heads. Saturates instead of wrapping on absurd sizes.
    pub fn necessary_ops(&self) -> u64 {
        self.shape().necessary().map_or(u64::MAX, |n| n.total())
    }

    /// `ceil(necessary ops / m)`.
    pub fn lower_bound(&self, pes: u32) -> u64 {
        self.necessary_ops().div_ceil(u64::from(pes.max(1)))
    }

    /// The chain schedules (the paper's and ours) need `m | tokens` and `m | dim`; says which
    /// fails, naming `who`.
    pub fn ring_divides_shape(&self, pes: u32, who: &str) -> Option<String> {
        [("tokens", self.tokens), ("dim", self.dim)]
            .into_iter()
            .find(|(_, v)| !v.is_multiple_of(pes))
            .map(|(field, v)| {
                format!("{who} needs the number of PEs to divide `{field}` ({v} is not a multiple of {pes})")
            })
    }

    /// Element count of one input or output tensor.
    pub fn tensor_len(&self) -> usize {
        self.heads as usize * self.tokens as usize * self.dim as usize
    }
}

/// Input values of one layer, created on demand at the PE a placement function names.
pub struct Inputs {
    problem: Problem,
    vals: rustc_hash::FxHashMap<Element, Val>,
}

impl Inputs {
    pub fn new(problem: Problem) -> Self {
        Inputs {
            problem,
            vals: Default::default(),
        }
    }

    /// The value of `role[head][row][col]`; created on `pe` the first time it is asked for.
    /// Asking again with another PE is a placement bug.
    pub fn get(
        &mut self,
        b: &mut Builder,
        role: Tensor,
        head: u32,
        row: u32,
        col: u32,
        pe: u32,
    ) -> Val {
        let element = Element {
            tensor: self.problem.tensor_for(role),
            head,
            row,
            col,
        };
        *self
            .vals
            .entry(element)
            .or_insert_with(|| b.input(element, pe))
    }
}
