//! Carried scores on a ring that does not divide the tokens: a shared layer (q = k = v) without
//! a mask under the safe softmax, its rows dealt whole in uneven counts.
//!
//! PE `p` owns the rows `[⌈p·n/m⌉, ⌈(p + 1)·n/m⌉)`, none cut, so no partial state is merged or
//! rescaled. The blocks of PEs `u` and `v` meet twice in a ring pass, and any split of their
//! `r_u × r_v` scores between the two meetings is correct: each score is computed once, kept by
//! the PE that computes it, and its mirror is sent, from the acc of the chain's last product,
//! into the payload that travels with the visiting block and reaches the block's PE with the
//! ring's last hop. The splits balance the PEs: one with a row more computes fewer cross scores.
//!
//! Each step forwards the block it holds on its own products: its x rows on the first, the
//! payload so far on the last (the ring's last hop as early as its words are there), what the
//! products cannot carry on sends of their own after them. A stretch (a step, then the rows)
//! waits until every word it reads from the previous PE has arrived, the cycles taken from the
//! flattened stretches. Then each row's maximum, exponentials and sum are local, `y = Σ e·x` over
//! the kept x rows, and `y` is divided by the sum once per element (deferred), row by row in the
//! order their words arrive.
//!
//! Or, relayed: every forwarded word (x rows and mirrors alike) goes on from the first chain
//! not yet taken whose products leave after it arrives, the x rows first, so that no step waits
//! on the words the previous step had to forward; what the chains cannot carry goes on sends of
//! their own after the last step. `run` keeps whichever timing takes fewer cycles.

// Every use of these maps looks words up or takes a maximum over them, whatever the order (std's
// randomly seeded hashing already varies it run to run), so the faster fixed hash is as good.
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeMap;

use isa::{Cmp, Field, LoopProgram, Node, Pred, Slot, Xfer, XferSrc};

use super::{ad, head_programs, lp, overlay, wait, Ad, Place, Stream, B, NAME};
use crate::problem::Problem;

/// Per-element placements leave the proof to the flattened programs, which `attnc verify` takes
/// up to this many bundles over all PEs.
const FLAT_PROOF_BUNDLES: u64 = 8_000_000;

/// Largest program (binary form) a PE is given.
const MAX_PROGRAM_BYTES: u64 = 16 * 1024;

/// Times the relay is planned anew on the timeline the last plan's programs took.
const RELAY_ROUNDS: usize = 4;

/// Why the mirrored deal does not apply to `p` on `m` PEs, if it does not.
pub fn unsupported(p: &Problem, m: u32) -> Option<String> {
    if !(p.symmetric && p.shared_values && !p.causal && p.safe()) {
        return Some(format!(
            "{NAME}: mirrored scores take a shared layer without a mask and the safe softmax"
        ));
    }
    let n = p.tokens;
    if m < 2 || n.is_multiple_of(m) {
        return Some(format!(
            "{NAME}: mirrored scores are for rings that do not divide the tokens ({n} on {m} PEs)"
        ));
    }
    if n / m < 2 || p.dim < 2 {
        return Some(format!(
            "{NAME}: mirrored scores need 2 rows per PE and d ≥ 2 ({n} tokens, d = {}, {m} PEs)",
            p.dim
        ));
    }
    None
}

/// The first token of PE `p`'s rows.
fn first(n: u32, m: u32, p: u32) -> u32 {
    (u64::from(p) * u64::from(n)).div_ceil(u64::from(m)) as u32
}

/// How the scores of PEs `u` and `v` (`u` the one that meets the other in the earlier step) are
/// split: `u` takes its rows `0 … k − 1` against all of `v`'s and row `k` against `v`'s first
/// `c` rows; `v` takes the rest.
#[derive(Clone, Copy, Debug)]
struct Split {
    k: u32,
    c: u32,
}

struct Deal {
    n: u32,
    d: u32,
    m: u32,
    heads: u32,
    /// Each weight divided by its row's sum (`n` divisions a row) rather than each output
    /// element (`d`): with fewer keys than columns.
    per_weight: bool,
    /// Each pair's scores kept whole at the home of each block: the segment of block `q`'s
    /// payload for its meeting with PE `o` holds all `r_q × r_o` scores of the pair (row-major
    /// where `q` meets `o` in the earlier step, column-major where it is the later one), the
    /// mirrors one contiguous run of it and the scores the home computes itself the rest, so
    /// that each of a row's keys of a block lies at an address affine in the row.
    full: bool,
    /// First token of each PE, and `n` at the end.
    x: Vec<u32>,
    /// Scores PE `p` computes in its meeting with PE `q`: `cnt[p][q]`.
    cnt: Vec<Vec<u32>>,
    /// Split of each pair, by `(u, v)` with `u` the earlier meeting.
    split: BTreeMap<(u32, u32), Split>,
    /// Start of block `q`'s x rows in a head's area.
    blk: Vec<u32>,
    /// Kept whole, where PE `p` keeps block `q`'s x rows in a head's area: `xat[p][q]`, the
    /// blocks in the order they come (its own first, then the previous PE's and so on), so
    /// that every block a PE passes on is one run of words, kept on the next PE as far on as
    /// that PE's own block is long. Not kept whole, `blk[q]` on every PE.
    xat: Vec<Vec<u32>>,
    /// Words of one head's area.
    area: u32,
    /// Start of block `q`'s payload (in head 0), and how far it moves from head to head: right
    /// after the x rows in each head's area, or kept whole, one payload for every head (in its
    /// transit layout, on the PEs it passes).
    pblk: Vec<u32>,
    /// Kept whole, where each PE keeps its own block's segments (`pay`), one area for every head
    /// and every PE's block alike; not kept whole, unused.
    home: u32,
    parea: u32,
    /// Offset in block `q`'s payload of the mirrors of its meeting in step `s`.
    pay: Vec<Vec<u32>>,
    /// Kept whole, offset in block `q`'s payload on the PEs it passes (the transit layout) of
    /// the mirrors of its meeting in step `s`: the mirrors meeting after meeting with nothing
    /// between, so that the payload so far is one run of words at every hop; the last hop
    /// moves each meeting's mirrors to where the home keeps them. Not kept whole, `pay`.
    tpay: Vec<Vec<u32>>,
    y: u32,
    sc: u32,
    e: u32,
    mx: u32,
    l: u32,
    words: u32,
}

impl Deal {
    fn r(&self, p: u32) -> u32 {
        self.x[p as usize + 1] - self.x[p as usize]
    }

    /// The PE that meets the other in the earlier step, then the other.
    fn orient(&self, a: u32, b: u32) -> (u32, u32) {
        let m = self.m;
        let sa = (a + m - b) % m;
        let sb = (b + m - a) % m;
        if sa < sb || (sa == sb && a < b) {
            (a, b)
        } else {
            (b, a)
        }
    }

    fn new(n: u32, d: u32, m: u32, heads: u32, per_weight: bool, full: bool) -> Option<Deal> {
        let x: Vec<u32> = (0..=m).map(|p| first(n, m, p)).collect();
        let r = |p: u32| i64::from(x[p as usize + 1] - x[p as usize]);
        let (n64, d64) = (i64::from(n), i64::from(d));
        let divs = if per_weight { n64 } else { d64 };
        // Each PE's own work in cycles: its triangle, softmax, values and divisions.
        let own = |p: u32| {
            let rp = r(p);
            d64 * rp * (rp + 1) / 2 + rp * (2 * n64 - 1) + rp * n64 * d64 + rp * divs
        };
        let cross: i64 = (0..m)
            .flat_map(|u| (u + 1..m).map(move |v| (u, v)))
            .map(|(u, v)| r(u) * r(v))
            .sum();
        let total: i64 = (0..m).map(own).sum::<i64>() + d64 * cross;
        // Cross scores each PE should compute to meet the mean, before rounding.
        let want: Vec<f64> = (0..m)
            .map(|p| (total as f64 / f64::from(m) - own(p) as f64) / f64::from(d))
            .collect();
        let half: Vec<f64> = (0..m)
            .map(|p| {
                (0..m)
                    .filter(|&q| q != p)
                    .map(|q| (r(p) * r(q)) as f64 / 2.0)
                    .sum()
            })
            .collect();
        let mu = m as usize;
        let mut cnt = vec![vec![0i64; mu]; mu];
        for u in 0..mu {
            for v in u + 1..mu {
                let all = r(u as u32) * r(v as u32);
                let du = want[u] - half[u];
                let dv = want[v] - half[v];
                let cu = (all as f64 / 2.0 + (du - dv) / f64::from(m)).round() as i64;
                let cu = cu.clamp(0, all);
                cnt[u][v] = cu;
                cnt[v][u] = all - cu;
            }
        }
        // Single scores moved until every PE's total is its share of the cross scores.
        let mut target: Vec<i64> = want.iter().map(|w| w.round() as i64).collect();
        let diff = cross - target.iter().sum::<i64>();
        for i in 0..diff.unsigned_abs() as usize {
            target[i % mu] += diff.signum();
        }
        for _ in 0..100_000 {
            let sum = |p: usize, cnt: &Vec<Vec<i64>>| cnt[p].iter().sum::<i64>();
            let over = (0..mu).find(|&p| sum(p, &cnt) > target[p]);
            let Some(u) = over else { break };
            let under = (0..mu).find(|&q| q != u && sum(q, &cnt) < target[q] && cnt[u][q] > 0);
            let Some(v) = under else { break };
            cnt[u][v] -= 1;
            cnt[v][u] += 1;
        }
        let cnt: Vec<Vec<u32>> = cnt
            .into_iter()
            .map(|row| row.into_iter().map(|c| c as u32).collect())
            .collect();
        let mut deal = Deal {
            n,
            d,
            m,
            heads,
            per_weight,
            full,
            x,
            cnt,
            split: BTreeMap::new(),
            blk: Vec::new(),
            xat: Vec::new(),
            area: 0,
            pblk: Vec::new(),
            home: 0,
            parea: 0,
            pay: Vec::new(),
            tpay: Vec::new(),
            y: 0,
            sc: 0,
            e: 0,
            mx: 0,
            l: 0,
            words: 0,
        };
        for a in 0..m {
            for b in a + 1..m {
                let (u, v) = deal.orient(a, b);
                let c = deal.cnt[u as usize][v as usize];
                let rv = deal.r(v);
                deal.split.insert(
                    (u, v),
                    Split {
                        k: c / rv,
                        c: c % rv,
                    },
                );
            }
        }
        let w = |x: u64| u32::try_from(x).ok();
        // Kept whole, the payloads follow every head's x rows and serve every head: the heads
        // start together on every PE, so a head's words all arrive and are read within it, and
        // the next head's overwrite them only after every PE has left it.
        let xwords = u64::from(n) * d64 as u64;
        let mut at = if full { u64::from(heads) * xwords } else { 0 };
        if full {
            // The home's segments hold `r_q·(n − r_q)` words; every other block's payload is
            // only passed on, its mirrors alone.
            deal.home = w(at)?;
            at += (0..m)
                .map(|q| u64::from(deal.r(q)) * u64::from(n - deal.r(q)))
                .max()
                .unwrap_or(0);
        }
        for q in 0..m {
            if full {
                deal.blk
                    .push(w(u64::from(deal.x[q as usize]) * d64 as u64)?);
                deal.pblk.push(w(at)?);
            } else {
                deal.blk.push(w(at)?);
                deal.pblk.push(w(at + u64::from(deal.r(q)) * d64 as u64)?);
            }
            let mut offs = vec![0u32; mu];
            let mut e = 0u64;
            for s in 1..m {
                offs[s as usize] = w(e)?;
                let o = (q + s) % m;
                e += if full {
                    u64::from(deal.r(q)) * u64::from(deal.r(o))
                } else {
                    u64::from(deal.cnt[o as usize][q as usize])
                };
            }
            deal.pay.push(offs);
            let mut transit = vec![0u32; mu];
            let mut t = 0u64;
            for s in 1..m {
                transit[s as usize] = w(t)?;
                t += u64::from(deal.cnt[((q + s) % m) as usize][q as usize]);
            }
            deal.tpay.push(if full {
                transit
            } else {
                deal.pay[q as usize].clone()
            });
            at += if full {
                t
            } else {
                u64::from(deal.r(q)) * d64 as u64 + e
            };
        }
        deal.xat = (0..m)
            .map(|p| {
                let mut at = vec![0u32; mu];
                let mut o = 0u32;
                for i in 0..m {
                    let q = (p + m - i) % m;
                    at[q as usize] = if full { o } else { deal.blk[q as usize] };
                    o += deal.r(q) * d;
                }
                at
            })
            .collect();
        let rmax = u64::from((0..m).map(|p| deal.r(p)).max()?);
        if full {
            deal.area = w(xwords)?;
            deal.parea = 0;
            deal.y = w(at)?;
        } else {
            deal.area = w(at)?;
            deal.parea = deal.area;
            deal.y = w(u64::from(heads) * at)?;
        }
        deal.sc = w(u64::from(deal.y) + u64::from(heads) * rmax * u64::from(d))?;
        deal.e = w(u64::from(deal.sc) + rmax * u64::from(n))?;
        deal.mx = w(u64::from(deal.e) + rmax * u64::from(n))?;
        deal.l = w(u64::from(deal.mx) + rmax)?;
        deal.words = w(u64::from(deal.l) + rmax)?;
        Some(deal)
    }

    /// Block `q`'s x rows in this head's area on PE `p`.
    fn xrows(&self, p: u32, q: u32) -> Ad {
        ad(self.xat[p as usize][q as usize]).t(0, i64::from(self.area))
    }

    /// Block `q`'s payload in this head's area.
    fn payload(&self, q: u32) -> Ad {
        ad(self.pblk[q as usize]).t(0, i64::from(self.parea))
    }

    /// Where PE `q` keeps the segments of its own block's payload.
    fn kept(&self, q: u32) -> Ad {
        if self.full {
            ad(self.home).t(0, i64::from(self.parea))
        } else {
            self.payload(q)
        }
    }

    /// How far word `a` of head 0's areas moves from head to head.
    fn head_stride(&self, a: u32) -> i64 {
        if self.full && a >= self.home {
            i64::from(self.parea)
        } else {
            i64::from(self.area)
        }
    }

    /// The mirrors in block `q`'s payload from its meeting in step `s`: their first word's
    /// offset in the payload and their count.
    fn mirrors(&self, q: u32, s: u32) -> (u32, u32) {
        let o = (q + s) % self.m;
        let at = self.pay[q as usize][s as usize];
        let words = self.cnt[o as usize][q as usize];
        if self.full && self.orient(q, o).0 == q {
            // The home computes the pair's first scores in row order, the rows before the
            // mirrors.
            (at + self.cnt[q as usize][o as usize], words)
        } else {
            (at, words)
        }
    }

    /// How far the mirrors of block `q`'s meeting in step `s` lie from where the home keeps
    /// them while they travel (the transit layout less the home's).
    fn transit_shift(&self, q: u32, s: u32) -> i64 {
        i64::from(self.tpay[q as usize][s as usize]) - i64::from(self.mirrors(q, s).0)
    }
}

/// A rectangle of scores: own rows `r0 … r0 + rows − 1` against visiting keys `k0 … k0 + keys −
/// 1` (local indices), each score kept at `sc` and, where `mirror` is given, sent on to the
/// next PE at `mirror + row·stride_r + key·stride_k` (absolute local row and key).
struct Rect {
    r0: u32,
    rows: u32,
    k0: u32,
    keys: u32,
    mirror: Option<(Ad, i64, i64)>,
}

/// What the products of a piece of a rectangle forward: nothing, every product but the last
/// of each chain (the word at `at + chain·(d − 1) + column`), or, in a single chain, its first
/// `rem`; each word to where the next PE keeps it, the last field further on.
#[derive(Clone)]
enum Fwd {
    No,
    All(Ad, i64),
    Part(Ad, u32, i64),
}

/// Words forwarded from `at` on, from the products of chain `chain` of the step on, each to
/// `shift` words further on on the next PE.
struct Seg {
    chain: u64,
    words: u64,
    at: Ad,
    shift: i64,
}

struct Gen<'a> {
    g: &'a Deal,
    /// The own rows.
    own: Ad,
    /// The visiting block's x rows.
    vis: Ad,
    /// Where the score of the own first row and the visiting block's first key is kept.
    sc: Ad,
    /// How that address moves per own row and per key.
    sc_step: (i64, i64),
}

impl Gen<'_> {
    /// Rows `ra …` × keys `ka …` of `rect`, `rows × keys` of them, forwarding as `f` says.
    fn piece(
        &self,
        rect: &Rect,
        (ra, rows): (u32, u32),
        (ka, keys): (u32, u32),
        f: Fwd,
    ) -> Vec<Node> {
        if rows == 0 || keys == 0 {
            return Vec::new();
        }
        let g = self.g;
        let d = i64::from(g.d);
        let (rs, ks) = self.sc_step;
        let (ra_, ka_) = (i64::from(ra), i64::from(ka));
        // Levels: 1 row, 2 key, 3 middle column.
        let own = self.own.clone().plus(ra_ * d).t(1, d);
        let vis = self.vis.clone().plus(ka_ * d).t(2, d);
        let sc = self.sc.clone().plus(ra_ * rs + ka_ * ks).t(1, rs).t(2, ks);
        let chain_w = |at: &Ad| at.clone().t(1, i64::from(keys) * (d - 1)).t(2, d - 1);
        let send = |mut b: B, src: Ad, shift: i64, pred: Option<u32>| {
            b.xfer = Xfer::Send {
                src: XferSrc::Mem(0),
                dst: 0,
            };
            b.fields.push((Field::XferSrc, src.clone()));
            b.fields.push((Field::XferDst, src.plus(shift)));
            if let Some(v) = pred {
                b.preds.push(Pred {
                    slot: Slot::Xfer,
                    level: 3,
                    cmp: Cmp::Lt,
                    value: v,
                });
            }
            b
        };
        let mut first = B::new()
            .mul(own.clone(), vis.clone(), None)
            .add(None, sc.clone());
        let mut mid = B::new()
            .mul(
                own.clone().plus(1).t(3, 1),
                vis.clone().plus(1).t(3, 1),
                None,
            )
            .add(Some(sc.clone()), sc.clone());
        match &f {
            Fwd::No => {}
            Fwd::All(at, shift) => {
                first = send(first, chain_w(at), *shift, None);
                mid = send(mid, chain_w(at).plus(1).t(3, 1), *shift, None);
            }
            Fwd::Part(at, rem, shift) => {
                if *rem >= 1 {
                    first = send(first, chain_w(at), *shift, None);
                }
                if *rem >= 2 {
                    let p = (rem - 1 < g.d - 2).then_some(rem - 1);
                    mid = send(mid, chain_w(at).plus(1).t(3, 1), *shift, p);
                }
            }
        }
        let mut last = B::new()
            .mul(own.plus(d - 1), vis.plus(d - 1), None)
            .add(Some(sc.clone()), sc);
        if let Some((base, sr, sk)) = &rect.mirror {
            last.xfer = Xfer::Send {
                src: XferSrc::Acc,
                dst: 0,
            };
            let dst = base.clone().plus(ra_ * sr + ka_ * sk).t(1, *sr).t(2, *sk);
            last.fields.push((Field::XferDst, dst));
        }
        let mut chain = vec![first.build()];
        chain.extend(lp(g.d - 2, vec![mid.build()]));
        chain.push(last.build());
        lp(rows, lp(keys, chain))
    }

    /// Chains `c0 … c1 − 1` of `rect` (counted within it), all forwarding as `f` (advanced
    /// chain by chain) says.
    fn span(&self, rect: &Rect, (c0, c1): (u64, u64), f: Fwd) -> Vec<Node> {
        let keys = u64::from(rect.keys);
        let per = i64::from(self.g.d - 1);
        let mut out = Vec::new();
        let mut c = c0;
        let adv = |f: &Fwd, by: u64| match f {
            Fwd::All(at, shift) => Fwd::All(at.clone().plus(by as i64 * per), *shift),
            other => other.clone(),
        };
        while c < c1 {
            let (row, key) = ((c / keys) as u32, (c % keys) as u32);
            let (rows, ks) = if key == 0 && c1 - c >= keys {
                (((c1 - c) / keys) as u32, rect.keys)
            } else {
                (1, (keys - u64::from(key)).min(c1 - c) as u32)
            };
            out.extend(self.piece(
                rect,
                (rect.r0 + row, rows),
                (rect.k0 + key, ks),
                adv(&f, c - c0),
            ));
            c += u64::from(rows) * u64::from(ks);
        }
        out
    }

    /// The rectangles in order, forwarding each segment's words on their products and what
    /// they cannot carry on sends of their own after them.
    fn step(&self, rects: &[Rect], segs: &[Seg]) -> Vec<Node> {
        let per = u64::from(self.g.d - 1);
        // Chain intervals of the step and how each forwards.
        let mut plan: Vec<(u64, u64, Fwd)> = Vec::new();
        let mut extra: Vec<(Ad, u64, i64)> = Vec::new();
        // Runs placed after the chains, at `(position − chains)·(d − 1)` sends after them.
        let mut tail: Vec<(u64, Ad, u64, i64)> = Vec::new();
        let total: u64 = rects
            .iter()
            .map(|r| u64::from(r.rows) * u64::from(r.keys))
            .sum();
        for sg in segs {
            if sg.chain >= total && sg.words > 0 {
                tail.push((sg.chain - total, sg.at.clone(), sg.words, sg.shift));
                continue;
            }
            let full = (sg.words / per).min(total.saturating_sub(sg.chain));
            plan.push((sg.chain, sg.chain + full, Fwd::All(sg.at.clone(), sg.shift)));
            let mut done = full * per;
            let rem = sg.words - done;
            if rem > 0 && rem < per && sg.chain + full < total {
                let c = sg.chain + full;
                plan.push((
                    c,
                    c + 1,
                    Fwd::Part(sg.at.clone().plus(done as i64), rem as u32, sg.shift),
                ));
                done += rem;
            }
            if done < sg.words {
                extra.push((sg.at.clone().plus(done as i64), sg.words - done, sg.shift));
            }
        }
        plan.retain(|p| p.0 < p.1);
        plan.sort_by_key(|p| p.0);
        let mut out = Vec::new();
        let mut base = 0u64;
        for rect in rects {
            let n = u64::from(rect.rows) * u64::from(rect.keys);
            if n == 0 {
                continue;
            }
            let (lo, hi) = (base, base + n);
            let mut c = lo;
            for (a, b, f) in &plan {
                let (a2, b2) = ((*a).max(lo), (*b).min(hi));
                if a2 >= b2 {
                    continue;
                }
                out.extend(self.span(rect, (c - lo, a2 - lo), Fwd::No));
                let f = match f {
                    Fwd::All(at, shift) => {
                        Fwd::All(at.clone().plus(((a2 - a) * per) as i64), *shift)
                    }
                    other => other.clone(),
                };
                out.extend(self.span(rect, (a2 - lo, b2 - lo), f));
                c = b2;
            }
            out.extend(self.span(rect, (c - lo, hi - lo), Fwd::No));
            base = hi;
        }
        tail.sort_by_key(|t| t.0);
        let mut sent = 0u64;
        for (pos, at, words, shift) in tail {
            out.extend(lp(
                (pos * per).saturating_sub(sent) as u32,
                vec![super::nop()],
            ));
            sent = sent.max(pos * per);
            out.extend(Self::sends(at, words, shift));
            sent += words;
        }
        for (at, words, shift) in extra {
            out.extend(Self::sends(at, words, shift));
        }
        out
    }

    /// `words` sends of their own, each word to its own address on the next PE, `shift` words
    /// further on.
    fn sends(at: Ad, words: u64, shift: i64) -> Vec<Node> {
        let src = at.t(1, 1);
        let mut b = B::new();
        b.xfer = Xfer::Send {
            src: XferSrc::Mem(0),
            dst: 0,
        };
        b.fields.push((Field::XferSrc, src.clone()));
        b.fields.push((Field::XferDst, src.plus(shift)));
        lp(words as u32, vec![b.build()])
    }
}

/// Where a step forwards its x rows (`x` words from `xat`, on its first products) and its
/// payload (`pay` words from `pat`, on its last ones, so that the mirrors the previous PE sent
/// last are forwarded last), over `chains` chains of `d − 1` forwarding products each.
fn segments(
    chains: u64,
    per: u64,
    (xat, x): (Ad, u64),
    (pat, pay): (Ad, u64),
    last_at: u64,
) -> Vec<Seg> {
    let xc = x.div_ceil(per);
    let pc = pay.div_ceil(per);
    let mut out = Vec::new();
    if x > 0 {
        out.push(Seg {
            chain: 0,
            words: x,
            at: xat.clone(),
            shift: 0,
        });
    }
    if pay > 0 {
        if x == 0 {
            // The ring's last hop: the payload as early as its words are there, so that the
            // rows it completes need not wait for the mirrors computed here.
            out.push(Seg {
                chain: last_at.min(chains.saturating_sub(pc)),
                words: pay,
                at: pat,
                shift: 0,
            });
        } else if xc + pc <= chains {
            out.push(Seg {
                chain: chains - pc,
                words: pay,
                at: pat,
                shift: 0,
            });
        } else if x > 0 && xat.clone().plus(x as i64).base == pat.base {
            // Not room for both apart: one run of words from the x rows on.
            out[0].words += pay;
        } else {
            out.push(Seg {
                chain: xc,
                words: pay,
                at: pat,
                shift: 0,
            });
        }
    }
    out
}

/// Per PE and ring step, the words it relays: `(chain, words, first word, shift)`, each word
/// kept `shift` words further on on the next PE; chains past the last step's own stand for
/// runs of `d − 1` cycles of the rows after it, whose transfer slots carry them.
type Relay = Vec<Vec<Vec<(u64, u64, Ad, i64)>>>;

/// The last chain a run of `chunks` consecutive chains may start on among `len`, plus one.
fn chains_len(len: usize, chunks: u64) -> Option<usize> {
    len.checked_sub(usize::try_from(chunks).ok()?)
        .map(|l| l + 1)
}

impl Deal {
    /// Chains of PE `p`'s step `s`, and the payload so far it forwards.
    fn step_size(&self, p: u32, s: u32) -> (u64, u64) {
        let b = (p + self.m - s) % self.m;
        if s == 0 {
            let r = u64::from(self.r(p));
            (r * (r + 1) / 2, 0)
        } else {
            (
                u64::from(self.cnt[p as usize][b as usize]),
                u64::from(self.pay[b as usize][s as usize]),
            )
        }
    }

    /// Every forwarded word relayed as soon as it arrives rather than with the step that reads
    /// it, on the timeline where PE `p`'s step `s` starts in cycle `starts[p][s]` and sends the
    /// mirror to address `a` of the next PE in cycle `fresh[p][s][a]` of the step. Each PE
    /// first places the x rows of its own block, then those of every block in the order they
    /// come, then the payloads step by step (the mirrors computed so far for each block it has
    /// met), in runs of `d − 1` words, each on the first chain not yet taken whose products
    /// leave after the run's words arrive. `None` where the chains cannot carry every run.
    fn relay(&self, starts: &[Vec<u64>], fresh: &[Vec<HashMap<u32, u64>>]) -> Option<Relay> {
        // A step reads its visiting block from its first chain, so the timeline planned on
        // starts each step once the block's x rows are all there; the relay is placed again on
        // that timeline until the two agree (placing on a later timeline moves no word
        // earlier); where they do not within the rounds (blocks so small that the steps outrun
        // any relay), `None`.
        let mut starts = starts.to_vec();
        let dd = u64::from(self.d);
        for _ in 0..RELAY_ROUNDS * 4 {
            let (plan, arrive) = self.place(&starts, fresh)?;
            let mut again = starts.clone();
            for (p, row) in again.iter_mut().enumerate() {
                for s in 1..row.len() {
                    let after = row[s - 1] + self.step_size(p as u32, s as u32 - 1).0 * dd;
                    let x_in = arrive[p].get(s).copied().unwrap_or(0);
                    row[s] = row[s].max(after).max(x_in);
                }
            }
            if again == starts {
                return Some(plan);
            }
            starts = again;
        }
        None
    }

    /// [`Deal::relay`] on one timeline, and per PE and step when the last of the visiting
    /// block's x rows arrives.
    fn place(
        &self,
        starts: &[Vec<u64>],
        fresh: &[Vec<HashMap<u32, u64>>],
    ) -> Option<(Relay, Vec<Vec<u64>>)> {
        let mu = self.m as usize;
        let dd = u64::from(self.d);
        let per = dd - 1;
        // Per PE, every chain: (step, chain, cycle of its first product); after the last
        // step's chains, runs of `d − 1` words laid one a cycle onto the rows that follow from
        // `starts[p][m]` on, as many runs as every word would take.
        let spare: u64 = (0..mu)
            .map(|b| {
                u64::from(self.r(b as u32) * self.d)
                    + (1..mu - 1)
                        .map(|s| u64::from(self.mirrors(b as u32, s as u32).1))
                        .sum::<u64>()
            })
            .sum::<u64>()
            .div_ceil(per);
        let chains: Vec<Vec<(usize, u64, u64)>> = (0..mu)
            .map(|p| {
                let mut list: Vec<(usize, u64, u64)> = (0..mu)
                    .flat_map(|s| {
                        let (n, _) = self.step_size(p as u32, s as u32);
                        let t = starts[p][s];
                        (0..n).map(move |c| (s, c, t + c * dd))
                    })
                    .collect();
                let (n, _) = self.step_size(p as u32, self.m - 1);
                let end = starts[p][mu];
                list.extend((0..spare).map(|k| (mu - 1, n + k, end + k * per)));
                list
            })
            .collect();
        // The first chain not yet taken from each index on (path-halving).
        let mut next: Vec<Vec<usize>> = chains.iter().map(|c| (0..=c.len()).collect()).collect();
        fn find(next: &mut [usize], mut i: usize) -> usize {
            while next[i] != i {
                next[i] = next[next[i]];
                i = next[i];
            }
            i
        }
        // When each PE sends the word for each address of the next PE.
        let mut sent: Vec<HashMap<u32, u64>> = (0..mu)
            .map(|p| {
                fresh[p]
                    .iter()
                    .enumerate()
                    .flat_map(|(s, f)| f.iter().map(move |(&a, &t)| (a, starts[p][s] + t)))
                    .collect()
            })
            .collect();
        // Chunks placed: per PE, (chain index, first address, words, shift).
        let mut placed: Vec<Vec<(usize, u32, u64, i64)>> = vec![Vec::new(); mu];
        let mut runs: Vec<Vec<(usize, u32, u64, i64)>> = Vec::new();
        if self.full {
            // Every block a PE passes on is one run from its own block's first word: placed
            // run by run of `d − 1` words on every PE in turn, as the words each needs are
            // placed on the previous PE a round before (its own block is as long as a run).
            let forward = |p: usize| {
                let next = (p + 1) % mu;
                (
                    (self.n - self.r(next as u32)) * self.d,
                    i64::from(self.r(next as u32) * self.d),
                )
            };
            let most = (0..mu).map(|p| forward(p).0).max().unwrap_or(0);
            for j in 0..u64::from(most).div_ceil(per) {
                runs.push(
                    (0..mu)
                        .filter_map(|p| {
                            let (words, shift) = forward(p);
                            let a = j * per;
                            (a < u64::from(words))
                                .then(|| (p, a as u32, per.min(u64::from(words) - a), shift))
                        })
                        .collect(),
                );
            }
        } else {
            for h in 0..mu - 1 {
                runs.push(
                    (0..mu)
                        .map(|p| {
                            let b = (p + mu - h) % mu;
                            (p, self.blk[b], u64::from(self.r(b as u32)) * dd, 0)
                        })
                        .collect(),
                );
            }
        }
        let x_rounds = runs.len();
        for st in 1..mu {
            runs.push(
                (0..mu)
                    .flat_map(|p| {
                        let b = (p + mu - st) % mu;
                        let at = self.pblk[b];
                        if self.full && st + 1 == mu {
                            // The ring's last hop: each meeting's mirrors from the transit
                            // layout to where the home keeps them.
                            (1..st)
                                .map(|s| {
                                    let (o, w) = self.mirrors(b as u32, s as u32);
                                    let src = at + self.tpay[b][s];
                                    let shift = i64::from(self.home + o) - i64::from(src);
                                    (p, src, u64::from(w), shift)
                                })
                                .filter(|r| r.2 > 0)
                                .collect::<Vec<_>>()
                        } else {
                            // The payload so far, one run in the transit layout.
                            vec![(p, at, u64::from(self.tpay[b][st]), 0)]
                        }
                    })
                    .collect(),
            );
        }
        for (ri, round) in runs.into_iter().enumerate() {
            let mut now: Vec<(usize, i64, u64)> = Vec::new();
            for (p, at, words, shift) in round {
                let q = (p + mu - 1) % mu;
                let chunks = words.div_ceil(per);
                let mut needs = Vec::with_capacity(chunks as usize);
                for j in 0..chunks {
                    let (i0, i1) = (j * per, ((j + 1) * per).min(words));
                    let mut need = 0u64;
                    for i in i0..i1 {
                        let a = at + i as u32;
                        // The own block's x rows are there from the start.
                        let arrive = if sent[q].contains_key(&a) {
                            sent[q][&a] + 1
                        } else if a >= self.xat[p][p]
                            && a < self.xat[p][p] + self.r(p as u32) * self.d
                        {
                            0
                        } else {
                            return None;
                        };
                        need = need.max(arrive.saturating_sub(i - i0));
                    }
                    needs.push(need);
                }
                let list = &chains[p];
                // Kept whole, a payload goes on consecutive chains where any are free from
                // when its words are there, so that it is one run of sends; otherwise (and
                // for the x rows, which the steps wait for) each chunk on the first free
                // chain after its words arrive.
                let batch = (self.full && ri >= x_rounds)
                    .then(|| {
                        let len = chains_len(list.len(), chunks)?;
                        let mut c = (0..chunks as usize)
                            .map(|j| list.partition_point(|x| x.2 < needs[j]).saturating_sub(j))
                            .max()
                            .unwrap_or(0);
                        while c < len {
                            match (0..chunks as usize).find(|&j| find(&mut next[p], c + j) != c + j)
                            {
                                None => return Some(c),
                                Some(j) => c += j + 1,
                            }
                        }
                        None
                    })
                    .flatten();
                for j in 0..chunks {
                    let (i0, i1) = (j * per, ((j + 1) * per).min(words));
                    let k = match batch {
                        Some(c) => c + j as usize,
                        None => {
                            let from = list.partition_point(|c| c.2 < needs[j as usize]);
                            find(&mut next[p], from)
                        }
                    };
                    if k >= list.len() {
                        return None;
                    }
                    next[p][k] = k + 1;
                    placed[p].push((k, at + i0 as u32, i1 - i0, shift));
                    for i in i0..i1 {
                        now.push((p, i64::from(at) + i as i64 + shift, list[k].2 + (i - i0)));
                    }
                }
            }
            for (p, a, t) in now {
                let a = u32::try_from(a).ok()?;
                sent[p].insert(a, t);
            }
        }
        let mut out: Relay = vec![vec![Vec::new(); mu]; mu];
        for (p, mut list) in placed.into_iter().enumerate() {
            list.sort_unstable();
            // The runs after the last step's chains (laid onto the rows) stay apart from those
            // on its chains.
            let last = self.step_size(p as u32, self.m - 1).0;
            let apart = |k: usize| chains[p][k].0 == mu - 1 && chains[p][k].1 >= last;
            let mut i = 0;
            while i < list.len() {
                let (k, a, mut w, shift) = list[i];
                let mut e = i + 1;
                // Whole runs on consecutive chains of one step go as one.
                while e < list.len()
                    && w % per == 0
                    && list[e].0 == k + (e - i)
                    && chains[p][list[e].0].0 == chains[p][k].0
                    && apart(list[e].0) == apart(k)
                    && list[e].1 == a + w as u32
                    && list[e].3 == shift
                {
                    w += list[e].2;
                    e += 1;
                }
                let (s, c, _) = chains[p][k];
                out[p][s].push((c, w, ad(a).t(0, self.head_stride(a)), shift));
                i = e;
            }
        }
        let arrive: Vec<Vec<u64>> = (0..mu)
            .map(|p| {
                let q = (p + mu - 1) % mu;
                (0..mu)
                    .map(|s| {
                        let b = (p + mu - s) % mu;
                        if s == 0 {
                            return 0;
                        }
                        let x0 = self.xat[p][b];
                        (x0..x0 + self.r(b as u32) * self.d)
                            .map(|a| sent[q].get(&a).map_or(0, |t| t + 1))
                            .max()
                            .unwrap_or(0)
                    })
                    .collect()
            })
            .collect();
        Some((out, arrive))
    }

    /// Step `s` of PE `p`: its score nests and the words they forward: its block and payload
    /// so far, or where `relay` is given, what it says instead.
    fn ring_step(
        &self,
        p: u32,
        s: u32,
        last_at: u64,
        relay: Option<&[(u64, u64, Ad, i64)]>,
    ) -> Vec<Node> {
        let relayed = || -> Vec<Seg> {
            relay
                .unwrap_or(&[])
                .iter()
                .map(|(chain, words, at, shift)| Seg {
                    chain: *chain,
                    words: *words,
                    at: at.clone(),
                    shift: *shift,
                })
                .collect()
        };
        let m = self.m;
        let b = (p + m - s) % m;
        let own = self.xrows(p, p);
        let rp = self.r(p);
        let rb = self.r(b);
        let sc_row = ad(self.sc).plus(i64::from(self.x[b as usize]));
        if s == 0 {
            // The own triangle (key ≥ row), forwarding the own x rows.
            let rects: Vec<Rect> = (0..rp)
                .map(|a| Rect {
                    r0: a,
                    rows: 1,
                    k0: a,
                    keys: rp - a,
                    mirror: None,
                })
                .collect();
            let chains: u64 = rects.iter().map(|r| u64::from(r.keys)).sum();
            let segs = if relay.is_some() {
                relayed()
            } else {
                segments(
                    chains,
                    u64::from(self.d - 1),
                    (own.clone(), u64::from(rp * self.d)),
                    (own.clone(), 0),
                    0,
                )
            };
            let gen = Gen {
                g: self,
                own: own.clone(),
                vis: own,
                sc: sc_row,
                sc_step: (i64::from(self.n), 1),
            };
            return gen.step(&rects, &segs);
        }
        let pay = self.payload(b);
        let e_s = i64::from(self.pay[b as usize][s as usize]);
        // The mirrors go where the next PE keeps them: at the home on the ring's last hop,
        // in the transit layout before it.
        let fresh = if s + 1 < m {
            pay.clone().plus(e_s + self.transit_shift(b, s))
        } else {
            self.kept(b).plus(e_s)
        };
        let (u, v) = self.orient(p, b);
        let sp = self.split[&(u, v)];
        let rects = if u == p {
            // Rows `0 … k − 1` against all keys, row `k` against keys `0 … c − 1`; the mirror
            // of (row i, key j) at `j·k + i`, the strip's at `k·r_b + j`.
            let k = i64::from(sp.k);
            vec![
                Rect {
                    r0: 0,
                    rows: sp.k,
                    k0: 0,
                    keys: rb,
                    // Kept whole, block `b`'s scores against this PE's rows are column-major
                    // at its home, the mirrors their first columns.
                    mirror: Some(if self.full {
                        (fresh.clone(), i64::from(rb), 1)
                    } else {
                        (fresh.clone(), 1, k)
                    }),
                },
                Rect {
                    r0: sp.k,
                    rows: u32::from(sp.c > 0),
                    k0: 0,
                    keys: sp.c,
                    mirror: Some((fresh.clone().plus(k * i64::from(rb)), 0, 1)),
                },
            ]
        } else {
            // All own rows against keys `k + 1 …`, rows `c …` against key `k`; the mirror of
            // (row j, key i) at `(i − k − 1)·r_p + j`, the strip's at `(r_b − k − 1)·r_p + j − c`.
            let (k, c) = (sp.k, sp.c);
            let rpi = i64::from(rp);
            let after = rb.saturating_sub(k + 1);
            let ki = i64::from(k);
            vec![
                Rect {
                    r0: 0,
                    rows: rp,
                    k0: k + 1,
                    keys: after,
                    // Kept whole, row-major at block `b`'s home, the mirrors its last rows.
                    mirror: Some(if self.full {
                        (fresh.clone(), 1, rpi)
                    } else {
                        (fresh.clone().plus(-(ki + 1) * rpi), 1, rpi)
                    }),
                },
                Rect {
                    r0: c,
                    rows: if k < rb { rp - c } else { 0 },
                    k0: k,
                    keys: 1,
                    mirror: Some(if self.full {
                        (fresh, 1, rpi)
                    } else {
                        (fresh.plus(i64::from(after) * rpi - i64::from(c)), 1, 0)
                    }),
                },
            ]
        };
        let x = if s == m - 1 {
            0
        } else {
            u64::from(rb * self.d)
        };
        let chains: u64 = rects
            .iter()
            .map(|r| u64::from(r.rows) * u64::from(r.keys))
            .sum();
        let segs = if relay.is_some() {
            relayed()
        } else {
            segments(
                chains,
                u64::from(self.d - 1),
                (self.xrows(p, b), x),
                (pay, e_s as u64),
                last_at,
            )
        };
        // The scores kept here: in the score rows, or kept whole, in this PE's own payload
        // segment for its meeting with block `b` (row-major where this PE meets `b` in the
        // earlier step, as the mirrors `b` computes fill its last rows; column-major otherwise).
        let (sc, sc_step) = if self.full {
            let seg = self
                .kept(p)
                .plus(i64::from(self.pay[p as usize][((b + m - p) % m) as usize]));
            if u == p {
                (seg, (i64::from(rb), 1))
            } else {
                (seg, (1, i64::from(rp)))
            }
        } else {
            (sc_row, (i64::from(self.n), 1))
        };
        let gen = Gen {
            g: self,
            own,
            vis: self.xrows(p, b),
            sc,
            sc_step,
        };
        gen.step(&rects, &segs)
    }

    /// Where row `j` of PE `p` finds its scores: runs of `(source, key stride, token, keys)` in
    /// token order (kept whole, from the next PE's block on, round the ring).
    fn runs(&self, p: u32, j: u32) -> Vec<(Ad, i64, u32, u32)> {
        let m = self.m;
        let n = i64::from(self.n);
        let mut out = Vec::new();
        let row = |q: u32| ad(self.sc).plus(i64::from(j) * n + i64::from(self.x[q as usize]));
        // Kept whole, the blocks from the next PE's on, so that the first run (which starts the
        // maximum) has the same keys in every row and the own block's runs, whose counts move
        // with the row, come last: the first rows then run alike with the rest.
        let from = if self.full { (p + 1) % m } else { 0 };
        for q in (0..m).map(|i| (from + i) % m) {
            let xq = self.x[q as usize];
            let rq = self.r(q);
            if q == p {
                // Keys below the row from their own rows' triangle, the others from this row.
                out.push((ad(self.sc).plus(i64::from(xq + j)), n, xq, j));
                out.push((row(q).plus(i64::from(j)), 1, xq + j, rq - j));
                continue;
            }
            if self.full {
                // The pair's scores kept whole in block `p`'s payload segment for its meeting
                // with `q`: row-major where `p` meets `q` in the earlier step.
                let seg = self
                    .kept(p)
                    .plus(i64::from(self.pay[p as usize][((q + m - p) % m) as usize]));
                if self.orient(p, q).0 == p {
                    out.push((seg.plus(i64::from(j * rq)), 1, xq, rq));
                } else {
                    out.push((seg.plus(i64::from(j)), i64::from(self.r(p)), xq, rq));
                }
                continue;
            }
            // The other meeting of this pair: block `p` at PE `q` in step `(q − p) mod m`.
            let mir = self
                .payload(p)
                .plus(i64::from(self.pay[p as usize][((q + m - p) % m) as usize]));
            let (u, _) = self.orient(p, q);
            let sp = self.split[&self.orient(p, q)];
            let (k, c) = (sp.k, sp.c);
            if u == p {
                let after = i64::from(self.r(p).saturating_sub(k + 1));
                if j < k {
                    out.push((row(q), 1, xq, rq));
                } else if j == k {
                    out.push((row(q), 1, xq, c));
                    out.push((mir.plus(after * i64::from(rq)), 1, xq + c, rq - c));
                } else {
                    out.push((mir.plus(i64::from(j - k - 1) * i64::from(rq)), 1, xq, rq));
                }
            } else {
                let rp = i64::from(self.r(p));
                out.push((mir.clone().plus(i64::from(j) * i64::from(k)), 1, xq, k));
                if k < rq {
                    if j < c {
                        out.push((mir.plus(i64::from(k) * rp + i64::from(j)), 1, xq + k, 1));
                    } else {
                        out.push((row(q).plus(i64::from(k)), 1, xq + k, 1));
                    }
                    out.push((row(q).plus(i64::from(k + 1)), 1, xq + k + 1, rq - k - 1));
                }
            }
        }
        out.retain(|r| r.3 > 0);
        out
    }

    /// Row `j` of PE `p`: its maximum, exponentials and their sum, `y = Σ e·x` over every
    /// block, then `y /= l`.
    fn row(&self, p: u32, j: u32, scale: f32) -> Vec<Node> {
        let (n, d) = (i64::from(self.n), i64::from(self.d));
        // Levels: 1 key of the softmax, or 1 column and 2 key of the values.
        let lv: u8 = 1;
        let runs = self.runs(p, j);
        let mx = ad(self.mx).plus(i64::from(j));
        let l = ad(self.l).plus(i64::from(j));
        let e = ad(self.e).plus(i64::from(j) * n);
        let key = |i: usize, k: u32| runs[i].0.clone().plus(i64::from(k) * runs[i].1);
        // The first two keys start the maximum.
        let (a, b) = if runs[0].3 >= 2 {
            (key(0, 0), key(0, 1))
        } else {
            (key(0, 0), key(1, 0))
        };
        let mut body = vec![B::new().max(a, b, mx.clone()).build()];
        let mut skip = 2u32;
        for (i, r) in runs.iter().enumerate() {
            let from = skip.min(r.3);
            skip -= from;
            body.extend(lp(
                r.3 - from,
                vec![B::new()
                    .max(mx.clone(), key(i, from).t(lv, r.1), mx.clone())
                    .build()],
            ));
        }
        let mut first = true;
        for (i, r) in runs.iter().enumerate() {
            let dst = e.clone().plus(i64::from(r.2));
            if first {
                body.push(
                    B::new()
                        .expd(key(i, 0), mx.clone(), scale, dst.clone())
                        .add(None, l.clone())
                        .build(),
                );
            }
            let from = u32::from(first);
            first = false;
            body.extend(lp(
                r.3 - from,
                vec![B::new()
                    .expd(
                        key(i, from).t(lv, r.1),
                        mx.clone(),
                        scale,
                        dst.plus(i64::from(from)).t(lv, 1),
                    )
                    .add(Some(l.clone()), l.clone())
                    .build()],
            ));
        }
        // Values: columns at `lv`.
        let y = ad(self.y)
            .plus(i64::from(j) * d)
            .t(0, i64::from(self.r(p)) * d)
            .t(lv, 1);
        self.weights_and_values(p, &mut body, &e, l, y, lv);
        body
    }

    /// The end of a row's body, shared by a row alone and a loop over rows alike: each weight
    /// divided by the row sum `l` (per weight), the values `y[c] += Σ_b e[b]·x[b][c]` (columns
    /// at `lv`, keys one deeper, the visiting blocks in ring order), and each output element
    /// divided (deferred). `e` and `y` carry the caller's row terms.
    fn weights_and_values(&self, p: u32, body: &mut Vec<Node>, e: &Ad, l: Ad, y: Ad, lv: u8) {
        let d = i64::from(self.d);
        if self.per_weight {
            let w = e.clone().t(lv, 1);
            body.extend(lp(
                self.n,
                vec![B::new().div(w.clone(), l.clone(), w).build()],
            ));
        }
        let (col, kl) = (lv, lv + 1);
        let mut inner = Vec::new();
        for q in 0..self.m {
            let xq = i64::from(self.x[q as usize]);
            let rq = self.r(q);
            let xr = self.xrows(p, q).t(col, 1);
            if q == 0 {
                inner.push(
                    B::new()
                        .mul(e.clone(), xr.clone(), None)
                        .add(None, y.clone())
                        .build(),
                );
                inner.extend(lp(
                    rq - 1,
                    vec![B::new()
                        .mul(e.clone().plus(1).t(kl, 1), xr.plus(d).t(kl, d), None)
                        .add(Some(y.clone()), y.clone())
                        .build()],
                ));
            } else {
                inner.extend(lp(
                    rq,
                    vec![B::new()
                        .mul(e.clone().plus(xq).t(kl, 1), xr.t(kl, d), None)
                        .add(Some(y.clone()), y.clone())
                        .build()],
                ));
            }
        }
        body.extend(lp(self.d, inner));
        if !self.per_weight {
            body.extend(lp(self.d, vec![B::new().div(y.clone(), l, y).build()]));
        }
    }

    /// The shape of row `j`'s code that does not move affinely with the row: per run of its
    /// scores, its key stride, where the maximum's loop starts and whether the loops of the
    /// maximum and the exponentials run at all; and which two keys start the maximum.
    fn row_shape(&self, p: u32, j: u32) -> (Vec<(i64, u32, bool, bool)>, bool) {
        let runs = self.runs(p, j);
        let pair = runs[0].3 >= 2;
        let mut skip = 2u32;
        let shape = runs
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let from = skip.min(r.3);
                skip -= from;
                (r.1, from, r.3 > from, r.3 > u32::from(i == 0))
            })
            .collect();
        (shape, pair)
    }

    /// Whether rows `j0 … j0 + count − 1` of PE `p` run one code with addresses and key
    /// counts that move by the same amount from row to row, so one loop over them is their
    /// code exactly.
    fn rows_alike(&self, p: u32, j0: u32, count: u32) -> bool {
        if count < 2 {
            return true;
        }
        let shape = self.row_shape(p, j0);
        let (a, b) = (self.runs(p, j0), self.runs(p, j0 + 1));
        if a.len() != b.len() {
            return false;
        }
        (j0 + 1..j0 + count).all(|j| {
            let r = self.runs(p, j);
            let k = i64::from(j - j0);
            self.row_shape(p, j) == shape
                && r.len() == a.len()
                && r.iter().zip(a.iter().zip(&b)).all(|(r, (x, y))| {
                    r.0.terms == x.0.terms
                        && x.0.terms == y.0.terms
                        && r.0.base == x.0.base + k * (y.0.base - x.0.base)
                        && i64::from(r.2) == i64::from(x.2) + k * (i64::from(y.2) - i64::from(x.2))
                        && i64::from(r.3) == i64::from(x.3) + k * (i64::from(y.3) - i64::from(x.3))
                })
        })
    }

    /// Rows `j0 … j0 + count − 1` of PE `p` (see [`Deal::rows_alike`]) as one loop at level 1:
    /// the code of [`Deal::row`] with every address and key count moved on by the row.
    fn row_loop(&self, p: u32, j0: u32, count: u32, scale: f32) -> Vec<Node> {
        if count == 1 {
            return self.row(p, j0, scale);
        }
        let (n, d) = (i64::from(self.n), i64::from(self.d));
        // Levels: 1 row, 2 key of the softmax, or 2 column and 3 key of the values.
        let (rl, lv) = (1u8, 2u8);
        let runs = self.runs(p, j0);
        let next = self.runs(p, j0 + 1);
        let moves: Vec<(i64, i64, i64)> = runs
            .iter()
            .zip(&next)
            .map(|(a, b)| {
                (
                    b.0.base - a.0.base,
                    i64::from(b.2) - i64::from(a.2),
                    i64::from(b.3) - i64::from(a.3),
                )
            })
            .collect();
        let j = i64::from(j0);
        let mx = ad(self.mx).plus(j).t(rl, 1);
        let l = ad(self.l).plus(j).t(rl, 1);
        let e = ad(self.e).plus(j * n).t(rl, n);
        let key = |i: usize, k: u32| {
            runs[i]
                .0
                .clone()
                .plus(i64::from(k) * runs[i].1)
                .t(rl, moves[i].0)
        };
        // A loop over a run's keys whose count moves with the row.
        let keys = |i: usize, from: u32, body: Node| -> Vec<Node> {
            let count = runs[i].3 - from;
            if count == 0 {
                return Vec::new();
            }
            let mut lp = isa::Loop::new(count, vec![body]);
            if moves[i].2 != 0 {
                lp.step = Some(isa::CountStep {
                    level: rl,
                    per: moves[i].2 as i16,
                });
            }
            vec![Node::Loop(lp)]
        };
        let (a, b) = if runs[0].3 >= 2 {
            (key(0, 0), key(0, 1))
        } else {
            (key(0, 0), key(1, 0))
        };
        let mut body = vec![B::new().max(a, b, mx.clone()).build()];
        let mut skip = 2u32;
        for (i, r) in runs.iter().enumerate() {
            let from = skip.min(r.3);
            skip -= from;
            body.extend(keys(
                i,
                from,
                B::new()
                    .max(mx.clone(), key(i, from).t(lv, r.1), mx.clone())
                    .build(),
            ));
        }
        let mut first = true;
        for (i, r) in runs.iter().enumerate() {
            let dst = e.clone().plus(i64::from(r.2)).t(rl, moves[i].1);
            if first {
                body.push(
                    B::new()
                        .expd(key(i, 0), mx.clone(), scale, dst.clone())
                        .add(None, l.clone())
                        .build(),
                );
            }
            let from = u32::from(first);
            first = false;
            body.extend(keys(
                i,
                from,
                B::new()
                    .expd(
                        key(i, from).t(lv, r.1),
                        mx.clone(),
                        scale,
                        dst.plus(i64::from(from)).t(lv, 1),
                    )
                    .add(Some(l.clone()), l.clone())
                    .build(),
            ));
        }
        // Values: columns at `lv`.
        let y = ad(self.y)
            .plus(j * d)
            .t(0, i64::from(self.r(p)) * d)
            .t(rl, d)
            .t(lv, 1);
        self.weights_and_values(p, &mut body, &e, l, y, lv);
        lp(count, body)
    }
}

/// When a stretch of a head's body first reads each word, and when it sends each word (the
/// address on the next PE), in cycles from its start; and its length.
pub(super) struct Line {
    pub(super) read: HashMap<u32, u64>,
    pub(super) sent: HashMap<u32, u64>,
    len: u64,
}

pub(super) fn line(nodes: &[Node], words: u32) -> Result<Line, String> {
    if nodes.is_empty() {
        return Ok(Line {
            read: Default::default(),
            sent: Default::default(),
            len: 0,
        });
    }
    Ok(line_of(stretch(nodes, words)?.instances()))
}

/// The sends of [`line`] alone.
fn sends(nodes: &[Node], words: u32) -> Result<HashMap<u32, u64>, String> {
    let mut sent = HashMap::default();
    if nodes.is_empty() {
        return Ok(sent);
    }
    for (t, b) in stretch(nodes, words)?.instances().enumerate() {
        if let Xfer::Send { dst, .. } = b.xfer {
            sent.insert(dst, t as u64);
        }
    }
    Ok(sent)
}

/// [`line`] of a stretch's bundles.
fn line_of(bundles: impl Iterator<Item = isa::Bundle>) -> Line {
    let mut read = HashMap::default();
    let mut sent = HashMap::default();
    let mut len = 0u64;
    for b in bundles {
        let t = len;
        len += 1;
        each_read(&b, |a| {
            read.entry(a).or_insert(t);
        });
        if let Xfer::Send { dst, .. } = b.xfer {
            sent.insert(dst, t);
        }
    }
    Line { read, sent, len }
}

/// Every word `b` reads from its PE's memory, in slot order (operands, the sum's source, the
/// send's source), each as often as a slot reads it.
fn each_read(b: &isa::Bundle, mut at: impl FnMut(u32)) {
    if let isa::Op::Arith(x) = &b.op {
        x.reads().for_each(&mut at);
    }
    if let isa::Acc::Add {
        src: isa::AccSrc::Mem(a),
        ..
    } = b.acc
    {
        at(a);
    }
    if let Xfer::Send {
        src: XferSrc::Mem(a),
        ..
    } = b.xfer
    {
        at(a);
    }
}

/// A stretch as the program [`flat`] flattens, checked as it checks it: its
/// [`LoopProgram::instances`] are the stretch's bundles, one at a time, so that scanning or
/// comparing a stretch never holds its expansion.
fn stretch(nodes: &[Node], words: u32) -> Result<LoopProgram, String> {
    let p = LoopProgram {
        pe: 0,
        pes: 1,
        mem_words: words,
        body: lp(1, nodes.to_vec()),
    };
    p.validate()
        .map_err(|e| format!("{NAME}: {:?}", isa::FlattenError::Invalid(e)))?;
    Ok(p)
}

/// The bundles `nodes` (a stretch of a head's body, head 0) execute, one a cycle.
fn flat(nodes: &[Node], words: u32) -> Result<Vec<isa::Bundle>, String> {
    Ok(LoopProgram {
        pe: 0,
        pes: 1,
        mem_words: words,
        body: lp(1, nodes.to_vec()),
    }
    .flatten(u64::MAX)
    .map_err(|e| format!("{NAME}: {e:?}"))?
    .bundles)
}

/// Per word, the last cycle any of `lines` (a PE's stretches, starting in cycles `starts`)
/// sends it to the next PE in: no stretch there reading it can run its read before that cycle
/// is over. Indexed by address.
fn last_sent(lines: &[Line], starts: &[u64]) -> Vec<Option<u64>> {
    let top = lines
        .iter()
        .flat_map(|l| l.sent.keys())
        .map(|&a| a as usize + 1)
        .max()
        .unwrap_or(0);
    let mut last = vec![None; top];
    for (l, &st) in lines.iter().zip(starts) {
        for (&a, &t) in &l.sent {
            let w = &mut last[a as usize];
            *w = (*w).max(Some(st + t));
        }
    }
    last
}

/// The reads of a [`Line`], all that the rows' stretches are asked for: each word a stretch
/// reads with the cycle it first reads it in, in the order of those cycles. A list rather than
/// a map: a row reads every x word, and the rows' lines are merged and scanned, never looked up.
struct Reads {
    first: Vec<(u32, u64)>,
    len: u64,
}

impl Reads {
    /// The reads of stretches run one after another: each word's first read is in the first
    /// stretch reading it. `seen` is scratch, all `false`, and left so.
    fn then<'a>(parts: impl Iterator<Item = &'a Reads>, seen: &mut Vec<bool>) -> Reads {
        let mut out = Reads {
            first: Vec::new(),
            len: 0,
        };
        for r in parts {
            for &(a, t) in &r.first {
                if !std::mem::replace(at_word(seen, a), true) {
                    out.first.push((a, out.len + t));
                }
            }
            out.len += r.len;
        }
        for &(a, _) in &out.first {
            seen[a as usize] = false;
        }
        out
    }

    /// The least cycle this stretch may start in on the PE after the one whose last sends
    /// are `last` ([`last_sent`]), as `ready` gives it for a [`Line`]: each word it reads is
    /// there by the cycle it reads it in.
    fn ready(&self, last: &[Option<u64>]) -> u64 {
        self.first
            .iter()
            .filter_map(|&(a, r)| {
                let t = last.get(a as usize).copied().flatten()?;
                Some((t as i64 + 1 - r as i64).max(0))
            })
            .max()
            .unwrap_or(0) as u64
    }
}

/// `seen[a]`, the vector grown to hold it.
fn at_word(seen: &mut Vec<bool>, a: u32) -> &mut bool {
    let a = a as usize;
    if a >= seen.len() {
        seen.resize(a + 1, false);
    }
    &mut seen[a]
}

/// [`Reads`] of a stretch's bundles (as [`line_of`] takes them). `seen` as in [`Reads::then`].
fn reads_of(bundles: impl Iterator<Item = isa::Bundle>, seen: &mut Vec<bool>) -> Reads {
    let mut out = Reads {
        first: Vec::new(),
        len: 0,
    };
    for b in bundles {
        let t = out.len;
        out.len += 1;
        each_read(&b, |a| {
            if !std::mem::replace(at_word(seen, a), true) {
                out.first.push((a, t));
            }
        });
    }
    for &(a, _) in &out.first {
        seen[a as usize] = false;
    }
    out
}

/// Whether the stretch `g` of a loop over rows runs, iteration by iteration, exactly the
/// stretches of `rows`: then it flattens to their bundles one after another, which is seen on
/// the loops' code alone ([`isa::looped::fix_level`]). `false` says nothing.
fn runs_rows(g: &LoopProgram, rows: &[Option<LoopProgram>]) -> bool {
    // A stretch is one loop of one iteration at level 0 ([`stretch`]); the rows' loop is the
    // only node in it, at level 1.
    fn once(nodes: &[Node]) -> Option<&[Node]> {
        match nodes {
            [Node::Loop(l)] if l.count == 1 && l.step.is_none() => Some(&l.body),
            _ => None,
        }
    }
    let Some([Node::Loop(l)]) = once(&g.body) else {
        return false;
    };
    l.step.is_none()
        && l.count as usize == rows.len()
        && rows.iter().enumerate().all(|(k, r)| {
            r.as_ref()
                .and_then(|r| once(&r.body))
                .is_some_and(|body| isa::looped::fix_level(&l.body, 1, k as u32) == body)
        })
}

/// Whether no bundle of `nodes` sends: none of their templates has a send, which no index
/// can add.
fn sends_nothing(nodes: &[Node]) -> bool {
    nodes.iter().all(|n| match n {
        Node::Bundle(b) => b.bundle.xfer == Xfer::Nop,
        Node::Loop(l) => sends_nothing(&l.body),
    })
}

/// The bundles of `progs` one after another.
fn instances<'a>(
    progs: impl Iterator<Item = &'a LoopProgram> + 'a,
) -> impl Iterator<Item = isa::Bundle> + 'a {
    progs.flat_map(LoopProgram::instances)
}

/// How the mirrored programs forward the words of the ring pass.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Timing {
    /// Whichever of the two below takes fewer cycles (on the step where they tie).
    Fastest,
    /// Each step forwards the block it holds and its payload so far.
    OnStep,
    /// Every word relayed as soon as it arrives, on whatever chains are free then.
    Relayed,
    /// Relayed, with each pair's scores kept whole at the homes (which `Fastest` and `Relayed`
    /// take where the relayed programs are too large otherwise).
    Whole,
}

/// The mirrored programs for `p` on `m` PEs, if every PE's memory is within `budget` words.
pub fn run(p: &Problem, m: u32, budget: Option<u64>) -> Result<Stream, String> {
    run_timed(p, m, budget, Timing::Fastest)
}

/// [`run`] with the forwarding `timing` says.
pub fn run_timed(
    p: &Problem,
    m: u32,
    budget: Option<u64>,
    timing: Timing,
) -> Result<Stream, String> {
    if let Some(why) = unsupported(p, m) {
        return Err(why);
    }
    let (n, d, heads) = (p.tokens, p.dim, p.heads);
    // Every PE's bundles are at least the layer's operations: beyond the flattened proof's
    // limit nothing need be built.
    let (n64, d64) = (u64::from(n), u64::from(d));
    let ops = u64::from(heads) * (n64 * (n64 + 1) / 2 * d64 + n64 * n64 * (d64 + 2));
    if ops > FLAT_PROOF_BUNDLES {
        return Err(format!(
            "{NAME}: mirrored scores would take {ops} bundles or more, more than the {FLAT_PROOF_BUNDLES} the flattened proof takes"
        ));
    }
    let scale = p.scale as f32;
    let per_weight = super::per_weight_pays(p);
    let deal = Deal::new(n, d, m, heads, per_weight, false)
        .ok_or_else(|| format!("{NAME}: the layer does not fit in 32-bit addresses"))?;
    if budget.is_some_and(|b| u64::from(deal.words) > b) {
        return Err(format!(
            "{NAME}: mirrored scores need {} words per PE, more than {}",
            deal.words,
            budget.unwrap_or(0)
        ));
    }
    // Relayed x rows leave the steps only the payloads to forward, which spares the steps of
    // the PEs with few cross scores from waiting on forwarded words; on the step stays where
    // relaying does not fit before the ring's last step or takes longer.
    let too_big = std::cell::Cell::new(false);
    let fits = |programs: Vec<LoopProgram>| -> Result<Vec<LoopProgram>, String> {
        // Each row's softmax is a body of its own, so the programs grow with the rows per PE.
        match programs
            .iter()
            .map(isa::looped_binary::encoded_len)
            .find(|&b| b > MAX_PROGRAM_BYTES)
        {
            Some(big) => Err({
                too_big.set(true);
                format!(
                "{NAME}: mirrored scores would take {big} bytes of program on a PE, more than {MAX_PROGRAM_BYTES}"
            )
            }),
            None => Ok(programs),
        }
    };
    let on_step = if matches!(timing, Timing::Relayed | Timing::Whole) {
        Err(format!("{NAME}: relayed timing asked for"))
    } else {
        build(&deal, None, scale)?
            .0
            .ok_or_else(|| format!("{NAME}: the steps' waits do not settle"))
            .and_then(fits)
    };
    // Both timings execute the same operations on every PE (the deal fixes them; only the
    // transfer slots differ), one a cycle at most, so where forwarding on the step already
    // takes no more cycles than its busiest PE's operations the relay cannot take fewer, and
    // a tie keeps the step: it is not built.
    let at_floor = on_step.as_ref().is_ok_and(|o| cycles_of(o) <= ops_floor(o));
    let whole_deal = || {
        Deal::new(n, d, m, heads, per_weight, true)
            .filter(|w| budget.is_none_or(|b| u64::from(w.words) <= b))
    };
    let mut kept_whole = None;
    let mut tried_whole = false;
    let relayed = if timing == Timing::OnStep {
        Err(format!("{NAME}: forwarding on the step asked for"))
    } else if timing == Timing::Whole {
        too_big.set(true);
        Err(format!("{NAME}: scores kept whole asked for"))
    } else if timing == Timing::Fastest && at_floor {
        Err(format!(
            "{NAME}: forwarding on the step takes only its busiest PE's operations"
        ))
    } else if timing == Timing::Fastest && m >= 12 && n / m >= 10 {
        // Blocks of ten rows or more on twelve PEs: relayed, the programs take more than
        // 16 KiB unless the scores are kept whole (17-19 KiB with 128 tokens, 38 KiB with 256),
        // so that is built first, and the relay without it only where it does not fit.
        tried_whole = true;
        let first = match whole_deal() {
            Some(whole) => match relay(&whole, scale, fits)? {
                Ok(p) => {
                    kept_whole = Some(whole);
                    Some(p)
                }
                Err(_) => None,
            },
            None => None,
        };
        match first {
            Some(p) => Ok(p),
            None => relay(&deal, scale, fits)?,
        }
    } else {
        too_big.set(false);
        relay(&deal, scale, fits)?
    };
    // Where the relayed programs were built but are too large, the same relay with each
    // pair's scores kept whole at the homes, whose rows then fold into loops.
    let relayed = match relayed {
        Err(e) if too_big.get() && !tried_whole => match whole_deal() {
            Some(whole) => {
                let r = relay(&whole, scale, fits)?;
                if r.is_ok() {
                    kept_whole = Some(whole);
                }
                r.map_err(|e2| format!("{e}; kept whole: {e2}"))
            }
            None => Err(e),
        },
        r => r,
    };
    let (programs, deal) = match (on_step, relayed) {
        (Ok(o), Ok(r)) => {
            if cycles_of(&r) < cycles_of(&o) {
                (r, kept_whole.unwrap_or(deal))
            } else {
                (o, deal)
            }
        }
        (Err(_), Ok(r)) => (r, kept_whole.unwrap_or(deal)),
        (Err(_), Err(e)) if matches!(timing, Timing::Relayed | Timing::Whole) => {
            return Err(format!(
                "{NAME}: the relayed timing does not apply or fit ({e})"
            ))
        }
        (o, Err(_)) => (o?, deal),
    };
    let cycles = programs.iter().map(LoopProgram::cycles).max().unwrap_or(0);
    let bundles = cycles.saturating_mul(u64::from(m));
    if bundles > FLAT_PROOF_BUNDLES {
        return Err(format!(
            "{NAME}: mirrored scores would take {bundles} bundles, more than the {FLAT_PROOF_BUNDLES} the flattened proof takes"
        ));
    }
    let (n64, h64) = (u64::from(n), u64::from(heads));
    // Each pair's score is computed once and serves both of its weights.
    let mut st = Stream::per_pe_deferred(
        programs,
        places(&deal),
        cycles,
        (n64 * (n64 + 1) / 2 * h64, n64 * n64 * h64),
        (n, d, heads),
        m,
    );
    if per_weight {
        st.ops.phase2_div = n64 * n64 * h64;
        st.normalisation = runtime::layer::Normalisation::PerWeight;
    }
    Ok(st)
}

/// The relayed programs, if a relay fits the chains and its waits settle: planned first on the
/// timeline without waits, then again on the timeline each plan gives (a plan changes the
/// timeline it was made on), the fastest that `fits` kept; otherwise why none was.
fn relay(
    deal: &Deal,
    scale: f32,
    fits: impl Fn(Vec<LoopProgram>) -> Result<Vec<LoopProgram>, String>,
) -> Result<Result<Vec<LoopProgram>, String>, String> {
    let (m, d) = (deal.m, deal.d);
    // Each step's start, then the rows'.
    let mut starts: Vec<Vec<u64>> = (0..m)
        .map(|pe| {
            let mut t = 0u64;
            let mut row: Vec<u64> = (0..m)
                .map(|s| {
                    let at = t;
                    t += deal.step_size(pe, s).0 * u64::from(d);
                    at
                })
                .collect();
            row.push(t);
            row
        })
        .collect();
    // When each step sends its mirrors: a step given nothing to relay sends nothing else.
    let fresh: Vec<Vec<HashMap<u32, u64>>> = (0..m)
        .map(|pe| {
            (0..m)
                .map(|s| sends(&deal.ring_step(pe, s, 0, Some(&[])), deal.words))
                .collect()
        })
        .collect::<Result<_, _>>()?;
    let mut best: Result<Vec<LoopProgram>, String> = Err(format!(
        "{NAME}: the relay does not keep ahead of the steps"
    ));
    for _ in 0..RELAY_ROUNDS {
        let Some(plan) = deal.relay(&starts, &fresh) else {
            break;
        };
        let (programs, next) = build(deal, Some(&plan), scale)?;
        match programs.map(&fits) {
            Some(Ok(p)) if best.as_ref().map_or(true, |b| cycles_of(&p) < cycles_of(b)) => {
                best = Ok(p);
            }
            Some(Err(e)) if best.is_err() => best = Err(e),
            _ => {}
        }
        if next == starts {
            break;
        }
        starts = next;
    }
    Ok(best)
}

/// The most operations any PE's program executes: no program with the same operations per PE
/// takes fewer cycles.
fn ops_floor(programs: &[LoopProgram]) -> u64 {
    programs
        .iter()
        .map(|p| p.op_counts().iter().sum::<u64>())
        .max()
        .unwrap_or(0)
}

fn cycles_of(programs: &[LoopProgram]) -> u64 {
    programs.iter().map(LoopProgram::cycles).max().unwrap_or(0)
}

/// Every PE's program, or none where the waits do not settle, and the cycle each stretch
/// starts in (as far as the rounds got).
type Built = (Option<Vec<LoopProgram>>, Vec<Vec<u64>>);

/// Every PE's program: the ring steps (forwarding on the step, or relaying as `relay` says,
/// the words left after the last step laid onto the rows), then the rows, each stretch after a
/// wait for the words it reads.
fn build(deal: &Deal, relay: Option<&Relay>, scale: f32) -> Result<Built, String> {
    let (m, d, heads) = (deal.m, deal.d, deal.heads);
    let mu = m as usize;
    let per = u64::from(d - 1);
    let prev = |pe: usize| (pe + mu - 1) % mu;
    // Forwarding on the step, the last step's payload waits for the timeline of the others;
    // relayed, every step is known up front.
    let upfront = if relay.is_some() { mu } else { mu - 1 };
    // Relayed, what the last step's chains cannot carry rides on the rows after it: runs of
    // sends from the rows' first cycle on, as the relay placed them.
    let mut tails: Vec<Vec<overlay::Run>> = vec![Vec::new(); mu];
    let mut steps: Vec<Vec<Vec<Node>>> = Vec::with_capacity(mu);
    for (pe, tail) in tails.iter_mut().enumerate() {
        let mut row = Vec::with_capacity(mu);
        for s in 0..upfront {
            let Some(r) = relay else {
                row.push(deal.ring_step(pe as u32, s as u32, 0, None));
                continue;
            };
            let chains = deal.step_size(pe as u32, s as u32).0;
            let (on, after): (Vec<_>, Vec<_>) = r[pe][s]
                .iter()
                .cloned()
                .partition(|e| s + 1 < mu || e.0 < chains);
            tail.extend(
                after
                    .into_iter()
                    .map(|(c, words, src, shift)| overlay::Run {
                        at: (c - chains) * per,
                        words,
                        src,
                        shift,
                    }),
            );
            row.push(deal.ring_step(pe as u32, s as u32, 0, Some(&on)));
        }
        tail.sort_by_key(|r| r.at);
        steps.push(row);
    }
    let mut lines: Vec<Vec<Line>> = steps
        .iter()
        .map(|st| st.iter().map(|s| line(s, deal.words)).collect())
        .collect::<Result<_, _>>()?;
    // Relayed, the rows' stretch as far as its laid sends go: each word read and sent in its
    // cycle from the rows' start.
    let laid = relay.is_some();
    if laid {
        for (pe, tail) in tails.iter().enumerate() {
            let mut l = Line {
                read: HashMap::default(),
                sent: HashMap::default(),
                len: 0,
            };
            for r in tail {
                for i in 0..r.words {
                    let a = u32::try_from(r.src.base + i as i64)
                        .map_err(|_| format!("{NAME}: a relayed word out of range"))?;
                    let to = u32::try_from(i64::from(a) + r.shift)
                        .map_err(|_| format!("{NAME}: a relayed word out of range"))?;
                    l.read.insert(a, r.at + i);
                    l.sent.insert(to, r.at + i);
                }
                l.len = l.len.max(r.at + r.words);
            }
            lines[pe].push(l);
        }
    }
    let stretches = upfront + usize::from(laid);
    // A stretch starts once every word it reads that the previous PE sends has arrived (a word
    // sent in one cycle is read from the next); the waits are the gaps this leaves.
    let mut waits = vec![vec![0u64; mu + 1]; mu];
    let mut start = vec![vec![0u64; mu + 1]; mu];
    let mut end = vec![0u64; mu];
    // How much later than stretch `sent` of the previous PE the stretch `reads` must start for
    // the words it takes from it. The lags keep their sign: a word read late in its stretch
    // lets the stretch start before the one sending it.
    let lag = |sent: &Line, reads: &Line| -> Option<i64> {
        sent.sent
            .iter()
            .filter_map(|(addr, &t)| reads.read.get(addr).map(|&r| t as i64 + 1 - r as i64))
            .max()
    };
    let ready = |lines: &[Vec<Line>], reads: &Line, pe: usize, start: &[Vec<u64>]| -> u64 {
        let q = prev(pe);
        (0..lines[q].len())
            .filter_map(|s| lag(&lines[q][s], reads).map(|l| (start[q][s] as i64 + l).max(0)))
            .max()
            .unwrap_or(0) as u64
    };
    // Relayed words may come from any stretch of the previous PE, even one that runs alongside
    // or after the reading one there, so the stretches built up front take the least starts
    // that meet every such bound, found by rounds that only move starts later. Where the
    // bounds do not hold on any timeline (a stretch forwarding a word before the stretch it
    // waits for can send it, round the ring) the rounds do not end, and the caller is told.
    let lags: Vec<Vec<Vec<(usize, i64)>>> = (0..mu)
        .map(|pe| {
            (0..stretches)
                .map(|s| {
                    (0..stretches)
                        .filter_map(|s2| lag(&lines[prev(pe)][s2], &lines[pe][s]).map(|l| (s2, l)))
                        .collect()
                })
                .collect()
        })
        .collect();
    let mut settled = false;
    for _ in 0..4 * mu + 16 {
        let mut moved = false;
        for s in 0..stretches {
            for pe in 0..mu {
                let before = if s == 0 {
                    0
                } else {
                    start[pe][s - 1] + lines[pe][s - 1].len
                };
                let q = prev(pe);
                let at = lags[pe][s]
                    .iter()
                    .map(|&(s2, l)| (start[q][s2] as i64 + l).max(0) as u64)
                    .fold(before, u64::max);
                if at != start[pe][s] {
                    moved = true;
                    start[pe][s] = at;
                }
            }
        }
        if !moved {
            settled = true;
            break;
        }
    }
    if !settled {
        return Ok((None, start));
    }
    for pe in 0..mu {
        for s in 0..upfront {
            waits[pe][s] = start[pe][s] - end[pe];
            end[pe] = start[pe][s] + lines[pe][s].len;
        }
    }
    if upfront < mu {
        let s = mu - 1;
        // The last hop's payload starts on the first chain from which every word it
        // forwards is there when the step starts without a wait.
        for pe in 0..mu {
            let q = prev(pe);
            let b = (pe as u32 + 1) % m;
            let pat = deal.pblk[b as usize];
            let words = u64::from(deal.pay[b as usize][mu - 1]);
            let dd = u64::from(d);
            let mut at = 0u64;
            for s2 in 0..mu - 1 {
                for (&a, &t) in &lines[q][s2].sent {
                    let w = u64::from(a.wrapping_sub(pat));
                    if a >= pat && w < words {
                        let arrive = start[q][s2] + t + 1;
                        let need = arrive.saturating_sub(end[pe] + w % per).div_ceil(dd);
                        at = at.max(need.saturating_sub(w / per));
                    }
                }
            }
            let nodes = deal.ring_step(pe as u32, s as u32, at, None);
            lines[pe].push(line(&nodes, deal.words)?);
            steps[pe].push(nodes);
        }
        for pe in 0..mu {
            let at = end[pe].max(ready(&lines, &lines[pe][s], pe, &start));
            waits[pe][s] = at - end[pe];
            start[pe][s] = at;
            end[pe] = at + lines[pe][s].len;
        }
    }
    // Each row's softmax and values once its scores are home: the rows whose mirrors arrive
    // first go first.
    let mut finals = Vec::with_capacity(mu);
    let mut seen = Vec::new();
    for pe in 0..mu {
        let q = prev(pe);
        let last = last_sent(&lines[q], &start[q]);
        let mut rows = (0..deal.r(pe as u32))
            .map(|j| {
                let nodes = deal.row(pe as u32, j, scale);
                // A row's program is kept: the rows' stretch flattens to its bundles and the
                // other rows' one after another, and is checked against them below.
                let prog = if nodes.is_empty() {
                    None
                } else {
                    Some(stretch(&nodes, deal.words)?)
                };
                let l = reads_of(prog.iter().flat_map(LoopProgram::instances), &mut seen);
                let need = l
                    .first
                    .iter()
                    .filter_map(|&(a, _)| last.get(a as usize).copied().flatten())
                    .max()
                    .unwrap_or(0);
                Ok((need, j, nodes, prog, l))
            })
            .collect::<Result<Vec<_>, String>>()?;
        rows.sort_by_key(|r| (r.0, r.1));
        let from = if laid { start[pe][mu] } else { end[pe] };
        if deal.full {
            // Kept whole, rows in token order fold into loops: they go in that order where
            // the stretch then starts no later.
            let mut start_of = |rows: &mut dyn Iterator<
                Item = &(u64, u32, Vec<Node>, Option<LoopProgram>, Reads),
            >| {
                let fl = Reads::then(rows.map(|r| &r.4), &mut seen);
                from.max(fl.ready(&last))
            };
            let by_need = start_of(&mut rows.iter());
            let mut by_token: Vec<usize> = (0..rows.len()).collect();
            by_token.sort_by_key(|&i| rows[i].1);
            if start_of(&mut by_token.iter().map(|&i| &rows[i])) <= by_need {
                rows.sort_by_key(|r| r.1);
            }
        }
        let order: Vec<(u32, u64)> = rows
            .iter()
            .map(|r| (r.1, super::head_cycles(&r.2)))
            .collect();
        // A node list runs its nodes one after another, so the rows' stretch flattens to the
        // rows' bundles in order, and its first read and last send of each word are those of
        // the first row reading it and the last row sending it.
        let fl = Reads::then(rows.iter().map(|r| &r.4), &mut seen);
        let mut each = Vec::new();
        // Each row's program, in the order of `order`.
        let mut progs = Vec::with_capacity(rows.len());
        for (_, _, nodes, prog, _) in rows {
            each.extend(nodes);
            progs.push(prog);
        }
        if each.is_empty() {
            // No rows: what flattening them says (it reads nothing).
            flat(&each, deal.words)?;
        }
        let at = from.max(fl.ready(&last));
        waits[pe][mu] = from - end[pe];
        // Rows that follow one another in token order and whose code moves on alike share one
        // loop (the same flattening, so the timing above holds); those the laid sends reach
        // keep bodies of their own, which the sends split.
        let reach = if laid {
            tails[pe].last().map_or(0, |r| r.at + r.words)
        } else {
            0
        };
        let mut grouped = Vec::new();
        // What `grouped` flattens to, group by group: a row alone is its own row's code, a
        // loop over rows its program (none where it is empty).
        let mut group_progs: Vec<(usize, usize, Option<LoopProgram>)> = Vec::new();
        let mut t = at - from;
        let mut i = 0;
        while i < order.len() {
            let j = order[i].0;
            let mut c = 1u32;
            if t >= reach {
                while i + (c as usize) < order.len()
                    && order[i + c as usize].0 == j + c
                    && deal.rows_alike(pe as u32, j, c + 1)
                {
                    c += 1;
                }
            }
            let nodes = deal.row_loop(pe as u32, j, c, scale);
            if c > 1 {
                let prog = if nodes.is_empty() {
                    None
                } else {
                    Some(stretch(&nodes, deal.words)?)
                };
                group_progs.push((i, i + c as usize, prog));
            }
            grouped.extend(nodes);
            t += order[i..i + c as usize].iter().map(|o| o.1).sum::<u64>();
            i += c as usize;
        }
        // The loops stand for the rows one by one only if they flatten to them: otherwise the
        // rows keep bodies of their own. Each loop over rows flattening to its rows' bundles,
        // the whole stretch does; where one does not, the whole stretches are compared all the
        // same.
        let same = group_progs.iter().all(|(a, b, g)| {
            let rows = &progs[*a..*b];
            g.as_ref().is_some_and(|g| runs_rows(g, rows))
                || instances(g.iter()).eq(instances(rows.iter().flatten()))
        }) || {
            let mut parts: Vec<&LoopProgram> = Vec::with_capacity(progs.len());
            let mut k = 0;
            for (a, b, g) in &group_progs {
                parts.extend(progs[k..*a].iter().flatten());
                parts.extend(g);
                k = *b;
            }
            parts.extend(progs[k..].iter().flatten());
            instances(parts.into_iter()).eq(instances(progs.iter().flatten()))
        };
        let fin = if same { grouped } else { each };
        if laid {
            // The rows wait inside their stretch, whose first cycle the laid sends count from.
            let mut nodes = wait(at - from)?;
            nodes.extend(fin);
            let have = super::head_cycles(&nodes);
            let need = tails[pe].last().map_or(0, |r| r.at + r.words);
            nodes.extend(wait(need.saturating_sub(have))?);
            let laid = overlay::overlay(&nodes, 1, &tails[pe])?;
            // The stretch with the sends laid must be the stretch, its transfer slots aside,
            // sending each word of each run in its cycle.
            let with = stretch(&laid, deal.words)?;
            let lead = (at - from) as usize;
            let len = (lead + fl.len as usize).max(need as usize);
            let plain = std::iter::repeat_n(isa::Bundle::NOP, lead)
                .chain(instances(progs.iter().flatten()))
                .chain(std::iter::repeat(isa::Bundle::NOP))
                .take(len);
            let mut want = vec![Xfer::Nop; len];
            for r in &tails[pe] {
                for i in 0..r.words {
                    let a = u32::try_from(r.src.base + i as i64)
                        .map_err(|_| format!("{NAME}: a relayed word out of range"))?;
                    let to = u32::try_from(i64::from(a) + r.shift)
                        .map_err(|_| format!("{NAME}: a relayed word out of range"))?;
                    want[(r.at + i) as usize] = Xfer::Send {
                        src: XferSrc::Mem(a),
                        dst: to,
                    };
                }
            }
            // Past the top-level nodes the runs touch, the overlay keeps the stretch's own
            // nodes, which flatten to the plain stretch there (its waits, and the rows' bundles
            // as checked above): there it suffices that they send nothing and that no send
            // was placed, and only the cycles before are flattened and compared.
            let keep = laid
                .iter()
                .rev()
                .zip(nodes.iter().rev())
                .take_while(|(a, b)| a == b)
                .count();
            let cut = super::head_cycles(&nodes[..nodes.len() - keep]);
            let total = with.cycles();
            let mut with = with.instances();
            let same = total == len as u64
                && super::head_cycles(&laid[..laid.len() - keep]) == cut
                && want
                    .get(cut as usize..)
                    .is_some_and(|w| w.iter().all(|x| *x == Xfer::Nop))
                && sends_nothing(&nodes[nodes.len() - keep..])
                && plain.zip(&want).take(cut as usize).all(|(a, x)| {
                    with.next().is_some_and(|b| {
                        a.op == b.op && a.acc == b.acc && a.xfer == Xfer::Nop && b.xfer == *x
                    })
                });
            if !same {
                return Err(format!(
                    "{NAME}: sends laid on the rows do not flatten as placed"
                ));
            }
            finals.push(laid);
        } else {
            waits[pe][mu] = at - end[pe];
            finals.push(fin);
        }
    }
    let mut bodies = Vec::with_capacity(mu);
    for (pe, fin) in finals.into_iter().enumerate() {
        let mut body = Vec::new();
        for (s, nodes) in steps[pe].iter().enumerate() {
            body.extend(wait(waits[pe][s])?);
            body.extend(nodes.iter().cloned());
        }
        body.extend(wait(waits[pe][mu])?);
        body.extend(fin);
        bodies.push(body);
    }
    // The heads start together, so the waits above hold in every head.
    let programs = head_programs(
        bodies,
        (m, heads),
        |_| deal.words,
        |raw| {
            // Ways to fold the loops, each shorter on some PEs: joining loops once, or once
            // more after the once-run loops are gone (alike chains then meet as siblings).
            use super::merge::{merge, merge_kept};
            use super::once::inline;
            let len = isa::looped_binary::encoded_len;
            let raw = super::once::strip(raw);
            let mut best = inline(merge(raw.clone()));
            for other in [
                inline(merge_kept(inline(merge_kept(raw.clone())))),
                inline(merge_kept(inline(merge(raw.clone())))),
                inline(merge_kept(raw)),
            ] {
                // The first of equally short ways is kept.
                if len(&other) < len(&best) {
                    best = other;
                }
            }
            best
        },
    )?;
    Ok((Some(programs), start))
}

/// x of token `t` in its block of each head's area on its owner, y in the owner's output rows.
fn places(deal: &Deal) -> (BTreeMap<String, Place>, Place) {
    let (n, d) = (deal.n, deal.d);
    let mut x = (Vec::new(), Vec::new());
    let mut y = (Vec::new(), Vec::new());
    for h in 0..deal.heads {
        for p in 0..deal.m {
            let rp = deal.r(p);
            for i in 0..rp {
                for c in 0..d {
                    x.0.push(p);
                    x.1.push(h * deal.area + deal.xat[p as usize][p as usize] + i * d + c);
                    y.0.push(p);
                    y.1.push(deal.y + (h * rp + i) * d + c);
                }
            }
        }
    }
    let list = |(pe, addr): (Vec<u32>, Vec<u32>)| Place::Listed {
        tokens: n,
        dim: d,
        pe,
        addr,
    };
    (BTreeMap::from([("x".to_string(), list(x))]), list(y))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loops over rows alike are seen to run their rows from their code alone (so the
    /// build flattens none of them), and that agrees with flattening them.
    #[test]
    fn row_loops_run_their_rows_by_their_code() -> Result<(), String> {
        let mut seen = 0;
        for (n, d, m, heads) in [(128, 32, 12, 1), (64, 16, 6, 2), (40, 8, 6, 1)] {
            for full in [false, true] {
                let deal = Deal::new(n, d, m, heads, false, full).ok_or("no deal")?;
                for pe in 0..m {
                    let rows = (0..deal.r(pe))
                        .map(|j| stretch(&deal.row(pe, j, 0.5), deal.words).map(Some))
                        .collect::<Result<Vec<_>, _>>()?;
                    for j in 0..deal.r(pe) {
                        for c in 2..=deal.r(pe) - j {
                            if !deal.rows_alike(pe, j, c) {
                                break;
                            }
                            let g = stretch(&deal.row_loop(pe, j, c, 0.5), deal.words)?;
                            let part = &rows[j as usize..(j + c) as usize];
                            assert!(runs_rows(&g, part), "{n} {d} {m} {heads} {pe} {j} {c}");
                            assert!(
                                instances(std::iter::once(&g)).eq(instances(part.iter().flatten()))
                            );
                            seen += 1;
                        }
                    }
                }
            }
        }
        assert!(seen > 100, "{seen} loops over rows");
        Ok(())
    }
}
