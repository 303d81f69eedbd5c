//! Whole rows under a causal mask on a ring that does not deal the tokens in `2m` equal chunks
//! (docs/scheduling.md, "Streaming ring schedule", "Whole rows under a causal mask").
//!
//! Row `t` of a causal head costs `(2d + 2)(t + 1) − 1 + d` operations, so equal shares need
//! rows from all over the sequence: the tokens from the last one down are dealt zigzag over
//! periods of `2m` (PE `p` takes positions `p` and `2m − 1 − p` of each period), and the
//! `n mod 2m` first, cheapest, rows each to the least loaded PE — which continues the zigzag into
//! a partial period at the bottom, so each PE's tokens are two progressions of stride `2m`. No
//! row is cut, so no partial states merge.
//!
//! Every PE keeps every k/v row of a head that reaches it, in token order, so nothing is
//! rescaled: the ring pass computes scores only (each row's `n`-word score row takes column
//! `key token`), and the ring's last hop brings each block home into its owner's buffer, so
//! that after the pass every row finds all its keys' scores and v rows at affine addresses and
//! takes its maximum, exponentials, sum, weighted values and `d` divisions in one stepped nest
//! per kind of row. The programs execute exactly the deferred formulation's operations, or the
//! per-weight one's (each exponential divided by its row's sum before the values: `t + 1`
//! divisions for row `t` instead of `d`), or per row whichever of the two divides fewer times
//! (rows are whole, so each may be either); the fewest cycles of the three are kept.
//!
//! The blocks are forwarded on the score loops of a few rows at the top of each kind, which
//! each step runs first; the PEs' steps differ in length, so a step waits (no-ops) until the
//! block it reads has arrived, the values until the own block is home, and the heads end
//! together. Each step is a loop of its own, and steps that see their blocks alike join into one
//! loop over them (`merge::merge_at`).
//!
//! What whole rows leave uneven (the first rows, one small one on each of the first PEs) is
//! evened out by rows passed on to the next PE: all their scores computed on their own PE,
//! which takes the maximum of the first keys and sends scores and maximum after the ring pass;
//! the rest of the row's softmax and its values on the next PE, after its own rows. Each row
//! still executes exactly its whole-row operations; that variant is kept only where it takes
//! fewer cycles. A finer grain: a row may instead keep its whole softmax and some of its output
//! columns, sending its exponentials and their sum; the next PE computes the other columns.
//!
//! Where a step waiting for its whole block leaves some step waiting (blocks of more tokens
//! than the steps they follow take to forward), the steps may instead start once each word
//! they read has arrived by the cycle they read it, from the steps' flattenings: the same
//! bundles with shorter waits, kept, like the finer grain, only with fewer cycles.
//!
//! Placements are listed per element, which leaves the proof to the flattened programs: layers
//! beyond the flattening limit are refused rather than written unprovable.

use std::collections::BTreeMap;

use isa::{Cmp, CountStep, Loop, LoopProgram, Node, Pred, Slot};

use super::mirrored::{line, Line};
use super::{ad, head_cycles, head_programs, lp, wait, Ad, Place, Send, Stream, B, NAME};
use crate::problem::Problem;
use runtime::layer::Normalisation;

/// Bundles of all PEs' programs flattened that the proof of a layer with per-element
/// placements can take (`attnc verify`'s flattening limit, `attnc::rundir::MAX_FLATTENED_BUNDLES`).
const FLAT_PROOF_BUNDLES: u64 = 8_000_000;

/// Rows a PE passes on to the next at most: each rides on a nest of its own.
const MAX_CUTS: usize = 3;

/// Why the whole-rows deal does not apply to `p` on `m` PEs, if it does not.
pub fn unsupported(p: &Problem, m: u32) -> Option<String> {
    if !p.causal || p.symmetric || p.shared_values || !p.safe() {
        return Some(format!(
            "{NAME}: whole rows take separate q, k, v under a causal mask and the safe softmax"
        ));
    }
    if m < 2 || p.tokens.is_multiple_of(2 * m) {
        return Some(format!(
            "{NAME}: whole rows are for rings of 2 or more PEs that do not deal the tokens in 2m equal chunks"
        ));
    }
    // A row's keys grow by a period, `2m`, from one row of a kind to the next: a loop count's
    // step, an `i16`.
    if 2 * u64::from(m) > i16::MAX as u64 {
        return Some(format!(
            "{NAME}: whole rows take rings of at most 16383 PEs"
        ));
    }
    // Two periods give every row kind a nest and the block's words score loops to ride on.
    if p.tokens / (2 * m) < 2 {
        return Some(format!(
            "{NAME}: whole rows need at least {} tokens on {m} PEs ({})",
            4 * m,
            p.tokens
        ));
    }
    None
}

/// Operations of causal row `t` (deferred safe softmax).
fn row_cost(t: u32, d: u32) -> u64 {
    (2 * u64::from(d) + 2) * (u64::from(t) + 1) - 1 + u64::from(d)
}

/// Which tokens each PE owns: zigzag over whole periods of `2m` from the last token down, the
/// `n mod 2m` first tokens (largest first) to the least loaded PE.
fn deal(n: u32, m: u32, d: u32) -> Vec<Vec<u32>> {
    let period = 2 * m;
    let rest = n % period;
    let mut rows: Vec<Vec<u32>> = vec![Vec::new(); m as usize];
    let mut load = vec![0u64; m as usize];
    for t in rest..n {
        let pos = (t - rest) % period;
        let pe = if pos < m { pos } else { period - 1 - pos };
        rows[pe as usize].push(t);
        load[pe as usize] += row_cost(t, d);
    }
    for t in (0..rest).rev() {
        let pe = (0..m as usize).min_by_key(|&q| (load[q], q)).unwrap_or(0);
        rows[pe].push(t);
        load[pe] += row_cost(t, d);
    }
    for r in &mut rows {
        r.sort_unstable();
    }
    rows
}

/// One PE's rows and memory map.
#[derive(Clone, Debug)]
struct Pe {
    /// Its tokens, ascending: per period (the first one partial, `n mod 2m` tokens, where they
    /// exist) the low position (`p`) and the high one (`2m − 1 − p`).
    tokens: Vec<u32>,
    /// Local row of period 0's low and high token: period `i`'s are `2i` further.
    c: [u32; 2],
    /// First period of its low and high tokens: −1 where the partial period holds one.
    first: [i32; 2],
    q: u32,
    /// The own block, per head `[k rows][v rows]`, in local order.
    kv: u32,
    y: u32,
    /// Every k/v row of the head, in token order (the own ones once they come home).
    kb: u32,
    vb: u32,
    /// Scores, one row of `n` per local row (column = key token), then its exponentials.
    s: u32,
    mx: u32,
    l: u32,
    words: u32,
}

impl Pe {
    fn rows(&self) -> u32 {
        self.tokens.len() as u32
    }
}

/// A key loop of a row's work against a block: `count` keys of its low or high progression
/// from its first (at the nest's first row), `stepped` when the count grows by one per period
/// of the rows.
#[derive(Clone, Copy, Debug)]
struct KeyLoop {
    high: bool,
    count: u32,
    stepped: bool,
}

/// Words a step forwards: `len` keys of a block's low or high progression from its key
/// `start`, k rows (`v` false) or v rows.
#[derive(Clone, Copy, Debug)]
struct Piece {
    high: bool,
    v: bool,
    start: u32,
    len: u32,
}

#[derive(Clone)]
struct Deal {
    n: u32,
    d: u32,
    m: u32,
    /// Which rows divide each weight by their sum before the values (one division per key)
    /// instead of each output element after them (`d` per row).
    norm: Normalisation,
    rest: u32,
    periods: u32,
    pes: Vec<Pe>,
    /// Rows passed on to the next PE (none in the plain deal).
    cuts: Vec<Cut>,
}

/// A row passed on: its scores are all computed in the ring pass on its own PE `from`, which
/// also takes the maximum of its first `c` keys (into the score row's column `t + 1`, free under
/// the mask) and sends the scores and that maximum to the next PE; there the rest of the
/// maxima, the exponentials, the sum, `y` and the divisions follow after that PE's own rows.
#[derive(Clone, Copy, Debug)]
struct Cut {
    t: u32,
    c: u32,
    from: u32,
    /// The next PE's words for the row: its scores and the sent maximum (`t + 2`), its
    /// maximum, its sum, and its `y` row per head.
    sc: u32,
    mx: u32,
    l: u32,
    y: u32,
    /// Output columns its own PE keeps, where it takes the whole softmax and sends only the
    /// exponentials (weights, per weight) and their sum: the next PE computes columns
    /// `keep … d − 1` of `y`. 0 for a row passed on after its first maxima.
    keep: u32,
}

impl Cut {
    /// Words the first part sends: every score, and its maximum where it took one.
    fn words(&self) -> u32 {
        self.t + 1 + u32::from(self.c >= 2)
    }
}

impl Deal {
    fn new(n: u32, d: u32, m: u32, heads: u32, norm: Normalisation) -> Option<Deal> {
        let rest = n % (2 * m);
        let periods = n / (2 * m);
        let (dd, nn, h) = (u64::from(d), u64::from(n), u64::from(heads));
        let mut pes = Vec::new();
        for (p, tokens) in deal(n, m, d).into_iter().enumerate() {
            let p = p as u32;
            // The least loaded PE takes each of the first tokens, and after whole periods
            // every PE's load is the same: that continues the zigzag into the partial period,
            // so each PE's tokens are two progressions of stride 2m (checked here).
            let pos = [p, 2 * m - 1 - p];
            let period =
                |x: usize, i: i64| i64::from(rest) + 2 * i64::from(m) * i + i64::from(pos[x]);
            let first = [0, 1].map(|x| if period(x, -1) >= 0 { -1 } else { 0 });
            let mut want: Vec<u32> = (0..2)
                .flat_map(|x| {
                    (first[x]..periods as i32).map(move |i| period(x, i64::from(i)) as u32)
                })
                .collect();
            want.sort_unstable();
            if want != tokens {
                return None;
            }
            let at = |t: i64| tokens.iter().position(|&x| i64::from(x) == t);
            let c = [at(period(0, 0))? as u32, at(period(1, 0))? as u32];
            let r = tokens.len() as u64;
            let q = 0u64;
            let kv = q + h * r * dd;
            let y = kv + h * 2 * r * dd;
            let kb = y + h * r * dd;
            let vb = kb + nn * dd;
            let s = vb + nn * dd;
            let mx = s + r * nn;
            let l = mx + r;
            let words = l + r;
            let w = |x: u64| u32::try_from(x).ok();
            pes.push(Pe {
                tokens,
                c,
                first,
                q: w(q)?,
                kv: w(kv)?,
                y: w(y)?,
                kb: w(kb)?,
                vb: w(vb)?,
                s: w(s)?,
                mx: w(mx)?,
                l: w(l)?,
                words: w(words)?,
            });
        }
        Some(Deal {
            n,
            d,
            m,
            norm,
            rest,
            periods,
            pes,
            cuts: Vec::new(),
        })
    }

    /// Operations (and cycles) of row `t` as a whole row under this deal's normalisation.
    fn cost(&self, t: u32) -> u64 {
        let d = u64::from(self.d);
        let div = if self.norm.defers(t + 1, self.d) {
            d
        } else {
            u64::from(t) + 1
        };
        let copy = u64::from(t == 0 && self.norm != Normalisation::PerWeight);
        (2 * d + 2) * (u64::from(t) + 1) - 1 + div + copy
    }

    /// What passing row `t` on with its first part's maximum over `c` keys moves to the next
    /// PE: all but its scores and the first part's `c − 1` maxima.
    fn moved(&self, t: u32, c: u32) -> u64 {
        self.cost(t) - (u64::from(t) + 1) * u64::from(self.d) - u64::from(c - 1)
    }

    /// Rows to pass on so that the PE that ends last (`loads`: where each would end with whole
    /// rows) ends as early as it can with at most
    /// `most` rows passed from each PE to the next (the last PE's to PE 0 too), or `None`
    /// where that is no shorter than the plain deal. Each boundary moves an amount of work
    /// within the sum of its rows' ranges (`moved(t, t + 1)` to `moved(t, 1)`); given the work
    /// a PE receives, the least it can pass on leaves the next PE the most room, so one pass
    /// round the ring per amount sent over the last boundary decides a busiest-PE bound.
    fn plan(&self, loads: &[u64], most: usize) -> Option<Vec<(u32, u32, u32)>> {
        let m = self.m as usize;
        // A row passed on sends its words on a value loop of `d` iterations. A PE's top row
        // stays: it reads the v rows of all the PE's tokens, which the ring's last hop brings
        // home to be read.
        let sets: Vec<Vec<(u64, u64, Vec<u32>)>> = self
            .pes
            .iter()
            .map(|pe| {
                let top = pe.tokens.iter().copied().max().unwrap_or(0);
                let rows: Vec<u32> = pe
                    .tokens
                    .iter()
                    .copied()
                    .filter(|&t| t >= 2 && t + 2 <= self.d && t != top)
                    .collect();
                let mut sets = vec![(0u64, 0u64, Vec::new())];
                let mut grow = vec![(0u64, 0u64, Vec::new(), 0usize)];
                for _ in 0..most {
                    let mut next = Vec::new();
                    for (lo, hi, set, from) in &grow {
                        for (i, &t) in rows.iter().enumerate().skip(*from) {
                            let mut s = set.clone();
                            s.push(t);
                            next.push((lo + self.moved(t, t + 1), hi + self.moved(t, 1), s, i + 1));
                        }
                    }
                    sets.extend(next.iter().map(|x| (x.0, x.1, x.2.clone())));
                    grow = next;
                }
                sets
            })
            .collect();
        // The amounts each PE can pass on: the union of its sets' ranges, in order.
        let unions: Vec<Vec<(u64, u64)>> = sets
            .iter()
            .map(|sets| {
                let mut r: Vec<(u64, u64)> = sets.iter().map(|x| (x.0, x.1)).collect();
                r.sort_unstable();
                let mut u: Vec<(u64, u64)> = Vec::new();
                for (lo, hi) in r {
                    match u.last_mut() {
                        Some(last) if lo <= last.1 + 1 => last.1 = last.1.max(hi),
                        _ => u.push((lo, hi)),
                    }
                }
                u
            })
            .collect();
        // The least amount PE `p` can pass on that keeps it within `top`, having received
        // `fin`.
        let pass = |p: usize, fin: u64, top: u64| -> Option<u64> {
            let need = (loads[p] + fin).saturating_sub(top);
            let u = &unions[p];
            let at = u.partition_point(|x| x.1 < need);
            u.get(at).map(|x| x.0.max(need))
        };
        let wraps = || unions[m - 1].iter().flat_map(|x| x.0..=x.1);
        let flows = least_flows(loads, wraps, pass)?;
        let mut cuts = Vec::new();
        for (p, amount) in flows.into_iter().enumerate() {
            // The fewest rows that can move the amount; each at least its least, the rest
            // spread first come.
            let set = (0..sets[p].len())
                .filter(|&i| sets[p][i].0 <= amount && amount <= sets[p][i].1)
                .min_by_key(|&i| (sets[p][i].2.len(), i))?;
            let rows = &sets[p][set].2;
            let mut left = amount - sets[p][set].0;
            for &t in rows {
                let more = left.min(self.moved(t, 1) - self.moved(t, t + 1));
                left -= more;
                let c = t + 1 - more as u32;
                cuts.push((p as u32, t, c));
            }
        }
        Some(cuts)
    }

    /// What keeping `keep` output columns of row `t` on its own PE moves to the next: the other
    /// columns' weighted sums and, deferred, their divisions.
    fn split_moved(&self, t: u32, keep: u32) -> u64 {
        let per = u64::from(t) + 1 + u64::from(self.norm.defers(t + 1, self.d));
        u64::from(self.d - keep) * per
    }

    /// [`Deal::plan`] with a finer grain: a row may also be passed on after its whole softmax,
    /// the next PE taking some of its output columns (`(PE, token, c, keep)`). Amounts are
    /// planned up to what the PEs' ends differ by in all (a larger flow round the ring only
    /// moves the same work further), at most `most` rows from each PE.
    fn plan_split(&self, loads: &[u64], most: usize) -> Option<Vec<(u32, u32, u32, u32)>> {
        let m = self.m as usize;
        let low = loads.iter().copied().min().unwrap_or(0);
        let cap = loads.iter().map(|x| x - low).sum::<u64>() as usize + 1;
        // Per PE: for each row, its choices (amount, c, keep), and after each row which amounts
        // `c` of the rows so far reach, for every `c` up to `most` (bit sets).
        /// A row's ways of being passed on: (amount, c, keep).
        type Choices = Vec<(usize, u32, u32)>;
        struct Table {
            rows: Vec<(u32, Choices)>,
            reach: Vec<Vec<Vec<u64>>>,
        }
        let wl = cap / 64 + 1;
        let has = |set: &[u64], a: usize| set[a / 64] >> (a % 64) & 1 == 1;
        // `to |= from << x`, within the cap.
        let or_shifted = |to: &mut [u64], from: &[u64], x: usize| {
            let (w, b) = (x / 64, x % 64);
            for i in (w..wl).rev() {
                let lo = from[i - w] << b;
                let hi = if b > 0 && i > w {
                    from[i - w - 1] >> (64 - b)
                } else {
                    0
                };
                to[i] |= lo | hi;
            }
        };
        let tables: Vec<Table> = self
            .pes
            .iter()
            .map(|pe| {
                let top = pe.tokens.iter().copied().max().unwrap_or(0);
                let rows: Vec<(u32, Choices)> = pe
                    .tokens
                    .iter()
                    .copied()
                    .filter(|&t| t >= 2 && t != top)
                    .map(|t| {
                        let mut o = Vec::new();
                        if t + 2 <= self.d {
                            o.extend((1..=t + 1).map(|c| (self.moved(t, c) as usize, c, 0)));
                        }
                        o.extend((1..self.d).map(|k| (self.split_moved(t, k) as usize, t + 1, k)));
                        o.retain(|x| x.0 <= cap);
                        (t, o)
                    })
                    .collect();
                let mut first = vec![vec![0u64; wl]; most + 1];
                first[0][0] = 1;
                let mut reach = vec![first];
                for (_, opts) in &rows {
                    let was = reach.last().cloned().unwrap_or_default();
                    let mut now = was.clone();
                    for &(x, _, _) in opts {
                        for c in 0..most {
                            or_shifted(&mut now[c + 1], &was[c], x);
                        }
                    }
                    reach.push(now);
                }
                Table { rows, reach }
            })
            .collect();
        // The least amount at or above each that PE `p` can pass on.
        let next: Vec<Vec<Option<usize>>> = tables
            .iter()
            .map(|tb| {
                let last = tb.reach.last().cloned().unwrap_or_default();
                let mut v = vec![None; cap + 2];
                for a in (0..=cap).rev() {
                    v[a] = if last.iter().any(|set| has(set, a)) {
                        Some(a)
                    } else {
                        v[a + 1]
                    };
                }
                v
            })
            .collect();
        let pass = |p: usize, fin: u64, top: u64| -> Option<u64> {
            let need = (loads[p] + fin).saturating_sub(top) as usize;
            next[p]
                .get(need.min(cap + 1))
                .copied()
                .flatten()
                .map(|x| x as u64)
        };
        let wraps = || {
            (0..=cap)
                .filter(|&a| next[m - 1][a] == Some(a))
                .map(|a| a as u64)
        };
        let flows = least_flows(loads, wraps, pass)?;
        let mut cuts = Vec::new();
        for (p, amount) in flows.into_iter().enumerate() {
            let tb = &tables[p];
            let mut a = amount as usize;
            let r = tb.reach.len() - 1;
            let mut c = (0..=most).find(|&c| has(&tb.reach[r][c], a))?;
            // Back through the rows: a row is left out where the rows before reach the amount
            // with as many rows, else one of its choices reaches it from one row fewer.
            for r in (1..=r).rev() {
                if has(&tb.reach[r - 1][c], a) {
                    continue;
                }
                let (t, opts) = &tb.rows[r - 1];
                let &(x, cc, keep) = opts
                    .iter()
                    .find(|o| c >= 1 && o.0 <= a && has(&tb.reach[r - 1][c - 1], a - o.0))?;
                cuts.push((p as u32, *t, cc, keep));
                a -= x;
                c -= 1;
            }
            if a != 0 {
                return None;
            }
        }
        Some(cuts)
    }

    /// The deal with `cuts` (`(PE, token, c, keep)`) passed on: the receiving PEs' words for
    /// them.
    fn with_cuts(mut self, cuts: &[(u32, u32, u32, u32)], heads: u32) -> Option<Deal> {
        for &(from, t, c, keep) in cuts {
            let to = ((from + 1) % self.m) as usize;
            let at = self.pes[to].words;
            let sc = at;
            let mx = sc + t + 2;
            let l = mx + 1;
            let y = l + 1;
            self.pes[to].words = y.checked_add(heads.checked_mul(self.d)?)?;
            self.cuts.push(Cut {
                t,
                c,
                from,
                sc,
                mx,
                l,
                y,
                keep,
            });
        }
        Some(self)
    }

    fn pe(&self, p: u32) -> &Pe {
        &self.pes[p as usize]
    }

    fn next(&self, p: u32) -> &Pe {
        &self.pes[((p + 1) % self.m) as usize]
    }

    /// Block held by PE `p` in ring step `s`.
    fn held(&self, p: u32, s: u32) -> u32 {
        (p + self.m - s) % self.m
    }

    /// Position in each period of PE `b`'s low or high tokens.
    fn pos(&self, b: u32, high: bool) -> u32 {
        if high {
            2 * self.m - 1 - b
        } else {
            b
        }
    }

    /// First period of block `b`'s low or high keys.
    fn first(&self, b: u32, high: bool) -> i32 {
        self.pe(b).first[usize::from(high)]
    }

    /// Keys of block `b`'s low or high progression.
    fn keys(&self, b: u32, high: bool) -> u32 {
        (self.periods as i32 - self.first(b, high)) as u32
    }

    /// Token of period `i` at PE `b`'s low or high position (it exists).
    fn token(&self, b: u32, high: bool, i: i32) -> u32 {
        (i64::from(self.rest) + 2 * i64::from(self.m) * i64::from(i) + i64::from(self.pos(b, high)))
            as u32
    }

    /// Token of the first key of block `b`'s low or high progression.
    fn key0(&self, b: u32, high: bool) -> u32 {
        self.token(b, high, self.first(b, high))
    }

    /// Where PE `p` reads the first key of a progression of block `b` (k row, column 0; `v`:
    /// its v row) and the stride of the key index there.
    fn key_at(&self, p: u32, b: u32, high: bool, v: bool) -> (Ad, i64) {
        let pe = self.pe(p);
        let d = i64::from(self.d);
        if b == p {
            let own = i64::from(pe.rows());
            let x = usize::from(high);
            let local = i64::from(pe.c[x]) + 2 * i64::from(pe.first[x]);
            let at = ad(pe.kv)
                .t(0, 2 * own * d)
                .plus((local + if v { own } else { 0 }) * d);
            (at, 2 * d)
        } else {
            let base = if v { pe.vb } else { pe.kb };
            (
                ad(base + self.key0(b, high) * self.d),
                2 * i64::from(self.m) * d,
            )
        }
    }

    /// Where the next PE keeps the first key of a progression of block `b`, and the stride.
    fn key_dst(&self, p: u32, b: u32, high: bool, v: bool) -> (Ad, i64) {
        let nx = self.next(p);
        let base = if v { nx.vb } else { nx.kb };
        (
            ad(base + self.key0(b, high) * self.d),
            2 * i64::from(self.m) * i64::from(self.d),
        )
    }

    /// The key loops of PE `p`'s low or high row of period `i` against block `b`: every key
    /// of the block at or before the row's token.
    fn key_loops(&self, p: u32, b: u32, high: bool, i: i32) -> Vec<KeyLoop> {
        // Keys of periods below `lim` are visible (the positions decide the row's own period).
        let lim = |keys_high: bool| match (high, keys_high) {
            (false, false) => i + i32::from(b <= p),
            (false, true) => i,
            (true, false) => i + 1,
            (true, true) => i + i32::from(b >= p),
        };
        [false, true]
            .map(|kh| KeyLoop {
                high: kh,
                count: (lim(kh) - self.first(b, kh)).max(0) as u32,
                stepped: true,
            })
            .to_vec()
    }

    /// Local row of PE `p`'s low or high row of period `i`.
    fn local(&self, p: u32, high: bool, i: i32) -> u32 {
        (self.pe(p).c[usize::from(high)] as i32 + 2 * i) as u32
    }

    /// Rows `local0 + 2·i` (`i < rows`) of PE `p` against block `b` through `loops` (counts
    /// at the first row; stepped ones one more per row), the link slots carrying `sends` (one
    /// per loop at most: the loop's index and the piece).
    fn scores(
        &self,
        p: u32,
        b: u32,
        (local0, rows): (u32, u32),
        loops: &[KeyLoop],
        sends: &[(usize, Piece)],
    ) -> Vec<Node> {
        let pe = self.pe(p);
        let (d, n) = (i64::from(self.d), i64::from(self.n));
        // Level 1 is the ring step's own loop (of one iteration: adjacent steps that continue
        // one another are merged into one loop afterwards).
        let (lr, lb, lc) = (2u8, 3u8, 4u8);
        let q = ad(pe.q + local0 * self.d)
            .t(0, i64::from(pe.rows()) * d)
            .t(lr, 2 * d);
        let mut body = Vec::new();
        for (at, kl) in loops.iter().enumerate() {
            if kl.count == 0 {
                continue;
            }
            let (k, kst) = self.key_at(p, b, kl.high, false);
            let sc = ad(pe.s + local0 * self.n + self.key0(b, kl.high))
                .t(lr, 2 * n)
                .t(lb, 2 * i64::from(self.m));
            let k = k.t(lb, kst);
            let send = sends.iter().find(|x| x.0 == at).map(|&(_, piece)| {
                let (src, sst) = self.key_at(p, b, piece.high, piece.v);
                let (dst, dstr) = self.key_dst(p, b, piece.high, piece.v);
                let off = i64::from(piece.start);
                let preds = if piece.len < kl.count || kl.stepped {
                    vec![Pred {
                        slot: Slot::Xfer,
                        level: lb,
                        cmp: Cmp::Lt,
                        value: piece.len,
                    }]
                } else {
                    Vec::new()
                };
                Send {
                    src: src.plus(off * sst).t(lb, sst),
                    dst: dst.plus(off * dstr).t(lb, dstr),
                    preds,
                }
            });
            let cols = |s: &Option<Send>| {
                s.as_ref().map(|s| Send {
                    src: s.src.clone().plus(1).t(lc, 1),
                    dst: s.dst.clone().plus(1).t(lc, 1),
                    preds: s.preds.clone(),
                })
            };
            let mut key = vec![B::new()
                .mul(q.clone(), k.clone(), None)
                .add(None, sc.clone())
                .send(send.as_ref())
                .build()];
            key.extend(lp(
                self.d - 1,
                vec![B::new()
                    .mul(q.clone().plus(1).t(lc, 1), k.plus(1).t(lc, 1), None)
                    .add(Some(sc.clone()), sc)
                    .send(cols(&send).as_ref())
                    .build()],
            ));
            body.push(Node::Loop(Loop {
                count: kl.count,
                step: (kl.stepped && rows > 1).then_some(CountStep { level: lr, per: 1 }),
                body: key,
            }));
        }
        // A row that sees no key of the block has nothing to do in the step.
        if body.is_empty() {
            return Vec::new();
        }
        lp(rows, body)
    }

    /// The words of a block a step forwards, as pieces of its progressions: every k and v
    /// row, the top high key's k row a piece of its own. The same pieces for every block, so
    /// that steps whose rows see their blocks alike carry them on the same loops and join into
    /// one loop; [`Deal::sent`] says which a step leaves out.
    fn pieces(&self, b: u32) -> Vec<Piece> {
        let mut v = Vec::new();
        for high in [false, true] {
            for vv in [false, true] {
                let keys = self.keys(b, high);
                let len = keys - u32::from(high && !vv);
                v.push(Piece {
                    high,
                    v: vv,
                    start: 0,
                    len,
                });
            }
        }
        v.push(Piece {
            high: true,
            v: false,
            start: self.keys(b, true) - 1,
            len: 1,
        });
        v
    }

    /// Whether step `s` sends `piece` of block `b`: the last hop brings only the v rows home
    /// (the owner's k rows are in its own region), and every PE's last token is `n − 1 − q`,
    /// so the top high key of block `b` (token `n − 1 − b`) is read by the PEs `q ≤ b` only:
    /// block 0's travels without its k row.
    fn sent(&self, b: u32, s: u32, piece: &Piece) -> bool {
        let top = piece.high && !piece.v && piece.start + piece.len == self.keys(b, true);
        piece.v || (s + 1 < self.m && !(b == 0 && top))
    }

    /// Ring step `s` on PE `p`: the top rows carrying the block to the next PE first, then
    /// the rest. Also the cycles, from the step's start, by which the next PE has the block.
    fn step(&self, p: u32, s: u32) -> Result<(Vec<Node>, u64), String> {
        let b = self.held(p, s);
        let pe = self.pe(p);
        let big = self.periods as i32;
        // Peel rows from the top, high and low alternately, one at a time until the block's
        // words fit their loops.
        let order: Vec<(bool, i32)> = (0..big)
            .flat_map(|k| [(true, big - 1 - k), (false, big - 1 - k)])
            .collect();
        for top in 1..=order.len() {
            let peeled = &order[..top];
            // Rows of each kind left below the peeled ones.
            let left = |high: bool| big - peeled.iter().filter(|x| x.0 == high).count() as i32;
            let rows: Vec<Vec<KeyLoop>> = peeled
                .iter()
                .map(|&(high, i)| fixed(&self.key_loops(p, b, high, i)))
                .collect();
            let Some(plan) = assign(&self.pieces(b), &rows) else {
                continue;
            };
            let plan: Vec<_> = plan.into_iter().filter(|x| self.sent(b, s, &x.2)).collect();
            let mut nodes = Vec::new();
            for (r, &(high, i)) in peeled.iter().enumerate() {
                let sends: Vec<(usize, Piece)> = plan
                    .iter()
                    .filter(|x| x.0 == r)
                    .map(|x| (x.1, x.2))
                    .collect();
                let local = self.local(p, high, i);
                nodes.extend(self.scores(p, b, (local, 1), &rows[r], &sends));
            }
            let ready = head_cycles(&lp(1, nodes.clone()));
            // The rest of each kind: one row alone while a key loop would be empty, then a
            // stepped nest.
            for high in [true, false] {
                let mut i = pe.first[usize::from(high)];
                while i < left(high) {
                    let loops = self.key_loops(p, b, high, i);
                    let local = self.local(p, high, i);
                    if loops.iter().any(|x| x.count == 0) {
                        nodes.extend(self.scores(p, b, (local, 1), &fixed(&loops), &[]));
                        i += 1;
                    } else {
                        let rows = (left(high) - i) as u32;
                        nodes.extend(self.scores(p, b, (local, rows), &loops, &[]));
                        break;
                    }
                }
            }
            return Ok((lp(1, nodes), ready));
        }
        Err(format!(
            "{NAME}: whole rows cannot carry block {b} on PE {p}'s score loops"
        ))
    }

    /// After the ring pass, rows `local0 + 2·i` (`i < rows`) of PE `p`, tokens `t0 + 2m·i`
    /// (at least 2 when `rows > 1`): maximum, exponentials summed into `l`, weighted values,
    /// `y /= l` (per weight: each exponential divided by `l` before the values instead).
    fn values(
        &self,
        p: u32,
        (local0, rows): (u32, u32),
        t0: u32,
        scale: f32,
        ride: Option<&Send>,
        split: Option<&Cut>,
    ) -> Vec<Node> {
        // Every row of the nest alike ([`Deal::all_values`] splits nests where rows differ).
        let per_weight = !self.norm.defers(t0 + 1, self.d);
        let pe = self.pe(p);
        let (d, n) = (i64::from(self.d), i64::from(self.n));
        let lr = 1u8;
        let sc = ad(pe.s + local0 * self.n).t(lr, 2 * n);
        let mx = ad(pe.mx + local0).t(lr, 2);
        let l = ad(pe.l + local0).t(lr, 2);
        let y = ad(pe.y + local0 * self.d)
            .t(0, i64::from(pe.rows()) * d)
            .t(lr, 2 * d);
        let per = 2 * self.m;
        let stepped = |count: u32, body: Vec<Node>| -> Vec<Node> {
            vec![Node::Loop(Loop {
                count,
                step: (rows > 1).then_some(CountStep {
                    level: lr,
                    per: per as i16,
                }),
                body,
            })]
        };
        let mut body = Vec::new();
        // The row's maximum. A row of one key has its score for one: per weight its
        // exponential takes the score itself, as that formulation counts no operation beyond
        // its own; deferred, it copies it (`max(S, S)`, declared as online work).
        let mut top = mx.clone();
        if t0 == 0 && self.norm == Normalisation::PerWeight {
            top = sc.clone();
        } else if t0 == 0 {
            body.push(B::new().max(sc.clone(), sc.clone(), mx.clone()).build());
        } else {
            body.push(
                B::new()
                    .max(sc.clone(), sc.clone().plus(1), mx.clone())
                    .build(),
            );
            if t0 >= 2 {
                body.extend(stepped(
                    t0 - 1,
                    vec![B::new()
                        .max(mx.clone(), sc.clone().plus(2).t(2, 1), mx.clone())
                        .build()],
                ));
            }
        }
        body.push(
            B::new()
                .expd(sc.clone(), top, scale, sc.clone())
                .add(None, l.clone())
                .build(),
        );
        if t0 >= 1 {
            let e = sc.clone().plus(1).t(2, 1);
            body.extend(stepped(
                t0,
                vec![B::new()
                    .expd(e.clone(), mx.clone(), scale, e)
                    .add(Some(l.clone()), l.clone())
                    .build()],
            ));
        }
        if per_weight {
            body.push(B::new().div(sc.clone(), l.clone(), sc.clone()).build());
            if t0 >= 1 {
                let w = sc.clone().plus(1).t(2, 1);
                body.extend(stepped(
                    t0,
                    vec![B::new().div(w.clone(), l.clone(), w).build()],
                ));
            }
        }
        let yc = y.clone().t(2, 1);
        let v = ad(pe.vb).t(2, 1);
        // A row split by its columns keeps the first `keep` here and sends its exponentials
        // on the first column's loop (they are final by then) and its sum on the first
        // division, for the next PE's columns.
        let first_col = |src: Ad, dst: Ad| Send {
            src,
            dst,
            preds: vec![Pred {
                slot: Slot::Xfer,
                level: 2,
                cmp: Cmp::Eq,
                value: 0,
            }],
        };
        let split_sends = split.map(|cut| {
            (
                first_col(sc.clone(), ad(cut.sc)),
                first_col(sc.clone().plus(1).t(3, 1), ad(cut.sc).plus(1).t(3, 1)),
                first_col(l.clone(), ad(cut.l)),
            )
        });
        let ncols = split.map_or(self.d, |cut| cut.keep);
        let mut cols = vec![B::new()
            .mul(sc.clone(), v.clone(), None)
            .add(None, yc.clone())
            .send(ride.or(split_sends.as_ref().map(|x| &x.0)))
            .build()];
        if t0 >= 1 {
            cols.extend(stepped(
                t0,
                vec![B::new()
                    .mul(sc.clone().plus(1).t(3, 1), v.plus(d).t(3, d), None)
                    .add(Some(yc.clone()), yc.clone())
                    .send(split_sends.as_ref().map(|x| &x.1))
                    .build()],
            ));
        }
        body.extend(lp(ncols, cols));
        if !per_weight {
            body.extend(lp(
                ncols,
                vec![B::new()
                    .div(yc.clone(), l, yc)
                    .send(split_sends.as_ref().map(|x| &x.2))
                    .build()],
            ));
        }
        lp(rows, body)
    }

    /// Every row's values but those passed on: the rows of tokens below 2 alone, the rest in
    /// one nest per kind (split where a row passed on leaves it). Before them the first parts
    /// of the rows passed on take their maxima, and each sends its words on the value loop of
    /// the first row of a nest of its own; also when (cycles from the start) each has sent them.
    fn all_values(&self, p: u32, scale: f32) -> Result<(Vec<Node>, Vec<u64>), String> {
        let pe = self.pe(p);
        let n = self.n;
        let all: Vec<&Cut> = self.cuts.iter().filter(|x| x.from == p).collect();
        let passed = |t: u32| all.iter().any(|x| x.t == t);
        // Rows split by their columns send their own words; the others ride on nests.
        let out: Vec<&Cut> = all.iter().copied().filter(|x| x.keep == 0).collect();
        let mut split_sent = Vec::new();
        let local_of = |t: u32| pe.tokens.iter().position(|&x| x == t).unwrap_or(0) as u32;
        let mut nodes = Vec::new();
        for cut in &out {
            if cut.c < 2 {
                continue;
            }
            let sc = ad(pe.s + local_of(cut.t) * n);
            let top = sc.clone().plus(i64::from(cut.t) + 1);
            nodes.push(
                B::new()
                    .max(sc.clone(), sc.clone().plus(1), top.clone())
                    .build(),
            );
            nodes.extend(lp(
                cut.c - 2,
                vec![B::new().max(top.clone(), sc.plus(2).t(1, 1), top).build()],
            ));
        }
        let mut sent = Vec::new();
        for high in [false, true] {
            let mut i = pe.first[usize::from(high)];
            while i < self.periods as i32 {
                let t = self.token(p, high, i);
                if let Some(cut) = all.iter().find(|x| x.t == t && x.keep > 0) {
                    let local = self.local(p, high, i);
                    let row = self.values(p, (local, 1), t, scale, None, Some(cut));
                    split_sent.push((cut.t, head_cycles(&nodes) + head_cycles(&row)));
                    nodes.extend(row);
                    i += 1;
                    continue;
                }
                if passed(t) {
                    i += 1;
                    continue;
                }
                let local = self.local(p, high, i);
                // Rows that divide otherwise than this one (per row: from the first with `d`
                // keys), and rows passed on, end a nest.
                let defers = self.norm.defers(t + 1, self.d);
                let alike = (i..self.periods as i32)
                    .take_while(|&j| {
                        let u = self.token(p, high, j);
                        !passed(u) && self.norm.defers(u + 1, self.d) == defers
                    })
                    .count() as i32;
                let rows = if t < 2 { 1 } else { alike as u32 };
                let ride = out.get(sent.len()).map(|cut| {
                    let mut preds = vec![Pred {
                        slot: Slot::Xfer,
                        level: 2,
                        cmp: Cmp::Lt,
                        value: cut.words(),
                    }];
                    if rows > 1 {
                        preds.push(Pred {
                            slot: Slot::Xfer,
                            level: 1,
                            cmp: Cmp::Eq,
                            value: 0,
                        });
                    }
                    Send {
                        src: ad(pe.s + local_of(cut.t) * n).t(2, 1),
                        dst: ad(cut.sc).t(2, 1),
                        preds,
                    }
                });
                if let Some(r) = &ride {
                    let first = self.values(p, (local, 1), t, scale, Some(r), None);
                    sent.push(head_cycles(&nodes) + head_cycles(&first));
                }
                nodes.extend(self.values(p, (local, rows), t, scale, ride.as_ref(), None));
                i += rows as i32;
            }
        }
        if sent.len() < out.len() {
            return Err(format!(
                "{NAME}: whole rows cannot send PE {p}'s rows passed on on its value loops"
            ));
        }
        // In the order of the cuts.
        let mut rides = sent.into_iter();
        let sent = all
            .iter()
            .map(|cut| {
                if cut.keep > 0 {
                    split_sent.iter().find(|x| x.0 == cut.t).map_or(0, |x| x.1)
                } else {
                    rides.next().unwrap_or(0)
                }
            })
            .collect();
        Ok((nodes, sent))
    }

    /// The second part of a row passed on to PE `p`: the maxima the first part left, the
    /// exponentials and their sum, `y` from every key's v row, and the divisions.
    fn second(&self, p: u32, cut: &Cut, scale: f32) -> Vec<Node> {
        let pe = self.pe(p);
        let d = i64::from(self.d);
        let t = cut.t;
        let sc = ad(cut.sc);
        let mx = ad(cut.mx);
        let l = ad(cut.l);
        let mut body = Vec::new();
        if cut.keep > 0 {
            return self.split_columns(p, cut);
        }
        let top = if cut.c == t + 1 {
            sc.clone().plus(i64::from(t) + 1)
        } else {
            let first = if cut.c >= 2 {
                sc.clone().plus(i64::from(t) + 1)
            } else {
                sc.clone()
            };
            let c = i64::from(cut.c);
            body.push(B::new().max(first, sc.clone().plus(c), mx.clone()).build());
            body.extend(lp(
                t - cut.c,
                vec![B::new()
                    .max(mx.clone(), sc.clone().plus(c + 1).t(2, 1), mx.clone())
                    .build()],
            ));
            mx
        };
        body.push(
            B::new()
                .expd(sc.clone(), top.clone(), scale, sc.clone())
                .add(None, l.clone())
                .build(),
        );
        let e = sc.clone().plus(1).t(2, 1);
        body.extend(lp(
            t,
            vec![B::new()
                .expd(e.clone(), top, scale, e)
                .add(Some(l.clone()), l.clone())
                .build()],
        ));
        let per_weight = !self.norm.defers(t + 1, self.d);
        if per_weight {
            let w = sc.clone().t(2, 1);
            body.extend(lp(
                t + 1,
                vec![B::new().div(w.clone(), l.clone(), w).build()],
            ));
        }
        let yc = ad(cut.y).t(0, d).t(2, 1);
        let v = ad(pe.vb).t(2, 1);
        let cols = weighted_columns(t, d, sc, v, &yc);
        body.extend(lp(self.d, cols));
        if !per_weight {
            body.extend(lp(self.d, vec![B::new().div(yc.clone(), l, yc).build()]));
        }
        lp(1, body)
    }

    /// The columns `keep … d − 1` of a row split by its columns, on the next PE `p`: each the
    /// weighted sum of the exponentials (weights, per weight) the row's PE sent, then deferred
    /// divided by the sum it sent.
    fn split_columns(&self, p: u32, cut: &Cut) -> Vec<Node> {
        let pe = self.pe(p);
        let d = i64::from(self.d);
        let (t, keep) = (cut.t, cut.keep);
        let sc = ad(cut.sc);
        let yc = ad(cut.y + keep).t(0, d).t(2, 1);
        let v = ad(pe.vb + keep).t(2, 1);
        let cols = weighted_columns(t, d, sc, v, &yc);
        let mut body = lp(self.d - keep, cols);
        if self.norm.defers(t + 1, self.d) {
            body.extend(lp(
                self.d - keep,
                vec![B::new().div(yc.clone(), ad(cut.l), yc).build()],
            ));
        }
        lp(1, body)
    }
}

/// One column of a row's output, `y[c] = Σ_k w[k]·v[k][c]` over the row's `t + 1` weights at
/// `sc` (the first starting the sum), for the column loop around it to step `v` and `yc` on.
fn weighted_columns(t: u32, d: i64, sc: Ad, v: Ad, yc: &Ad) -> Vec<Node> {
    vec![
        B::new()
            .mul(sc.clone(), v.clone(), None)
            .add(None, yc.clone())
            .build(),
        Node::Loop(Loop::new(
            t,
            vec![B::new()
                .mul(sc.plus(1).t(3, 1), v.plus(d).t(3, d), None)
                .add(Some(yc.clone()), yc.clone())
                .build()],
        )),
    ]
}

/// `loops` as the loops of one row: fixed counts.
fn fixed(loops: &[KeyLoop]) -> Vec<KeyLoop> {
    loops
        .iter()
        .map(|x| KeyLoop {
            stepped: false,
            ..*x
        })
        .collect()
}

/// Which key loop of which row carries which piece of the block: `(row, loop, piece)`, each
/// loop carrying at most one piece no longer than its count; pieces longer than any free loop
/// are split. `None` if the loops do not hold them all.
fn assign(pieces: &[Piece], rows: &[Vec<KeyLoop>]) -> Option<Vec<(usize, usize, Piece)>> {
    let mut free: Vec<(usize, usize, u32)> = rows
        .iter()
        .enumerate()
        .flat_map(|(r, loops)| {
            loops
                .iter()
                .enumerate()
                .filter(|x| x.1.count > 0)
                .map(move |(i, x)| (r, i, x.count))
        })
        .collect();
    let mut todo: Vec<Piece> = pieces.to_vec();
    let mut plan = Vec::new();
    while let Some(at) = (0..todo.len()).max_by_key(|&i| (todo[i].len, std::cmp::Reverse(i))) {
        let piece = todo.swap_remove(at);
        // The smallest loop that holds it whole, else the largest, and the rest again.
        let fit = (0..free.len())
            .filter(|&i| free[i].2 >= piece.len)
            .min_by_key(|&i| (free[i].2, free[i].0, free[i].1));
        let pick =
            fit.or_else(|| (0..free.len()).max_by_key(|&i| (free[i].2, std::cmp::Reverse(i))))?;
        let (r, l, cap) = free.swap_remove(pick);
        let len = piece.len.min(cap);
        plan.push((r, l, Piece { len, ..piece }));
        if len < piece.len {
            todo.push(Piece {
                start: piece.start + len,
                len: piece.len - len,
                ..piece
            });
        }
    }
    Some(plan)
}

/// The whole-rows programs for `p` on `m` PEs (see the module's doc), if every PE's memory is
/// within `budget` words (checked before anything is built).
pub fn run(p: &Problem, m: u32, budget: Option<u64>) -> Result<Stream, String> {
    let mut best = build(p, m, budget, Normalisation::Deferred)?;
    // One division per weight takes `t + 1` divisions for row `t` where deferred
    // normalisation takes `d`; per row, whichever is fewer. Which leaves the busiest PE
    // shortest only the built programs' cycles tell exactly.
    for norm in [Normalisation::PerWeight, Normalisation::PerRow] {
        if let Ok(w) = build(p, m, budget, norm) {
            if w.cycles < best.cycles {
                best = w;
            }
        }
    }
    // Rows passed on to the next PE even out what whole rows cannot; kept only where they
    // take fewer cycles, so that every other layer's programs stay as they were.
    for norm in NORMS {
        if let Ok(w) = build_with(p, m, budget, norm, Pass::Rows, Timing::Block, None) {
            if w.cycles < best.cycles {
                best = w;
            }
        }
    }
    // Steps that start as soon as the words they read are there rather than the whole block
    // (where waiting for whole blocks leaves some step waiting: otherwise nothing changes but
    // what the rows wait for), with and without rows passed on, and rows split by their
    // columns; kept only where that takes fewer cycles.
    let word = word_lines(p, m).ok().flatten();
    let (timing, passes): (Timing, &[Pass]) = match word {
        Some(_) => (Timing::Word, &[Pass::Off, Pass::Rows, Pass::Split]),
        None => (Timing::Block, &[Pass::Split]),
    };
    for &pass in passes {
        for norm in NORMS {
            if let Ok(w) = build_with(p, m, budget, norm, pass, timing, word.as_deref()) {
                if w.cycles < best.cycles {
                    best = w;
                }
            }
        }
    }
    Ok(best)
}

/// Every PE's ring steps' words read and sent ([`line`]), where the steps waiting for whole
/// blocks leave some step waiting; `None` where none waits.
fn word_lines(p: &Problem, m: u32) -> Result<Option<Vec<Vec<Line>>>, String> {
    let deal = Deal::new(p.tokens, p.dim, m, p.heads, Normalisation::Deferred)
        .ok_or_else(|| format!("{NAME}: whole rows do not deal the layer"))?;
    let mu = m as usize;
    let steps: Vec<Vec<(Vec<Node>, u64)>> = (0..m)
        .map(|pe| (0..m).map(|s| deal.step(pe, s)).collect::<Result<_, _>>())
        .collect::<Result<_, _>>()?;
    let mut start = vec![vec![0u64; mu]; mu];
    let mut end = vec![0u64; mu];
    let mut waits = false;
    for s in 0..mu {
        for pe in 0..mu {
            let q = (pe + mu - 1) % mu;
            let ready = if s == 0 {
                0
            } else {
                start[q][s - 1] + steps[q][s - 1].1
            };
            waits |= ready > end[pe];
            start[pe][s] = end[pe].max(ready);
            end[pe] = start[pe][s] + head_cycles(&steps[pe][s].0);
        }
    }
    if !waits {
        return Ok(None);
    }
    step_lines(&deal, &steps).map(Some)
}

/// [`line`] of every PE's ring steps.
fn step_lines(deal: &Deal, steps: &[Vec<(Vec<Node>, u64)>]) -> Result<Vec<Vec<Line>>, String> {
    let words = deal.pes.iter().map(|x| x.words).max().unwrap_or(0);
    steps
        .iter()
        .map(|st| st.iter().map(|x| line(&x.0, words)).collect())
        .collect()
}

/// The normalisations whole rows are built under, in the order that wins ties.
const NORMS: [Normalisation; 3] = [
    Normalisation::Deferred,
    Normalisation::PerWeight,
    Normalisation::PerRow,
];

/// Which rows a PE passes on to the next.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Pass {
    /// None: every row whole on its PE.
    Off,
    /// Rows after their first maxima.
    Rows,
    /// Rows after their first maxima, or after their whole softmax with some of their output
    /// columns left to the next PE.
    Split,
}

/// When a ring step may start.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Timing {
    /// Once the block it reads is whole on its PE.
    Block,
    /// Once every word it reads has arrived by the cycle it reads it.
    Word,
}

/// The whole-rows programs under the normalisation `norm`, whatever the others would take.
pub fn run_as(p: &Problem, m: u32, norm: Normalisation) -> Result<Stream, String> {
    build(p, m, None, norm)
}

/// The whole-rows programs under `norm` with rows passed on, an error where passing rows on
/// does not shorten the layer.
pub fn run_passed_as(p: &Problem, m: u32, norm: Normalisation) -> Result<Stream, String> {
    build_with(p, m, None, norm, Pass::Rows, Timing::Block, None)
}

/// The whole-rows programs under `norm`, rows passed on as `pass` says (an error where that
/// does not shorten the layer), each step starting as `timing` says.
pub fn run_timed_as(
    p: &Problem,
    m: u32,
    norm: Normalisation,
    pass: Pass,
    timing: Timing,
) -> Result<Stream, String> {
    build_with(p, m, None, norm, pass, timing, None)
}

fn build(p: &Problem, m: u32, budget: Option<u64>, norm: Normalisation) -> Result<Stream, String> {
    build_with(p, m, budget, norm, Pass::Off, Timing::Block, None)
}

/// [`build`], with rows passed on to the next PE where that shortens the busiest PE
/// (`pass`), else without.
fn build_with(
    p: &Problem,
    m: u32,
    budget: Option<u64>,
    norm: Normalisation,
    pass: Pass,
    timing: Timing,
    lines: Option<&[Vec<Line>]>,
) -> Result<Stream, String> {
    if let Some(why) = unsupported(p, m) {
        return Err(why);
    }
    let (n, d, heads) = (p.tokens, p.dim, p.heads);
    let scale = p.scale as f32;
    let mut deal = Deal::new(n, d, m, heads, norm).ok_or_else(|| {
        format!("{NAME}: whole rows do not deal the layer in two progressions per PE within 32-bit addresses")
    })?;
    let check = |deal: &Deal| {
        let words = deal.pes.iter().map(|x| x.words).max().unwrap_or(0);
        if budget.is_some_and(|b| u64::from(words) > b) {
            return Err(format!(
                "{NAME}: whole rows need {words} words per PE, more than {}",
                budget.unwrap_or(0)
            ));
        }
        Ok(())
    };
    check(&deal)?;
    let mu = m as usize;
    let prev = |pe: usize| (pe + mu - 1) % mu;
    let steps: Vec<Vec<(Vec<Node>, u64)>> = (0..m)
        .map(|pe| (0..m).map(|s| deal.step(pe, s)).collect::<Result<_, _>>())
        .collect::<Result<_, _>>()?;
    // By word: when each step first reads each word and sends each word, from its start (the
    // steps are the same under every normalisation and whatever rows are passed on).
    let own;
    let lines: &[Vec<Line>] = match (timing, lines) {
        (Timing::Block, _) => &[],
        (Timing::Word, Some(x)) => x,
        (Timing::Word, None) => {
            own = step_lines(&deal, &steps)?;
            &own
        }
    };
    // Each step waits until the block it reads is whole on its PE (the PE before forwards it
    // from the start of its step before), or by word until each word it reads has arrived
    // (a word sent in one cycle is read from the next). A word is read late in its step where
    // the step computes on it, so the lag keeps its sign.
    let mut waits = vec![vec![0u64; mu]; mu];
    let mut start = vec![vec![0u64; mu]; mu];
    let mut end = vec![0u64; mu];
    for s in 0..mu {
        for pe in 0..mu {
            let q = prev(pe);
            let ready = match timing {
                _ if s == 0 => 0,
                Timing::Block => start[q][s - 1] + steps[q][s - 1].1,
                Timing::Word => {
                    let (sent, reads) = (&lines[q][s - 1], &lines[pe][s]);
                    let lag = sent
                        .sent
                        .iter()
                        .filter_map(|(a, &t)| reads.read.get(a).map(|&r| t as i64 + 1 - r as i64))
                        .max()
                        .unwrap_or(0);
                    (start[q][s - 1] as i64 + lag).max(0) as u64
                }
            };
            let at = end[pe].max(ready);
            waits[pe][s] = at - end[pe];
            start[pe][s] = at;
            end[pe] = at + head_cycles(&steps[pe][s].0);
        }
    }
    // When every word the ring pass brings has arrived, which the rows after it wait for: the
    // own block home on the last step of the PE before (the last hop's v rows, which no step
    // reads).
    let home = |pe: usize| -> u64 {
        let start = &start;
        let q = prev(pe);
        match timing {
            Timing::Block => start[q][mu - 1] + steps[q][mu - 1].1,
            Timing::Word => (0..mu)
                .map(|s| start[q][s] + lines[q][s].sent.values().map(|&t| t + 1).max().unwrap_or(0))
                .max()
                .unwrap_or(0),
        }
    };
    if pass != Pass::Off {
        // Where each PE would end with whole rows: the ring pass's waits stay as they are,
        // so what passing rows on can even out is these ends.
        let ends = (0..mu)
            .map(|pe| {
                let (nodes, _) = deal.all_values(pe as u32, scale)?;
                Ok(end[pe].max(home(pe)) + head_cycles(&nodes))
            })
            .collect::<Result<Vec<u64>, String>>()?;
        // Each row a PE passes on rides on a nest of its own: where the plan passes more
        // than its nests take, fewer rows per boundary are planned.
        let cut = (1..=MAX_CUTS).rev().find_map(|most| {
            let cuts = match pass {
                Pass::Split => deal.plan_split(&ends, most)?,
                _ => deal
                    .plan(&ends, most)?
                    .into_iter()
                    .map(|(p, t, c)| (p, t, c, 0))
                    .collect(),
            };
            let cut = deal.clone().with_cuts(&cuts, heads)?;
            (0..m)
                .all(|pe| cut.all_values(pe, scale).is_ok())
                .then_some(cut)
        });
        deal =
            cut.ok_or_else(|| format!("{NAME}: passing rows on does not shorten the busiest PE"))?;
        check(&deal)?;
    }
    let mut bodies = Vec::with_capacity(mu);
    // When each PE's rows passed on have reached the next PE.
    let mut arrive: Vec<Vec<u64>> = vec![Vec::new(); mu];
    let mut tails = Vec::with_capacity(mu);
    for pe in 0..mu {
        let mut body = Vec::new();
        for (s, (nodes, _)) in steps[pe].iter().enumerate() {
            body.extend(wait(waits[pe][s])?);
            body.extend(nodes.iter().cloned());
        }
        let (nodes, sent) = deal.all_values(pe as u32, scale)?;
        let home = home(pe);
        body.extend(wait(home.saturating_sub(end[pe]))?);
        let from = end[pe].max(home);
        arrive[pe] = sent.iter().map(|x| from + x).collect();
        tails.push(from + head_cycles(&nodes));
        body.extend(nodes);
        bodies.push(body);
    }
    // Each PE takes the rows passed on to it last, once their words are there.
    for (pe, body) in bodies.iter_mut().enumerate() {
        let from = prev(pe) as u32;
        let mut at = tails[pe];
        for (k, cut) in deal.cuts.iter().filter(|x| x.from == from).enumerate() {
            // They read the v rows of any block: all of them home first.
            let ready = arrive[from as usize][k].max(home(pe));
            body.extend(wait(ready.saturating_sub(at))?);
            let part = deal.second(pe as u32, cut, scale);
            at = at.max(ready) + head_cycles(&part);
            body.extend(part);
        }
    }
    // Steps whose rows see their blocks alike (a run of blocks before or after the PE's, whose
    // first periods agree) continue one another: one loop over them.
    let programs = head_programs(
        bodies,
        (m, heads),
        |pe| deal.pes[pe].words,
        |raw| super::merge::merge(super::merge::merge_at(super::once::strip(raw), 1)),
    )?;
    let cycles = programs.iter().map(LoopProgram::cycles).max().unwrap_or(0);
    // Per-element placements leave the proof to the flattened programs (the checks without
    // unrolling take affine layouts only), and `attnc verify` flattens at most this many
    // bundles: a layer beyond it would be written unprovable, so it keeps another stream.
    let bundles = cycles.saturating_mul(u64::from(m));
    if bundles > FLAT_PROOF_BUNDLES {
        return Err(format!(
            "{NAME}: whole rows would take {bundles} bundles, more than the {FLAT_PROOF_BUNDLES} the flattened proof takes"
        ));
    }
    let weights = u64::from(n) * (u64::from(n) + 1) / 2 * u64::from(heads);
    let divisions: u64 = (0..n)
        .map(|t| {
            if norm.defers(t + 1, d) {
                u64::from(d)
            } else {
                u64::from(t) + 1
            }
        })
        .sum::<u64>()
        * u64::from(heads);
    // Each PE's map has its own sizes (its rows).
    Ok(Stream::per_pe(
        programs,
        places(&deal, heads),
        cycles,
        (weights, weights),
        (n, d, heads),
        (0, norm, divisions),
    ))
}

/// Every element's word: q, k, v and y of token `t` on the PE that owns its row.
fn places(deal: &Deal, heads: u32) -> (BTreeMap<String, Place>, Place) {
    let (n, d) = (deal.n, deal.d);
    let mut owner = vec![(0u32, 0u32); n as usize];
    for (p, pe) in deal.pes.iter().enumerate() {
        for (i, &t) in pe.tokens.iter().enumerate() {
            owner[t as usize] = (p as u32, i as u32);
        }
    }
    let mut lists: [(Vec<u32>, Vec<u32>); 4] = Default::default();
    for h in 0..heads {
        for &(p, i) in &owner {
            let pe = &deal.pes[p as usize];
            let rows = pe.rows();
            for c in 0..d {
                let kv = pe.kv + h * 2 * rows * d + i * d + c;
                let t = pe.tokens[i as usize];
                // A row passed on ends on the next PE.
                // A row split by its columns keeps its first columns.
                let (yp, ya) = match deal.cuts.iter().find(|x| x.from == p && x.t == t) {
                    Some(cut) if c >= cut.keep => ((p + 1) % deal.m, cut.y + h * d + c),
                    _ => (p, pe.y + (h * rows + i) * d + c),
                };
                let at = [
                    (p, pe.q + (h * rows + i) * d + c),
                    (p, kv),
                    (p, kv + rows * d),
                    (yp, ya),
                ];
                for (list, (q, a)) in lists.iter_mut().zip(at) {
                    list.0.push(q);
                    list.1.push(a);
                }
            }
        }
    }
    let [q, k, v, y] = lists.map(|(pe, addr)| Place::Listed {
        tokens: n,
        dim: d,
        pe,
        addr,
    });
    let inputs = BTreeMap::from([
        ("q".to_string(), q),
        ("k".to_string(), k),
        ("v".to_string(), v),
    ]);
    (inputs, y)
}

/// The amounts passed over every boundary of the ring that bring the latest PE's end lowest,
/// found by bisection on that end between the even share and the end without passing:
/// `wraps` lists the amounts the last boundary (PE `m − 1` to PE 0) may carry, tried first,
/// and `pass(p, fin, top)` the least amount PE `p` passes on to end by `top` having received
/// `fin`. `None` when no amounts end below the PEs' largest load.
fn least_flows<I: Iterator<Item = u64>>(
    loads: &[u64],
    wraps: impl Fn() -> I,
    pass: impl Fn(usize, u64, u64) -> Option<u64>,
) -> Option<Vec<u64>> {
    let m = loads.len();
    let walk = |top: u64| -> Option<Vec<u64>> {
        'wrap: for wf in wraps() {
            let mut flows = Vec::with_capacity(m);
            let mut fin = wf;
            for p in 0..m - 1 {
                let Some(x) = pass(p, fin, top) else {
                    continue 'wrap;
                };
                fin = x;
                flows.push(x);
            }
            if loads[m - 1] + fin <= top + wf {
                flows.push(wf);
                return Some(flows);
            }
        }
        None
    };
    let total: u64 = loads.iter().sum();
    let plain = loads.iter().copied().max().unwrap_or(0);
    let (mut lo, mut hi) = (total.div_ceil(m as u64), plain);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if walk(mid).is_some() {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    if lo >= plain {
        return None;
    }
    walk(lo)
}

#[cfg(test)]
mod tests {
    use super::*;
    use runtime::layer::Softmax;

    /// The programs execute the operations of the formulation they declare and, deferred or
    /// per row, one more per head (token 0's maximum copies its only score), validate, and
    /// every PE's is as long as the layer; the padded stream takes more cycles on the shapes
    /// the deal is for.
    #[test]
    fn programs_execute_the_formulation_and_beat_padding() {
        for (n, d, h, m) in [(29u32, 3u32, 2u32, 3u32), (64, 8, 1, 6), (128, 16, 1, 12)] {
            let p = Problem::attention(n, d, h, false, true, Softmax::Safe);
            let st = run(&p, m, None).unwrap();
            let need = p.shape().necessary_as(st.normalisation).unwrap();
            let copy = u64::from(st.normalisation != Normalisation::PerWeight);
            assert_eq!(
                st.total_ops,
                need.total() + copy * u64::from(h),
                "n={n} m={m}"
            );
            for lp in &st.programs {
                lp.validate().unwrap();
                assert_eq!(lp.cycles(), st.cycles, "n={n} m={m} PE {}", lp.pe);
            }
            if n >= 64 {
                let padded = super::super::run_with(&p, m, true, super::super::Lag::Off).unwrap();
                assert!(st.cycles < padded.cycles, "n={n} m={m}");
            }
        }
    }

    /// Rings that deal the tokens in equal chunks, and non-causal or shared layers, are not
    /// for whole rows.
    #[test]
    fn refuses_what_it_is_not_for() {
        let even = Problem::attention(48, 4, 1, false, true, Softmax::Safe);
        assert!(unsupported(&even, 4).is_some());
        let open = Problem::attention(50, 4, 1, false, false, Softmax::Safe);
        assert!(unsupported(&open, 4).is_some());
        let plain = Problem::attention(50, 4, 1, false, true, Softmax::Plain);
        assert!(unsupported(&plain, 4).is_some());
        let short = Problem::attention(15, 4, 1, false, true, Softmax::Safe);
        assert!(unsupported(&short, 4).is_some());
        assert!(
            unsupported(&Problem::attention(50, 4, 1, false, true, Softmax::Safe), 4).is_none()
        );
        // 720,764 cycles on 12 PEs: more bundles than the flattened proof takes.
        let big = Problem::attention(128, 128, 4, false, true, Softmax::Safe);
        assert!(unsupported(&big, 12).is_none());
        assert!(run(&big, 12, None).is_err());
    }

    /// The deal gives every token to exactly one PE, zigzag over the periods from the top.
    #[test]
    fn every_token_is_dealt_once_and_periods_zigzag() {
        for (n, m) in [(64u32, 6u32), (128, 6), (128, 12), (29, 3), (50, 4)] {
            let rows = deal(n, m, 8);
            let mut all: Vec<u32> = rows.iter().flatten().copied().collect();
            all.sort_unstable();
            assert_eq!(all, (0..n).collect::<Vec<_>>(), "n={n} m={m}");
            let rest = n % (2 * m);
            for (p, r) in rows.iter().enumerate() {
                let p = p as u32;
                for t in r.iter().filter(|&&t| t >= rest) {
                    let pos = (t - rest) % (2 * m);
                    assert!(pos == p || pos == 2 * m - 1 - p, "n={n} m={m} t={t} p={p}");
                }
            }
        }
    }
}
