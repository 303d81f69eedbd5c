//! The f64 reference every emitted program is checked against: naive attention exactly as
//! docs/scheduling.md states it, written independently of the schedulers (no shared code with them).

/// Layer parameters the reference needs.
#[derive(Clone, Copy, Debug)]
pub struct RefLayer {
    pub heads: usize,
    pub tokens: usize,
    pub dim: usize,
    pub scale: f64,
    pub causal: bool,
}

/// `y[h][i][c] = Σ_j softmax_j(scale · q_i·k_j) v_j[c]`, inputs `[heads, tokens, dim]` C order.
/// Uses the max-subtracted softmax, the numerically careful form, so it is a reference for the
/// schedules' plain `exp(s·x)/Σ exp(s·x)` rather than a copy of it.
pub fn attention(l: &RefLayer, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f64> {
    let (n, d) = (l.tokens, l.dim);
    let at = |t: &[f32], h: usize, i: usize, c: usize| f64::from(t[(h * n + i) * d + c]);
    let mut y = vec![0.0; l.heads * n * d];
    for h in 0..l.heads {
        for i in 0..n {
            let cols = if l.causal { i + 1 } else { n };
            let scores: Vec<f64> = (0..cols)
                .map(|j| l.scale * (0..d).map(|c| at(q, h, i, c) * at(k, h, j, c)).sum::<f64>())
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = e.iter().sum();
            for c in 0..d {
                y[(h * n + i) * d + c] = (0..cols).map(|j| e[j] / total * at(v, h, j, c)).sum();
            }
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_token_returns_its_value() {
        let l = RefLayer {
            heads: 1,
            tokens: 1,
            dim: 2,
            scale: 1.0,
            causal: false,
        };
        assert_eq!(
            attention(&l, &[1.0, 2.0], &[3.0, 4.0], &[5.0, -6.0]),
            vec![5.0, -6.0]
        );
    }

    #[test]
    fn uniform_scores_average_values() {
        // q = 0 makes every score 0, so the output is the plain mean of the visible values.
        let l = RefLayer {
            heads: 1,
            tokens: 2,
            dim: 1,
            scale: 0.5,
            causal: true,
        };
        let y = attention(&l, &[0.0, 0.0], &[1.0, 2.0], &[2.0, 4.0]);
        assert_eq!(y, vec![2.0, 3.0]);
    }
}
