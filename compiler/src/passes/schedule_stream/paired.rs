//! The stream schedule of a shared layer without a mask that computes each score block once
//! and uses it for both of the rows it serves.
//!
//! With q = k = v = x the blocks of PEs `p` and `q = p − s` meet twice in a ring pass: at PE `p`
//! in step `s` and at PE `q` in step `m − s`. Each meeting computes half of the score block
//! `S(p, q)` and uses every score twice: for PE `p`'s own rows against the visiting keys, with
//! the running state that stays on `p` (*stationary*), and, transposed, for the visiting block's
//! rows against `p`'s own keys, with a running state (`l`, row maximum, unnormalised `y`) that
//! travels around the ring with its block (*travelling*). Each block's rows fall in two parts,
//! `F = ⌊B/2⌋` and `G = B − F` rows (the `G` part first where a padded last block keeps it and two
//! more, so that no high step meets a missing row; the `F` part first otherwise), called the
//! first and second half below. Steps `s < m/2` take the first half of
//! the own rows against the whole visiting block; steps `s > m/2` the whole own block against
//! the visiting block's second half, so that the two meetings of a pair cover its block exactly
//! once. In step `m/2` of an even ring the two meetings are in the same step: PEs below `m/2` take
//! the first kind, the others the second (with `B` odd the second half is the larger, and the
//! shorter kind waits before forwarding). Step 0 pairs the own block
//! with itself the same way in quarters: the two diagonal quarters in full for the stationary
//! state (their products twice, declared like the unexploited layers'), the off-diagonal one once,
//! its transpose starting the travelling state of the second half. After the last step the
//! travelling state is back on its block's PE and is merged into the stationary one (one more
//! maximum, two rescale factors), then divided once.

use isa::{Cmp, Node, Pred, Slot};

use super::{ad, lp, mask_keys, mask_rows, Ad, Ctx, Map, Send, Work, B};

/// Memory map of one PE (the same on every PE).
pub(super) struct PMap {
    pub d: u32,
    /// Tokens per PE (`B`).
    pub rows: u32,
    heads: u32,
    reuse: bool,
    pub x: u32,
    pub y: u32,
    /// The visiting x block, rotated in place.
    rot: u32,
    /// Travelling state of the visiting block's rows: `y` rows, `l`, running maximum.
    ytr: u32,
    ltr: u32,
    mtr: u32,
    /// Scores of one step (`B/2 × B` words).
    sc: u32,
    /// Exponentials of one visiting row.
    ev: u32,
    /// New maxima of the visiting rows, forwarded into the next PE's `mtr`.
    mnew: u32,
    /// Stationary state: row sums and two slots of maxima.
    l: u32,
    mx: u32,
    f: u32,
    f2: u32,
    mf: u32,
    pub words: u32,
}

impl PMap {
    /// `reuse`: the visiting block and the travelling `y` rows of a head live in per-head
    /// regions nothing needs while that head runs (the x rows of the two heads before it, or
    /// the outputs of the last two heads, written only when those run); three heads or more.
    /// The outputs then lie just below the x rows, so that those regions are the two heads'
    /// worth of words below the running head's x rows for every head, and one head loop with
    /// addresses affine in the head serves them all.
    pub fn new(rows: u32, d: u32, heads: u32, reuse: bool) -> Option<PMap> {
        if reuse && heads < 3 {
            return None;
        }
        let hd = rows.checked_mul(d)?;
        let all = heads.checked_mul(hd)?;
        let (x, y) = if reuse { (all, 0) } else { (0, all) };
        let end = all.checked_add(all)?;
        let (rot, ytr, ltr) = if reuse {
            (0, 0, end)
        } else {
            (
                end,
                end.checked_add(hd)?,
                end.checked_add(hd)?.checked_add(hd)?,
            )
        };
        let mtr = ltr.checked_add(rows)?;
        let sc = mtr.checked_add(rows)?;
        let ev = sc.checked_add(rows.checked_mul(rows.div_ceil(2))?)?;
        let mnew = ev.checked_add(rows)?;
        let l = mnew.checked_add(rows)?;
        let mx = l.checked_add(rows)?;
        let f = mx.checked_add(2 * rows)?;
        Some(PMap {
            d,
            rows,
            heads,
            reuse,
            x,
            y,
            rot,
            ytr,
            ltr,
            mtr,
            sc,
            ev,
            mnew,
            l,
            mx,
            f,
            f2: f + 1,
            mf: f + 2,
            words: f.checked_add(3)?,
        })
    }
}

impl PMap {
    /// The memory map, buffer by buffer. With `reuse` the visiting block and the travelling
    /// `y` rows have no words of their own: they move through the x and y regions from head
    /// to head.
    pub fn buffers(&self) -> Vec<runtime::manifest::BufferInfo> {
        let hd = self.rows * self.d;
        let all = self.heads * hd;
        let mut list = vec![("x", self.x, all), ("y", self.y, all)];
        if !self.reuse {
            list.push(("visiting block", self.rot, hd));
            list.push(("travelling y rows", self.ytr, hd));
        }
        list.extend([
            ("travelling row sums", self.ltr, self.rows),
            ("travelling row maxima", self.mtr, self.rows),
            ("scores", self.sc, self.ev - self.sc),
            ("visiting exponentials", self.ev, self.rows),
            ("new travelling maxima", self.mnew, self.rows),
            ("row sums", self.l, self.rows),
            ("row maxima", self.mx, 2 * self.rows),
            ("rescale factors", self.f, 3),
        ]);
        list.into_iter()
            .map(|(name, base, words)| runtime::manifest::BufferInfo {
                name: name.to_string(),
                base,
                words,
            })
            .collect()
    }
}

/// Whether the paired schedule applies: safe softmax, q = k = v, no mask, blocks of at least 4
/// tokens on 3 PEs or more; when the tokens do not deal evenly, the last
/// PE's block keeps its first half and two more (so that every range of keys a first maximum
/// takes has two tokens).
pub(super) fn applies(n: u32, m: u32) -> bool {
    let b = n.div_ceil(m);
    m >= 3
        && b >= 4
        && n.checked_sub((m - 1) * b)
            .is_some_and(|last| last >= b / 2 + 2)
}

/// Whether the `G` rows of each block (those the high steps visit) come first: where the last
/// PE's block keeps them and two more, so that its missing rows all lie in the other part and
/// no high step meets a missing key or row; otherwise the `F` rows come first.
fn part_g_first(b: u32, last: u32) -> bool {
    last >= b - b / 2 + 2
}

/// Phase-1 products executed per head: each distinct one once, and those of the own block's two
/// diagonal quarters (done in full) a second time.
pub(super) fn products_per_head(n: u32, d: u32, m: u32) -> u64 {
    let b = n.div_ceil(m);
    let last = n - (m - 1) * b;
    let half = u64::from(b / 2);
    let g_rows = u64::from(b) - half;
    let twice = |k: u64| k * k.saturating_sub(1) / 2;
    // The last PE's quarters hold its live rows, the part that comes first in full.
    let (first, second) = if part_g_first(b, last) {
        (g_rows, half)
    } else {
        (half, g_rows)
    };
    let last_second = u64::from(last) - first;
    let n = u64::from(n);
    let extra = u64::from(m) * twice(first) + u64::from(m - 1) * twice(second) + twice(last_second);
    u64::from(d) * (n * (n + 1) / 2 + extra)
}

/// Own rows of one row loop and the max slots (old, new; bases of `B` words) they use.
struct Group {
    r0: u32,
    rows: u32,
    old: Ad,
    new: Ad,
}

/// The paired work of one ring step (of step 0, its off-diagonal quarter).
struct StepSpec {
    /// Own rows `r0 .. r0 + rr` against the visiting keys `k0 .. k0 + kk` (also the visiting
    /// rows whose travelling state this step updates, against own keys `r0 .. r0 + rr`).
    r0: u32,
    rr: u32,
    k0: u32,
    kk: u32,
    /// Visiting rows in this range get their travelling state's first update.
    first: (u32, u32),
    /// The visiting keys' x rows: the rotating block, or in step 0 the own ones.
    xq: Option<Ad>,
    /// Travelling rows in this range are forwarded (the others hold nothing yet).
    trav: (u32, u32),
    /// Tokens of the visiting block (fewer than its rows for the last PE's padded one).
    vis_live: u32,
    groups: Vec<Group>,
    /// Visiting keys the last own row forwards in place (a range), if any.
    x_fwd: Option<(u32, u32)>,
    /// Whether the own rows' loops forward the travelling state; otherwise a tail does.
    trav_inline: bool,
    /// When this step is a run's body and the run's last step forwards fewer keys.
    last_from: Option<LastFrom>,
    /// When this step is a run's body and one of the run's steps has the padded block.
    pad_at: Option<PadAt>,
}

/// Iteration `index` of a run of steps (a loop at `level`) holds a visiting block of `live`
/// tokens, whose missing rows' travelling state is not forwarded; it reads no missing word.
#[derive(Clone, Copy)]
struct PadAt {
    level: u8,
    index: u32,
    live: u32,
}

/// The last step of a run of `count` steps (a loop at `level`) forwards the visiting keys in
/// `keys` only.
#[derive(Clone, Copy)]
struct LastFrom {
    level: u8,
    count: u32,
    keys: (u32, u32),
}

struct Gen<'a> {
    map: &'a PMap,
    scale: f32,
    /// The head of the head loop's first iteration (the loop is at level 0).
    h0: u32,
    /// Where the visiting block and the travelling `y` rows are in this head loop.
    rot: Ad,
    ytr: Ad,
    /// Own rows holding tokens (fewer on the last PE when the tokens do not deal evenly).
    live: u32,
    /// Set when a run's padded step could not share the run's body (the run is then emitted
    /// with that step apart).
    refused: std::cell::Cell<bool>,
}

impl Gen<'_> {
    fn hd(&self) -> i64 {
        i64::from(self.map.rows) * i64::from(self.map.d)
    }

    /// A per-head region at `base`, in the current head.
    fn own(&self, base: u32) -> Ad {
        ad(base)
            .plus(i64::from(self.h0) * self.hd())
            .t(0, self.hd())
    }

    /// Own x row `a` (head term included).
    fn xown(&self, a: u32) -> Ad {
        self.own(self.map.x)
            .plus(i64::from(a) * i64::from(self.map.d))
    }

    fn step(&self, st: &StepSpec, lr: u8) -> Vec<Node> {
        let m = self.map;
        let d = i64::from(m.d);
        let (lb, lc) = (lr + 1, lr + 2);
        let kk = i64::from(st.kk);
        let xq = st
            .xq
            .clone()
            .unwrap_or_else(|| self.rot.clone())
            .plus(i64::from(st.k0) * d);
        let mut body = Vec::new();
        // Scores of own rows against visiting keys, row-major `(a − r0)·kk + (b − k0)`.
        let scw = ad(m.sc).t(lr, kk).t(lb, 1);
        let xa = self.xown(st.r0).t(lr, d);
        let xb = xq.clone().t(lb, d);
        let mut cols = vec![B::new()
            .mul(xa.clone(), xb.clone(), None)
            .add(None, scw.clone())
            .build()];
        cols.extend(lp(
            m.d - 1,
            vec![B::new()
                .mul(xa.plus(1).t(lc, 1), xb.plus(1).t(lc, 1), None)
                .add(Some(scw.clone()), scw)
                .build()],
        ));
        let mut scores = lp(st.rr, lp(st.kk, cols));
        let kl = st.vis_live.saturating_sub(st.k0).min(st.kk);
        if kl < st.kk {
            mask_keys(&mut scores, lb, kl);
        }
        mask_rows(&mut scores, lr, st.r0, st.rr, self.live);
        body.extend(scores);
        // Own keys holding tokens; a loop over keys from key `from` keeps those.
        let ol = self.live.saturating_sub(st.r0).min(st.rr);
        let own_keys = |mut nodes: Vec<Node>, level: u8, from: u32| {
            if ol < st.rr {
                mask_keys(&mut nodes, level, ol.saturating_sub(from));
            }
            nodes
        };

        // Visiting rows `k0 + j0 + j` (loop at lr) against own keys `r0 + i`: the scores'
        // column `j0 + j`; rows in their first round and the others in loops of their own.
        let end = st.k0 + st.kk;
        let lo = st.first.0.clamp(st.k0, end);
        let hi = st.first.1.clamp(lo, end);
        for (j0, rows, first) in [
            (0, lo - st.k0, false),
            (lo - st.k0, hi - lo, true),
            (hi - st.k0, end - hi, false),
        ] {
            if rows == 0 {
                continue;
            }
            let at = i64::from(st.k0 + j0);
            let sc = |i: u32| ad(m.sc).plus(i64::from(i) * kk + i64::from(j0)).t(lr, 1);
            let mn = ad(m.mnew).plus(at).t(lr, 1);
            let mt = ad(m.mtr).plus(at).t(lr, 1);
            let lt = ad(m.ltr).plus(at).t(lr, 1);
            let yt = self.ytr.clone().plus(at * d).t(lr, d);
            let ev = |i: u32| ad(m.ev).plus(i64::from(i));
            let f = ad(m.f);
            let mut v = Vec::new();
            // i0: the first key a loop over keys starts at.
            let i0 = if first {
                v.push(B::new().max(sc(0), sc(1), mn.clone()).build());
                v.extend(own_keys(
                    lp(
                        st.rr - 2,
                        vec![B::new()
                            .max(mn.clone(), sc(2).t(lb, kk), mn.clone())
                            .build()],
                    ),
                    lb,
                    2,
                ));
                v.push(
                    B::new()
                        .expd(sc(0), mn.clone(), self.scale, ev(0))
                        .add(None, lt.clone())
                        .build(),
                );
                1
            } else {
                v.push(B::new().max(mt.clone(), sc(0), mn.clone()).build());
                v.extend(own_keys(
                    lp(
                        st.rr - 1,
                        vec![B::new()
                            .max(mn.clone(), sc(1).t(lb, kk), mn.clone())
                            .build()],
                    ),
                    lb,
                    1,
                ));
                v.push(B::new().expd(mt, mn.clone(), self.scale, f.clone()).build());
                v.push(
                    B::new()
                        .mul(lt.clone(), f.clone(), Some(lt.clone()))
                        .build(),
                );
                let yc = yt.clone().t(lb, 1);
                v.extend(lp(m.d, vec![B::new().mul(yc.clone(), f, Some(yc)).build()]));
                0
            };
            v.extend(own_keys(
                lp(
                    st.rr - i0,
                    vec![B::new()
                        .expd(sc(i0).t(lb, kk), mn.clone(), self.scale, ev(i0).t(lb, 1))
                        .add(Some(lt.clone()), lt)
                        .build()],
                ),
                lb,
                i0,
            ));
            // y[b][c] += Σ_a e[a]·x[a][c]: columns outside (lb), own keys inside (lc).
            let yc = yt.t(lb, 1);
            let xk = |i: u32| self.xown(st.r0 + i).t(lb, 1);
            let mut pv = Vec::new();
            if i0 == 1 {
                pv.push(
                    B::new()
                        .mul(ev(0), xk(0), None)
                        .add(None, yc.clone())
                        .build(),
                );
            }
            pv.extend(own_keys(
                lp(
                    st.rr - i0,
                    vec![B::new()
                        .mul(ev(i0).t(lc, 1), xk(i0).t(lc, d), None)
                        .add(Some(yc.clone()), yc)
                        .build()],
                ),
                lc,
                i0,
            ));
            v.extend(lp(m.d, pv));
            let mut vis = lp(rows, v);
            mask_rows(&mut vis, lr, st.k0 + j0, rows, st.vis_live);
            body.extend(vis);
        }

        // Own rows against the visiting keys, group by group (groups differ in max slots).
        let (tf, tt) = st.trav;
        let pieces = (tt - tf).div_ceil(st.kk);
        // The travelling maxima go in runs that take one source each: the rows this step did
        // not update keep the one that arrived, the others send their new one.
        let mut m_runs: Vec<(u32, u32, u32)> = Vec::new();
        let upd = st.k0.clamp(tf, tt);
        let upd_end = (st.k0 + st.kk).clamp(upd, tt);
        for (from, to, src) in [
            (tf, upd, m.mtr),
            (upd, upd_end, m.mnew),
            (upd_end, tt, m.mtr),
        ] {
            let mut at = from;
            while at < to {
                let len = (to - at).min(st.kk);
                m_runs.push((at, len, src));
                at += len;
            }
        }
        debug_assert!(m_runs.len() as u32 <= pieces, "too few carrying rows");
        #[derive(Clone, Copy, PartialEq)]
        enum Role {
            Plain,
            /// Forwards piece `p` of the travelling state (one row).
            Carry(u32),
            /// Forwards the visiting keys (one row).
            Keys,
        }
        // A bundle has one send: each row that forwards something is a loop of its own.
        let mut loops: Vec<(&Group, u32, u32, Role)> = Vec::new();
        let last_group = st.groups.len() - 1;
        for (gi, g) in st.groups.iter().enumerate() {
            let mut r0 = g.r0;
            let mut end = g.r0 + g.rows;
            if gi == 0 && st.trav_inline {
                for p in 0..pieces {
                    loops.push((g, r0, 1, Role::Carry(p)));
                    r0 += 1;
                }
            }
            let keys = gi == last_group && st.x_fwd.is_some();
            if keys {
                end -= 1;
            }
            debug_assert!(r0 <= end, "too few own rows for the sends");
            if end > r0 {
                loops.push((g, r0, end - r0, Role::Plain));
            }
            if keys {
                loops.push((g, end, 1, Role::Keys));
            }
        }
        for &(g, r0, rows, role) in &loops {
            let g = Group {
                r0,
                rows,
                old: g.old.clone(),
                new: g.new.clone(),
            };
            let rel = i64::from(g.r0 - st.r0) * kk;
            let scr = ad(m.sc).plus(rel).t(lr, kk);
            let mo = g.old.clone().plus(i64::from(g.r0)).t(lr, 1);
            let mn = g.new.clone().plus(i64::from(g.r0)).t(lr, 1);
            let l = ad(m.l).plus(i64::from(g.r0)).t(lr, 1);
            let yo = self.own(m.y).plus(i64::from(g.r0) * d).t(lr, d);
            let f = ad(m.f);
            // A carrying row forwards the travelling rows `tf + p·kk + b` of its piece that
            // hold a token, `b` being the key the bundle works on.
            let (piece, cl) = match role {
                Role::Carry(p) => (
                    p,
                    st.vis_live
                        .min(tt)
                        .saturating_sub(tf + p * st.kk)
                        .min(st.kk),
                ),
                _ => (0, 0),
            };
            // The maxima of run `piece`, if there is one: start, words holding a token, source.
            let (m_at, m_keep, m_src) = match (role, m_runs.get(piece as usize)) {
                (Role::Carry(_), Some(&(at, len, src))) => {
                    (at, st.vis_live.saturating_sub(at).min(len), src)
                }
                _ => (0, 0, m.mtr),
            };
            let carry_n =
                |src: Ad, dst: Ad, level: Option<u8>, less: u32, cl: u32| -> Option<Send> {
                    let keep = cl.checked_sub(less).filter(|&k| k > 0)?;
                    let mut preds = Vec::new();
                    if let Some(level) = level {
                        if keep < st.kk - less {
                            preds.push(Pred {
                                slot: Slot::Xfer,
                                level,
                                cmp: Cmp::Lt,
                                value: keep,
                            });
                        }
                    }
                    Some(Send { src, dst, preds })
                };
            let carry = |src: Ad, dst: Ad, level: Option<u8>, less: u32| -> Option<Send> {
                carry_n(src, dst, level, less, cl)
            };
            let at = i64::from(tf + piece * st.kk);
            let msrc = ad(m_src + m_at);
            let mdst = ad(m.mtr + m_at);
            let mut o = vec![B::new()
                .max(mo.clone(), scr.clone(), mn.clone())
                .send(carry_n(msrc.clone(), mdst.clone(), None, 0, m_keep).as_ref())
                .build()];
            let mut more = lp(
                st.kk - 1,
                vec![B::new()
                    .max(mn.clone(), scr.clone().plus(1).t(lb, 1), mn.clone())
                    .send(
                        carry_n(
                            msrc.plus(1).t(lb, 1),
                            mdst.plus(1).t(lb, 1),
                            Some(lb),
                            1,
                            m_keep,
                        )
                        .as_ref(),
                    )
                    .build()],
            );
            mask_ops(&mut more, lb, st.kk - 1, kl.saturating_sub(1));
            o.extend(more);
            o.push(B::new().expd(mo, mn.clone(), self.scale, f.clone()).build());
            o.push(B::new().mul(l.clone(), f.clone(), Some(l.clone())).build());
            let yc = yo.clone().t(lb, 1);
            o.extend(lp(
                m.d,
                vec![B::new().mul(yc.clone(), f, Some(yc.clone())).build()],
            ));
            let lw = ad(m.ltr).plus(at).t(lb, 1);
            let mut ex = lp(
                st.kk,
                vec![B::new()
                    .expd(
                        scr.clone().t(lb, 1),
                        mn.clone(),
                        self.scale,
                        scr.clone().t(lb, 1),
                    )
                    .add(Some(l.clone()), l)
                    .send(carry(lw.clone(), lw, Some(lb), 0).as_ref())
                    .build()],
            );
            mask_ops(&mut ex, lb, st.kk, kl);
            // In the run's padded step a carrying row forwards fewer words: each loop of its
            // sends is cut where those stop, the rest sent in the other steps only.
            let pad = match (role, st.pad_at) {
                (Role::Carry(_), Some(pa)) => {
                    let cl_pad = st
                        .vis_live
                        .min(pa.live)
                        .min(tt)
                        .saturating_sub(tf + piece * st.kk)
                        .min(st.kk);
                    let m_keep_pad = match m_runs.get(piece as usize) {
                        Some(&(at, len, _)) => st.vis_live.min(pa.live).saturating_sub(at).min(len),
                        None => 0,
                    };
                    let other = Pred {
                        slot: Slot::Xfer,
                        level: pa.level,
                        cmp: Cmp::Ne,
                        value: pa.index,
                    };
                    Some((cl_pad, m_keep_pad, other))
                }
                _ => None,
            };
            let cut_at = |nodes: Vec<Node>, level: u8, from: u32, keep: u32| -> Vec<Node> {
                match (&pad, nodes.as_slice()) {
                    (Some((_, _, other)), [Node::Loop(l)]) if from < keep => {
                        super::cut::cut(l, level, from, *other).unwrap_or_else(|| {
                            self.refused.set(true);
                            nodes
                        })
                    }
                    (Some(_), _) if from < keep => {
                        self.refused.set(true);
                        nodes
                    }
                    _ => nodes,
                }
            };
            if let Some((_, m_keep_pad, other)) = pad {
                if m_keep_pad == 0 && m_keep > 0 {
                    if let Some(Node::Bundle(b)) = o.first_mut() {
                        b.preds.push(other);
                        b.preds.sort();
                    }
                }
                // Rebuilt below with the cut: the maxima loop sends word `j + 1` in iteration j.
                if let Some(Node::Loop(_)) = o.get(1) {
                    let more = o.remove(1);
                    let cut_more = cut_at(
                        vec![more],
                        lb,
                        m_keep_pad.saturating_sub(1),
                        m_keep.saturating_sub(1),
                    );
                    for (k, n) in cut_more.into_iter().enumerate() {
                        o.insert(1 + k, n);
                    }
                }
            }
            let ex = match pad {
                Some((cl_pad, _, _)) => cut_at(ex, lb, cl_pad, cl),
                None => ex,
            };
            o.extend(ex);
            let xv = xq.clone().t(lc, d).t(lb, 1);
            let yw = self.ytr.clone().plus(at * d).t(lc, d).t(lb, 1);
            let send = match role {
                Role::Keys => {
                    let mut preds = Vec::new();
                    let (from, to) = st.x_fwd.unwrap_or((st.k0, st.k0 + st.kk));
                    if from > st.k0 {
                        preds.push(Pred {
                            slot: Slot::Xfer,
                            level: lc,
                            cmp: Cmp::Ge,
                            value: from - st.k0,
                        });
                    }
                    let below = to.saturating_sub(st.k0).min(kl);
                    if below < st.kk {
                        preds.push(Pred {
                            slot: Slot::Xfer,
                            level: lc,
                            cmp: Cmp::Lt,
                            value: below,
                        });
                    }
                    Some(Send {
                        src: xv.clone(),
                        dst: xv.clone(),
                        preds,
                    })
                }
                Role::Carry(_) => carry(yw.clone(), yw, Some(lc), 0),
                Role::Plain => None,
            };
            let pv_keys = |from: u32, count: u32, send: Option<&Send>| {
                let at = i64::from(from);
                lp(
                    count,
                    vec![B::new()
                        .mul(scr.clone().plus(at).t(lc, 1), xv.clone().plus(at * d), None)
                        .add(Some(yc.clone()), yc.clone())
                        .send(
                            send.map(|s| Send {
                                src: s.src.clone().plus(at * d),
                                dst: s.dst.clone().plus(at * d),
                                preds: s.preds.clone(),
                            })
                            .as_ref(),
                        )
                        .build()],
                )
            };
            // In a run whose last step forwards only some of the keys, the others are sent by
            // loops of their own that the run's last iteration leaves out.
            let split = match (role, st.last_from, &send) {
                (Role::Keys, Some(lf), Some(s)) if kl == st.kk && s.preds.is_empty() => {
                    let a = lf.keys.0.saturating_sub(st.k0).min(st.kk);
                    let b = lf.keys.1.saturating_sub(st.k0).clamp(a, st.kk);
                    let mut early = s.clone();
                    early.preds.push(Pred {
                        slot: Slot::Xfer,
                        level: lf.level,
                        cmp: Cmp::Lt,
                        value: lf.count - 1,
                    });
                    let mut v = Vec::new();
                    for (at, len, send) in [(0, a, &early), (a, b - a, s), (b, st.kk - b, &early)] {
                        v.extend(pv_keys(at, len, Some(send)));
                    }
                    Some(v)
                }
                _ => None,
            };
            let inner = split.unwrap_or_else(|| pv_keys(0, st.kk, send.as_ref()));
            let inner = match pad {
                Some((cl_pad, _, _)) => cut_at(inner, lc, cl_pad, cl),
                None => inner,
            };
            let mut pv = lp(m.d, inner);
            mask_ops(&mut pv, lc, st.kk, kl);
            o.extend(pv);
            let mut nodes = lp(g.rows, o);
            mask_rows(&mut nodes, lr, g.r0, g.rows, self.live);
            body.extend(nodes);
        }
        body
    }

    /// Sends only, at level `lr`: the visiting keys in `keys`, then the travelling state, in
    /// the two parts of the rows (below `part` and the others), each part's maximum taken from
    /// the new maxima where the step updated it (rows in `upd`).
    /// A padded visiting block (`vis_live` tokens) keeps its missing words where they are.
    fn tail(
        &self,
        keys: (u32, u32),
        upd: (u32, u32),
        part: u32,
        vis_live: u32,
        lr: u8,
    ) -> Vec<Node> {
        let m = self.map;
        // `count` cycles sending the first `keep` of `count` words.
        let words = |src: Ad, dst: Ad, count: u32, keep: u32| {
            let keep = keep.min(count);
            let send = (keep > 0).then(|| Send {
                src: src.t(lr, 1),
                dst: dst.t(lr, 1),
                preds: (keep < count)
                    .then_some(Pred {
                        slot: Slot::Xfer,
                        level: lr,
                        cmp: Cmp::Lt,
                        value: keep,
                    })
                    .into_iter()
                    .collect(),
            });
            lp(count, vec![B::new().send(send.as_ref()).build()])
        };
        let (x0, x1) = (keys.0 * m.d, keys.1 * m.d);
        let x = self.rot.clone().plus(i64::from(x0));
        let live_words = vis_live * m.d;
        let mut v = words(x.clone(), x, x1 - x0, live_words.min(x1).saturating_sub(x0));
        v.extend(words(
            self.ytr.clone(),
            self.ytr.clone(),
            m.rows * m.d,
            live_words,
        ));
        v.extend(words(ad(m.ltr), ad(m.ltr), m.rows, vis_live));
        // The two parts of the rows, so that both kinds of PE take the same cycles.
        for (at, count) in [(0, part), (part, m.rows - part)] {
            let src = if at >= upd.0 && at + count <= upd.1 {
                m.mnew
            } else {
                m.mtr
            };
            v.extend(words(
                ad(src + at),
                ad(m.mtr + at),
                count,
                vis_live.saturating_sub(at),
            ));
        }
        v
    }

    /// Merges the travelling state into the stationary one and normalises, rows `r0 ..
    /// r0 + rows` whose stationary maximum is in the slot at `slot`.
    fn merge(&self, r0: u32, rows: u32, slot: u32) -> Vec<Node> {
        let m = self.map;
        let d = i64::from(m.d);
        let (lr, lc) = (1, 2);
        let r = |base: u32| ad(base).plus(i64::from(r0)).t(lr, 1);
        let (ms, mt, l, lt) = (r(slot), r(m.mtr), r(m.l), r(m.ltr));
        let (f, f2, mf) = (ad(m.f), ad(m.f2), ad(m.mf));
        let y = self.own(m.y).plus(i64::from(r0) * d).t(lr, d).t(lc, 1);
        let yt = self.ytr.clone().plus(i64::from(r0) * d).t(lr, d).t(lc, 1);
        let mut v = vec![
            B::new().max(ms.clone(), mt.clone(), mf.clone()).build(),
            B::new().expd(ms, mf.clone(), self.scale, f.clone()).build(),
            B::new().expd(mt, mf, self.scale, f2.clone()).build(),
            B::new().mul(l.clone(), f.clone(), Some(l.clone())).build(),
            B::new()
                .mul(lt, f2.clone(), None)
                .add(Some(l.clone()), l.clone())
                .build(),
        ];
        v.extend(lp(
            m.d,
            vec![
                B::new().mul(y.clone(), f, Some(y.clone())).build(),
                B::new()
                    .mul(yt, f2, None)
                    .add(Some(y.clone()), y.clone())
                    .build(),
                B::new().div(y.clone(), l, y).build(),
            ],
        ));
        let mut nodes = lp(rows, v);
        mask_rows(&mut nodes, lr, r0, rows, self.live);
        nodes
    }
}

/// Turns off the op and acc slots of the bundles in `nodes` (a loop over keys at `level`) in the
/// iterations at or past `keep`, keys past the layer's end; their sends, which carry other
/// words, stay.
fn mask_ops(nodes: &mut [Node], level: u8, count: u32, keep: u32) {
    mask_rows(nodes, level, 0, count, keep);
}

/// PE `pe`'s program; `last_live` of the last PE's rows hold tokens. Its rows come in one
/// loop per kind of send; those that continue one another are merged, which only shortens it.
pub(super) fn program(
    map: &PMap,
    pe: u32,
    m: u32,
    heads: u32,
    scale: f32,
    last_live: u32,
) -> Option<isa::LoopProgram> {
    unmerged(map, pe, m, heads, scale, last_live)
        .map(super::once::strip)
        .map(super::merge::merge)
}

/// [`program`] as generated: a loop per run of rows that send alike.
pub(super) fn unmerged(
    map: &PMap,
    pe: u32,
    m: u32,
    heads: u32,
    scale: f32,
    last_live: u32,
) -> Option<isa::LoopProgram> {
    let b = map.rows;
    let live = if pe + 1 == m { last_live } else { b };
    // The last PE's block, padded when the tokens do not deal evenly, visits this PE in step
    // `pe + 1` (it is its own in step 0): that step is emitted alone, its missing words masked.
    let padded_step = (pe + 1) % m;
    let vis_live = |s: u32| if s == padded_step { last_live } else { b };
    // The runs of steps `s0 .. s0 + count` with the padded step alone.
    let around = |s0: u32, count: u32| -> Vec<(u32, u32)> {
        let end = s0 + count;
        if last_live == b || !(s0..end).contains(&padded_step) {
            return vec![(s0, count)];
        }
        [
            (s0, padded_step - s0),
            (padded_step, 1),
            (padded_step + 1, end - padded_step - 1),
        ]
        .into_iter()
        .filter(|&(_, c)| c > 0)
        .collect()
    };
    // The two parts of the own rows: `F` rows (`half`) paired in the low steps, `G` (`g_rows`,
    // one more when `B` is odd) visiting in the high ones, the `G` rows first where the padded
    // block's missing rows then all lie in the other part (at `a0`, the `G` at `b0`).
    let half = b / 2;
    let g_rows = b - half;
    let (a0, b0) = if part_g_first(b, last_live) {
        (g_rows, 0)
    } else {
        (0, half)
    };
    let by_row = |mut v: Vec<Group>| {
        v.sort_by_key(|g| g.r0);
        v
    };
    let even = m.is_multiple_of(2);
    // Steps 1 ..= low take the first half of the own rows against the whole visiting block,
    // high .. m − 1 the whole own block against the visiting block's second half.
    let low = (m - 1) / 2;
    let high = m / 2 + 1;
    let kind_b = even && pe >= m / 2;
    // Max slots: a group touched for the j-th time writes slot j % 2 and reads the other. The
    // first half of the own rows is touched in every step; the second in step 0, in step m/2 on
    // the upper PEs of an even ring, and from `high` on.
    // The second half starts in slot `flip` (its count of touches shifted by one) where that
    // makes both halves write the same slot in every step that touches both, so that their
    // rows continue one another in one loop (and so do their merges at the end).
    let flip = (u32::from(kind_b) + high) % 2;
    let slot_at = |j: u32| ad(map.mx + (j % 2) * b);
    let g_touch = |s: u32| s + 1 + u32::from(kind_b) - high + flip;
    let alternating = |j0: u32, count: u32| {
        let at = slot_at(j0);
        if count > 1 {
            at.wrap(
                1,
                if j0.is_multiple_of(2) {
                    i64::from(b)
                } else {
                    -i64::from(b)
                },
                2,
            )
        } else {
            at
        }
    };
    // The first half is touched twice in step 0, so its j in step s is s + 1.
    let low_groups = |s0: u32, count: u32| {
        vec![Group {
            r0: a0,
            rows: half,
            old: alternating(s0, count),
            new: alternating(s0 + 1, count),
        }]
    };
    let high_groups = |s0: u32, count: u32| {
        by_row(vec![
            Group {
                r0: a0,
                rows: half,
                old: alternating(s0, count),
                new: alternating(s0 + 1, count),
            },
            Group {
                r0: b0,
                rows: g_rows,
                old: alternating(g_touch(s0) + 1, count),
                new: alternating(g_touch(s0), count),
            },
        ])
    };
    let low_spec = |s0: u32, count: u32, x_keys: (u32, u32)| StepSpec {
        r0: a0,
        rr: half,
        k0: 0,
        kk: b,
        // The other part's travelling rows began in step 0.
        first: if s0 == 1 { (a0, a0 + half) } else { (0, 0) },
        xq: None,
        trav: (0, b),
        groups: low_groups(s0, count),
        x_fwd: Some(x_keys),
        trav_inline: true,
        vis_live: vis_live(s0),
        last_from: None,
        pad_at: None,
    };
    let high_spec = |s0: u32, count: u32, fwd: bool| StepSpec {
        r0: 0,
        rr: b,
        k0: b0,
        kk: g_rows,
        first: (0, 0),
        xq: None,
        trav: (0, b),
        groups: high_groups(s0, count),
        x_fwd: fwd.then_some((b0, b0 + g_rows)),
        trav_inline: true,
        vis_live: vis_live(s0),
        last_from: None,
        pad_at: None,
    };
    // Step 0: the diagonal quarters, whose last rows forward the own x rows, then the other one.
    let hb = |g: &Gen| -> Option<Vec<Node>> {
        let mut head = Vec::new();
        let old_map = Map {
            d: map.d,
            rows: b,
            q: map.x + g.h0 * b * map.d,
            kv: map.x + g.h0 * b * map.d,
            block: b * map.d,
            v_off: 0,
            y: map.y + g.h0 * b * map.d,
            buf: [map.rot, map.rot],
            s: map.sc,
            l: map.l,
            mx: map.mx,
            f: map.f,
            words: map.words,
        };
        // Each quarter in a loop of its own (at level 1), so that the two join into one loop
        // over the quarter where they continue one another (`B` even, both live alike).
        let ctx = Ctx {
            map: &old_map,
            scale,
            depth: 2,
            head: 0,
            live,
        };
        let mut quarters = [(a0, half, slot_at(0)), (b0, g_rows, slot_at(flip))];
        quarters.sort_by_key(|q| q.0);
        for (r0, rows, slot) in quarters {
            head.extend(lp(
                1,
                ctx.block(&Work {
                    r0,
                    rows,
                    k0: r0,
                    keys: rows,
                    kb: g.own(map.x),
                    first: true,
                    send: None,
                    slots: Some((slot.clone(), slot)),
                    tri: false,
                    forward_to: Some(g.rot.clone()),
                    key_limit: (live < r0 + rows).then(|| live - r0),
                }),
            ));
        }
        head.extend(g.step(
            &StepSpec {
                r0: a0,
                rr: half,
                k0: b0,
                kk: g_rows,
                first: (0, b),
                xq: Some(g.own(map.x)),
                trav: (b0, b0 + g_rows),
                groups: vec![Group {
                    r0: a0,
                    rows: half,
                    old: slot_at(0),
                    new: slot_at(1),
                }],
                x_fwd: None,
                trav_inline: true,
                vis_live: vis_live(0),
                last_from: None,
                pad_at: None,
            },
            1,
        ));
        // Low steps: the first alone (the travelling state's first update), the others one run.
        // The last forwards only the keys its receiver reads (a high step, or step m/2 on an
        // upper PE, reads the `G` part only): in the run, the other keys are sent by loops of
        // their own kept from its last iteration, so that the steps share one body.
        let all = (0, b);
        let last_keys = (!even || (pe + 1) % m >= m / 2).then_some((b0, b0 + g_rows));
        let mut runs = vec![(1, 1)];
        if low >= 2 {
            runs.push((2, low - 1));
        }
        for (s0, count) in runs {
            for (s0, count) in around(s0, count) {
                let spec = match last_keys {
                    Some(keys) if s0 + count - 1 == low => {
                        if count == 1 {
                            low_spec(s0, 1, keys)
                        } else {
                            StepSpec {
                                last_from: Some(LastFrom {
                                    level: 1,
                                    count,
                                    keys,
                                }),
                                ..low_spec(s0, count, all)
                            }
                        }
                    }
                    _ => low_spec(s0, count, all),
                };
                head.extend(lp(count, g.step(&spec, 2)));
            }
        }
        if even {
            let s = m / 2;
            let spec = if kind_b {
                StepSpec {
                    x_fwd: None,
                    trav_inline: false,
                    ..high_spec(s, 1, false)
                }
            } else {
                StepSpec {
                    x_fwd: None,
                    trav_inline: false,
                    ..low_spec(s, 1, all)
                }
            };
            let mut body = g.step(&spec, 2);
            // With `B` odd the two kinds differ in length: the shorter waits, so that the
            // tails, whose sends replace words in place, run in the same cycles on both.
            let long = [low_spec(s, 1, all), high_spec(s, 1, false)]
                .iter()
                .map(|sp| {
                    isa::LoopProgram {
                        pe,
                        pes: m,
                        mem_words: map.words,
                        body: g.step(sp, 2),
                    }
                    .cycles()
                })
                .max()
                .unwrap_or(0);
            let own = isa::LoopProgram {
                pe,
                pes: m,
                mem_words: map.words,
                body: body.clone(),
            }
            .cycles();
            // The longer kind is at least as long as this one; a wait beyond 32 bits cannot be
            // a loop count, and the layer then gets the unpaired stream.
            let wait = long.checked_sub(own).and_then(|w| u32::try_from(w).ok())?;
            body.extend(lp(wait, vec![B::new().build()]));
            body.extend(g.tail(
                (b0, b0 + g_rows),
                (spec.k0, spec.k0 + spec.kk),
                a0.max(b0),
                spec.vis_live,
                2,
            ));
            head.extend(lp(1, body));
        }
        // High steps, one run; the last forwards no keys (nobody reads them again). Where
        // the padded block's missing rows all lie outside the part the high steps visit, its
        // step differs only in the travelling words it forwards and stays in the run.
        if high < m {
            let count = m - high;
            let padded = last_live < b && (high..m).contains(&padded_step);
            let clean = b0 + g_rows <= last_live;
            let run = (count >= 2 && (clean || !padded)).then(|| {
                let spec = StepSpec {
                    last_from: Some(LastFrom {
                        level: 1,
                        count,
                        keys: (b0, b0),
                    }),
                    pad_at: padded.then(|| PadAt {
                        level: 1,
                        index: padded_step - high,
                        live: last_live,
                    }),
                    vis_live: b,
                    ..high_spec(high, count, true)
                };
                lp(count, g.step(&spec, 2))
            });
            match run {
                Some(run) if !g.refused.replace(false) => head.extend(run),
                _ => {
                    for (s0, count) in around(high, m - 1 - high) {
                        head.extend(lp(count, g.step(&high_spec(s0, count, true), 2)));
                    }
                    head.extend(lp(1, g.step(&high_spec(m - 1, 1, false), 2)));
                }
            }
        }
        let last_g = g_touch(m - 1);
        let mut merges = [
            (a0, half, map.mx + (m % 2) * b),
            (b0, g_rows, map.mx + (last_g % 2) * b),
        ];
        merges.sort_by_key(|q| q.0);
        for (r0, rows, slot) in merges {
            head.extend(g.merge(r0, rows, slot));
        }
        Some(head)
    };
    let hd = b * map.d;
    let gen = |h0: u32, rot: Ad, ytr: Ad| Gen {
        map,
        scale,
        h0,
        rot,
        ytr,
        live,
        refused: std::cell::Cell::new(false),
    };
    let body = if map.reuse {
        // Head h's visiting block is in the words of x rows h − 1 (for head 0 the last head's
        // outputs), its travelling rows in those of x rows h − 2 (the last two heads' outputs).
        let below = |k: u32| ad(map.x - k * hd).t(0, i64::from(hd));
        lp(heads, hb(&gen(0, below(1), below(2)))?)
    } else {
        lp(heads, hb(&gen(0, ad(map.rot), ad(map.ytr)))?)
    };
    Some(isa::LoopProgram {
        pe,
        pes: m,
        mem_words: map.words,
        body,
    })
}
