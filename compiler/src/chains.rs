//! Building blocks shared by the pair-based schedules (symmetric and causal): travelling
//! partial-sum chains packed into waves, and row walks for softmax.
//!
//! Data layout (as in the baseline): element `[r][c]` of every input sits on PE `c mod m`, and
//! output `y[a][c]` accumulates on PE `c mod m`. With `m | d` a chain that starts on PE `s` and
//! moves one PE per cycle for `d` cycles meets every column exactly once (at step `j` it is on PE
//! `p = (s + j) mod m` and takes column `p + m·⌊j/m⌋`) and ends on PE `(s − 1) mod m`.
//!
//! A *wave* is `d` cycles in which up to `m` chains with distinct start PEs run in lockstep; they
//! never meet, so every PE and every link carries at most one chain per cycle. Packing chains
//! into waves costs `d · max_p #(chains starting on p)` cycles.

use crate::ir::Tensor;
use crate::problem::{Inputs, Problem};
use crate::schedule::{Builder, Element, Val, Work};

/// One phase-1 chain: `w'[a][b] = Σ_c q[a][c]·k[b][c]`, finishing on PE `end`.
#[derive(Clone, Copy, Debug)]
pub struct ScoreChain {
    pub a: u32,
    pub b: u32,
    pub end: u32,
}

/// Groups items by start PE into waves: wave `i` takes the `i`-th item of every PE.
fn waves<T: Copy>(items: &[T], start: impl Fn(&T) -> u32, m: u32) -> Vec<Vec<T>> {
    let mut per_pe: Vec<Vec<T>> = vec![Vec::new(); m as usize];
    for it in items {
        per_pe[start(it) as usize].push(*it);
    }
    let depth = per_pe.iter().map(Vec::len).max().unwrap_or(0);
    (0..depth)
        .map(|i| per_pe.iter().filter_map(|v| v.get(i).copied()).collect())
        .collect()
}

fn rot(x: i64, m: u32) -> u32 {
    x.rem_euclid(i64::from(m)) as u32
}

/// Column taken at step `j` of a chain that is on PE `pe` then.
fn column(pe: u32, j: u32, m: u32) -> u32 {
    pe + m * (j / m)
}

/// Emits phase 1 for `chains` starting at cycle `t0`; returns the finished scores (indexed by
/// chain) and the first free cycle.
pub fn phase1(
    b: &mut Builder,
    inputs: &mut Inputs,
    p: &Problem,
    h: u32,
    t0: usize,
    chains: &[ScoreChain],
) -> (Vec<Val>, usize) {
    let (m, d) = (b.pes(), p.dim);
    let indexed: Vec<(usize, ScoreChain)> = chains.iter().copied().enumerate().collect();
    let ws = waves(&indexed, |(_, c)| rot(i64::from(c.end) + 1, m), m);
    let mut scores = vec![None; chains.len()];
    for (w, wave) in ws.iter().enumerate() {
        for &(idx, ch) in wave {
            let start = rot(i64::from(ch.end) + 1, m);
            let mut acc = None;
            for j in 0..d {
                let t = t0 + w * d as usize + j as usize;
                let pe = (start + j) % m;
                let c = column(pe, j, m);
                let qa = inputs.get(b, Tensor::Q, h, ch.a, c, pe);
                let kb = inputs.get(b, Tensor::K, h, ch.b, c, pe);
                let out = b.computed();
                b.work(pe, t, 1, Work::Mac { a: qa, b: kb, acc, out });
                acc = Some(out);
                if j + 1 < d {
                    b.send(pe, t, out);
                }
            }
            scores[idx] = acc;
        }
    }
    let scores = scores.into_iter().map(|s| s.expect("d >= 1")).collect();
    (scores, t0 + ws.len() * d as usize)
}

/// Where one softmax row finds its scores: `(column b, value, PE holding it)`.
pub type RowScores = Vec<(u32, Val, u32)>;

/// Emits phase 2 (exponent-accumulate, then divide) for all rows; returns the weights
/// `w[a] = [(b, value, pe)]` and the first free cycle.
///
/// Rows go in blocks of `m` (`a = blk·m + r`). Row `a` walks the ring from PE `a mod m`, one PE
/// per cycle, taking at each PE one of its scores held there. Step 1's block lasts a multiple of
/// `m` cycles, during which the running sum keeps travelling, so that every finished sum is back
/// on PE `a mod m` where step 2 walks the same path dividing.
pub fn phase2(b: &mut Builder, p: &Problem, t0: usize, rows: &[RowScores]) -> (Vec<RowScores>, usize) {
    let m = b.pes() as usize;
    let n = rows.len();
    let scale = p.scale as f32;
    // walk[a][j] = index into rows[a] taken at step j, if any.
    let mut walks: Vec<Vec<Option<usize>>> = Vec::with_capacity(n);
    for (a, row) in rows.iter().enumerate() {
        let mut left: Vec<Vec<usize>> = vec![Vec::new(); m];
        for (i, &(_, _, pe)) in row.iter().enumerate() {
            left[pe as usize].push(i);
        }
        for l in &mut left {
            l.reverse();
        }
        let mut walk = Vec::new();
        let mut remaining = row.len();
        let mut j = 0;
        while remaining > 0 {
            let pe = (a + j) % m;
            let pick = left[pe].pop();
            if pick.is_some() {
                remaining -= 1;
            }
            walk.push(pick);
            j += 1;
        }
        walks.push(walk);
    }
    let mut t = t0;
    let mut blocks = Vec::new();
    for blk in 0..n.div_ceil(m) {
        let rows_in = blk * m..(blk * m + m).min(n);
        let len = rows_in.clone().map(|a| walks[a].len()).max().unwrap_or(0);
        blocks.push((rows_in, len, t));
        t += len.div_ceil(m) * m;
    }
    let mut sums: Vec<Option<Val>> = vec![None; n];
    let mut exps: Vec<Vec<Option<Val>>> = rows.iter().map(|r| vec![None; r.len()]).collect();
    for (rows_in, len, tb) in &blocks {
        let span = len.div_ceil(m) * m;
        for a in rows_in.clone() {
            for j in 0..span {
                let pe = ((a + j) % m) as u32;
                if let Some(Some(i)) = walks[a].get(j) {
                    let (e, sum) = (b.computed(), b.computed());
                    let acc = sums[a].replace(sum);
                    let x = rows[a][*i].1;
                    b.work(pe, tb + j, 2, Work::Exp { x, scale, acc, e, sum });
                    exps[a][*i] = Some(e);
                }
                if let Some(s) = sums[a] {
                    b.send(pe, tb + j, s);
                }
            }
        }
    }
    let mut weights: Vec<RowScores> = rows.iter().map(|r| Vec::with_capacity(r.len())).collect();
    for (rows_in, len, _) in &blocks {
        for a in rows_in.clone() {
            let den = sums[a].expect("every row has at least one score");
            let last = walks[a].iter().rposition(Option::is_some).unwrap_or(0);
            for j in 0..=last {
                let pe = ((a + j) % m) as u32;
                if let Some(i) = walks[a][j] {
                    let num = exps[a][i].expect("step 1 made it");
                    let out = b.computed();
                    b.work(pe, t + j, 2, Work::Div { num, den, out });
                    weights[a].push((rows[a][i].0, out, pe));
                }
                if j < last {
                    b.send(pe, t + j, den);
                }
            }
        }
        t += len;
    }
    (weights, t)
}

/// Emits phase 3: every weight `w[a][b]` travels `d` steps from its PE, adding `w·v[b][c]` into
/// `y[a][c]` on each PE it meets; returns the first free cycle and registers every `y` as output.
pub fn phase3(b: &mut Builder, inputs: &mut Inputs, p: &Problem, h: u32, t0: usize, weights: &[RowScores]) -> usize {
    let (m, d, n) = (b.pes(), p.dim, p.tokens);
    let items: Vec<(u32, u32, Val, u32)> = weights
        .iter()
        .enumerate()
        .flat_map(|(a, row)| row.iter().map(move |&(bc, v, pe)| (a as u32, bc, v, pe)))
        .collect();
    let ws = waves(&items, |it| it.3, m);
    let mut ys: Vec<Vec<Option<Val>>> = vec![vec![None; d as usize]; n as usize];
    for (w, wave) in ws.iter().enumerate() {
        // Step-major: the running y[a][c] must be chained in time order, and two chains of
        // one row in a wave take turns on the same y.
        for j in 0..d {
            for &(a, bc, wv, start) in wave {
                let t = t0 + w * d as usize + j as usize;
                let pe = (start + j) % m;
                let c = column(pe, j, m);
                let vb = inputs.get(b, Tensor::V, h, bc, c, pe);
                let out = b.computed();
                let acc = ys[a as usize][c as usize].replace(out);
                b.work(pe, t, 3, Work::Mac { a: wv, b: vb, acc, out });
                if j + 1 < d {
                    b.send(pe, t, wv);
                }
            }
        }
    }
    for (a, row) in ys.iter().enumerate() {
        for (c, y) in row.iter().enumerate() {
            let y = y.expect("every output row has at least one weight");
            let element = Element {
                tensor: Tensor::Y,
                head: h,
                row: a as u32,
                col: c as u32,
            };
            b.output(element, c as u32 % m, y);
        }
    }
    t0 + ws.len() * d as usize
}
