//! `schedule-baseline`: the paper's Algorithm 1 (§3.2), heads one after another.
//!
//! Written 0-based. Every input element `t[h][r][c]` sits on PE `c mod m` ("column-cyclic"),
//! which is what the paper's phase-1 index formulas imply. With `m | n` and `m | d` every PE is
//! busy in every cycle and one head takes exactly `(2dn² + 2n²)/m` cycles:
//!
//! * phase 1 (`d·n²/m` cycles): the partial sum of `w'[a][b]` travels one PE per cycle, collecting
//!   `q[a][c]·k[b][c]` for the `c` each PE holds; it starts on PE `b mod m` and ends, complete, on
//!   PE `(b − 1) mod m`. So after phase 1 PE `p` holds the columns `b ≡ p + 1 (mod m)` of `w'`.
//! * phase 2, step 1 (`n²/m`): the running sum of row `a` travels the ring `n/m` times, adding
//!   `exp(s·w'[a][b])` for the `b` each PE holds; the exponent replaces `w'` in place.
//! * phase 2, step 2 (`n²/m`): the finished sum travels again; each PE divides its exponents.
//! * phase 3 (`d·n²/m`): each weight `w[a][b]` travels `d − 1` hops from PE `(b − 1) mod m`; each
//!   PE accumulates `y[a][c] += w[a][b]·v[b][c]` for its own columns `c`, so `y` never moves.
//!
//! The paper states phases 2–3 only as "loops similar to phase 1"; the formulas here are ours and
//! the verifier proves them. On a causal layer the same timetable is kept and every operation on a
//! masked element becomes a no-op (the running sums still travel), so the cycle count is the
//! paper's Algo 1 figure while no masked element is touched.

use crate::ir::Tensor;
use crate::passes::select::{chain_refusal, Refusal};
use crate::problem::{Inputs, Problem};
use crate::schedule::{Builder, Element, RingSchedule, ScheduleError, Val, Work};
use crate::scheduler::Scheduler;

pub const NAME: &str = "schedule-baseline";
pub const DESCRIPTION: &str =
    "the paper's Algorithm 1: column-cyclic data, travelling partial sums";

/// Why the baseline cannot schedule a shape.
pub fn unsupported(p: &Problem, pes: u32) -> Option<String> {
    p.ring_divides_shape(pes, "the baseline schedule")
        .or_else(|| p.needs_plain("the baseline schedule"))
}

/// Cycles of one head.
pub fn head_cycles(p: &Problem, pes: u32) -> usize {
    let (n, d, m) = (p.tokens as usize, p.dim as usize, pes as usize);
    (2 * d * n * n + 2 * n * n) / m
}

/// The registry's handle on this pass.
pub struct Baseline;

impl Scheduler for Baseline {
    fn name(&self) -> &'static str {
        "baseline"
    }
    fn pass(&self) -> &'static str {
        NAME
    }
    fn description(&self) -> &'static str {
        DESCRIPTION
    }
    fn title(&self) -> &'static str {
        "baseline (paper Algorithm 1)"
    }
    fn refusal(&self, p: &Problem, pes: u32) -> Option<Refusal> {
        unsupported(p, pes).map(|why| chain_refusal(p, pes, "baseline", why))
    }
    fn necessary_only(&self) -> bool {
        // On q = k it computes x_a·x_b for both scores (a, b) and (b, a), as the paper does.
        false
    }
    fn schedule(&self, p: &Problem, pes: u32) -> Result<RingSchedule, Vec<ScheduleError>> {
        run(p, pes)
    }
}

pub fn run(p: &Problem, pes: u32) -> Result<RingSchedule, Vec<ScheduleError>> {
    let mut b = Builder::new(NAME, pes);
    let mut inputs = Inputs::new(*p);
    for h in 0..p.heads {
        head(&mut b, &mut inputs, p, h, h as usize * head_cycles(p, pes));
    }
    b.finish()
}

fn head(b: &mut Builder, inputs: &mut Inputs, p: &Problem, h: u32, t0: usize) {
    let (n, d, m) = (p.tokens as usize, p.dim as usize, b.pes() as usize);
    let nb = n / m;
    let scale = p.scale as f32;
    let rot = |x: isize| x.rem_euclid(m as isize) as usize;

    // Phase 1.
    let mut scores: Vec<Vec<Option<Val>>> = vec![vec![None; n]; n];
    let mut partial: Vec<Vec<Option<Val>>> = vec![vec![None; n]; n];
    for a in 0..n {
        for blk in 0..nb {
            for j in 0..d {
                let t = t0 + (a * nb + blk) * d + j;
                for pe in 0..m {
                    let bcol = blk * m + rot(pe as isize - j as isize);
                    if !p.unmasked(a as u32, bcol as u32) {
                        continue;
                    }
                    let c = pe + m * (j / m);
                    let qa = inputs.get(b, Tensor::Q, h, a as u32, c as u32, pe as u32);
                    let kb = inputs.get(b, Tensor::K, h, bcol as u32, c as u32, pe as u32);
                    let out = b.computed();
                    let acc = partial[a][bcol].replace(out);
                    b.work(
                        pe as u32,
                        t,
                        1,
                        Work::Mac {
                            a: qa,
                            b: kb,
                            acc,
                            out,
                        },
                    );
                    if j + 1 < d {
                        b.send(pe as u32, t, out);
                    } else {
                        scores[a][bcol] = Some(out);
                    }
                }
            }
        }
    }

    // Phase 2, step 1: exponent-accumulate; step 2: divide. Row `a` is on PE (a + j) mod m at
    // step j; the column each PE takes is one it holds after phase 1 (b ≡ pe + 1).
    let t1 = t0 + n * nb * d;
    let t2 = t1 + nb * n;
    let mut exps: Vec<Vec<Option<Val>>> = vec![vec![None; n]; n];
    let mut sums: Vec<Option<Val>> = vec![None; n];
    for blk in 0..nb {
        for j in 0..n {
            let t = t1 + blk * n + j;
            for pe in 0..m {
                let a = blk * m + rot(pe as isize - j as isize);
                let bcol = rot(pe as isize + 1) + m * (j / m);
                if let Some(x) = scores[a][bcol] {
                    let (e, sum) = (b.computed(), b.computed());
                    let acc = sums[a].replace(sum);
                    b.work(
                        pe as u32,
                        t,
                        2,
                        Work::Exp {
                            x,
                            bias: None,
                            scale,
                            acc,
                            e,
                            sum,
                        },
                    );
                    exps[a][bcol] = Some(e);
                }
                // The last hop carries the finished sum to where step 2 starts the row.
                if let Some(sum) = sums[a] {
                    b.send(pe as u32, t, sum);
                }
            }
        }
    }
    // Step 2 carries each sum only as far as its row's last division.
    let column_at = |a: usize, j: usize| rot(((a + j) % m) as isize + 1) + m * (j / m);
    let last_div: Vec<usize> = (0..n)
        .map(|a| {
            (0..n)
                .rev()
                .find(|&j| exps[a][column_at(a, j)].is_some())
                .unwrap_or(0)
        })
        .collect();
    let mut weights: Vec<Vec<Option<Val>>> = vec![vec![None; n]; n];
    for blk in 0..nb {
        for j in 0..n {
            let t = t2 + blk * n + j;
            for pe in 0..m {
                let a = blk * m + rot(pe as isize - j as isize);
                let bcol = rot(pe as isize + 1) + m * (j / m);
                let Some(den) = sums[a] else {
                    b.bug(NAME, "a row without its unmasked diagonal");
                    continue;
                };
                if let Some(num) = exps[a][bcol] {
                    let out = b.computed();
                    b.work(pe as u32, t, 2, Work::Div { num, den, out });
                    weights[a][bcol] = Some(out);
                }
                if j < last_div[a] {
                    b.send(pe as u32, t, den);
                }
            }
        }
    }

    // Phase 3: w[a][bcol] starts on PE (bcol − 1) mod m and moves one PE per step.
    let t3 = t2 + nb * n;
    let mut ys: Vec<Vec<Option<Val>>> = vec![vec![None; d]; n];
    for a in 0..n {
        for blk in 0..nb {
            for j in 0..d {
                let t = t3 + (a * nb + blk) * d + j;
                for pe in 0..m {
                    let bcol = blk * m + rot(pe as isize + 1 - j as isize);
                    let Some(w) = weights[a][bcol] else { continue };
                    let c = pe + m * (j / m);
                    let vb = inputs.get(b, Tensor::V, h, bcol as u32, c as u32, pe as u32);
                    let out = b.computed();
                    let acc = ys[a][c].replace(out);
                    b.work(
                        pe as u32,
                        t,
                        3,
                        Work::Mac {
                            a: w,
                            b: vb,
                            acc,
                            out,
                        },
                    );
                    if j + 1 < d {
                        b.send(pe as u32, t, w);
                    }
                }
            }
        }
    }
    for (a, row) in ys.iter().enumerate() {
        for (c, y) in row.iter().enumerate() {
            let Some(y) = *y else {
                b.bug(NAME, "an output row without its diagonal term");
                continue;
            };
            let element = Element {
                tensor: Tensor::Y,
                head: h,
                row: a as u32,
                col: c as u32,
            };
            b.output(element, (c % m) as u32, y);
        }
    }
}
