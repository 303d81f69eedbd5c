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
//! its necessary operations plus, per merged cut row and head, the merge's `d + 2`. Where a
//! first part's share of its PE's work is at most its scores' (about half a row), the row is
//! passed on instead: the first part's scores and their maximum go to the second part's score
//! row as they are read, and the second part takes the whole row's softmax, with no merge.
//!
//! Passing leaves the first part's PE more of its work in the ring pass than the next PE, which
//! would catch up with it and wait for blocks; since every block stays, score nests of the
//! steps before such a wait can run after the ring pass instead (late scores), and a passed
//! first part can take only two keys of step 0's block (lean), shortening the step no score
//! may leave.

use std::collections::BTreeMap;

use isa::{Cmp, LoopProgram, Node, Pred, Slot};

use super::{ad, head_programs, lp, wait, Ad, Place, Send, Stream, B, NAME};
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

/// What one part of a cut row takes of the block of a ring step: keys `k0 … k0 + keys − 1`
/// (the whole block, or the share of it that evens the two PEs' cycles out).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Piece {
    step: u32,
    k0: u32,
    keys: u32,
    /// A passed first part's last keys of the piece whose maxima its PE leaves to the second
    /// part's (each moves one operation to the next PE: the deal's fine adjustment).
    loose: u32,
}

/// One PE's share and memory map.
#[derive(Clone, Debug)]
struct Pe {
    /// First token whose q, k, v rows it holds (`⌈x_p⌉`).
    first: u32,
    /// Tokens whose rows start in its stretch: its k/v block.
    own: u32,
    /// The row cut at `x_p`: its second part is local row 0 here, against these pieces of the
    /// ring steps' blocks (the keys the first part, on the PE before, does not take; step 0's,
    /// of the own block, after the ring pass).
    cut_in: Option<Vec<Piece>>,
    /// The row cut at `x_{p+1}`: its first part is the last local row, against these pieces
    /// (step 0's whole block among them).
    cut_out: Option<Vec<Piece>>,
    /// Whether the row cut at `x_p` (`pass_in`) or at `x_{p+1}` (`pass_out`) is passed on
    /// rather than merged: its first part computes scores and their maximum only and sends
    /// them on, and the second part takes the whole row's softmax.
    pass_in: bool,
    pass_out: bool,
    /// Its last whole row is handed to the next PE after the ring pass (`hand_out`: its
    /// scores and maximum go on, the next PE takes its exponentials, values and divisions), or
    /// it takes such a row from the PE before (`hand_in`, local row `c2 + full`).
    hand_out: bool,
    hand_in: bool,
    /// The handed row's last keys in step 0 (the own block) whose maxima the next PE takes,
    /// as a cut row's loose ones.
    hand_loose: u32,
    /// Rows wholly its own.
    full: u32,
    rows: u32,
    q: u32,
    /// The own block, per head `[k rows][v rows]`.
    kv: u32,
    y: u32,
    /// Every other block of the head as it arrives, in token order: the k row of token `t` at
    /// `kb + t·d`, its v row at `vb + t·d`.
    kb: u32,
    vb: u32,
    /// Scores, one row of `n` per local row (column = key token), then its exponentials.
    s: u32,
    /// Running maxima, then (`mx + rows`) the sums `l`.
    mx: u32,
    l: u32,
    /// The first part's maximum, `l` and `y` row, from the PE before.
    rcv: u32,
    /// The first part's rescale factor.
    tmp: u32,
    words: u32,
}

impl Pe {
    fn c2(&self) -> u32 {
        u32::from(self.cut_in.is_some())
    }
    fn piece_in(&self, s: u32) -> Option<Piece> {
        self.cut_in
            .as_ref()
            .and_then(|i| i.iter().copied().find(|x| x.step == s))
    }
    fn piece_out(&self, s: u32) -> Option<Piece> {
        self.cut_out
            .as_ref()
            .and_then(|o| o.iter().copied().find(|x| x.step == s))
    }
    /// The second part's first ring step (its own block, step 0, comes after the pass).
    fn in_first(&self) -> Option<u32> {
        self.cut_in
            .as_ref()
            .and_then(|i| i.iter().map(|x| x.step).filter(|&s| s > 0).min())
    }
}

/// What a score loop's link slot carries.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fwd {
    None,
    /// The block, to the next PE's buffers: k rows on row 0's loops, v rows on row 1's.
    Block,
    /// The row's q row, to local row 0 of the next PE (the second part of the cut row).
    Q,
}

struct Deal {
    n: u32,
    d: u32,
    m: u32,
    /// Whether cut rows may be passed on rather than merged, and whether passed first parts
    /// leave maxima loose: whether each takes a key more (rather than the nearest count), and
    /// by how many cycles each cut's (index `p`) should shorten its first part's PE.
    pass: bool,
    loose: Option<(bool, Vec<u64>)>,
    /// Per boundary `p` (`0 … m`): the first token whose row starts in PE `p`'s stretch, and
    /// whether the token before it is cut (its first part on PE `p − 1`).
    bounds: Vec<(u32, bool)>,
    /// Per boundary: whether PE `p − 1` hands its last whole row to PE `p`.
    hands: Vec<bool>,
    /// Each row divides its `n` weights by their sum before the values instead of its `d`
    /// output elements after them (only with no cut row merged: a merged first part's
    /// weights never meet the row's sum).
    per_weight: bool,
    /// A passed first part takes only two keys of step 0's block (its first maximum and the
    /// q row's carrier), the second part the rest one step later: the first part's PE's step 0
    /// is then shorter, so that the next PE's early steps do not wait for its blocks.
    lean: bool,
    pes: Vec<Pe>,
}

impl Deal {
    /// The first token whose row starts in PE `p`'s stretch (`⌈p·n/m⌉`, one more where the
    /// boundary hands a row).
    fn start(&self, p: u32) -> u32 {
        self.bounds[p as usize].0
    }
    /// Whether the row before boundary `p` is cut.
    fn cut(&self, p: u32) -> bool {
        self.bounds[p as usize].1
    }
    /// First token and size of PE `b`'s block.
    fn block(&self, b: u32) -> (u32, u32) {
        let t = self.start(b);
        (t, self.start(b + 1) - t)
    }
    /// Block held by PE `p` in ring step `s`.
    fn held(&self, p: u32, s: u32) -> u32 {
        (p + self.m - s) % self.m
    }
    fn pe(&self, p: u32) -> &Pe {
        &self.pes[p as usize]
    }
    fn next(&self, p: u32) -> &Pe {
        &self.pes[((p + 1) % self.m) as usize]
    }

    fn new(
        n: u32,
        d: u32,
        m: u32,
        heads: u32,
        (pass, loose, hand, per_weight, lean): How,
    ) -> Option<Deal> {
        // A boundary whose first part would hold more than half a row (more than a passed
        // first part of scores can) moves a token on where rows are handed: the PE before
        // owns one whole row more and hands one to the next PE, whose cut row's first part is
        // then the smaller rest.
        let (nn, mm) = (u64::from(n), u64::from(m));
        let hands: Vec<bool> = (0..=m)
            .map(|p| {
                let frac = u64::from(p) * nn % mm;
                hand && p > 0 && p < m && 2 * frac > mm
            })
            .collect();
        let bounds: Vec<(u32, bool)> = (0..=m)
            .map(|p| {
                let x = u64::from(p) * nn;
                let start = x.div_ceil(mm) as u32 + u32::from(hands[p as usize]);
                (start, x % mm != 0)
            })
            .collect();
        // A PE takes one handed row at most, and hands none then.
        if (1..m as usize).any(|p| hands[p] && hands[p - 1]) {
            return None;
        }
        let mut deal = Deal {
            n,
            d,
            m,
            pass,
            loose,
            lean,
            bounds,
            hands,
            per_weight,
            pes: Vec::new(),
        };
        let cuts = deal.cuts();
        if per_weight && cuts.iter().flatten().any(|x| !x.1) {
            return None;
        }
        let (dd, h) = (u64::from(d), u64::from(heads));
        for p in 0..m {
            let (first, own) = deal.block(p);
            let pass_out = cuts[p as usize + 1].as_ref().is_some_and(|x| x.1);
            let pass_in = cuts[p as usize].as_ref().is_some_and(|x| x.1);
            let cut_out = cuts[p as usize + 1].as_ref().map(|x| x.0.clone());
            // The second part takes the blocks the first does not: on this PE, one step later.
            let cut_in = cuts[p as usize]
                .as_ref()
                .map(|out| deal.rest(p - 1, &out.0));
            let full = own - u32::from(cut_out.is_some());
            let hand_out = deal.hands[p as usize + 1];
            let hand_in = deal.hands[p as usize];
            // What the cut's loose maxima leave of the shortening asked for, from the handed
            // row's step 0 (its first maximum keeps two keys; one send of its own).
            let hand_loose = match (&deal.loose, &cuts[p as usize + 1]) {
                (Some(want), Some((pieces, true))) if hand_out => {
                    let sends = pieces
                        .iter()
                        .filter(|x| x.loose > 0)
                        .map(|x| if x.step == 0 { 2 } else { 1 })
                        .sum::<u64>();
                    let got = pieces.iter().map(|x| u64::from(x.loose)).sum::<u64>();
                    let left = (want.1[p as usize + 1] + sends).saturating_sub(got);
                    if left > 0 {
                        u32::try_from(left + 1)
                            .unwrap_or(u32::MAX)
                            .min(own.saturating_sub(2))
                    } else {
                        0
                    }
                }
                _ => 0,
            };
            // The handed row's local row sits between the whole rows and a cut row's first
            // part, which must then be passed (a first part in the whole rows' loops would not
            // be the last of them).
            if hand_in && cut_out.is_some() && !pass_out {
                return None;
            }
            if (hand_out && !pass_out) || (hand_in && !pass_in) {
                return None;
            }
            let rows = full
                + u32::from(cut_in.is_some())
                + u32::from(cut_out.is_some())
                + u32::from(hand_in);
            let r = u64::from(rows);
            let q = 0u64;
            let kv = q + h * r * dd;
            let y = kv + h * 2 * u64::from(own) * dd;
            let kb = y + h * r * dd;
            let vb = kb + nn * dd;
            let s = vb + nn * dd;
            let mx = s + r * nn;
            let l = mx + r;
            let rcv = l + r;
            let tmp = rcv + dd + 2;
            let words = tmp + 1;
            let w = |x: u64| u32::try_from(x).ok();
            deal.pes.push(Pe {
                first,
                own,
                cut_in,
                cut_out,
                pass_in,
                pass_out,
                hand_out,
                hand_in,
                hand_loose,
                full,
                rows,
                q: w(q)?,
                kv: w(kv)?,
                y: w(y)?,
                kb: w(kb)?,
                vb: w(vb)?,
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

    /// The ring steps of the first part of each cut row (index `p`: the row cut at `x_p`, its
    /// first part on PE `p − 1`), and whether the row is passed on (else merged). A part takes
    /// as many keys as bring its PE's cycles to the mean (to within half a block): `2d + 2`
    /// per score of a whole row (product, maximum, exponential, weighted value), `d` per row it
    /// normalises; a merged first part's keys cost the same and its merge `d + 3` on the next
    /// PE; a passed first part's keys only `d + 1` (product and maximum), the second part
    /// taking every exponential and value of the row. A row is passed wherever its first part
    /// can take the keys that even its PE out that way: passing spares the merge, but a first
    /// part of scores holds about half a row's work at most. Its steps are chosen so that its
    /// PE's work so far stays as close as it can to the even pace: a PE running ahead of the one
    /// before it would wait for blocks. Step 0 is always among them, so the q row the part
    /// sends on in that step is there before the second part's first step.
    fn cuts(&self) -> Vec<Option<(Vec<Piece>, bool)>> {
        let (n, m) = (u64::from(self.n), u64::from(self.m));
        let d = f64::from(self.d);
        let (pair, merge) = (2.0 * d + 2.0, d + 3.0);
        let count = (1..self.m).filter(|&p| self.cut(p)).count() as f64;
        let total = pair * (n * n) as f64 + self.divisions() * n as f64;
        // Which cuts merge follows from the mean, and the mean from the merges: from every cut
        // merged, until the count stays.
        let mut merges = count;
        let mut result = Vec::new();
        for _ in 0..4 {
            let mean = (total + merge * merges) / m as f64;
            result = self.cuts_at(mean);
            let now = result
                .iter()
                .filter(|x| x.as_ref().is_some_and(|x| !x.1))
                .count() as f64;
            if now == merges {
                break;
            }
            merges = now;
        }
        result
    }

    /// [`Deal::cuts`] for PEs whose cycles should come to `mean`.
    fn cuts_at(&self, mean: f64) -> Vec<Option<(Vec<Piece>, bool)>> {
        let (n, m) = (u64::from(self.n), u64::from(self.m));
        let mut cuts: Vec<Option<(Vec<Piece>, bool)>> = vec![None; self.m as usize + 1];
        let d = f64::from(self.d);
        let (pair, score, merge) = (2.0 * d + 2.0, d + 1.0, d + 3.0);
        // The second part on PE `q`, of the cut before, and whether it was passed.
        let mut taken_in: Vec<Piece> = Vec::new();
        let mut passed_in = false;
        // The maxima a passed first part left to the second part on PE `q`.
        let mut loose_in = 0u64;
        // A handed row's exponentials, values and divisions, on the PE it is handed to.
        let div = self.divisions();
        let handed = (pair - score) * n as f64 + div;
        for p in 1..self.m {
            let q = p - 1;
            // Rows wholly PE q's (a handed one among them).
            let whole = u64::from(self.start(p) - u32::from(self.cut(p)) - self.start(q));
            let hand = |x: u32| if self.hands[x as usize] { handed } else { 0.0 };
            if !self.cut(p) {
                taken_in.clear();
                continue;
            }
            // Work in key·rows, scaled by m: the even pace is n·n per step (n/m rows, n/m keys).
            let in_keys: u64 = taken_in.iter().map(|x| u64::from(x.keys)).sum();
            let in_at = |s: u32| {
                taken_in
                    .iter()
                    .find(|x| x.step == s && s > 0)
                    .map_or(0, |x| u64::from(x.keys))
            };
            let merged = !taken_in.is_empty();
            let fixed =
                pair * ((whole * n) as f64) + div * (whole + u64::from(merged)) as f64 + hand(q)
                    - hand(p)
                    + match (merged, passed_in) {
                        (false, _) => 0.0,
                        (true, true) => {
                            score * in_keys as f64 + (pair - score) * n as f64 + loose_in as f64
                        }
                        (true, false) => pair * in_keys as f64 + merge,
                    };
            let plan = |per_key: f64, paced: bool| {
                let want = ((mean - fixed) / per_key).max(1.0);
                let target = (want * m as f64).round() as u64;
                let mut keys = 0u64;
                let mut work = 0u64;
                let mut pieces = Vec::new();
                for s in 0..self.m {
                    let b = u64::from(self.block(self.held(q, s)).1);
                    work += (whole * b + in_at(s)) * m;
                    let pace = u64::from(s + 1) * n * n / m;
                    let budget = (keys + b) * m <= target;
                    if s == 0 && self.lean && per_key == score {
                        keys += 2;
                        work += 2 * m;
                        pieces.push(Piece {
                            step: 0,
                            k0: 0,
                            keys: 2,
                            loose: 0,
                        });
                    } else if s == 0 || (budget && (!paced || (work + b * m / 2) < pace)) {
                        keys += b;
                        work += b * m;
                        pieces.push(Piece {
                            step: s,
                            k0: 0,
                            keys: b as u32,
                            loose: 0,
                        });
                    }
                }
                // What whole blocks leave: the last step not taken shares its block (the
                // second part's side at least 2 keys, for a first maximum if it is the part's
                // first).
                // A passed part takes a key more rather than less, its PE's excess then moved
                // to the next PE by maxima left loose.
                let left = if per_key == score && self.loose.as_ref().is_some_and(|x| x.0) {
                    (want - keys as f64).ceil()
                } else {
                    (want - keys as f64).round()
                };
                // A passed part may share more than one block where one is not enough.
                let mut left = left.max(0.0) as u32;
                let shares = if per_key == score { self.m } else { 1 };
                for _ in 0..shares {
                    if left == 0 {
                        break;
                    }
                    let free = (1..self.m)
                        .rev()
                        .find(|s| !pieces.iter().any(|x| x.step == *s));
                    let Some(s) = free else { break };
                    let b = self.block(self.held(q, s)).1;
                    if b < 4 {
                        break;
                    }
                    let c = left.min(b - 2);
                    keys += u64::from(c);
                    left -= c;
                    pieces.push(Piece {
                        step: s,
                        k0: 0,
                        keys: c,
                        loose: 0,
                    });
                    pieces.sort_by_key(|x| x.step);
                }
                (pieces, (want - keys as f64).abs() <= 1.0)
            };
            let passed = self
                .pass
                .then(|| [plan(score, true), plan(score, false)])
                .and_then(|x| x.into_iter().find(|x| x.1));
            let (mut pieces, pass) = passed.unwrap_or_else(|| (plan(pair, true).0, false));
            // The excess in maxima left loose, from the last piece back; each piece with some
            // costs its PE a send (step 0's two: its q row's first word moves off the chains).
            loose_in = 0;
            let cut = self.loose.as_ref().map_or(0, |x| x.1[p as usize]);
            if pass && cut > 0 {
                let mut u = u32::try_from(cut).unwrap_or(u32::MAX);
                for x in pieces.iter_mut().rev() {
                    if u == 0 {
                        break;
                    }
                    // Step 0's first maximum keeps two keys, and its q row's first word
                    // takes a send of its own.
                    let (cap, sends) = if x.step == 0 {
                        (x.keys.saturating_sub(2), 2)
                    } else {
                        (x.keys, 1)
                    };
                    if cap == 0 {
                        continue;
                    }
                    u += sends;
                    let take = u.min(cap);
                    x.loose = take;
                    u -= take;
                    loose_in += u64::from(take);
                }
            }
            taken_in = self.rest(q, &pieces);
            passed_in = pass;
            cuts[p as usize] = Some((pieces, pass));
        }
        cuts
    }

    /// The second part of a cut row whose first part takes `out` on PE `q`: every key it does
    /// not, each block one ring step later on PE `q + 1`.
    fn rest(&self, q: u32, out: &[Piece]) -> Vec<Piece> {
        let mut rest: Vec<Piece> = (0..self.m)
            .filter_map(|s| {
                let b = self.block(self.held(q, s)).1;
                let taken = out.iter().find(|x| x.step == s).map_or(0, |x| x.keys);
                (taken < b).then_some(Piece {
                    step: (s + 1) % self.m,
                    k0: taken,
                    keys: b - taken,
                    loose: 0,
                })
            })
            .collect();
        rest.sort_by_key(|x| x.step);
        rest
    }

    /// Where PE `p` holds block `b`: its first k row, and how far its v rows are from its k rows.
    fn loc(&self, p: u32, b: u32) -> (Ad, i64) {
        let pe = self.pe(p);
        let d = i64::from(self.d);
        if b == p {
            (
                ad(pe.kv).t(0, 2 * i64::from(pe.own) * d),
                i64::from(pe.own) * d,
            )
        } else {
            let (t, _) = self.block(b);
            (ad(pe.kb + t * self.d), i64::from(pe.vb) - i64::from(pe.kb))
        }
    }

    /// Rows `lo … lo + rows − 1` of PE `p` against keys `k0 … k0 + keys − 1` of block `b`:
    /// scores into their score rows and their running maxima (`first`: the rows' first
    /// keys), the link slot carrying `fwd` (the whole block's words: only with all its keys).
    /// Also the cycles of one row.
    #[allow(clippy::too_many_arguments)] // one work: its rows, its keys, its flags
    fn scores(
        &self,
        p: u32,
        b: u32,
        (k0, keys): (u32, u32),
        lo: u32,
        rows: u32,
        first: bool,
        fwd: Fwd,
        (pass_to, loose): (Option<u32>, u32),
    ) -> (Vec<Node>, u64) {
        let pass_on = pass_to.is_some();
        // The local row on the next PE that takes the scores passed on.
        let to = pass_to.unwrap_or(0) * self.n;
        let pe = self.pe(p);
        let next = self.next(p);
        let (d, n) = (i64::from(self.d), i64::from(self.n));
        let (t0, _) = self.block(b);
        let (lr, lb, lc) = (1u8, 2u8, 3u8);
        let q = ad(pe.q + lo * self.d).t(0, i64::from(pe.rows) * d).t(lr, d);
        let (kloc, vdel) = self.loc(p, b);
        let k = kloc.clone().plus(i64::from(k0) * d).t(lb, d);
        let sc = ad(pe.s + lo * self.n + t0 + k0).t(lr, n);
        let send = |c0: i64, col: bool| {
            let cols = |x: Ad| if col { x.t(lc, 1) } else { x };
            match fwd {
                Fwd::None => None,
                Fwd::Block => Some(Send {
                    src: cols(kloc.clone().plus(c0).t(lr, vdel).t(lb, d)),
                    dst: cols(
                        ad(next.kb + t0 * self.d)
                            .plus(c0)
                            .t(lr, i64::from(next.vb) - i64::from(next.kb))
                            .t(lb, d),
                    ),
                    preds: vec![Pred {
                        slot: Slot::Xfer,
                        level: lr,
                        cmp: Cmp::Lt,
                        value: 2,
                    }],
                }),
                Fwd::Q => Some(Send {
                    src: cols(q.clone().plus(c0)),
                    dst: cols(ad(next.q).t(0, i64::from(next.rows) * d).plus(c0)),
                    preds: vec![Pred {
                        slot: Slot::Xfer,
                        level: lb,
                        cmp: Cmp::Eq,
                        value: 0,
                    }],
                }),
            }
        };
        // Loose keys (a passed part's last, without a maximum here) send each score from the
        // next key's chain, the last one after the loop.
        let loose_send = (loose > 0).then(|| {
            debug_assert!(fwd != Fwd::Block && rows == 1 && (!first || loose + 2 <= keys));
            Send {
                src: sc.clone().plus(-1).t(lb, 1),
                dst: ad(next.s + to + t0 + k0 - 1).t(lb, 1),
                preds: vec![Pred {
                    slot: Slot::Xfer,
                    level: lb,
                    cmp: Cmp::Ge,
                    value: keys - loose + 1,
                }],
            }
        });
        let mut score = vec![B::new()
            .mul(q.clone(), k.clone(), None)
            .add(None, sc.clone().t(lb, 1))
            .send(loose_send.clone().or(send(0, false)).as_ref())
            .build()];
        score.extend(lp(
            self.d - 1,
            vec![B::new()
                .mul(q.clone().plus(1).t(lc, 1), k.plus(1).t(lc, 1), None)
                .add(Some(sc.clone().t(lb, 1)), sc.clone().t(lb, 1))
                .send(send(1, true).as_ref())
                .build()],
        ));
        let mut body = lp(keys, score);
        let mx = ad(pe.mx + lo).t(lr, 1);
        // A first part's scores go on to the second part's score row (local row 0 of the next
        // PE, the same columns) as its maximum reads them, so that the second part takes the
        // whole row's softmax and nothing is merged.
        let on = |key: u32, by_key: bool| {
            pass_on.then(|| {
                let src = sc.clone().plus(i64::from(key));
                let dst = ad(next.s + to + t0 + k0 + key);
                let (src, dst) = if by_key {
                    (src.t(lb, 1), dst.t(lb, 1))
                } else {
                    (src, dst)
                };
                Send {
                    src,
                    dst,
                    preds: vec![Pred {
                        slot: Slot::Xfer,
                        level: lr,
                        cmp: Cmp::Eq,
                        value: rows.saturating_sub(1),
                    }],
                }
            })
        };
        // The last key's score, whose maximum a loose first part leaves to the next PE.
        let last_loose = || {
            B::new()
                .send(Some(&Send {
                    src: sc.clone().plus(i64::from(keys - 1)),
                    dst: ad(next.s + to + t0 + k0 + keys - 1),
                    preds: Vec::new(),
                }))
                .build()
        };
        if first {
            body.push(
                B::new()
                    .max(sc.clone(), sc.clone().plus(1), mx.clone())
                    .send(on(0, false).as_ref())
                    .build(),
            );
            body.extend(lp(
                keys.saturating_sub(2) - loose,
                vec![B::new()
                    .max(mx.clone(), sc.clone().plus(2).t(lb, 1), mx.clone())
                    .send(on(2, true).as_ref())
                    .build()],
            ));
            // The maximum took two scores in one bundle: the second goes on alone.
            if pass_on {
                body.push(B::new().send(on(1, false).as_ref()).build());
            }
            if loose > 0 {
                body.push(last_loose());
                // The q row's first word, whose bundle the loose keys' sends took.
                if fwd == Fwd::Q {
                    body.push(
                        B::new()
                            .send(Some(&Send {
                                src: q.clone(),
                                dst: ad(next.q).t(0, i64::from(next.rows) * d),
                                preds: Vec::new(),
                            }))
                            .build(),
                    );
                }
            }
        } else {
            body.extend(lp(
                keys - loose,
                vec![B::new()
                    .max(mx.clone(), sc.clone().t(lb, 1), mx.clone())
                    .send(on(0, true).as_ref())
                    .build()],
            ));
            if loose > 0 {
                body.push(last_loose());
            }
        }
        let row = cycles(&body);
        (lp(rows, body), row)
    }

    /// How many of step `s`'s score nests on PE `p` may wait until after the ring pass (see
    /// [`Deal::step`]): a first part's piece of its own, then the whole rows' loop from its
    /// bottom up, two rows staying to forward the block. Step 0 keeps everything (the rows'
    /// first maxima, the q row sent on), and so does a second part's piece (its first maximum
    /// may be in any step).
    fn deferrable(&self, p: u32, s: u32) -> u32 {
        if s == 0 {
            return 0;
        }
        let (lo, hi, out) = self.rows_of(p, s);
        let piece = u32::from(self.pe(p).piece_out(s).is_some() && !out);
        piece + (hi - lo).saturating_sub(2)
    }

    /// The main score loop's rows `lo … hi − 1` in ring step `s` on PE `p`, and whether a
    /// first part's whole piece is among them (its last).
    fn rows_of(&self, p: u32, s: u32) -> (u32, u32, bool) {
        let pe = self.pe(p);
        let size = self.block(self.held(p, s)).1;
        let whole = |x: Option<Piece>| x.is_some_and(|x| x.keys == size);
        let lo = if pe.in_first().is_some_and(|u| s > u) && whole(pe.piece_in(s)) {
            0
        } else {
            pe.c2()
        };
        // A passed first part is a nest of its own in every step (its maxima may leave keys
        // loose).
        let out = s > 0 && whole(pe.piece_out(s)) && !pe.pass_out;
        (lo, pe.c2() + pe.full + u32::from(out), out)
    }

    /// Ring step `s` on PE `p`: the rows taking its block (all but the cut rows' other steps),
    /// rows 0 and 1 forwarding the block; in step 0 the first part of a cut row then sends its
    /// q row on; in the second part's first step, that row alone. The last `defer` of its
    /// score nests (see [`Deal::deferrable`]) are returned apart, to run after the ring pass
    /// from the kept blocks: a PE whose ring pass would run ahead of the next one's leaves
    /// that one waiting for blocks. Also the cycle, from the step's start, by which the next
    /// PE has the whole block, and the cycle by which it needs a second part's q row.
    fn step(&self, p: u32, s: u32, defer: u32) -> (Vec<Node>, Vec<Node>, u64, u64) {
        let pe = self.pe(p);
        let b = self.held(p, s);
        let (_, size) = self.block(b);
        let in_first = pe.in_first();
        let (lo, hi, out) = self.rows_of(p, s);
        let fwd = if s + 1 < self.m {
            Fwd::Block
        } else {
            Fwd::None
        };
        // A handed row is the whole rows' last: its scores go on from their maxima to the
        // next PE's handed-in row; in step 0 (whose first maximum takes two scores at once,
        // one going on alone) it is a nest of its own.
        let next = self.next(p);
        let hand_to = pe.hand_out.then(|| next.c2() + next.full);
        let peel = u32::from(s == 0 && pe.hand_out);
        let main_to = hand_to.filter(|_| peel == 0);
        let piece = pe.piece_out(s).filter(|_| s == 0 || !out);
        let defer = defer.min(self.deferrable(p, s));
        let late_piece = defer > 0 && piece.is_some() && s > 0;
        let late_rows = defer - u32::from(late_piece);
        let kept = hi - lo - peel - late_rows;
        let (mut nodes, row) = self.scores(
            p,
            b,
            (0, size),
            lo,
            kept,
            s == 0,
            fwd,
            (main_to.filter(|_| late_rows == 0), 0),
        );
        let mut late = Vec::new();
        if late_rows > 0 {
            late.extend(
                self.scores(
                    p,
                    b,
                    (0, size),
                    lo + kept,
                    late_rows,
                    false,
                    Fwd::None,
                    (main_to, 0),
                )
                .0,
            );
        }
        if peel == 1 {
            nodes.extend(
                self.scores(
                    p,
                    b,
                    (0, size),
                    hi - 1,
                    1,
                    true,
                    Fwd::None,
                    (hand_to, pe.hand_loose),
                )
                .0,
            );
        }
        // The cut rows' pieces that the rows above do not take.
        if let Some(x) = piece {
            let fwd = if s == 0 { Fwd::Q } else { Fwd::None };
            let first = s == 0;
            let work = self
                .scores(
                    p,
                    b,
                    (x.k0, x.keys),
                    pe.rows - 1,
                    1,
                    first,
                    fwd,
                    (pe.pass_out.then_some(0), x.loose),
                )
                .0;
            if late_piece {
                late.extend(work);
            } else {
                nodes.extend(work);
            }
        }
        // The second part's piece comes last: its q row need only be there by then.
        let q_at = cycles(&nodes);
        if let Some(x) = pe.piece_in(s).filter(|_| s > 0 && lo > 0) {
            let first = in_first == Some(s);
            nodes.extend(
                self.scores(p, b, (x.k0, x.keys), 0, 1, first, Fwd::None, (None, 0))
                    .0,
            );
        }
        (nodes, late, row + u64::from(size) * u64::from(self.d), q_at)
    }

    /// The keys a row of kind `part` on PE `p` sees, as (first token, count, of the own block).
    fn keys_of(&self, p: u32, part: Part) -> Vec<(u32, u32, bool)> {
        let pe = self.pe(p);
        let part = if part == Part::In && pe.pass_in {
            Part::Full
        } else {
            part
        };
        let pieces: Vec<Piece> = match part {
            Part::Full => (0..self.m)
                .map(|s| Piece {
                    step: s,
                    k0: 0,
                    keys: self.block(self.held(p, s)).1,
                    loose: 0,
                })
                .collect(),
            Part::Out => pe.cut_out.clone().unwrap_or_default(),
            Part::In => pe.cut_in.clone().unwrap_or_default(),
        };
        let mut keys: Vec<(u32, u32, bool)> = pieces
            .into_iter()
            .map(|x| {
                let b = self.held(p, x.step);
                (self.block(b).0 + x.k0, x.keys, b == p)
            })
            .collect();
        keys.sort_unstable();
        keys
    }

    /// After the ring pass, rows `r0 … r0 + rows − 1` of PE `p` (all of kind `part`): their
    /// exponentials against their final maxima, summed into `l`, and `y` from the kept blocks
    /// (token runs of the buffers, and the own block), their link slots carrying `ride`. Also
    /// the cycles of one row.
    fn values(
        &self,
        p: u32,
        r0: u32,
        rows: u32,
        part: Part,
        ride: Ride,
        scale: f32,
    ) -> (Vec<Node>, u64) {
        let pe = self.pe(p);
        let next = self.next(p);
        let (d, n) = (i64::from(self.d), i64::from(self.n));
        let sc = ad(pe.s + r0 * self.n).t(1, n);
        let mx = ad(pe.mx + r0).t(1, 1);
        let l = ad(pe.l + r0).t(1, 1);
        let yc = ad(pe.y + r0 * self.d)
            .t(0, i64::from(pe.rows) * d)
            .t(1, d)
            .t(2, 1);
        // Runs of tokens: (first token, count, own block).
        let mut runs: Vec<(u32, u32, bool)> = Vec::new();
        for (t, keys, own) in self.keys_of(p, part) {
            match runs.last_mut() {
                Some(r) if r.0 + r.1 == t && !r.2 && !own => r.1 += keys,
                _ => runs.push((t, keys, own)),
            }
        }
        let row0 = Pred {
            slot: Slot::Xfer,
            level: 1,
            cmp: Cmp::Eq,
            value: 0,
        };
        // The first iteration of the level-2 loop (over a run's exponentials, or a row's columns).
        let first_at_level2 = Pred { level: 2, ..row0 };
        // Exponentials in place, over runs of adjacent tokens wherever their blocks are.
        let mut spans: Vec<(u32, u32)> = Vec::new();
        for &(t, c, _) in &runs {
            match spans.last_mut() {
                Some(x) if x.0 + x.1 == t => x.1 += c,
                _ => spans.push((t, c)),
            }
        }
        let mut body = Vec::new();
        for (i, &(t, c)) in spans.iter().enumerate() {
            let e = sc.clone().plus(i64::from(t));
            let ex = |x: Ad, init: bool| {
                B::new()
                    .expd(x.clone(), mx.clone(), scale, x)
                    .add((!init).then(|| l.clone()), l.clone())
            };
            if i == 0 {
                let max = match ride {
                    Ride::Max => Some(Send {
                        src: mx.clone(),
                        dst: ad(next.rcv),
                        preds: Vec::new(),
                    }),
                    Ride::PassedMax => Some(Send {
                        src: ad(pe.mx + pe.rows - 1),
                        dst: ad(next.rcv),
                        preds: vec![row0],
                    }),
                    _ => None,
                };
                body.push(ex(e.clone(), true).send(max.as_ref()).build());
                let state = (ride == Ride::State).then(|| Send {
                    src: ad(pe.l + pe.rows - 1),
                    dst: ad(next.rcv + 1),
                    preds: vec![row0, first_at_level2],
                });
                body.extend(lp(
                    c.saturating_sub(1),
                    vec![ex(e.plus(1).t(2, 1), false).send(state.as_ref()).build()],
                ));
            } else {
                body.extend(lp(c, vec![ex(e.t(2, 1), false).build()]));
            }
        }
        // One division per weight: each exponential by the row's sum, in place.
        if self.per_weight {
            for &(t, c) in &spans {
                let w = sc.clone().plus(i64::from(t)).t(2, 1);
                body.extend(lp(c, vec![B::new().div(w.clone(), l.clone(), w).build()]));
            }
        }
        let mut cols = Vec::new();
        for (i, &(t, c, own)) in runs.iter().enumerate() {
            let e = sc.clone().plus(i64::from(t));
            let v = if own {
                ad(pe.kv)
                    .t(0, 2 * i64::from(pe.own) * d)
                    .plus(i64::from(pe.own + t - pe.first) * d)
            } else {
                ad(pe.vb + t * self.d)
            }
            .t(2, 1);
            let mac = |e: Ad, v: Ad, init: bool| {
                B::new()
                    .mul(e, v, None)
                    .add((!init).then(|| yc.clone()), yc.clone())
            };
            if i == 0 && pe.hand_out && part == Part::Full && r0 == pe.c2() {
                let hand = Send {
                    src: ad(pe.mx + pe.c2() + pe.full - 1),
                    dst: ad(next.mx + next.c2() + next.full),
                    preds: vec![row0, first_at_level2],
                };
                cols.push(mac(e.clone(), v.clone(), true).send(Some(&hand)).build());
                cols.extend(lp(
                    c.saturating_sub(1),
                    vec![mac(e.plus(1).t(3, 1), v.plus(d).t(3, d), false).build()],
                ));
            } else if i == 0 {
                let y_row = (ride == Ride::State).then(|| Send {
                    src: ad(pe.y + (pe.rows - 1) * self.d)
                        .t(0, i64::from(pe.rows) * d)
                        .t(2, 1),
                    dst: ad(next.rcv + 2).t(2, 1),
                    preds: vec![row0],
                });
                cols.push(mac(e.clone(), v.clone(), true).send(y_row.as_ref()).build());
                cols.extend(lp(
                    c.saturating_sub(1),
                    vec![mac(e.plus(1).t(3, 1), v.plus(d).t(3, d), false).build()],
                ));
            } else {
                cols.extend(lp(c, vec![mac(e.t(3, 1), v.t(3, d), false).build()]));
            }
        }
        body.extend(lp(self.d, cols));
        let row = cycles(&body);
        (lp(rows, body), row)
    }

    /// Local row 0 of PE `p` takes in the first part, whose maximum it took into its own
    /// before its exponentials (`M = max(M₁, M₂)`): the first part's `l` and `y` scaled by
    /// `exp(s·(M₁ − M))` and added.
    fn merge(&self, p: u32, scale: f32) -> Vec<Node> {
        let pe = self.pe(p);
        let f1 = ad(pe.tmp);
        let (mx, l, rcv) = (ad(pe.mx), ad(pe.l), ad(pe.rcv));
        let y = ad(pe.y).t(0, i64::from(pe.rows * self.d)).t(1, 1);
        let mut nodes = vec![
            B::new().expd(rcv.clone(), mx, scale, f1.clone()).build(),
            B::new()
                .mul(rcv.plus(1), f1.clone(), None)
                .add(Some(l.clone()), l)
                .build(),
        ];
        nodes.extend(lp(
            self.d,
            vec![B::new()
                .mul(ad(pe.rcv + 2).t(1, 1), f1, None)
                .add(Some(y.clone()), y)
                .build()],
        ));
        nodes
    }

    /// Divisions per row: `n` weights or `d` output elements.
    fn divisions(&self) -> f64 {
        f64::from(if self.per_weight { self.n } else { self.d })
    }

    /// `y /= l` for the rows whose result this PE holds (all but a first part); nothing
    /// where each weight is divided.
    fn normalise(&self, p: u32) -> Vec<Node> {
        if self.per_weight {
            return Vec::new();
        }
        let pe = self.pe(p);
        let d = i64::from(self.d);
        let y = ad(pe.y).t(0, i64::from(pe.rows) * d).t(1, d).t(2, 1);
        let rows = pe.rows - u32::from(pe.cut_out.is_some()) - u32::from(pe.hand_out);
        lp(
            rows,
            lp(
                self.d,
                vec![B::new().div(y.clone(), ad(pe.l).t(1, 1), y).build()],
            ),
        )
    }
}

/// What the link slots of a row kind's exponential and value loops carry.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Ride {
    None,
    /// A first part's maximum, final after the ring pass, to the next PE, which takes it
    /// into the second part's before that one's exponentials.
    Max,
    /// The PE's first part's `l` and `y` row (row 0's loops: the whole rows come after the
    /// first part), for the merge.
    State,
    /// A passed first part's maximum (row 0's first exponential: the first part has none).
    PassedMax,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Part {
    Full,
    /// A first part (the last local row).
    Out,
    /// A second part (local row 0).
    In,
}

/// One ring step of a PE as built: its score nests in the ring pass and their cycles, the
/// nests deferred past it, the cycle from its start by which the next PE has the block, and
/// the one by which it needs a second part's q row.
struct Step {
    nodes: Vec<Node>,
    cycles: u64,
    late: Vec<Node>,
    ready: u64,
    q_at: u64,
}

/// The ring pass's timing: each step's wait and start, each PE's end of the pass and of step 0.
struct Timing {
    waits: Vec<Vec<u64>>,
    start: Vec<Vec<u64>>,
    end: Vec<u64>,
    end0: Vec<u64>,
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

/// The uneven deal's programs for `p` on `m` PEs (see the module's doc), if every PE's memory
/// is within `budget` words (checked before anything is built).
pub fn run(p: &Problem, m: u32, budget: Option<u64>) -> Result<Stream, String> {
    if let Some(why) = unsupported(p, m) {
        return Err(why);
    }
    // Passing cut rows on spares their merges, but its deal is coarser (a first part's key
    // is half a whole row's) and its first parts run longer in the ring pass, which can make
    // the next PE wait: both deals are built and the faster kept (the merged one on a tie).
    let mut best = run_as(p, m, budget, (false, None, false, false, false), false)?.0;
    let mut keep = |s: Stream| {
        if s.cycles < best.cycles {
            best = s;
        }
    };
    // One division per weight needs every cut passed; it pays where rows have fewer keys than
    // `d`.
    let per_weight = [false, true]
        .into_iter()
        .filter(|&w| !w || p.tokens < p.dim);
    let variants = per_weight.flat_map(|w| [(w, false), (w, true)]);
    let variants: Vec<_> = variants.flat_map(|x| [(x, false), (x, true)]).collect();
    // Passed first parts of the nearest key count or a key more, then the built PEs' cycles
    // say how many maxima to leave loose: along each chain of cuts, whatever its first part's
    // PE has above the mean. Each is built as it is and then (winning only where faster) with
    // score nests deferred past the ring pass where a PE would otherwise wait for blocks.
    let ways = [(false, false), (true, false), (true, true)];
    for (balance, lean) in ways {
        for &((per_weight, hand), more) in &variants {
            let zero = Some((more, vec![0; m as usize + 1]));
            let how = (true, zero, hand, per_weight, lean);
            if let Ok((s, mut load)) = run_as(p, m, budget, how, balance) {
                keep(s);
                let mean = load.iter().sum::<u64>().div_ceil(u64::from(m));
                let mut cut = vec![0u64; m as usize + 1];
                for x in 1..m as usize {
                    let r = load[x - 1].saturating_sub(mean);
                    cut[x] = r;
                    load[x - 1] -= r;
                    // The next PE takes the maxima, and about a send per piece they come from.
                    load[x] += r + 2;
                }
                let loose = Some((more, cut));
                let how = (true, loose, hand, per_weight, lean);
                if let Ok((s, _)) = run_as(p, m, budget, how, balance) {
                    keep(s);
                }
            }
        }
    }
    Ok(best)
}

/// Whether cut rows may be passed on, with loose maxima (see [`Deal::loose`]), whether rows
/// are handed where a first part would be too large to pass (see [`Deal::hands`]), and
/// whether each weight is divided (see [`Deal::per_weight`]).
type How = (bool, Option<(bool, Vec<u64>)>, bool, bool, bool);

/// [`run`] with cut rows passed on wherever that evens the PEs out (`pass.0`; `pass.1`: with
/// loose maxima), or all merged.
fn run_as(
    p: &Problem,
    m: u32,
    budget: Option<u64>,
    pass: How,
    balance: bool,
) -> Result<(Stream, Vec<u64>), String> {
    let (n, d, heads) = (p.tokens, p.dim, p.heads);
    let scale = p.scale as f32;
    let deal = Deal::new(n, d, m, heads, pass)
        .ok_or_else(|| format!("{NAME}: the layer does not fit in 32-bit addresses"))?;
    let words = deal.pes.iter().map(|x| x.words).max().unwrap_or(0);
    if budget.is_some_and(|b| u64::from(words) > b) {
        return Err(format!(
            "{NAME}: the uneven deal needs {words} words per PE, more than {}",
            budget.unwrap_or(0)
        ));
    }
    let mu = m as usize;
    let prev = |pe: usize| (pe + mu - 1) % mu;
    // Ring steps: each waits until the block it reads is whole on its PE, and a second part's
    // first step until its q row is there (sent at the end of the PE before's step 0).
    let q_from = |pe: usize| deal.pes[pe].in_first().map(|s| s as usize);
    let timing = |steps: &[Vec<Step>]| {
        let mut t = Timing {
            waits: vec![vec![0u64; mu]; mu],
            start: vec![vec![0u64; mu]; mu],
            end: vec![0u64; mu],
            end0: vec![0u64; mu],
        };
        for s in 0..mu {
            for pe in 0..mu {
                let mut ready = if s == 0 {
                    0
                } else {
                    t.start[prev(pe)][s - 1] + steps[prev(pe)][s - 1].ready
                };
                if q_from(pe) == Some(s) {
                    ready = ready.max(t.end0[prev(pe)].saturating_sub(steps[pe][s].q_at));
                }
                let at = t.end[pe].max(ready);
                t.waits[pe][s] = at - t.end[pe];
                t.start[pe][s] = at;
                t.end[pe] = at + steps[pe][s].cycles;
                if s == 0 {
                    t.end0[pe] = t.end[pe];
                }
            }
        }
        t
    };
    let step = |pe: usize, s: usize, defer: u32| {
        let (nodes, late, ready, q_at) = deal.step(pe as u32, s as u32, defer);
        Step {
            cycles: cycles(&nodes),
            nodes,
            late,
            ready,
            q_at,
        }
    };
    let mut steps: Vec<Vec<Step>> = (0..mu)
        .map(|pe| (0..mu).map(|s| step(pe, s, 0)).collect())
        .collect();
    let mut t = timing(&steps);
    let lean = deal.lean;
    if balance && !lean && t.waits.iter().flatten().all(|&w| w == 0) {
        // Nothing to defer: the same programs as without.
        return Err(format!("{NAME}: no PE waits for blocks"));
    }
    if balance {
        // The earliest wait, step `s` of PE `pe`, is for the block PE `q` holds in step
        // `s − 1`; a score nest of one of `q`'s steps before that (the latest with one left)
        // then runs after its ring pass instead. Each round defers one nest more, so this ends.
        let mut defer = vec![vec![0u32; mu]; mu];
        loop {
            let mut hits: Vec<(u64, usize, usize)> = (0..mu)
                .flat_map(|pe| (1..mu).map(move |s| (pe, s)))
                .filter(|&(pe, s)| t.waits[pe][s] > 0)
                .map(|(pe, s)| (t.start[pe][s], pe, s))
                .collect();
            hits.sort_unstable();
            let fix = hits.into_iter().find_map(|(_, pe, s)| {
                let q = prev(pe);
                (1..s.saturating_sub(1))
                    .rev()
                    .find(|&u| defer[q][u] < deal.deferrable(q as u32, u as u32))
                    .map(|u| (q, u))
            });
            let Some((q, u)) = fix else { break };
            defer[q][u] += 1;
            steps[q][u] = step(q, u, defer[q][u]);
            t = timing(&steps);
        }
    }
    let Timing {
        waits, end, end0, ..
    } = t;
    // The nests deferred past the ring pass delay what a PE sends after it.
    let lead: Vec<u64> = steps
        .iter()
        .map(|x| x.iter().map(|y| cycles(&y.late)).sum())
        .collect();
    // After the ring pass: the first part of a cut row, the whole rows (whose first row sends
    // that part on), the second part (its own block's scores first), which waits for the
    // first part to merge it.
    let mut bodies = Vec::with_capacity(mu);
    let mut sent_by = vec![0u64; mu];
    let mut parts = Vec::with_capacity(mu);
    for pe in 0..mu {
        let me = &deal.pes[pe];
        let p32 = pe as u32;
        let mut body = Vec::new();
        for (s, x) in steps[pe].iter().enumerate() {
            body.extend(wait(waits[pe][s])?);
            body.extend(x.nodes.iter().cloned());
        }
        for x in &steps[pe] {
            body.extend(x.late.iter().cloned());
        }
        if me.cut_out.is_some() && !me.pass_out {
            body.extend(
                deal.values(p32, me.rows - 1, 1, Part::Out, Ride::Max, scale)
                    .0,
            );
        }
        let ride = match (me.cut_out.is_some(), me.pass_out) {
            (false, _) => Ride::None,
            (true, false) => Ride::State,
            (true, true) => Ride::PassedMax,
        };
        let whole = me.full - u32::from(me.hand_out);
        let (full, row) = deal.values(p32, me.c2(), whole, Part::Full, ride, scale);
        sent_by[pe] = cycles(&body) + row;
        body.extend(full);
        if me.cut_in.is_some() {
            let alone = me.in_first().is_none();
            if alone {
                // The row's only block is the own one: its q row may still be on its way.
                body.extend(wait(end0[prev(pe)].saturating_sub(cycles(&body)))?);
            }
            if let Some(x) = me.piece_in(0) {
                let work = deal.scores(p32, p32, (x.k0, x.keys), 0, 1, alone, Fwd::None, (None, 0));
                body.extend(work.0);
            }
            // The first part's maximum, sent as its PE's exponentials begin.
            body.extend(wait(
                (end[prev(pe)] + lead[prev(pe)] + 1).saturating_sub(cycles(&body)),
            )?);
            let (mx, rcv) = (ad(me.mx), ad(me.rcv));
            body.push(B::new().max(mx.clone(), rcv, mx.clone()).build());
            // The passed part's loose keys, whose scores came on without their maxima.
            let q = prev(pe) as u32;
            for x in deal.pes[prev(pe)].cut_out.iter().flatten() {
                if x.loose > 0 {
                    let col = deal.block(deal.held(q, x.step)).0 + x.k0 + x.keys - x.loose;
                    body.extend(lp(
                        x.loose,
                        vec![B::new()
                            .max(mx.clone(), ad(me.s + col).t(1, 1), mx.clone())
                            .build()],
                    ));
                }
            }
            body.extend(deal.values(p32, 0, 1, Part::In, Ride::None, scale).0);
        }
        if me.hand_in {
            // The handed row's maximum comes on the first value product of the PE before's
            // first whole row, after its deferred score nests and that row's `n` exponentials
            // (and, per weight, its `n` divisions).
            let n = u64::from(deal.n) * if deal.per_weight { 2 } else { 1 };
            body.extend(wait(
                (end[prev(pe)] + lead[prev(pe)] + n + 1).saturating_sub(cycles(&body)),
            )?);
            let hin = me.c2() + me.full;
            // The handed row's loose keys, of the PE before's own block.
            let before = &deal.pes[prev(pe)];
            if before.hand_loose > 0 {
                let mx = ad(me.mx + hin);
                let (t0, size) = deal.block(prev(pe) as u32);
                let col = t0 + size - before.hand_loose;
                body.extend(lp(
                    before.hand_loose,
                    vec![B::new()
                        .max(mx.clone(), ad(me.s + hin * deal.n + col).t(1, 1), mx)
                        .build()],
                ));
            }
            body.extend(deal.values(p32, hin, 1, Part::Full, Ride::None, scale).0);
        }
        parts.push(cycles(&body));
        bodies.push(body);
    }
    for (pe, body) in bodies.iter_mut().enumerate() {
        let p32 = pe as u32;
        if deal.pes[pe].cut_in.is_some() && !deal.pes[pe].pass_in {
            body.extend(wait(sent_by[prev(pe)].saturating_sub(parts[pe]))?);
            body.extend(deal.merge(p32, scale));
        }
        body.extend(deal.normalise(p32));
    }
    let load: Vec<u64> = bodies.iter().map(|b| cycles(b)).collect();
    let programs = head_programs(bodies, (m, heads), |pe| deal.pes[pe].words, |p| p)?;
    let cycles = programs.iter().map(LoopProgram::cycles).max().unwrap_or(0);
    let weights = u64::from(n) * u64::from(n) * u64::from(heads);
    // Each PE's map has its own sizes (its rows and cut rows).
    let mut stream = Stream::per_pe_deferred(
        programs,
        places(&deal, heads),
        cycles,
        (weights, weights),
        (n, d, heads),
        0,
    );
    if deal.per_weight {
        stream.ops.phase2_div = weights;
        stream.normalisation = runtime::layer::Normalisation::PerWeight;
    }
    Ok((stream, load))
}

/// Every element's word: q, k, v on the PE whose stretch the token's row starts in, y on the
/// one it ends in (a cut row's first part is computed before its second).
fn places(deal: &Deal, heads: u32) -> (BTreeMap<String, Place>, Place) {
    let (n, d, m) = (deal.n, deal.d, deal.m);
    // The stretch `t` starts in.
    let owner = |t: u32| (0..m).rev().find(|&p| deal.start(p) <= t).unwrap_or(0);
    let mut lists: [(Vec<u32>, Vec<u32>); 4] = Default::default();
    for h in 0..heads {
        for t in 0..n {
            let p = owner(t);
            let pe = &deal.pes[p as usize];
            let i = t - pe.first;
            // The cut token's row is the last local row (after a handed-in one).
            let row = if i == pe.full {
                pe.rows - 1
            } else {
                pe.c2() + i
            };
            let next = (p + 1) % m;
            let (yp, yrow) = if pe.cut_out.is_some() && i == pe.full {
                (next, 0)
            } else if pe.hand_out && i + 1 == pe.full {
                let nx = &deal.pes[next as usize];
                (next, nx.c2() + nx.full)
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
