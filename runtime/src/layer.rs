//! What a layer computes, reduced to what counting work needs: the operations a correct program
//! must perform and the lower bound they imply. The compiler, the manifest checks and the verifier
//! all take their counts from here, so the three can never disagree.

/// Sizes and structure of one layer (all heads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub heads: u32,
    pub tokens: u32,
    pub dim: u32,
    /// q = k = v = x: scores are symmetric, so only unordered pairs are distinct products.
    pub shared: bool,
    /// Only `j <= i` take part in row `i`.
    pub causal: bool,
    pub softmax: Softmax,
}

/// How a row's softmax is formed; the two need different operations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Softmax {
    /// `exp(s·(w' − M))` with `M` the exact row maximum of the unmasked scores: one `max` per
    /// unmasked score but the first of its row, and the bias rides in the exponential (`expd`).
    #[default]
    Safe,
    /// `exp(s·w')`, the paper's formulation.
    Plain,
}

/// Where a row's softmax divides by its denominator `Z`; the two need different numbers of
/// divisions, so the lower bound depends on which one a program uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Normalisation {
    /// Every weight is divided, `exp_ij / Z_i`, and the weights multiply `v`: one division per
    /// unmasked score (the paper's phase 2).
    #[default]
    PerWeight,
    /// The unnormalised weights multiply `v` and each output element is divided once,
    /// `(Σ_j exp_ij·v_j[c]) / Z_i`: `dim` divisions per row (streamed softmax).
    Deferred,
    /// Each row as whichever of the two divides fewer times: per weight where the row has
    /// fewer unmasked scores than `dim`, deferred otherwise (streamed softmax).
    PerRow,
}

impl Normalisation {
    pub fn is_per_weight(&self) -> bool {
        *self == Normalisation::PerWeight
    }

    /// Whether a row with `keys` unmasked scores of `dim` columns divides each output element
    /// (deferred) rather than each weight.
    pub fn defers(&self, keys: u32, dim: u32) -> bool {
        match self {
            Normalisation::PerWeight => false,
            Normalisation::Deferred => true,
            Normalisation::PerRow => keys >= dim,
        }
    }
}

impl Softmax {
    /// The manifest's and the layer language's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Softmax::Safe => "safe",
            Softmax::Plain => "plain",
        }
    }

    pub fn from_name(s: &str) -> Option<Softmax> {
        match s {
            "safe" => Some(Softmax::Safe),
            "plain" => Some(Softmax::Plain),
            _ => None,
        }
    }
}

/// Operation counts a correct program performs, summed over heads (docs/scheduling.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Necessary {
    pub phase1_mul: u64,
    pub exp: u64,
    pub div: u64,
    pub phase3_mul: u64,
    /// Row maxima of the safe softmax; 0 for the plain one.
    pub max: u64,
}

impl Necessary {
    pub fn total(&self) -> u64 {
        self.phase1_mul + self.exp + self.div + self.phase3_mul + self.max
    }
}

impl Shape {
    /// Elements of one `[heads, tokens, dim]` tensor; `None` on overflow.
    pub fn tensor_len(&self) -> Option<usize> {
        (self.heads as usize)
            .checked_mul(self.tokens as usize)?
            .checked_mul(self.dim as usize)
    }

    /// Unmasked weights of one head: `n²`, or `n(n+1)/2` under a causal mask.
    pub fn weights_per_head(&self) -> Option<u64> {
        let n = u64::from(self.tokens);
        if self.causal {
            Some(n.checked_mul(n + 1)? / 2)
        } else {
            n.checked_mul(n)
        }
    }

    /// The necessary operations; `None` on overflow, which no real layer reaches.
    pub fn necessary(&self) -> Option<Necessary> {
        let (h, n, d) = (
            u64::from(self.heads),
            u64::from(self.tokens),
            u64::from(self.dim),
        );
        let weights = self.weights_per_head()?;
        // For a shared layer q_i·k_j = q_j·k_i, so only unordered pairs are distinct; under a
        // causal mask each unmasked weight already is one unordered pair.
        let distinct = if self.shared && !self.causal {
            n.checked_mul(n + 1)? / 2
        } else {
            weights
        };
        let hd = h.checked_mul(d)?;
        // A row's maximum over k unmasked scores takes k - 1 two-operand maxima, and every row
        // has at least one score (its diagonal), so a head needs weights - n of them.
        let max = match self.softmax {
            Softmax::Safe => h.checked_mul(weights - n)?,
            Softmax::Plain => 0,
        };
        Some(Necessary {
            max,
            phase1_mul: hd.checked_mul(distinct)?,
            exp: h.checked_mul(weights)?,
            div: h.checked_mul(weights)?,
            phase3_mul: hd.checked_mul(weights)?,
        })
    }

    /// [`Shape::necessary`] for a program that normalises as `norm`.
    pub fn necessary_as(&self, norm: Normalisation) -> Option<Necessary> {
        let mut need = self.necessary()?;
        match norm {
            Normalisation::PerWeight => {}
            Normalisation::Deferred => need.div = self.tensor_len()? as u64,
            Normalisation::PerRow => {
                let d = u64::from(self.dim);
                let mut per_head = 0u64;
                for i in 0..self.tokens {
                    let keys = if self.causal { i + 1 } else { self.tokens };
                    per_head = per_head.checked_add(u64::from(keys).min(d))?;
                }
                need.div = per_head.checked_mul(u64::from(self.heads))?;
            }
        }
        Some(need)
    }

    /// `ceil(necessary ops / pes)` for a program that normalises as `norm`.
    pub fn lower_bound_as(&self, pes: u32, norm: Normalisation) -> Option<u64> {
        if pes == 0 {
            return None;
        }
        Some(self.necessary_as(norm)?.total().div_ceil(u64::from(pes)))
    }

    /// `ceil(necessary ops / pes)`; `None` on overflow or for an empty ring.
    pub fn lower_bound(&self, pes: u32) -> Option<u64> {
        if pes == 0 {
            return None;
        }
        Some(self.necessary()?.total().div_ceil(u64::from(pes)))
    }

    /// Is score `(i, j)` taking part?
    pub fn unmasked(&self, i: u32, j: u32) -> bool {
        !self.causal || j <= i
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(n: u32, d: u32, shared: bool, causal: bool) -> Shape {
        Shape {
            heads: 1,
            tokens: n,
            dim: d,
            shared,
            causal,
            softmax: Softmax::Plain,
        }
    }

    #[test]
    fn safe_softmax_adds_one_max_per_score_but_the_first_of_each_row() {
        let safe = |n, shared, causal| Shape {
            softmax: Softmax::Safe,
            ..shape(n, 4, shared, causal)
        };
        // n = 4 unmasked: 4 rows of 4 scores, 3 maxima each.
        assert_eq!(safe(4, false, false).necessary().unwrap().max, 12);
        // Shared: every row still takes its own maximum over n scores.
        assert_eq!(safe(4, true, false).necessary().unwrap().max, 12);
        // Causal n = 4: rows of 1, 2, 3, 4 scores need 0 + 1 + 2 + 3.
        assert_eq!(safe(4, false, true).necessary().unwrap().max, 6);
        let plain = shape(4, 4, false, true).necessary().unwrap();
        let with_max = safe(4, false, true).necessary().unwrap();
        assert_eq!(with_max.total(), plain.total() + 6);
        assert_eq!(plain.max, 0);
        // Three heads, n = 5 unmasked: 3 · 5 · 4.
        let three = Shape {
            heads: 3,
            ..safe(5, false, false)
        };
        assert_eq!(three.necessary().unwrap().max, 60);
    }

    #[test]
    fn counts_follow_the_paper_formulas() {
        // Separate, unmasked, n = d = 3: 27 + 9 + 9 + 27 = 72 (the paper's 2dn² + 2n²).
        assert_eq!(shape(3, 3, false, false).necessary().unwrap().total(), 72);
        // Shared, n = d = 3: phase 1 only needs the 6 unordered pairs, 18 products.
        let s = shape(3, 3, true, false).necessary().unwrap();
        assert_eq!((s.phase1_mul, s.exp, s.phase3_mul), (18, 9, 27));
        // Causal, n = d = 4: 10 unmasked weights; 40 + 10 + 10 + 40 = 100, LB on 4 PEs 25.
        let c = shape(4, 4, false, true);
        assert_eq!(c.necessary().unwrap().total(), 100);
        assert_eq!(c.lower_bound(4), Some(25));
    }

    #[test]
    fn overflow_is_none_not_a_wrap() {
        let huge = Shape {
            heads: u32::MAX,
            tokens: u32::MAX,
            dim: u32::MAX,
            shared: false,
            causal: false,
            softmax: Softmax::Safe,
        };
        assert_eq!(huge.necessary(), None);
        assert_eq!(shape(2, 2, false, false).lower_bound(0), None);
    }

    /// Per row, each row divides the fewer of its weights and its output elements.
    #[test]
    fn per_row_normalisation_divides_the_fewer() {
        // Causal, 4 tokens, d = 2: rows of 1, 2, 3, 4 keys take 1, 2, 2, 2 divisions.
        let causal = shape(4, 2, false, true);
        let need = causal.necessary_as(Normalisation::PerRow).unwrap();
        assert_eq!(need.div, 7);
        let all = causal.necessary_as(Normalisation::PerWeight).unwrap();
        assert_eq!(need.total(), all.total() - all.div + 7);
        // Without a mask every row has `n` keys: the fewer of n and d per row.
        assert_eq!(
            shape(3, 5, false, false)
                .necessary_as(Normalisation::PerRow)
                .unwrap()
                .div,
            9
        );
        assert_eq!(
            shape(3, 2, false, false)
                .necessary_as(Normalisation::PerRow)
                .unwrap()
                .div,
            6
        );
        assert!(Normalisation::PerRow.defers(2, 2) && !Normalisation::PerRow.defers(1, 2));
        assert!(Normalisation::Deferred.defers(1, 2) && !Normalisation::PerWeight.defers(9, 2));
    }
}
