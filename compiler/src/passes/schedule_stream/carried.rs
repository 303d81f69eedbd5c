//! The stream schedule of a shared layer without a mask in which every score is computed once
//! and its mirror image is carried home with the block it belongs to, so that each row's whole
//! softmax is local and nothing is ever rescaled or merged.
//!
//! With q = k = v = x the blocks of PEs `p` and `q` meet twice in a ring pass (at `p` in step
//! `s = p − q` and at `q` in step `m − s`), and each meeting computes half of their score block:
//! steps `s < m/2` the first half of the own rows against the whole visiting block, steps
//! `s > m/2` the whole own block against the visiting block's second half (in step `m/2` PEs
//! below `m/2` take the first kind, the others the second). A score's chain ends in one bundle
//! whose acc writes it into the PE's own score rows and whose xfer sends the same sum on, into the
//! payload that travels with the visiting block; that payload, forwarded on the score loops of
//! every later step, is back on the block's PE when the ring pass ends. Then every PE holds all
//! `n` scores of each of its rows (its own triangle read once from each side), and, since every
//! visiting block was kept in a buffer of its own step, every x row of the head.
//!
//! What follows is local: each row's exact maximum (`n − 1` maxima), its exponentials and their
//! sum, then `y = Σ e·x` over the kept blocks, and one division per output element (or, with
//! fewer tokens than `d`, one per weight before the values). Every PE executes the formulation's
//! necessary operations and nothing else, the same number of cycles in every step, so the
//! programs run at the lower bound.

use isa::{Cmp, CountStep, Field, Loop, LoopProgram, Node, Pred, Slot, Xfer, XferSrc};

use super::{ad, buffer, lp, Ad, Send, B};

/// Memory map of one PE (the same on every PE).
struct CMap {
    n: u32,
    d: u32,
    m: u32,
    /// Tokens per PE (`B`), even.
    b: u32,
    /// Scores one meeting computes: `B²/2`.
    f: u32,
    /// Payload units the x rows of a block take: `B·d / F`.
    xu: u32,
    x: u32,
    y: u32,
    /// Score rows: row `a`, key `j·B + k` of the block `j` PEs ahead (`j = 0` the own block,
    /// only `k ≥ a` written).
    sc: u32,
    /// Exponentials (or weights), laid out like the score rows but complete.
    e: u32,
    /// The payload as it comes home: `F` words per block ahead, `j = 1 … m − 1`.
    home: u32,
    /// The block received for step `s` (x rows, then the payload so far) at `t + (s − 1)·tsz`.
    t: u32,
    tsz: u32,
    mx: u32,
    l: u32,
    words: u32,
}

impl CMap {
    fn new(n: u32, d: u32, m: u32, heads: u32) -> Option<CMap> {
        let w = |x: u64| u32::try_from(x).ok();
        let b = n.checked_div(m)?;
        let f = w(u64::from(b) * u64::from(b) / 2)?;
        let hd = u64::from(b) * u64::from(d);
        let xu = w(hd.checked_div(u64::from(f))?)?;
        let x = 0u32;
        let y = w(u64::from(heads) * hd)?;
        let sc = w(2 * u64::from(heads) * hd)?;
        let e = w(u64::from(sc) + u64::from(b) * u64::from(n))?;
        let home = w(u64::from(e) + u64::from(b) * u64::from(n))?;
        let t = w(u64::from(home) + u64::from(m - 1) * u64::from(f))?;
        let tsz = w(hd + u64::from(m - 2) * u64::from(f))?;
        let mx = w(u64::from(t) + u64::from(m - 1) * u64::from(tsz))?;
        let l = w(u64::from(mx) + u64::from(b))?;
        let words = w(u64::from(l) + u64::from(b))?;
        Some(CMap {
            n,
            d,
            m,
            b,
            f,
            xu,
            x,
            y,
            sc,
            e,
            home,
            t,
            tsz,
            mx,
            l,
            words,
        })
    }
}

/// Why the carried schedule does not apply to `n` tokens of `d` columns on `m` PEs, if it does
/// not. Safe softmax, q = k = v and no mask are the caller's to check.
pub(super) fn unsupported(n: u32, d: u32, m: u32) -> Option<String> {
    let b = n.checked_div(m).unwrap_or(0);
    // The forwarding rides on the middle products of each score's chain: the x rows and the
    // payload so far, `2d/B + s − 1` words per chain in step `s`, leave at least one product
    // without a send.
    let xu = d.saturating_mul(2).checked_div(b).unwrap_or(0);
    if m < 4 || !m.is_multiple_of(2) {
        Some(format!("an even ring of 4 PEs or more, not {m}"))
    } else if !n.is_multiple_of(m) || b < 4 || !b.is_multiple_of(2) {
        Some(format!(
            "the tokens dealt evenly in blocks of an even number, at least 4 ({n} on {m} PEs)"
        ))
    } else if !u64::from(d).saturating_mul(2).is_multiple_of(u64::from(b))
        || u64::from(d) < u64::from(xu) + u64::from(m)
    {
        Some(format!(
            "d a multiple of half a block and at least 2d/B + m ({d} with blocks of {b} on {m} PEs)"
        ))
    } else {
        None
    }
}

/// Words per PE the carried programs take, if they apply.
pub(super) fn words(n: u32, d: u32, m: u32, heads: u32) -> Option<u32> {
    if unsupported(n, d, m).is_some() {
        return None;
    }
    CMap::new(n, d, m, heads).map(|c| c.words)
}

/// A loop whose count is `count + per·i_level` where `per` is given, else fixed.
fn lps(count: u32, step: Option<(u8, i16)>, body: Vec<Node>) -> Vec<Node> {
    match step {
        Some((level, per)) => vec![Node::Loop(Loop {
            count,
            step: Some(CountStep { level, per }),
            body,
        })],
        None => lp(count, body),
    }
}

/// `send acc -> dst`.
fn send_acc(mut b: B, dst: Ad) -> B {
    b.xfer = Xfer::Send {
        src: XferSrc::Acc,
        dst: 0,
    };
    b.fields.push((Field::XferDst, dst));
    b
}

fn xfer_if(level: u8, cmp: Cmp, value: u32) -> Pred {
    Pred {
        slot: Slot::Xfer,
        level,
        cmp,
        value,
    }
}

/// One piece of the score pass: `count` steps from `s0`, each of the same kind.
struct Piece {
    s0: u32,
    count: u32,
    /// The first half of the own rows against every visiting key (else every own row against
    /// the visiting block's second half).
    low: bool,
    /// The ring's last step: the payload goes home, the x rows stay.
    last: bool,
}

struct Gen<'a> {
    c: &'a CMap,
    scale: f32,
    per_weight: bool,
}

impl Gen<'_> {
    /// The x rows of this head, row `r` column `c`: base plus head term.
    fn own(&self) -> Ad {
        ad(self.c.x).t(0, i64::from(self.c.b * self.c.d))
    }

    /// Step 0: the own triangle `a ≤ k`, forwarding the own x rows (row `a` on the chain of
    /// its diagonal score) into the next PE's buffer of step 1.
    fn triangle(&self) -> Vec<Node> {
        let c = self.c;
        let (d, n) = (i64::from(c.d), i64::from(c.n));
        // Levels: 1 step (one), 2 row a, 3 key k − a (stepped), 4 column.
        let row = self.own().t(2, d);
        let key = self.own().t(2, d).t(3, d);
        let sc = ad(c.sc).t(2, n + 1).t(3, 1);
        let fwd = |col: Ad, col_dst: Ad| Send {
            src: col,
            dst: col_dst,
            preds: vec![xfer_if(3, Cmp::Eq, 0)],
        };
        let t1 = ad(c.t).t(2, d);
        let first = B::new()
            .mul(row.clone(), key.clone(), None)
            .add(None, sc.clone())
            .send(Some(&fwd(row.clone(), t1.clone())))
            .build();
        let mid = B::new()
            .mul(
                row.clone().plus(1).t(4, 1),
                key.clone().plus(1).t(4, 1),
                None,
            )
            .add(Some(sc.clone()), sc.clone())
            .send(Some(&fwd(
                row.clone().plus(1).t(4, 1),
                t1.clone().plus(1).t(4, 1),
            )))
            .build();
        let end = d - 1;
        let last = B::new()
            .mul(row.clone().plus(end), key.plus(end), None)
            .add(Some(sc.clone()), sc)
            .send(Some(&fwd(row.plus(end), t1.plus(end))))
            .build();
        let mut chain = vec![first];
        chain.extend(lp(c.d - 2, vec![mid]));
        chain.push(last);
        lp(1, lp(c.b, lps(c.b, Some((2, -1)), chain)))
    }

    /// Steps `s0 … s0 + count − 1` of one kind.
    fn piece(&self, p: &Piece) -> Vec<Node> {
        let c = self.c;
        let (d, n, b, f) = (
            i64::from(c.d),
            i64::from(c.n),
            i64::from(c.b),
            i64::from(c.f),
        );
        let (rows, keys, k0) = if p.low {
            (c.b / 2, c.b, 0)
        } else {
            (c.b, c.b / 2, c.b / 2)
        };
        let kk = i64::from(keys);
        let s0 = i64::from(p.s0);
        let tsz = i64::from(c.tsz);
        let stepped = p.count > 1;
        // Levels: 1 step s = s0 + i1, 2 own row, 3 visiting key, 4 column.
        let own = self.own().t(2, d);
        let vis = ad(c.t)
            .plus((s0 - 1) * tsz + i64::from(k0) * d)
            .t(1, tsz)
            .t(3, d);
        let sc = ad(c.sc)
            .plus((i64::from(c.m) - s0) * b + i64::from(k0))
            .t(1, -b)
            .t(2, n)
            .t(3, 1);
        // The chain's index among the step's `F` scores.
        let idx = |a: Ad| a.t(2, kk).t(3, 1);
        let here = idx(ad(c.t).plus((s0 - 1) * tsz)).t(1, tsz);
        let next = idx(ad(c.t).plus(s0 * tsz)).t(1, tsz);
        // Middle products: the first `sends` of them forward a word each (`u·F + index`).
        let (sends, fwd, fresh) = if p.last {
            let xu = i64::from(c.xu);
            (
                c.m - 2,
                Send {
                    src: here.clone().plus(xu * f).t(4, f),
                    dst: idx(ad(c.home)).t(4, f),
                    preds: Vec::new(),
                },
                idx(ad(c.home).plus(i64::from(c.m - 2) * f)),
            )
        } else {
            (
                c.xu + p.s0 - 1,
                Send {
                    src: here.t(4, f),
                    dst: next.clone().t(4, f),
                    preds: Vec::new(),
                },
                next.plus(i64::from(c.b * c.d) + (s0 - 1) * f).t(1, f),
            )
        };
        let step_of = |per: i16| (stepped && !p.last).then_some((1u8, per));
        let col = |a: &Ad, c0: i64, with_step: bool| {
            let x = a.clone().plus(c0).t(4, 1);
            if with_step {
                x.t(1, 1)
            } else {
                x
            }
        };
        let first = B::new()
            .mul(own.clone(), vis.clone(), None)
            .add(None, sc.clone())
            .build();
        let mid_a = B::new()
            .mul(col(&own, 1, false), col(&vis, 1, false), None)
            .add(Some(sc.clone()), sc.clone())
            .send(Some(&fwd))
            .build();
        // The rest of the middle products start at column `1 + sends`, which moves with the
        // step.
        let c_b = 1 + i64::from(sends);
        let moving = stepped && !p.last;
        let mid_b = B::new()
            .mul(col(&own, c_b, moving), col(&vis, c_b, moving), None)
            .add(Some(sc.clone()), sc.clone())
            .build();
        let end = d - 1;
        let last = send_acc(
            B::new()
                .mul(own.plus(end), vis.plus(end), None)
                .add(Some(sc.clone()), sc),
            fresh,
        )
        .build();
        let mut chain = vec![first];
        chain.extend(lps(sends, step_of(1), vec![mid_a]));
        chain.extend(lps(c.d - 2 - sends, step_of(-1), vec![mid_b]));
        chain.push(last);
        lp(p.count, lp(rows, lp(keys, chain)))
    }

    /// Where row `a`'s scores are, as runs of keys, for the rows `r0 … r0 + rows − 1` of
    /// group `upper` (the second half of the own rows) on PE `pe`.
    fn runs(&self, pe: u32, r0: u32, rows: u32, upper: bool) -> Vec<Run> {
        let c = self.c;
        let (n, b, f) = (i64::from(c.n), i64::from(c.b), i64::from(c.f));
        let (m, half) = (c.m, c.b / 2);
        let hh = i64::from(half);
        let r0i = i64::from(r0);
        // Blocks `j` PEs ahead met in step `m − j`: those of a low step (`j > m/2`, and `m/2`
        // on the lower PEs) computed here for the first half of the rows, the others here for
        // the second half of the keys.
        let low_j0 = if pe < m / 2 { m / 2 } else { m / 2 + 1 };
        let row = |base: u32, stride: i64| ad(base).plus(r0i * stride).t(1, stride);
        let mut runs = Vec::new();
        // Blocks of low steps.
        let low_count = m - low_j0;
        let low_e = row(c.e, n).plus(i64::from(low_j0) * b);
        let low_src = if upper {
            // From the payload: PE `pe + j` took all its rows against this PE's second half.
            ad(c.home)
                .plus(i64::from(low_j0 - 1) * f + r0i - hh)
                .t(1, 1)
        } else {
            row(c.sc, n).plus(i64::from(low_j0) * b)
        };
        runs.push(Run {
            src: low_src,
            e: low_e,
            js: Some((low_count, if upper { f } else { b }, b)),
            keys: c.b,
            step: None,
            src_k: if upper { hh } else { 1 },
        });
        // Blocks of high steps: the second half of the keys here, the first from the payload
        // (PE `pe + j` took the first half of its rows against this whole block).
        let high_count = low_j0 - 1;
        runs.push(Run {
            src: row(c.sc, n).plus(b + hh),
            e: row(c.e, n).plus(b + hh),
            js: Some((high_count, b, b)),
            keys: half,
            step: None,
            src_k: 1,
        });
        runs.push(Run {
            src: row(c.home, 1),
            e: row(c.e, n).plus(b),
            js: Some((high_count, f, b)),
            keys: half,
            step: None,
            src_k: b,
        });
        // The own triangle: keys `k ≥ a` from row `a`, keys `k < a` from row `k`.
        let stepped = rows > 1;
        runs.push(Run {
            src: row(c.sc, n + 1),
            e: row(c.e, n + 1),
            js: None,
            keys: c.b - r0,
            step: stepped.then_some((1, -1)),
            src_k: 1,
        });
        if r0 > 0 {
            runs.push(Run {
                src: row(c.sc, 1),
                e: row(c.e, n),
                js: None,
                keys: r0,
                step: stepped.then_some((1, 1)),
                src_k: n,
            });
        }
        runs
    }

    /// Maxima, exponentials with their sum (and, per weight, the divisions) of rows `r0 …
    /// r0 + rows − 1`.
    fn softmax(&self, pe: u32, r0: u32, rows: u32, upper: bool) -> Option<Vec<Node>> {
        let c = self.c;
        let runs = self.runs(pe, r0, rows, upper);
        let (lead, others) = runs.split_first()?;
        let mx = ad(c.mx).plus(i64::from(r0)).t(1, 1);
        let l = ad(c.l).plus(i64::from(r0)).t(1, 1);
        let mut body = Vec::new();
        // The first run's first block starts the maximum with its first two keys and the sum
        // with its first key; it has at least four keys.
        let at = |a: &Ad, k: i64| a.clone().plus(k * lead.src_k);
        body.push(
            B::new()
                .max(at(&lead.src, 0), at(&lead.src, 1), mx.clone())
                .build(),
        );
        body.extend(self.rest(lead, 2, |s, _| {
            B::new().max(mx.clone(), s, mx.clone()).build()
        }));
        for r in others {
            body.extend(self.all(r, |s, _| B::new().max(mx.clone(), s, mx.clone()).build()));
        }
        body.push(
            B::new()
                .expd(lead.src.clone(), mx.clone(), self.scale, lead.e.clone())
                .add(None, l.clone())
                .build(),
        );
        let exp = |s: Ad, e: Ad| {
            B::new()
                .expd(s, mx.clone(), self.scale, e)
                .add(Some(l.clone()), l.clone())
                .build()
        };
        body.extend(self.rest(lead, 1, exp));
        for r in others {
            body.extend(self.all(r, exp));
        }
        if self.per_weight {
            let e = ad(c.e)
                .plus(i64::from(r0 * c.n))
                .t(1, i64::from(c.n))
                .t(2, 1);
            body.extend(lp(c.n, vec![B::new().div(e.clone(), l.clone(), e).build()]));
        }
        Some(lp(rows, body))
    }

    /// The keys of `r`'s first block from `k0` on, then its other blocks.
    fn rest(&self, r: &Run, k0: u32, op: impl Fn(Ad, Ad) -> Node) -> Vec<Node> {
        let Some((blocks, sj, ej)) = r.js else {
            return Vec::new();
        };
        let k = i64::from(k0);
        let mut out = lp(
            r.keys - k0,
            vec![op(
                r.src.clone().plus(k * r.src_k).t(2, r.src_k),
                r.e.clone().plus(k).t(2, 1),
            )],
        );
        if blocks > 1 {
            out.extend(lp(
                blocks - 1,
                lp(
                    r.keys,
                    vec![op(
                        r.src.clone().plus(sj).t(2, sj).t(3, r.src_k),
                        r.e.clone().plus(ej).t(2, ej).t(3, 1),
                    )],
                ),
            ));
        }
        out
    }

    /// Every key of `r`.
    fn all(&self, r: &Run, op: impl Fn(Ad, Ad) -> Node) -> Vec<Node> {
        match r.js {
            Some((0, _, _)) => Vec::new(),
            Some((blocks, sj, ej)) => lp(
                blocks,
                lp(
                    r.keys,
                    vec![op(
                        r.src.clone().t(2, sj).t(3, r.src_k),
                        r.e.clone().t(2, ej).t(3, 1),
                    )],
                ),
            ),
            None => lps(
                r.keys,
                r.step,
                vec![op(r.src.clone().t(2, r.src_k), r.e.clone().t(2, 1))],
            ),
        }
    }

    /// `y = Σ e·x` over the own block and every kept block, columns outside, keys inside;
    /// then, deferred, `y /= l`.
    fn values(&self) -> Vec<Node> {
        let c = self.c;
        let (d, n, b) = (i64::from(c.d), i64::from(c.n), i64::from(c.b));
        let tsz = i64::from(c.tsz);
        // Levels: 1 step, 2 row, 3 column, 4 key.
        let y = ad(c.y).t(0, b * d).t(2, d).t(3, 1);
        let e0 = ad(c.e).t(2, n);
        let own = self.own().t(3, 1);
        let mut out = Vec::new();
        let first = B::new()
            .mul(e0.clone(), own.clone(), None)
            .add(None, y.clone())
            .build();
        let rest = B::new()
            .mul(e0.clone().plus(1).t(4, 1), own.plus(d).t(4, d), None)
            .add(Some(y.clone()), y.clone())
            .build();
        let mut chain = vec![first];
        chain.extend(lp(c.b - 1, vec![rest]));
        out.extend(lp(1, lp(c.b, lp(c.d, chain))));
        // Step s = 1 + i1 holds the block `m − s` PEs ahead in its own buffer.
        let e = ad(c.e)
            .plus((i64::from(c.m) - 1) * b)
            .t(1, -b)
            .t(2, n)
            .t(4, 1);
        let xv = ad(c.t).t(1, tsz).t(3, 1).t(4, d);
        let mac = B::new().mul(e, xv, None).add(Some(y.clone()), y).build();
        out.extend(lp(c.m - 1, lp(c.b, lp(c.d, lp(c.b, vec![mac])))));
        if !self.per_weight {
            let yy = ad(c.y).t(0, b * d).t(1, d).t(2, 1);
            out.extend(lp(
                c.b,
                lp(
                    c.d,
                    vec![B::new().div(yy.clone(), ad(c.l).t(1, 1), yy).build()],
                ),
            ));
        }
        out
    }
}

/// A run of keys of one row: `src + k·src_k` (and, over blocks, `+ j·sj`), its exponential at
/// `e + k` (`+ j·ej`).
struct Run {
    src: Ad,
    e: Ad,
    /// Blocks, and the source's and exponentials' strides from one to the next.
    js: Option<(u32, i64, i64)>,
    keys: u32,
    /// A count that moves with the row (the own triangle).
    step: Option<(u8, i16)>,
    src_k: i64,
}

/// The programs, their memory and the cycles, if the schedule applies.
pub(super) struct Carried {
    pub programs: Vec<LoopProgram>,
    pub x: u32,
    pub y: u32,
    pub rows: u32,
    pub buffers: Vec<runtime::manifest::BufferInfo>,
}

/// PE programs for `n` tokens of `d` columns, `heads` heads on `m` PEs.
pub(super) fn build(
    n: u32,
    d: u32,
    m: u32,
    heads: u32,
    scale: f32,
    per_weight: bool,
) -> Option<Carried> {
    if unsupported(n, d, m).is_some() || heads == 0 {
        return None;
    }
    let c = CMap::new(n, d, m, heads)?;
    let g = Gen {
        c: &c,
        scale,
        per_weight,
    };
    let half = c.b / 2;
    let programs = (0..m)
        .map(|pe| {
            let mut head = g.triangle();
            let mid_low = pe < m / 2;
            let pieces = [
                Piece {
                    s0: 1,
                    count: m / 2 - 1,
                    low: true,
                    last: false,
                },
                Piece {
                    s0: m / 2,
                    count: 1,
                    low: mid_low,
                    last: false,
                },
                Piece {
                    s0: m / 2 + 1,
                    count: m - 2 - m / 2,
                    low: false,
                    last: false,
                },
                Piece {
                    s0: m - 1,
                    count: 1,
                    low: false,
                    last: true,
                },
            ];
            for p in pieces.iter().filter(|p| p.count > 0) {
                head.extend(g.piece(p));
            }
            head.extend(g.softmax(pe, 0, 1, false)?);
            head.extend(g.softmax(pe, 1, half - 1, false)?);
            head.extend(g.softmax(pe, half, half, true)?);
            head.extend(g.values());
            Some(LoopProgram {
                pe,
                pes: m,
                mem_words: c.words,
                body: lp(heads, head),
            })
        })
        .collect::<Option<Vec<_>>>()?;
    let hd = c.b * c.d;
    let buffers = vec![
        buffer("x", c.x, heads * hd),
        buffer("y", c.y, heads * hd),
        buffer("score rows", c.sc, c.e - c.sc),
        buffer("exponentials", c.e, c.home - c.e),
        buffer("payload home", c.home, c.t - c.home),
        buffer("visiting blocks", c.t, c.mx - c.t),
        buffer("row maxima", c.mx, c.l - c.mx),
        buffer("row sums", c.l, c.words - c.l),
    ];
    Some(Carried {
        programs,
        x: c.x,
        y: c.y,
        rows: c.b,
        buffers,
    })
}

/// The carried stream of a safe shared layer without a mask, within `budget` words per PE;
/// `per_weight` divides each weight by its row's sum instead of each output element.
pub(super) fn stream(
    p: &crate::problem::Problem,
    pes: u32,
    budget: u64,
    per_weight: bool,
) -> Option<super::Stream> {
    if !(p.symmetric && p.shared_values && !p.causal && p.safe()) {
        return None;
    }
    let (n, d, heads) = (p.tokens, p.dim, p.heads);
    if u64::from(words(n, d, pes, heads)?) > budget {
        return None;
    }
    let built = build(n, d, pes, heads, p.scale as f32, per_weight)?;
    let cycles = built
        .programs
        .iter()
        .map(LoopProgram::cycles)
        .max()
        .unwrap_or(0);
    let total_ops: u64 = built
        .programs
        .iter()
        .map(|p| p.op_counts().iter().sum::<u64>())
        .sum();
    let (n64, d64, h64) = (u64::from(n), u64::from(d), u64::from(heads));
    let weights = n64 * n64 * h64;
    let ops = crate::schedule::OpCounts {
        phase1_mac: n64 * (n64 + 1) / 2 * d64 * h64,
        phase2_exp: weights,
        phase2_max: 0,
        phase2_div: if per_weight { weights } else { n64 * d64 * h64 },
        phase3_mac: weights * d64,
    };
    let hd = built.rows * d;
    let lay = |base: u32| {
        super::Place::Affine(super::Layout {
            order: runtime::manifest::RowOrder::Contiguous,
            rows_per_pe: built.rows,
            base,
            head_stride: hd,
            row_stride: d,
        })
    };
    let inputs = std::collections::BTreeMap::from([("x".to_string(), lay(built.x))]);
    Some(super::Stream {
        inputs,
        output: lay(built.y),
        programs: built.programs,
        cycles,
        ops,
        total_ops,
        lag: pes,
        buffers: built.buffers,
        normalisation: if per_weight {
            runtime::layer::Normalisation::PerWeight
        } else {
            runtime::layer::Normalisation::Deferred
        },
    })
}
