//! The uneven deal: separate q, k, v without a mask on a ring that does not divide the tokens,
//! without padding (docs/scheduling.md, "Streaming ring schedule", "Tokens the ring does not
//! divide").
//!
//! PE `p` owns the stretch `[x_p, x_{p+1})` of the rows, `x_p = p·n/m`, so every PE has exactly
//! `n/m` rows' worth of work. A row that a boundary `x_p` cuts is computed in two parts, the
//! first on PE `p − 1` against the key blocks of that PE's first `k` ring steps, the second on PE
//! `p` against the others (its step 0 and steps `k + 1 … m − 1`), and the parts' states merge
//! once, over the link, on PE `p`. The blocks are the tokens whose rows start on a PE, so they
//! differ in size by one, and the PEs' steps differ in length: each PE keeps every block of a
//! head that reaches it (in a buffer of its own per block), waits before a step only until the
//! block it reads has arrived, and the heads end together.
//!
//! With every block kept, the scores of a row need no rescaling: the ring pass computes the
//! scores and the running maximum only, and then each row takes its exponentials against its
//! final maximum and its values from the kept blocks. The safe softmax then executes exactly
//! its necessary operations plus, per cut row and head, the merge's `2d + 4`.

use std::collections::BTreeMap;

use isa::{Cmp, LoopProgram, Node, Pred, Slot};

use super::{ad, lp, Ad, Place, Send, Stream, B, NAME};
use crate::problem::Problem;

/// Why the uneven deal does not apply to `p` on `m` PEs, if it does not.
pub fn unsupported(p: &Problem, m: u32) -> Option<String> {
    if p.causal || p.symmetric || p.shared_values || !p.safe() {
        return Some(format!(
            "{NAME}: the uneven deal takes separate q, k, v without a mask and the safe softmax"
        ));
    }
    if m < 2 || p.tokens.is_multiple_of(m) {
        return Some(format!(
            "{NAME}: the uneven deal is for rings of 2 or more PEs that do not divide the tokens"
        ));
    }
    // Every PE needs two whole rows to carry a block on its score loops, and every block two
    // keys for a first maximum.
    if p.tokens / m < 4 {
        return Some(format!(
            "{NAME}: the uneven deal needs at least 4 tokens per PE ({} on {m})",
            p.tokens
        ));
    }
    None
}

/// One PE's share and memory map.
#[derive(Clone, Debug)]
struct Pe {
    /// First token whose q, k, v rows it holds (`⌈x_p⌉`).
    first: u32,
    /// Tokens whose rows start in its stretch: its k/v block.
    own: u32,
    /// The row cut at `x_p`: its second part is local row 0 here, after the first part's `k`
    /// steps on the PE before.
    cut_in: Option<u32>,
    /// The row cut at `x_{p+1}`: its first part is the last local row, for steps `0 … k − 1`.
    cut_out: Option<u32>,
    /// Rows wholly its own.
    full: u32,
    rows: u32,
    q: u32,
    kv: u32,
    y: u32,
    /// Block `b` of the head arrives at `buf + 2d·⌈x_b⌉` (`[k rows][v rows]`).
    buf: u32,
    /// Scores, one row of `n` per local row (column = key token), then its exponentials.
    s: u32,
    mx: u32,
    l: u32,
    /// The first part's maximum, `l` and `y` row, from the PE before.
    rcv: u32,
    /// The merged maximum and the two parts' factors.
    tmp: u32,
    words: u32,
}

impl Pe {
    fn c2(&self) -> u32 {
        u32::from(self.cut_in.is_some())
    }
}

struct Deal {
    n: u32,
    d: u32,
    m: u32,
    heads: u32,
    pes: Vec<Pe>,
}

impl Deal {
    /// `⌈p·n/m⌉`: the first token whose row starts in PE `p`'s stretch.
    fn start(&self, p: u32) -> u32 {
        (u64::from(p) * u64::from(self.n)).div_ceil(u64::from(self.m)) as u32
    }
    fn block(&self, b: u32) -> (u32, u32) {
        let t = self.start(b);
        (t, self.start(b + 1) - t)
    }
    /// Block held by PE `p` in ring step `s`.
    fn held(&self, p: u32, s: u32) -> u32 {
        (p + self.m - s) % self.m
    }

    fn new(n: u32, d: u32, m: u32, heads: u32) -> Option<Deal> {
        let mut deal = Deal {
            n,
            d,
            m,
            heads,
            pes: Vec::new(),
        };
        // The first part of the row cut at `x_p` (p = 1 … m − 1) takes the blocks of PE p − 1's
        // first `k` steps: as many keys as its share `frac(x_p)·n` of the row, within one
        // block.
        let cut_k = |p: u32| -> Option<u32> {
            let frac = u64::from(p) * u64::from(n) % u64::from(m);
            if frac == 0 {
                return None;
            }
            let target = frac * u64::from(n);
            let mut keys = 0u64;
            let mut best = (u64::MAX, 1);
            for k in 1..m {
                keys += u64::from(deal.block(deal.held(p - 1, k - 1)).1);
                let miss = (keys * u64::from(m)).abs_diff(target);
                if miss < best.0 {
                    best = (miss, k);
                }
            }
            Some(best.1)
        };
        let cuts: Vec<Option<u32>> = (0..=m)
            .map(|p| if p == 0 || p == m { None } else { cut_k(p) })
            .collect();
        let dd = u64::from(d);
        let nn = u64::from(n);
        let h = u64::from(heads);
        for p in 0..m {
            let (first, own) = deal.block(p);
            let (cut_in, cut_out) = (cuts[p as usize], cuts[p as usize + 1]);
            let full = own - u32::from(cut_out.is_some());
            let rows = full + u32::from(cut_in.is_some()) + u32::from(cut_out.is_some());
            let r = u64::from(rows);
            let q = 0u64;
            let kv = q + h * r * dd;
            let y = kv + h * 2 * u64::from(own) * dd;
            let buf = y + h * r * dd;
            let s = buf + 2 * nn * dd;
            let mx = s + r * nn;
            let l = mx + r;
            let rcv = l + r;
            let tmp = rcv + dd + 2;
            let words = tmp + 3;
            let w = |x: u64| u32::try_from(x).ok();
            deal.pes.push(Pe {
                first,
                own,
                cut_in,
                cut_out,
                full,
                rows,
                q: w(q)?,
                kv: w(kv)?,
                y: w(y)?,
                buf: w(buf)?,
                s: w(s)?,
                mx: w(mx)?,
                l: w(l)?,
                rcv: w(rcv)?,
                tmp: w(tmp)?,
                words: w(words)?,
            });
        }
        Some(deal)
    }

    /// Where PE `p` reads the block of its step `s` (k rows; v rows `K·d` on).
    fn at(&self, p: u32, s: u32) -> Ad {
        let pe = &self.pes[p as usize];
        if s == 0 {
            ad(pe.kv).t(0, i64::from(2 * pe.own * self.d))
        } else {
            let (t, _) = self.block(self.held(p, s));
            ad(pe.buf + 2 * self.d * t)
        }
    }

    /// Local rows of PE `p` that take the block of step `s`.
    fn active(&self, p: u32, s: u32) -> (u32, u32) {
        let pe = &self.pes[p as usize];
        let c2 = pe.c2();
        let lo = match pe.cut_in {
            Some(k) if s == 0 || s > k => 0,
            _ => c2,
        };
        let hi = c2 + pe.full + u32::from(pe.cut_out.is_some_and(|k| s < k));
        (lo, hi)
    }

    /// Ring step `s` on PE `p`: scores of the active rows against the block into their score
    /// rows, and their running maxima; rows 0 and 1 forward the block (k rows, then v rows) to
    /// the next PE's buffer on their score loops. Also the cycle, from the step's start, by
    /// which the next PE has the whole block.
    fn step(&self, p: u32, s: u32) -> (Vec<Node>, u64) {
        let pe = &self.pes[p as usize];
        let (d, n) = (i64::from(self.d), i64::from(self.n));
        let (t0, keys) = self.block(self.held(p, s));
        let (lo, hi) = self.active(p, s);
        let (lr, lb, lc) = (1u8, 2u8, 3u8);
        let kd = i64::from(keys) * d;
        let q = ad(pe.q + lo * self.d).t(0, i64::from(pe.rows) * d).t(lr, d);
        let loc = self.at(p, s);
        let k = loc.clone().t(lb, d);
        let sc = ad(pe.s + lo * self.n + t0).t(lr, n);
        let next = &self.pes[((p + 1) % self.m) as usize];
        let dst = ad(next.buf + 2 * self.d * t0);
        let send = |c0: i64, col: bool| {
            (s + 1 < self.m).then(|| {
                let at = |a: &Ad| {
                    let x = a.clone().plus(c0).t(lr, kd).t(lb, d);
                    if col {
                        x.t(lc, 1)
                    } else {
                        x
                    }
                };
                Send {
                    src: at(&loc),
                    dst: at(&dst),
                    preds: vec![Pred {
                        slot: Slot::Xfer,
                        level: lr,
                        cmp: Cmp::Lt,
                        value: 2,
                    }],
                }
            })
        };
        let mut score = vec![B::new()
            .mul(q.clone(), k.clone(), None)
            .add(None, sc.clone().t(lb, 1))
            .send(send(0, false).as_ref())
            .build()];
        score.extend(lp(
            self.d - 1,
            vec![B::new()
                .mul(q.plus(1).t(lc, 1), k.plus(1).t(lc, 1), None)
                .add(Some(sc.clone().t(lb, 1)), sc.clone().t(lb, 1))
                .send(send(1, true).as_ref())
                .build()],
        ));
        let mut body = lp(keys, score);
        let mx = ad(pe.mx + lo).t(lr, 1);
        if s == 0 {
            body.push(
                B::new()
                    .max(sc.clone(), sc.clone().plus(1), mx.clone())
                    .build(),
            );
            body.extend(lp(
                keys - 2,
                vec![B::new()
                    .max(mx.clone(), sc.plus(2).t(lb, 1), mx.clone())
                    .build()],
            ));
        } else {
            body.extend(lp(
                keys,
                vec![B::new().max(mx.clone(), sc.t(lb, 1), mx.clone()).build()],
            ));
        }
        let row = cycles(&body);
        (lp(hi - lo, body), row + u64::from(keys) * u64::from(self.d))
    }

    /// The blocks a row of kind `part` on PE `p` sees, as the steps that bring them.
    fn steps_of(&self, p: u32, part: Part) -> Vec<u32> {
        let pe = &self.pes[p as usize];
        match part {
            Part::Full => (0..self.m).collect(),
            Part::Out => (0..pe.cut_out.unwrap_or(0)).collect(),
            Part::In => {
                let k = pe.cut_in.unwrap_or(0);
                std::iter::once(0).chain(k + 1..self.m).collect()
            }
        }
    }

    /// After the ring pass, rows `r0 … r0 + rows − 1` of PE `p` (all of kind `part`): their
    /// exponentials against their final maxima, summed into `l`, and `y` from the kept blocks.
    fn values(&self, p: u32, r0: u32, rows: u32, part: Part, scale: f32) -> Vec<Node> {
        let pe = &self.pes[p as usize];
        let (d, n) = (i64::from(self.d), i64::from(self.n));
        let sc = ad(pe.s + r0 * self.n).t(1, n);
        let mx = ad(pe.mx + r0).t(1, 1);
        let l = ad(pe.l + r0).t(1, 1);
        let yc = ad(pe.y + r0 * self.d)
            .t(0, i64::from(pe.rows) * d)
            .t(1, d)
            .t(2, 1);
        let blocks: Vec<(Ad, u32, u32)> = self
            .steps_of(p, part)
            .into_iter()
            .map(|s| {
                let (t0, keys) = self.block(self.held(p, s));
                (self.at(p, s), keys, t0)
            })
            .collect();
        let mut body = Vec::new();
        for (i, (_, keys, t0)) in blocks.iter().enumerate() {
            let e = sc.clone().plus(i64::from(*t0));
            let ex = |x: Ad, init: bool| {
                B::new()
                    .expd(x.clone(), mx.clone(), scale, x)
                    .add((!init).then(|| l.clone()), l.clone())
                    .build()
            };
            if i == 0 {
                body.push(ex(e.clone(), true));
                body.extend(lp(keys - 1, vec![ex(e.plus(1).t(2, 1), false)]));
            } else {
                body.extend(lp(*keys, vec![ex(e.t(2, 1), false)]));
            }
        }
        let mut cols = Vec::new();
        for (i, (loc, keys, t0)) in blocks.iter().enumerate() {
            let e = sc.clone().plus(i64::from(*t0));
            let v = loc.clone().plus(i64::from(*keys) * d).t(2, 1);
            let mac = |e: Ad, v: Ad, init: bool| {
                B::new()
                    .mul(e, v, None)
                    .add((!init).then(|| yc.clone()), yc.clone())
                    .build()
            };
            if i == 0 {
                cols.push(mac(e.clone(), v.clone(), true));
                cols.extend(lp(
                    keys - 1,
                    vec![mac(e.plus(1).t(3, 1), v.plus(d).t(3, d), false)],
                ));
            } else {
                cols.extend(lp(*keys, vec![mac(e.t(3, 1), v.t(3, d), false)]));
            }
        }
        body.extend(lp(self.d, cols));
        lp(rows, body)
    }

    /// PE `p`'s first part of a cut row goes to the next PE: maximum, `l`, `y` row.
    fn send_part(&self, p: u32) -> Vec<Node> {
        let pe = &self.pes[p as usize];
        let next = &self.pes[((p + 1) % self.m) as usize];
        let r = pe.rows - 1;
        let one = |src: Ad, dst: Ad| {
            B::new()
                .send(Some(&Send {
                    src,
                    dst,
                    preds: Vec::new(),
                }))
                .build()
        };
        let mut nodes = vec![
            one(ad(pe.mx + r), ad(next.rcv)),
            one(ad(pe.l + r), ad(next.rcv + 1)),
        ];
        nodes.extend(lp(
            self.d,
            vec![one(
                ad(pe.y + r * self.d)
                    .t(0, i64::from(pe.rows * self.d))
                    .t(1, 1),
                ad(next.rcv + 2).t(1, 1),
            )],
        ));
        nodes
    }

    /// Local row 0 of PE `p` takes in the first part: `M = max(M₁, M₂)`, each part's state
    /// scaled by `exp(s·(Mᵢ − M))`, `l` and `y` summed.
    fn merge(&self, p: u32, scale: f32) -> Vec<Node> {
        let pe = &self.pes[p as usize];
        let (t, f1, f2) = (ad(pe.tmp), ad(pe.tmp + 1), ad(pe.tmp + 2));
        let (mx, l, rcv) = (ad(pe.mx), ad(pe.l), ad(pe.rcv));
        let y = ad(pe.y).t(0, i64::from(pe.rows * self.d)).t(1, 1);
        let mut nodes = vec![
            B::new().max(mx.clone(), rcv.clone(), t.clone()).build(),
            B::new().expd(mx, t.clone(), scale, f2.clone()).build(),
            B::new().expd(rcv.clone(), t, scale, f1.clone()).build(),
            B::new().mul(l.clone(), f2.clone(), Some(l.clone())).build(),
            B::new()
                .mul(rcv.plus(1), f1.clone(), None)
                .add(Some(l.clone()), l)
                .build(),
        ];
        nodes.extend(lp(
            self.d,
            vec![B::new().mul(y.clone(), f2, Some(y.clone())).build()],
        ));
        nodes.extend(lp(
            self.d,
            vec![B::new()
                .mul(ad(pe.rcv + 2).t(1, 1), f1, None)
                .add(Some(y.clone()), y)
                .build()],
        ));
        nodes
    }

    /// `y /= l` for the rows whose result this PE holds (all but a first part).
    fn normalise(&self, p: u32) -> Vec<Node> {
        let pe = &self.pes[p as usize];
        let d = i64::from(self.d);
        let y = ad(pe.y).t(0, i64::from(pe.rows) * d).t(1, d).t(2, 1);
        let rows = pe.rows - u32::from(pe.cut_out.is_some());
        lp(
            rows,
            lp(
                self.d,
                vec![B::new().div(y.clone(), ad(pe.l).t(1, 1), y).build()],
            ),
        )
    }

    /// Before the heads: each PE with a first part sends that row's q rows, every head's, to
    /// local row 0 of the next PE, which needs them in its step 0.
    fn prologue(&self, p: u32) -> Vec<Node> {
        let pe = &self.pes[p as usize];
        let next = &self.pes[((p + 1) % self.m) as usize];
        let body = if pe.cut_out.is_some() {
            B::new()
                .send(Some(&Send {
                    src: ad(pe.q + (pe.rows - 1) * self.d)
                        .t(0, i64::from(pe.rows * self.d))
                        .t(1, 1),
                    dst: ad(next.q).t(0, i64::from(next.rows * self.d)).t(1, 1),
                    preds: Vec::new(),
                }))
                .build()
        } else {
            nop()
        };
        lp(self.heads, lp(self.d, vec![body]))
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Part {
    Full,
    /// A first part (the last local row).
    Out,
    /// A second part (local row 0).
    In,
}

fn nop() -> Node {
    B::new().build()
}

fn cycles(nodes: &[Node]) -> u64 {
    LoopProgram {
        pe: 0,
        pes: 1,
        mem_words: 0,
        body: nodes.to_vec(),
    }
    .cycles()
}

/// `count` idle cycles.
fn wait(count: u64) -> Result<Vec<Node>, String> {
    let c = u32::try_from(count).map_err(|_| format!("{NAME}: a wait of {count} cycles"))?;
    Ok(lp(c, vec![nop()]))
}

/// The uneven deal's programs for `p` on `m` PEs (see the module's doc).
pub fn run(p: &Problem, m: u32) -> Result<Stream, String> {
    if let Some(why) = unsupported(p, m) {
        return Err(why);
    }
    let (n, d, heads) = (p.tokens, p.dim, p.heads);
    let scale = p.scale as f32;
    let deal = Deal::new(n, d, m, heads)
        .ok_or_else(|| format!("{NAME}: the layer does not fit in 32-bit addresses"))?;
    let mu = m as usize;
    // Ring steps: each waits until the block it reads is whole on its PE.
    let steps: Vec<Vec<(Vec<Node>, u64)>> = (0..m)
        .map(|pe| (0..m).map(|s| deal.step(pe, s)).collect())
        .collect();
    let mut waits = vec![vec![0u64; mu]; mu];
    let mut start = vec![vec![0u64; mu]; mu];
    let mut end = vec![0u64; mu];
    for s in 0..mu {
        for pe in 0..mu {
            let prev = (pe + mu - 1) % mu;
            let ready = if s == 0 {
                0
            } else {
                start[prev][s - 1] + steps[prev][s - 1].1
            };
            let at = end[pe].max(ready);
            waits[pe][s] = at - end[pe];
            start[pe][s] = at;
            end[pe] = at + cycles(&steps[pe][s].0);
        }
    }
    // After the ring pass: the first part first (its state then goes out), the whole rows,
    // the second part, which waits for the first's state to merge it.
    struct Tail {
        out: Vec<Node>,
        rest: Vec<Node>,
        merge: Vec<Node>,
        sent_by: u64,
        merge_at: u64,
    }
    let tails: Vec<Tail> = (0..m)
        .map(|pe| {
            let me = &deal.pes[pe as usize];
            let mut out = Vec::new();
            if me.cut_out.is_some() {
                out = deal.values(pe, me.rows - 1, 1, Part::Out, scale);
                out.extend(deal.send_part(pe));
            }
            let mut rest = deal.values(pe, me.c2(), me.full, Part::Full, scale);
            if me.cut_in.is_some() {
                rest.extend(deal.values(pe, 0, 1, Part::In, scale));
            }
            let t = end[pe as usize];
            let sent_by = t + cycles(&out);
            let merge_at = sent_by + cycles(&rest);
            let merge = if me.cut_in.is_some() {
                deal.merge(pe, scale)
            } else {
                Vec::new()
            };
            Tail {
                out,
                rest,
                merge,
                sent_by,
                merge_at,
            }
        })
        .collect();
    let mut bodies = Vec::with_capacity(mu);
    let mut ends = Vec::with_capacity(mu);
    for pe in 0..mu {
        let mut body = Vec::new();
        for (s, (nodes, _)) in steps[pe].iter().enumerate() {
            body.extend(wait(waits[pe][s])?);
            body.extend(nodes.iter().cloned());
        }
        let t = &tails[pe];
        body.extend(t.out.iter().cloned());
        body.extend(t.rest.iter().cloned());
        if !t.merge.is_empty() {
            let prev = (pe + mu - 1) % mu;
            body.extend(wait(tails[prev].sent_by.saturating_sub(t.merge_at))?);
            body.extend(t.merge.iter().cloned());
        }
        body.extend(deal.normalise(pe as u32));
        ends.push(cycles(&body));
        bodies.push(body);
    }
    // The heads start together: a block of the next head lands where this one's was read.
    let head = ends.iter().copied().max().unwrap_or(0);
    let programs = bodies
        .into_iter()
        .zip(&ends)
        .enumerate()
        .map(|(pe, (mut body, &e))| {
            body.extend(wait(head - e)?);
            let mut top = deal.prologue(pe as u32);
            top.extend(lp(heads, body));
            Ok(LoopProgram {
                pe: pe as u32,
                pes: m,
                mem_words: deal.pes[pe].words,
                body: top,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let cycles = programs.iter().map(LoopProgram::cycles).max().unwrap_or(0);
    let total_ops: u64 = programs
        .iter()
        .map(|p| p.op_counts().iter().sum::<u64>())
        .sum();
    let weights = u64::from(n) * u64::from(n) * u64::from(heads);
    let ops = crate::schedule::OpCounts {
        phase1_mac: weights * u64::from(d),
        phase2_exp: weights,
        phase2_max: 0,
        phase2_div: u64::from(n) * u64::from(d) * u64::from(heads),
        phase3_mac: weights * u64::from(d),
    };
    let (inputs, output) = places(&deal);
    Ok(Stream {
        programs,
        inputs,
        output,
        cycles,
        ops,
        total_ops,
        lag: 0,
    })
}

/// Every element's word: q, k, v on the PE whose stretch the token's row starts in, y on the
/// one it ends in (a cut row's first part is computed before its second).
fn places(deal: &Deal) -> (BTreeMap<String, Place>, Place) {
    let (n, d, m) = (deal.n, deal.d, deal.m);
    let owner = |t: u32| (0..m).rev().find(|&p| deal.start(p) <= t).unwrap_or(0);
    let mut lists: [(Vec<u32>, Vec<u32>); 4] = Default::default();
    for h in 0..deal.heads {
        for t in 0..n {
            let p = owner(t);
            let pe = &deal.pes[p as usize];
            let i = t - pe.first;
            let row = pe.c2() + i;
            let (yp, yrow) = if pe.cut_out.is_some() && row == pe.rows - 1 {
                ((p + 1) % m, 0)
            } else {
                (p, row)
            };
            let ype = &deal.pes[yp as usize];
            for c in 0..d {
                let kv = pe.kv + h * 2 * pe.own * d + i * d + c;
                let at = [
                    (p, pe.q + (h * pe.rows + row) * d + c),
                    (p, kv),
                    (p, kv + pe.own * d),
                    (yp, ype.y + (h * ype.rows + yrow) * d + c),
                ];
                for (list, (q, a)) in lists.iter_mut().zip(at) {
                    list.0.push(q);
                    list.1.push(a);
                }
            }
        }
    }
    let [q, k, v, y] = lists.map(|(pe, addr)| Place::Listed { pe, addr });
    let inputs = BTreeMap::from([
        ("q".to_string(), q),
        ("k".to_string(), k),
        ("v".to_string(), v),
    ]);
    (inputs, y)
}
