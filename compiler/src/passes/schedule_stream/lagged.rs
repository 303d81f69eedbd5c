//! The stream with values trailing keys by `g` ring steps (separate q/k/v, safe softmax), under
//! a causal mask or without one.
//!
//! The plain causal stream rescales every row's `l` and `y` in every ring step: `d + 3`
//! operations per row and step, about `1/(2C)` of the work with `C = n/2m`. Here the k blocks
//! and the v blocks rotate as two rings, the v ring `g` steps behind. A step's scores go to a
//! ring of `2g` score slots; the row maxima of a group of `g` steps are complete before the
//! first of its exponentials is taken, so `l` and `y` are rescaled once per group instead of
//! once per step. Group by group, every PE does the same: the k work of the group's `g` steps
//! (scores and running maxima), then the v work of the previous group's (exponentials, `l`,
//! `y`), so the PEs stay in lockstep; the first group of a head has no v work and the last no
//! k work, which only shortens them.
//!
//! Group `j` holds steps `jg .. jg + g`; its maxima go to max slot `j mod 2`. It opens by copying
//! the maxima of the rows with scores still to come from the other slot (`max(a, a)`, so all of
//! its maxima read and write one slot) and, from group 2 on, by rescaling the rows of group `j − 1` before that group's v work
//! starts (old maximum in slot `j mod 2`, new in the other: the rescale runs before the copy
//! overwrites the old one). Rows with no score in a group (the early chunk's rows once the
//! blocks are later than them) keep their maximum and are not rescaled; the rows that are take
//! their place in time as no-ops, so every PE's group costs the same.
//!
//! Without a mask the same plan is simpler: every step, step 0 included, is all of the PE's rows
//! against all of the block's keys (a square instead of a triangle and two kinds of steps), every
//! row is rescaled in every group, and every hop forwards the whole block.
//!
//! Memory: a head's own k/v block feeds only its step 0 and is dead after it, and the block of
//! the head before is dead altogether; so from step 1 on even steps' blocks go to the head's own
//! block and odd steps' to the one before it; before the first head that is the last two heads'
//! outputs (three heads or more) or a spare block.
//! Both move with the head by the same stride, so a step's buffer is affine in the head and the
//! step. Step 0's triangle has a score area of its own, and the score ring takes `2g · 2C²`
//! words. `g` is the largest even divisor of `m` whose working set fits
//! the allowance.

use super::*;

/// Memory map of one PE (the same on every PE).
pub(super) struct LMap {
    /// Under a causal mask (zigzag chunks, a triangle, two kinds of steps); otherwise every
    /// step is all rows against all keys.
    causal: bool,
    d: u32,
    /// Tokens per chunk; a PE owns two chunks.
    c: u32,
    rows: u32,
    hd: u32,
    q: u32,
    /// Own k/v blocks, per head `[k rows][v rows]`; the block below them is free in the first
    /// head.
    pub(super) kv: u32,
    block: u32,
    pub(super) y: u32,
    /// Step 0's scores, row `r` at `tri + r·rows`.
    tri: u32,
    /// The score ring: slot `s mod 2g` holds step `s`'s scores.
    sc: u32,
    /// Words of one slot (`2C²` causal, `rows²` without a mask).
    slot: u32,
    pub(super) g: u32,
    /// Divide each weight by its row's sum before the values (one division per weight)
    /// instead of each output element after them: with the whole ring's lag the sums are
    /// complete before the first value is used, and where a row has fewer keys than `d` it
    /// takes fewer divisions.
    pub(super) per_weight: bool,
    l: u32,
    mx: u32,
    f: u32,
    pub(super) words: u32,
}

impl LMap {
    /// The map for lag `g`, or `None` if it does not fit in 32-bit addresses.
    pub(super) fn new(p: &Problem, pes: u32, g: u32) -> Option<LMap> {
        Self::with_norm(p, pes, g, false)
    }

    /// [`LMap::new`], with one division per weight if `per_weight` (only with the whole
    /// ring's lag, `g = pes`).
    pub(super) fn with_norm(p: &Problem, pes: u32, g: u32, per_weight: bool) -> Option<LMap> {
        if per_weight && g != pes {
            return None;
        }
        let (n, d, heads) = (u64::from(p.tokens), u64::from(p.dim), u64::from(p.heads));
        let rows = n / u64::from(pes);
        let c = rows / 2;
        let hd = rows * d;
        let block = 2 * hd;
        let slot = if p.causal { 2 * c * c } else { rows * rows };
        // With three heads or more the outputs go right below the own blocks: the block before
        // the first head's is then the last two heads' outputs, unused until long after the
        // first head. Otherwise a spare block sits there.
        let (y, kv, tri) = if heads >= 3 {
            let y = heads * hd;
            let kv = y + heads * hd;
            (y, kv, kv + heads * block)
        } else {
            let kv = heads * hd + block;
            let y = kv + heads * block;
            (y, kv, y + heads * hd)
        };
        let sc = tri + rows * rows;
        let l = sc + 2 * u64::from(g) * slot;
        let mx = l + rows;
        let f = mx + 2 * rows;
        let words = f + 1;
        let w = |x: u64| u32::try_from(x).ok();
        Some(LMap {
            causal: p.causal,
            d: w(d)?,
            c: w(c)?,
            rows: w(rows)?,
            hd: w(hd)?,
            q: 0,
            kv: w(kv)?,
            block: w(block)?,
            y: w(y)?,
            tri: w(tri)?,
            sc: w(sc)?,
            slot: w(slot)?,
            g,
            per_weight,
            l: w(l)?,
            mx: w(mx)?,
            f: w(f)?,
            words: w(words)?,
        })
    }
}

impl LMap {
    /// The map buffer by buffer, for `heads` heads.
    pub(super) fn buffers(&self, heads: u32) -> Vec<runtime::manifest::BufferInfo> {
        let mut out = vec![
            buffer("q", self.q, heads * self.hd),
            buffer("y", self.y, heads * self.hd),
            buffer("k/v", self.kv, heads * self.block),
        ];
        if heads < 3 {
            // The block below the first head's: the previous head's blocks land there.
            out.push(buffer("spare block", heads * self.hd, self.block));
        }
        out.push(buffer("step-0 scores", self.tri, self.sc - self.tri));
        out.push(buffer("score ring", self.sc, self.l - self.sc));
        out.push(buffer("row sums", self.l, self.rows));
        out.push(buffer("row maxima", self.mx, 2 * self.rows));
        out.push(buffer("rescale factor", self.f, 1));
        out
    }
}

/// The lags worth trying on `pes` PEs, largest first: even divisors of the ring.
pub(super) fn lags(pes: u32) -> impl Iterator<Item = u32> {
    (2..=pes)
        .rev()
        .filter(move |g| g % 2 == 0 && pes.is_multiple_of(*g))
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// Step 0: the PE's own rows against its own keys, a triangle.
    Tri,
    /// A block earlier than both own chunks: all rows against its first chunk.
    A,
    /// A block between the own chunks: the late chunk's rows against both of its chunks.
    B,
    /// Without a mask: every row against every key of the block.
    Full,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Pat {
    kind: Kind,
    fwd: Fwd,
}

/// A run of consecutive steps of a group with the same k (or v) work.
#[derive(Clone, PartialEq, Eq, Debug)]
struct Seg {
    /// Offset of the first step in the group.
    i0: u32,
    count: u32,
    pat: Pat,
    /// The run ends with the ring's last step, which forwards nothing: a predicate on the
    /// step loop rather than a run of its own.
    silent_last: bool,
}

#[derive(Clone, PartialEq, Eq, Debug)]
struct Group {
    /// Rescale the previous group's rows from this local row on (0, or `C` when the early
    /// chunk's rows had no score in it).
    rescale: Option<u32>,
    /// Copy the maxima into this group's slot from this local row on (the early chunk's rows
    /// only while they still have scores to come).
    copy: Option<u32>,
    /// The group's own steps' k work, then the previous group's steps' v work: each ring
    /// runs its `g` steps back to back, which it may, since a block is forwarded during the
    /// step that reads it and only the next step on the next PE reads it there.
    k: Vec<Seg>,
    v: Vec<Seg>,
}

/// Appends step offset `i` of pattern `pat` to `segs`, merging it into the last run where the
/// same loop body serves.
fn push_step(segs: &mut Vec<Seg>, i: u32, pat: Pat) {
    if let Some(x) = segs.last_mut() {
        if x.i0 + x.count == i && !x.silent_last {
            if x.pat == pat {
                x.count += 1;
                return;
            }
            if pat.fwd == Fwd::None && x.pat.kind == pat.kind && x.pat.fwd == Fwd::Full {
                x.count += 1;
                x.silent_last = true;
                return;
            }
        }
    }
    segs.push(Seg {
        i0: i,
        count: 1,
        pat,
        silent_last: false,
    });
}

struct LCtx<'a> {
    map: &'a LMap,
    scale: f32,
    pe: u32,
    m: u32,
    /// Local rows below this hold tokens ([`super::mask_rows`]).
    live: u32,
    /// Under a causal mask, the first PE whose second chunk holds a token: the blocks of PEs
    /// up to it carry a second chunk nobody else reads ([`LCtx::pat`]).
    p_live: u32,
}

/// What [`LCtx::kwork`] computes: `rows` rows from local row `r0` against `keys` keys of the k
/// rows at `kb`, scores of row `r0 + i` at `sc + i·stride`, running maxima at `mx + row`.
struct KW {
    r0: u32,
    rows: u32,
    keys: u32,
    kb: Ad,
    sc: Ad,
    stride: i64,
    mx: Ad,
    /// Step 0: each row's first maximum takes two scores (or copies its only one, unless
    /// [`LCtx::single_unmaxed`]).
    first: bool,
    /// A later step of one row whose running maximum was never written: the first key's
    /// maximum takes this score (the row's only earlier one) instead.
    start: Option<Ad>,
    /// Row `r0 + i` sees `keys + i` keys (stepped loops).
    tri: bool,
    /// Words of the block forwarded on the score loops (from their first iterations), and
    /// where.
    send: Option<(Ad, Ad, u32)>,
}

/// What [`LCtx::vwork`] computes: the exponentials of the scores [`KW`] left, summed into `l`,
/// and their weighted values of the v rows at `vb` summed into `y`.
struct VW {
    r0: u32,
    rows: u32,
    keys: u32,
    vb: Ad,
    sc: Ad,
    stride: i64,
    mx: Ad,
    /// Step 0: the first key of each row starts `l` and `y`.
    first: bool,
    tri: bool,
    send: Option<(Ad, Ad, u32)>,
    mode: VMode,
}

/// Which part of the v work [`LCtx::vwork`] emits.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum VMode {
    /// Exponentials, their sum and the weighted values, one row after another (deferred
    /// normalisation).
    Both,
    /// The exponentials and their sum only.
    Exp,
    /// Each exponential divided by its row's sum, in place.
    Div,
    /// The weighted values only (and the v block's forwarding).
    Mul,
}

impl LCtx<'_> {
    /// Whether a row with a single score in step 0 (each PE's local row 0 under a causal mask)
    /// leaves its running maximum unwritten there. The per-weight formulation counts `k − 1`
    /// maxima for a row of `k` keys, so that row's maximum starts from its step-0 score in the
    /// first later step that gives it keys (step 1, on every PE but PE 0), and PE 0's, which
    /// sees no other key, is that score itself. The deferred programs keep the copy: their
    /// running maximum alternates between slots, which the copy fills.
    fn single_unmaxed(&self) -> bool {
        self.map.per_weight && self.map.causal
    }

    /// Loops over `keys − less` keys at `level`, stepped by the row loop at `lr` in a triangle.
    fn klp(tri: bool, keys: u32, less: u32, lr: u8, body: Vec<Node>) -> Vec<Node> {
        let count = keys - less;
        if tri && count > 0 {
            vec![Node::Loop(Loop {
                count,
                step: Some(CountStep { level: lr, per: 1 }),
                body,
            })]
        } else {
            lp(count, body)
        }
    }

    fn kwork(&self, w: &KW, lr: u8) -> Vec<Node> {
        let m = self.map;
        let d = i64::from(m.d);
        let (lb, lc) = (lr + 1, lr + 2);
        let q = ad(m.q)
            .t(0, i64::from(m.hd))
            .plus(i64::from(w.r0) * d)
            .t(lr, d);
        let s = w.sc.clone().t(lr, w.stride);
        let key_words = i64::from(w.keys) * d;
        // Iteration (row a, key b, column c) of the score loops forwards word
        // `(a − r0)·keys·d + b·d + c`; in a triangle rows differ in length, so each row forwards
        // the same number of words from its first keys.
        let send_at = |c0: i64, col: Option<u8>| {
            w.send.as_ref().map(|(src, dst, words)| {
                let per_row = if w.tri { i64::from(*words) } else { key_words };
                // When only the first row sends, the row term would add nothing.
                let one_row = !w.tri && (w.rows == 1 || i64::from(*words) <= key_words);
                let at = |a: &Ad| {
                    let mut x = a.clone().plus(c0).t(lb, d);
                    if !one_row {
                        x = x.t(lr, per_row);
                    }
                    if let Some(cl) = col {
                        x = x.t(cl, 1);
                    }
                    x
                };
                let mut preds = Vec::new();
                if w.tri {
                    preds.push(Pred {
                        slot: Slot::Xfer,
                        level: lb,
                        cmp: Cmp::Lt,
                        value: words / m.d,
                    });
                } else {
                    let full = u32::try_from(i64::from(*words) / key_words).unwrap_or(u32::MAX);
                    let rem = i64::from(*words) % key_words;
                    let rows_used = full.saturating_add(u32::from(rem > 0));
                    if rows_used < w.rows {
                        preds.push(Pred {
                            slot: Slot::Xfer,
                            level: lr,
                            cmp: Cmp::Lt,
                            value: rows_used,
                        });
                    }
                    if rem > 0 {
                        // Predicates are conjunctions: a cut inside a row is only expressible
                        // in a one-row work, and every caller cuts only those.
                        debug_assert_eq!(full, 0, "partial send in a row loop");
                        preds.push(Pred {
                            slot: Slot::Xfer,
                            level: lb,
                            cmp: Cmp::Lt,
                            value: (rem / d) as u32,
                        });
                    }
                }
                Send {
                    src: at(src),
                    dst: at(dst),
                    preds,
                }
            })
        };
        let k_at = |c0: i64, col: bool| {
            let a = w.kb.clone().plus(c0).t(lb, d);
            if col {
                a.t(lc, 1)
            } else {
                a
            }
        };
        let mut score = vec![B::new()
            .mul(q.clone(), k_at(0, false), None)
            .add(None, s.clone().t(lb, 1))
            .send(send_at(0, None).as_ref())
            .build()];
        score.extend(lp(
            m.d - 1,
            vec![B::new()
                .mul(q.clone().plus(1).t(lc, 1), k_at(1, true), None)
                .add(Some(s.clone().t(lb, 1)), s.clone().t(lb, 1))
                .send(send_at(1, Some(lc)).as_ref())
                .build()],
        ));
        let mut body = Self::klp(w.tri, w.keys, 0, lr, score);
        let mx = w.mx.clone().plus(i64::from(w.r0)).t(lr, 1);
        let e = |off: i64| s.clone().plus(off).t(lb, 1);
        if w.first {
            if w.keys >= 2 {
                body.push(
                    B::new()
                        .max(s.clone(), s.clone().plus(1), mx.clone())
                        .build(),
                );
                body.extend(Self::klp(
                    w.tri,
                    w.keys,
                    2,
                    lr,
                    vec![B::new().max(mx.clone(), e(2), mx.clone()).build()],
                ));
            } else if !self.single_unmaxed() {
                body.push(B::new().max(s.clone(), s.clone(), mx.clone()).build());
            }
        } else if let Some(start) = &w.start {
            body.push(B::new().max(start.clone(), s.clone(), mx.clone()).build());
            body.extend(Self::klp(
                w.tri,
                w.keys,
                1,
                lr,
                vec![B::new().max(mx.clone(), e(1), mx.clone()).build()],
            ));
        } else {
            body.extend(Self::klp(
                w.tri,
                w.keys,
                0,
                lr,
                vec![B::new().max(mx.clone(), e(0), mx.clone()).build()],
            ));
        }
        let mut nodes = lp(w.rows, body);
        mask_rows(&mut nodes, lr, w.r0, w.rows, self.live);
        nodes
    }

    fn vwork(&self, w: &VW, lr: u8) -> Vec<Node> {
        let m = self.map;
        let d = i64::from(m.d);
        let (lb, lk) = (lr + 1, lr + 2);
        let s = w.sc.clone().t(lr, w.stride);
        let mx = w.mx.clone().plus(i64::from(w.r0)).t(lr, 1);
        let l = ad(m.l).plus(i64::from(w.r0)).t(lr, 1);
        let y = ad(m.y)
            .t(0, i64::from(m.hd))
            .plus(i64::from(w.r0) * d)
            .t(lr, d);
        let ex = |x: Ad| B::new().expd(x.clone(), mx.clone(), self.scale, x);
        let mut body = Vec::new();
        if w.mode == VMode::Div {
            let e = s.clone().t(lb, 1);
            body.extend(Self::klp(
                w.tri,
                w.keys,
                0,
                lr,
                vec![B::new().div(e.clone(), l.clone(), e).build()],
            ));
            let mut nodes = lp(w.rows, body);
            mask_rows(&mut nodes, lr, w.r0, w.rows, self.live);
            return nodes;
        }
        if w.mode == VMode::Mul {
            // The exponentials and their sum were taken in an earlier pass.
        } else if w.first {
            body.push(ex(s.clone()).add(None, l.clone()).build());
            body.extend(Self::klp(
                w.tri,
                w.keys,
                1,
                lr,
                vec![ex(s.clone().plus(1).t(lb, 1))
                    .add(Some(l.clone()), l.clone())
                    .build()],
            ));
        } else {
            body.extend(Self::klp(
                w.tri,
                w.keys,
                0,
                lr,
                vec![ex(s.clone().t(lb, 1))
                    .add(Some(l.clone()), l.clone())
                    .build()],
            ));
        }
        // Columns outside, keys inside, so each y word is one running sum. Iteration (row a,
        // column c, key b) forwards word `(a − r0)·keys·d + b·d + c` of the v rows, the word
        // its product reads (any bijection would do, source and destination offsets being the
        // same; this one keeps each send within the key row it reads, so the proof without
        // unrolling reads every forwarded run from one row of the block instead of regrouping
        // the column loop). Less than a row's worth (`wk < keys` keys' words, a trimmed hop
        // of a step whose rows see two chunks) rides on the first row's first `wk` keys.
        let kd = i64::from(w.keys) * d;
        let send = w.send.as_ref().map(|(src, dst, words)| {
            let words = i64::from(*words);
            if words < kd {
                debug_assert_eq!(words % d, 0, "whole keys only");
                let wk = words / d;
                let at = |a: &Ad| a.clone().t(lb, 1).t(lk, d);
                let mut preds = vec![Pred {
                    slot: Slot::Xfer,
                    level: lk,
                    cmp: Cmp::Lt,
                    value: wk as u32,
                }];
                if w.rows > 1 {
                    preds.push(Pred {
                        slot: Slot::Xfer,
                        level: lr,
                        cmp: Cmp::Lt,
                        value: 1,
                    });
                }
                return Send {
                    src: at(src),
                    dst: at(dst),
                    preds,
                };
            }
            let full = u32::try_from(words / kd).unwrap_or(u32::MAX);
            let at = |a: &Ad| {
                let x = a.clone().t(lb, 1).t(lk, d);
                if full > 1 {
                    x.t(lr, kd)
                } else {
                    x
                }
            };
            debug_assert_eq!(words % kd, 0, "whole rows only");
            Send {
                src: at(src),
                dst: at(dst),
                preds: (full < w.rows)
                    .then_some(Pred {
                        slot: Slot::Xfer,
                        level: lr,
                        cmp: Cmp::Lt,
                        value: full,
                    })
                    .into_iter()
                    .collect(),
            }
        });
        if w.mode == VMode::Exp {
            let mut nodes = lp(w.rows, body);
            mask_rows(&mut nodes, lr, w.r0, w.rows, self.live);
            return nodes;
        }
        let yc = y.t(lb, 1);
        let vv = |off: i64| w.vb.clone().plus(off * d).t(lb, 1).t(lk, d);
        let ee = |off: i64| s.clone().plus(off).t(lk, 1);
        let mut pv = Vec::new();
        if w.first {
            pv.push(
                B::new()
                    .mul(s.clone(), w.vb.clone().t(lb, 1), None)
                    .add(None, yc.clone())
                    .build(),
            );
            pv.extend(Self::klp(
                w.tri,
                w.keys,
                1,
                lr,
                vec![B::new()
                    .mul(ee(1), vv(1), None)
                    .add(Some(yc.clone()), yc.clone())
                    .build()],
            ));
        } else {
            pv.extend(lp(
                w.keys,
                vec![B::new()
                    .mul(ee(0), vv(0), None)
                    .add(Some(yc.clone()), yc.clone())
                    .send(send.as_ref())
                    .build()],
            ));
        }
        body.extend(lp(m.d, pv));
        let mut nodes = lp(w.rows, body);
        mask_rows(&mut nodes, lr, w.r0, w.rows, self.live);
        nodes
    }

    /// The own k rows' scores of step 0 (local row `r` sees keys `0..=r`), the own block (k and
    /// v rows, `ranges` of it) forwarded to the next PE's odd buffer on the way; rows 0 and 1
    /// alone, then per range a stepped loop whose every row forwards [`TRI_KEYS`] keys' worth,
    /// a row for the remainder, and the rows left. `None` if the rows cannot carry the block.
    fn tri_k(&self, ranges: &[(u32, u32)]) -> Option<Vec<Node>> {
        let m = self.map;
        let own = ad(m.kv).t(0, i64::from(m.block));
        if !m.causal {
            // The square: the first two rows' score loops (`rows·d` iterations each) forward
            // the block's `2·rows·d` words.
            let send = match ranges {
                [] => None,
                [(0, words)] if *words == m.block && m.rows >= 2 => {
                    Some((own.clone(), Self::odd_buffer(m), m.block))
                }
                _ => return None,
            };
            return Some(self.kwork(
                &KW {
                    r0: 0,
                    rows: m.rows,
                    keys: m.rows,
                    kb: own,
                    sc: ad(m.tri),
                    stride: i64::from(m.rows),
                    mx: ad(m.mx),
                    first: true,
                    start: None,
                    tri: false,
                    send,
                },
                1,
            ));
        }
        let send = |piece: Option<Piece>| {
            piece.map(|(at, words)| {
                let at = i64::from(at);
                (own.clone().plus(at), Self::odd_buffer(m).plus(at), words)
            })
        };
        let mut nodes = Vec::new();
        let Some(segments) = tri_segments(ranges, m.d, m.rows) else {
            // Too few rows for equal pieces: row by row.
            let (pieces, dealt) = tri_rows(ranges, m.d, m.rows);
            for (r, piece) in (0..m.rows).zip(pieces) {
                nodes.extend(self.kwork(&self.tri_kw(r, 1, send(piece), false), 1));
            }
            return dealt.then_some(nodes);
        };
        for r in 0..2 {
            nodes.extend(self.kwork(&self.tri_kw(r, 1, None, false), 1));
        }
        for (r0, count, piece) in segments {
            nodes.extend(self.kwork(&self.tri_kw(r0, count, send(piece), count > 1), 1));
        }
        Some(nodes)
    }

    /// `w` (every row from local row 0) with row 0 apart, its maximum started from its step-0
    /// score; the block's words row 0's score loops no longer forward go on the other rows'.
    fn peeled_row0(&self, w: KW) -> Vec<Node> {
        let key_words = w.keys * self.map.d;
        let split = |send: &Option<(Ad, Ad, u32)>, first: bool| {
            send.as_ref().and_then(|(src, dst, words)| {
                if first {
                    Some((src.clone(), dst.clone(), (*words).min(key_words)))
                } else {
                    let at = i64::from(key_words);
                    (*words > key_words).then(|| {
                        (
                            src.clone().plus(at),
                            dst.clone().plus(at),
                            words - key_words,
                        )
                    })
                }
            })
        };
        let row0 = KW {
            rows: 1,
            start: Some(ad(self.map.tri)),
            send: split(&w.send, true),
            sc: w.sc.clone(),
            kb: w.kb.clone(),
            mx: w.mx.clone(),
            ..w
        };
        let rest = KW {
            r0: w.r0 + 1,
            rows: w.rows - 1,
            sc: w.sc.clone().plus(w.stride),
            send: split(&w.send, false),
            ..w
        };
        let mut nodes = self.kwork(&row0, 3);
        nodes.extend(self.kwork(&rest, 3));
        nodes
    }

    /// Step 0's k work for `rows` rows from `r0`.
    fn tri_kw(&self, r0: u32, rows: u32, send: Option<(Ad, Ad, u32)>, tri: bool) -> KW {
        let m = self.map;
        KW {
            r0,
            rows,
            keys: r0 + 1,
            kb: ad(m.kv).t(0, i64::from(m.block)),
            sc: ad(m.tri + r0 * m.rows),
            stride: i64::from(m.rows),
            mx: ad(m.mx),
            first: true,
            start: None,
            tri,
            send,
        }
    }

    /// Step 0's exponentials and weighted values, on the own v rows (the part `mode` says).
    fn tri_v(&self, lr: u8, mode: VMode) -> Vec<Node> {
        let m = self.map;
        let own_v = ad(m.kv + m.hd).t(0, i64::from(m.block));
        let vw = |r0: u32, rows: u32| VW {
            r0,
            rows,
            keys: r0 + 1,
            vb: own_v.clone(),
            sc: ad(m.tri + r0 * m.rows),
            stride: i64::from(m.rows),
            mx: ad(m.mx),
            first: true,
            tri: rows > 1,
            send: None,
            mode,
        };
        if !m.causal {
            let mut square = vw(0, m.rows);
            square.keys = m.rows;
            square.tri = false;
            return self.vwork(&square, lr);
        }
        // Row 0 alone: a stepped loop over the keys after the first needs one.
        let mut row0 = vw(0, 1);
        if self.single_unmaxed() && self.pe == 0 {
            // Its only score is its maximum.
            row0.mx = ad(m.tri);
        }
        let mut nodes = self.vwork(&row0, lr);
        nodes.extend(self.vwork(&vw(1, m.rows - 1), lr));
        nodes
    }

    fn pat(&self, s: u32) -> Pat {
        let kind = if s == 0 {
            Kind::Tri
        } else if !self.map.causal {
            Kind::Full
        } else if s <= self.pe {
            Kind::A
        } else {
            Kind::B
        };
        let fwd = hop(self.pe, self.m, s, self.map.causal, self.p_live);
        Pat { kind, fwd }
    }

    /// Group `j`'s steps (`0..=m/g`; the last has only v work).
    fn group(&self, j: u32) -> Group {
        let g = self.map.g;
        let groups = self.m / g;
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for i in 0..g {
            let s = j * g + i;
            // Step 0's k work is the triangle, emitted before the groups.
            if s < self.m && s > 0 {
                push_step(&mut k, i, self.pat(s));
            }
            if j >= 1 {
                push_step(&mut v, i, self.pat(s - g));
            }
        }
        // Under a causal mask the early chunk's rows have no score once the blocks are later
        // than them; without one every row has scores in every group.
        let from = |group: u32| {
            if !self.map.causal || group * g <= self.pe {
                0
            } else {
                self.map.c
            }
        };
        Group {
            rescale: (j >= 2).then(|| from(j - 1)),
            copy: (j >= 1 && j < groups).then(|| from(j)),
            k,
            v,
        }
    }

    /// Where the next PE keeps the block of an odd step of this head: the block before the
    /// head's own.
    fn odd_buffer(m: &LMap) -> Ad {
        ad(m.kv - m.block).t(0, i64::from(m.block))
    }

    /// Offset `at` of the block of step `i0 + i_2` of a run of `count` steps (`i_2` at level 2;
    /// `g` is even, so a step's parity is its offset's): the head's own block for even steps,
    /// the one before for odd ones; `next` gives the buffer of the step after.
    fn by_parity(m: &LMap, at: u32, i0: u32, count: u32, next: bool) -> Ad {
        let block = i64::from(m.block);
        let odd = (i0 % 2 == 1) != next;
        let x = ad(m.kv + at).t(0, block).plus(if odd { -block } else { 0 });
        if count > 1 {
            x.wrap(2, if odd { block } else { -block }, 2)
        } else {
            x
        }
    }

    /// `base + per·g·((j − back) mod 2)` for group `j = j0 + i_1` of a run of `run` groups from
    /// `j0` (the loop at level 1), `back` at most 2: where group `j − back`'s half of a
    /// two-group ring starts.
    fn group_slot(base: u32, per: u32, g: u32, j0: u32, back: u32, run: u32) -> Ad {
        let par = (j0 + 2 - back) % 2;
        let x = ad(base + par * per * g);
        let stride = i64::from(per) * i64::from(g);
        if run > 1 {
            x.wrap(1, if par == 0 { stride } else { -stride }, 2)
        } else {
            x
        }
    }

    /// A run of `run` identical groups starting at group `j0`, as one loop at level 1.
    ///
    fn groups(&self, j0: u32, run: u32, grp: &Group) -> Vec<Node> {
        let m = self.map;
        let (d, rows) = (m.d, m.rows);
        // Max slot of group j − back.
        let mslot = |back: u32| Self::group_slot(m.mx, rows, 1, j0, back, run);
        let mut body = Vec::new();
        // Rows without a score in the group take their time as no-ops, so that every PE's
        // group is as long.
        let mut idle = 0;
        if let Some(r0) = grp.rescale {
            // Group j − 1's rows move from the maximum before it (slot j mod 2) to its own.
            let old = mslot(2).plus(i64::from(r0)).t(2, 1);
            let new = mslot(1).plus(i64::from(r0)).t(2, 1);
            let f = ad(m.f);
            let l = ad(m.l).plus(i64::from(r0)).t(2, 1);
            let y = ad(m.y)
                .t(0, i64::from(m.hd))
                .plus(i64::from(r0 * d))
                .t(2, i64::from(d))
                .t(3, 1);
            let mut nodes = lp(
                rows - r0,
                vec![
                    B::new().expd(old, new, self.scale, f.clone()).build(),
                    B::new().mul(l.clone(), f.clone(), Some(l)).build(),
                    Node::Loop(Loop::new(
                        d,
                        vec![B::new().mul(y.clone(), f, Some(y)).build()],
                    )),
                ],
            );
            mask_rows(&mut nodes, 2, r0, rows - r0, self.live);
            body.extend(nodes);
            idle += r0 * (d + 2);
        }
        if let Some(r0) = grp.copy {
            let at = |back| mslot(back).plus(i64::from(r0)).t(2, 1);
            let mut nodes = lp(rows - r0, vec![B::new().max(at(1), at(1), at(0)).build()]);
            mask_rows(&mut nodes, 2, r0, rows - r0, self.live);
            body.extend(nodes);
            idle += r0;
        }
        body.extend(lp(idle, vec![B::new().build()]));
        let c = m.c;
        let words = |f: Fwd| match f {
            Fwd::None => None,
            Fwd::Full => Some(m.hd),
            Fwd::Trim => Some(c * d),
        };
        // Rows, keys and score stride of a pattern's work.
        let shape = |kind: Kind| match kind {
            Kind::A => (0, rows, c),
            Kind::Full => (0, rows, rows),
            _ => (c, c, 2 * c),
        };
        // Score slot of the step at group offset i0 + i_2 of group j − back.
        let slot = |seg: &Seg, back: u32| {
            let x = Self::group_slot(m.sc, m.slot, m.g, j0, back, run)
                .plus(i64::from(seg.i0) * i64::from(m.slot));
            if seg.count > 1 {
                x.t(2, i64::from(m.slot))
            } else {
                x
            }
        };
        let silence = |seg: &Seg, mut nodes: Vec<Node>| {
            if seg.silent_last {
                add_xfer_preds(
                    &mut nodes,
                    &[Pred {
                        slot: Slot::Xfer,
                        level: 2,
                        cmp: Cmp::Lt,
                        value: seg.count - 1,
                    }],
                );
            }
            lp(seg.count, nodes)
        };
        let mut k_segs: Vec<Seg> = grp.k.clone();
        // Step 1 starts local row 0's maximum where step 0 left it unwritten
        // ([`LCtx::single_unmaxed`]): that step runs alone, its row 0 apart.
        let peel = self.single_unmaxed() && j0 == 0 && self.pe >= 1;
        if peel {
            if let Some(first) = k_segs.first_mut() {
                if first.count > 1 {
                    let mut rest = first.clone();
                    rest.i0 += 1;
                    rest.count -= 1;
                    first.count = 1;
                    first.silent_last = false;
                    k_segs.insert(1, rest);
                }
            }
        }
        for (i, seg) in k_segs.iter().enumerate() {
            let kb = Self::by_parity(m, 0, seg.i0, seg.count, false);
            let dst = Self::by_parity(m, 0, seg.i0, seg.count, true);
            let (r0, n_rows, keys) = shape(seg.pat.kind);
            let kw = KW {
                r0,
                rows: n_rows,
                keys,
                kb: kb.clone(),
                sc: slot(seg, 0),
                stride: i64::from(keys),
                mx: mslot(0),
                first: false,
                start: None,
                tri: false,
                send: words(seg.pat.fwd).map(|w| (kb, dst, w)),
            };
            let nodes = if peel && i == 0 && seg.pat.kind == Kind::A {
                self.peeled_row0(kw)
            } else {
                self.kwork(&kw, 3)
            };
            let nodes = silence(seg, nodes);
            body.extend(nodes);
        }
        // Per weight, the whole ring's exponentials and sums first, then every weight
        // divided, then the values; otherwise one pass.
        let passes: &[VMode] = if m.per_weight {
            &[VMode::Exp, VMode::Div, VMode::Mul]
        } else {
            &[VMode::Both]
        };
        for &mode in passes {
            self.v_pass(
                &mut body,
                grp,
                mode,
                mslot(1),
                &slot,
                &words,
                &shape,
                &silence,
            );
        }
        lp(run, body)
    }

    /// The v work of `grp`'s steps, the part `mode` says; the block forwarding rides on the
    /// pass that uses the values.
    #[allow(clippy::too_many_arguments)] // the run's own helpers, passed down
    fn v_pass(
        &self,
        body: &mut Vec<Node>,
        grp: &Group,
        mode: VMode,
        mx: Ad,
        slot: &dyn Fn(&Seg, u32) -> Ad,
        words: &dyn Fn(Fwd) -> Option<u32>,
        shape: &dyn Fn(Kind) -> (u32, u32, u32),
        silence: &dyn Fn(&Seg, Vec<Node>) -> Vec<Node>,
    ) {
        let m = self.map;
        for seg in &grp.v {
            if seg.pat.kind == Kind::Tri {
                body.extend(lp(seg.count, self.tri_v(3, mode)));
                continue;
            }
            let vb = Self::by_parity(m, m.hd, seg.i0, seg.count, false);
            let dst = Self::by_parity(m, m.hd, seg.i0, seg.count, true);
            let (r0, n_rows, keys) = shape(seg.pat.kind);
            let nodes = self.vwork(
                &VW {
                    r0,
                    rows: n_rows,
                    keys,
                    vb: vb.clone(),
                    sc: slot(seg, 1),
                    stride: i64::from(keys),
                    mx: mx.clone(),
                    first: false,
                    tri: false,
                    send: (mode == VMode::Both || mode == VMode::Mul)
                        .then(|| words(seg.pat.fwd).map(|w| (vb, dst, w)))
                        .flatten(),
                    mode,
                },
                3,
            );
            body.extend(silence(seg, nodes));
        }
    }
}

/// PE `pe`'s program, or `None` if its rows cannot carry step 0's forwarding.
pub(super) fn program(
    map: &LMap,
    pe: u32,
    m: u32,
    heads: u32,
    scale: f32,
    live: u32,
    p_live: u32,
) -> Option<LoopProgram> {
    let ctx = LCtx {
        map,
        scale,
        pe,
        m,
        live,
        p_live,
    };
    let (c, d) = (map.c, map.d);
    let cd = c * d;
    // Step 0 forwards the own block: only the first chunk of its k and v rows where the second
    // is read by nobody after it ([`hop`]).
    let ranges = match hop(pe, m, 0, map.causal, p_live) {
        Fwd::None => Vec::new(),
        Fwd::Trim => vec![(0, cd), (map.hd, cd)],
        Fwd::Full => vec![(0, map.block)],
    };
    let mut head = ctx.tri_k(&ranges)?;
    let groups = m / map.g;
    let mut j = 0;
    while j <= groups {
        let grp = ctx.group(j);
        let mut run = 1;
        while j + run <= groups && ctx.group(j + run) == grp {
            run += 1;
        }
        // The last group with k work often differs from the groups before it only by its
        // silent last step. It stays a run of its own: joined to theirs, with that step's
        // sends predicated on the group, the run's key steps became a loop of `g − 1` and a
        // step apart, which the proof without unrolling evaluates as three pieces (and the
        // value steps reading their scores cut at the same place) in every group of the run.
        head.extend(ctx.groups(j, run, &grp));
        j += run;
    }
    if !map.per_weight {
        head.extend(normalise(map.y, map.l, map.rows, d, live));
    }
    Some(LoopProgram {
        pe,
        pes: m,
        mem_words: map.words,
        body: lp(heads, head),
    })
}
