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

/// The name these building blocks report their inconsistencies under.
const WHO: &str = "chains";

/// One phase-1 chain: `w'[a][b] = Σ_c q[a][c]·k[b][c]` of one head, finishing on PE `end`.
#[derive(Clone, Copy, Debug)]
pub struct ScoreChain {
    pub head: u32,
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
                let qa = inputs.get(b, Tensor::Q, ch.head, ch.a, c, pe);
                let kb = inputs.get(b, Tensor::K, ch.head, ch.b, c, pe);
                let out = b.computed();
                b.work(
                    pe,
                    t,
                    1,
                    Work::Mac {
                        a: qa,
                        b: kb,
                        acc,
                        out,
                    },
                );
                acc = Some(out);
                if j + 1 < d {
                    b.send(pe, t, out);
                }
            }
            scores[idx] = acc;
        }
    }
    let scores = scores
        .into_iter()
        .map(|s| {
            s.unwrap_or_else(|| {
                b.bug(WHO, "a score chain with no product (dim 0)");
                Val::from_u32(0)
            })
        })
        .collect();
    (scores, t0 + ws.len() * d as usize)
}

/// Scores or weights of one softmax row: `(column b, value, PE holding it)`.
pub type RowScores = Vec<(u32, Val, u32)>;

/// One softmax row and the PE its walk starts from.
#[derive(Clone, Debug)]
pub struct Row {
    pub head: u32,
    pub a: u32,
    pub start: u32,
    pub scores: RowScores,
}

/// Emits phase 2 (exponent-accumulate, then divide) for all rows; returns each row with its
/// weights in place of its scores, and the first free cycle.
///
/// Row walks go in blocks of rows with distinct start PEs (longest rows together, so a block's
/// length is spent on rows that need it). A walk moves one PE per cycle from its start PE, taking
/// at each PE one of the row's scores held there. Step 1's block lasts a multiple of `m` cycles,
/// during which the running sum keeps travelling, so that every finished sum is back on its start
/// PE where step 2 walks the same path dividing.
pub fn phase2(b: &mut Builder, p: &Problem, t0: usize, rows: &[Row]) -> (Vec<Row>, usize) {
    let m = b.pes() as usize;
    let scale = p.scale as f32;
    // walk[r][j] = index into rows[r].scores taken at step j, if any.
    let walks: Vec<Vec<Option<usize>>> = rows.iter().map(|row| walk(row, m)).collect();
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by_key(|&r| std::cmp::Reverse(walks[r].len()));
    let mut blocks: Vec<Vec<usize>> = Vec::new();
    for r in order {
        let start = rows[r].start;
        match blocks
            .iter_mut()
            .find(|blk| blk.iter().all(|&o| rows[o].start != start))
        {
            Some(blk) => blk.push(r),
            None => blocks.push(vec![r]),
        }
    }
    let block_len = |blk: &Vec<usize>| blk.iter().map(|&r| walks[r].len()).max().unwrap_or(0);

    let mut t = t0;
    let mut sums: Vec<Option<Val>> = vec![None; rows.len()];
    let mut exps: Vec<Vec<Option<Val>>> = rows.iter().map(|r| vec![None; r.scores.len()]).collect();
    for blk in &blocks {
        let span = block_len(blk).div_ceil(m) * m;
        for &r in blk {
            for j in 0..span {
                let pe = ((rows[r].start as usize + j) % m) as u32;
                if let Some(Some(i)) = walks[r].get(j) {
                    let (e, sum) = (b.computed(), b.computed());
                    let acc = sums[r].replace(sum);
                    let x = rows[r].scores[*i].1;
                    b.work(
                        pe,
                        t + j,
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
                    exps[r][*i] = Some(e);
                }
                if let Some(s) = sums[r] {
                    b.send(pe, t + j, s);
                }
            }
        }
        t += span;
    }
    let mut out: Vec<Row> = rows
        .iter()
        .map(|r| Row {
            scores: Vec::with_capacity(r.scores.len()),
            ..r.clone()
        })
        .collect();
    for blk in &blocks {
        for &r in blk {
            let Some(den) = sums[r] else {
                b.bug(WHO, "a softmax row with no score");
                continue;
            };
            let last = walks[r].iter().rposition(Option::is_some).unwrap_or(0);
            for (j, step) in walks[r].iter().enumerate().take(last + 1) {
                let pe = ((rows[r].start as usize + j) % m) as u32;
                if let Some(i) = *step {
                    let Some(num) = exps[r][i] else {
                        b.bug(WHO, "a weight whose exponential was never made");
                        continue;
                    };
                    let w = b.computed();
                    b.work(pe, t + j, 2, Work::Div { num, den, out: w });
                    out[r].scores.push((rows[r].scores[i].0, w, pe));
                }
                if j < last {
                    b.send(pe, t + j, den);
                }
            }
        }
        t += block_len(blk);
    }
    (out, t)
}

/// The order in which a row's walk takes its scores: at step `j` it is on PE `start + j`.
fn walk(row: &Row, m: usize) -> Vec<Option<usize>> {
    let mut left: Vec<Vec<usize>> = vec![Vec::new(); m];
    for (i, &(_, _, pe)) in row.scores.iter().enumerate().rev() {
        left[pe as usize].push(i);
    }
    let mut steps = Vec::new();
    let mut remaining = row.scores.len();
    while remaining > 0 {
        let pe = (row.start as usize + steps.len()) % m;
        let pick = left[pe].pop();
        remaining -= usize::from(pick.is_some());
        steps.push(pick);
    }
    steps
}

/// Emits phase 3: every weight `w[a][b]` travels `d` steps from its PE, adding `w·v[b][c]` into
/// `y[a][c]` on each PE it meets; registers every `y` as output and returns the first free cycle.
pub fn phase3(b: &mut Builder, inputs: &mut Inputs, p: &Problem, t0: usize, rows: &[Row]) -> usize {
    let (m, d, n) = (b.pes(), p.dim, p.tokens as usize);
    let items: Vec<(u32, u32, u32, Val, u32)> = rows
        .iter()
        .flat_map(|r| {
            r.scores
                .iter()
                .map(move |&(bc, v, pe)| (r.head, r.a, bc, v, pe))
        })
        .collect();
    let ws = waves(&items, |it| it.4, m);
    let at = |h: u32, a: u32, c: u32| (h as usize * n + a as usize) * d as usize + c as usize;
    let mut ys: Vec<Option<Val>> = vec![None; p.heads as usize * n * d as usize];
    for (w, wave) in ws.iter().enumerate() {
        // Step-major: the running y[a][c] must be chained in time order, and two chains of
        // one row in a wave take turns on the same y.
        for j in 0..d {
            for &(h, a, bc, wv, start) in wave {
                let t = t0 + w * d as usize + j as usize;
                let pe = (start + j) % m;
                let c = column(pe, j, m);
                let vb = inputs.get(b, Tensor::V, h, bc, c, pe);
                let out = b.computed();
                let acc = ys[at(h, a, c)].replace(out);
                b.work(
                    pe,
                    t,
                    3,
                    Work::Mac {
                        a: wv,
                        b: vb,
                        acc,
                        out,
                    },
                );
                if j + 1 < d {
                    b.send(pe, t, wv);
                }
            }
        }
    }
    for h in 0..p.heads {
        for a in 0..n as u32 {
            for c in 0..d {
                let Some(y) = ys[at(h, a, c)] else {
                    b.bug(WHO, "an output row with no weight");
                    continue;
                };
                let element = Element {
                    tensor: Tensor::Y,
                    head: h,
                    row: a,
                    col: c,
                };
                b.output(element, c % m, y);
            }
        }
    }
    t0 + ws.len() * d as usize
}
