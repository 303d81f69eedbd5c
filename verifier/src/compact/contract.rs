//! The value half of the per-step contracts (docs/verifier.md, "Contracts of ring steps"): what
//! a PE's receive buffer holds after a block has travelled `s` hops, stated from the manifest's
//! input layout alone, and the comparison of what a PE sends with what its successor is owed.
//!
//! A block of keys (or values) starts on its owner and moves one PE per hop, so after `s` hops
//! the block on PE `p` is the one PE `(p − s) mod m` owns. Within the hops where the origin does
//! not wrap (`s ≤ p`, then `s > p`) the origin is `c − s` for a constant `c`, and every run of
//! local rows the layout deals holds tokens affine in `s`: contiguous rows `c·R − R·s + r`,
//! the zigzag layout's first chunk `c·C − C·s + r` and its second `(2m − 1 − c)·C + C·s + r`.
//! Under a causal mask a row travels only while a PE ahead still needs its token ([`Need`]).
//! [`pieces`] gives those formulas; `owed` turns one piece into facts of input atoms at a
//! given placement of the buffer and a given (possibly symbolic) hop; `discharge` accepts a
//! PE's sends only if they tile exactly the words its successor is owed, with their values,
//! so nothing arrives that the contract does not state.
//!
//! Nothing here is used for a verdict yet: the per-PE evaluation with step loops symbolic,
//! which would push these facts at each step's start and collect the sends to compare, does
//! not exist. The parts are exact or refuse, so they can be built on.

use super::aff::Aff;
use super::prove::{tensor_layout, Eval, Fact, R};
use runtime::manifest::{Layout, Manifest, RowOrder};

/// Local rows `row0 .. row0 + len` of a block, holding after hop `s` the tokens
/// `token0 + per_hop·s + i` for row `row0 + i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub row0: u32,
    pub len: u32,
    pub token0: i64,
    pub per_hop: i64,
}

/// Hops `lo .. hi` of the blocks passing PE `p`, in which the origin `(p − s) mod m` has no
/// wrap and the rows present do not change, with the runs of rows that hold their tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    pub lo: u32,
    pub hi: u32,
    pub runs: Vec<Run>,
}

/// Which key tokens each PE needs: all of them, or (under a causal mask) those up to the
/// largest query token it owns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Need {
    All,
    UpTo(Vec<i64>),
}

impl Need {
    /// From `m`'s mask and query layout.
    pub fn from_manifest(m: &Manifest) -> Result<Need, String> {
        match m.layer.mask.as_str() {
            "none" => Ok(Need::All),
            "causal" => {
                let q = tensor_layout(m, "q")?;
                Ok(Need::UpTo(
                    (0..m.pes)
                        .map(|p| {
                            q.tokens_of(m.pes, p, m.layer.tokens)
                                .iter()
                                .map(|&(t, _)| i64::from(t))
                                .max()
                                .unwrap_or(-1)
                        })
                        .collect(),
                ))
            }
            other => Err(format!("mask `{other}`")),
        }
    }
}

/// The pieces of hops `0 .. m` for PE `p` of a ring of `pes` PEs, whose inputs `layout`
/// deals. A row is in a block at hop `s > 0` only while some PE still ahead on its way (at hop
/// `s` or later) needs its token: a ring that carries every key to every PE that needs it
/// carries at least those rows, and past the last PE that needs a row nothing has to. Pieces
/// are cut where the origin wraps and where the rows present change. Refuses layouts with rows
/// that hold no token (padding): the contract of such a row would have to say it holds
/// nothing, which these facts cannot.
pub fn pieces(
    layout: &Layout,
    pes: u32,
    tokens: u32,
    p: u32,
    need: &Need,
) -> Result<Vec<Piece>, String> {
    if p >= pes {
        return Err(format!("PE {p} on a ring of {pes}"));
    }
    let r = layout.rows_per_pe;
    let (m, rr) = (i64::from(pes), i64::from(r));
    if rr == 0 || i64::from(tokens) != m * rr {
        return Err(format!(
            "{tokens} tokens dealt as {r} rows to each of {pes} PEs: padded rows have no contract"
        ));
    }
    if layout.order == RowOrder::Zigzag && !r.is_multiple_of(2) {
        return Err(format!("a zigzag layout of {r} rows (odd)"));
    }
    // At hop `s` the PEs still ahead (the receiver included) are `p, p + 1, …` for `m − s`
    // PEs; `ahead[j]` is the largest token any of the first `j` of them needs.
    let mut ahead = vec![i64::MIN; pes as usize + 1];
    for j in 0..pes {
        let q = (p + j) % pes;
        let wants = match need {
            Need::All => i64::MAX,
            Need::UpTo(last) => last.get(q as usize).copied().unwrap_or(i64::MIN),
        };
        ahead[j as usize + 1] = ahead[j as usize].max(wants);
    }
    let mut out: Vec<Piece> = Vec::new();
    for s in 0..pes {
        // The origin is `c − s`.
        let c = if s <= p {
            i64::from(p)
        } else {
            i64::from(p) + m
        };
        let whole = match layout.order {
            RowOrder::Contiguous => vec![Run {
                row0: 0,
                len: r,
                token0: c * rr,
                per_hop: -rr,
            }],
            RowOrder::Zigzag => {
                let ch = rr / 2;
                vec![
                    Run {
                        row0: 0,
                        len: r / 2,
                        token0: c * ch,
                        per_hop: -ch,
                    },
                    Run {
                        row0: r / 2,
                        len: r / 2,
                        token0: (2 * m - 1 - c) * ch,
                        per_hop: ch,
                    },
                ]
            }
        };
        let present = |t: i64| s == 0 || t <= ahead[(pes - s) as usize];
        let mut runs = Vec::new();
        for w in whole {
            let at = |i: u32| w.token0 + w.per_hop * i64::from(s) + i64::from(i);
            let mut i = 0;
            while i < w.len {
                if !present(at(i)) {
                    i += 1;
                    continue;
                }
                let a = i;
                while i < w.len && present(at(i)) {
                    i += 1;
                }
                runs.push(Run {
                    row0: w.row0 + a,
                    len: i - a,
                    token0: w.token0 + i64::from(a),
                    per_hop: w.per_hop,
                });
            }
        }
        match out.last_mut() {
            Some(last) if last.runs == runs => last.hi = s + 1,
            _ => out.push(Piece {
                lo: s,
                hi: s + 1,
                runs,
            }),
        }
    }
    Ok(out)
}

/// What a contract states about one tensor: its atoms' tensor number (q 0, k 1, v 2), the
/// layer's heads and width, and where the receive buffer of each parity of the hop lies (the
/// even one is the layout's own words, where a PE's block starts; the odd one is a placement
/// with the same strides elsewhere).
#[derive(Clone, Copy, Debug)]
pub struct Block {
    pub tensor: u8,
    pub heads: u32,
    pub dim: u32,
    pub at: [Layout; 2],
}

impl Block {
    /// The contract's block for input `name` (`"k"` or `"v"`) of `m`'s layer. The even buffer is
    /// the tensor's own layout. The odd one is taken one head stride below it (head `h`'s odd
    /// buffer is head `h − 1`'s even one, which head `h − 1` no longer reads): a placement the
    /// manifest does not state, so it is only a candidate. Nothing trusts it: a send that does
    /// not land exactly there fails `discharge`, and the timing must show that the receiver
    /// writes none of its words locally.
    pub fn from_manifest(m: &Manifest, name: &str) -> Result<Block, String> {
        let tensor = match name {
            "k" => 1,
            "v" => 2,
            _ => return Err(format!("no ring contract for `{name}`")),
        };
        let even = tensor_layout(m, name)?;
        let base = even
            .base
            .checked_sub(even.head_stride)
            .filter(|_| even.head_stride > 0)
            .ok_or_else(|| format!("no room for `{name}`'s odd buffer below its layout"))?;
        Ok(Block {
            tensor,
            heads: m.layer.heads,
            dim: m.layer.dim,
            at: [even, Layout { base, ..even }],
        })
    }
}

/// The facts PE `p`'s buffer of parity `parity` holds at hop `hop` (an affine form, which the
/// caller keeps inside `piece`'s hops and of that parity), head `head` (a fixed or symbolic
/// head), as input atoms: one fact per run of rows, over its rows and columns.
// Nothing calls it until the per-PE evaluation over symbolic steps exists; the tests
// below exercise it.
#[allow(dead_code)]
pub(super) fn owed(
    e: &mut Eval,
    block: &Block,
    piece: &Piece,
    parity: usize,
    hop: &Aff,
    head: &Aff,
) -> R<Vec<Fact>> {
    let at = block.at[parity];
    let mut out = Vec::new();
    for run in &piece.runs {
        let (r, c) = (e.fresh(u64::from(run.len)), e.fresh(u64::from(block.dim)));
        let token = hop.scaled(run.per_hop).add_const(run.token0).add_term(r, 1);
        let value = e.tm.atom(block.tensor, head.clone(), token, Aff::var(c));
        let base = head
            .scaled(i64::from(at.head_stride))
            .add_const(i64::from(at.base) + i64::from(run.row0) * i64::from(at.row_stride));
        let dims = vec![
            (r, i64::from(at.row_stride), u64::from(run.len)),
            (c, 1, u64::from(block.dim)),
        ];
        out.push(e.fact(base, dims, value, false)?);
    }
    Ok(out)
}

/// Accepts `sent` (a PE's sends over some stretch, as remote facts) only if they are exactly
/// the facts `owed` (its successor's contract for the next hop), word for word:
///
/// * each sent fact is a box of one owed fact's coordinates — its strides among the owed
///   fact's, its base the owed base moved by a constant that splits into whole coordinate
///   offsets, its counts inside the owed counts from there — holding the owed fact's value at
///   every word (one canonical node once the owed coordinates are written in the sent ones);
/// * the boxes of one owed fact are pairwise apart, and they hold as many words as the owed
///   facts together.
///
/// The owed facts hold distinct words (rows of one layout), so the sends then deliver each
/// owed word exactly once with its value and nothing else, however the sending loops cut the
/// rows. Anything else refuses.
// Nothing calls it until the per-PE evaluation over symbolic steps exists; the tests
// below exercise it.
#[allow(dead_code)]
pub(super) fn discharge(e: &mut Eval, sent: &[Fact], owed: &[Fact]) -> Result<(), String> {
    // Per owed fact, the boxes found in it: per coordinate, (offset, count).
    let mut boxes: Vec<Vec<Vec<(u64, u64)>>> = vec![Vec::new(); owed.len()];
    let mut parts = Vec::new();
    for s in sent {
        if !s.remote {
            return Err("a word kept locally where a send is owed".into());
        }
        parts.extend(cut_at_owed_edges(e, s, owed));
    }
    for s in &parts {
        let mut placed = false;
        for (k, o) in owed.iter().enumerate() {
            if let Some(b) = inside(e, s, o) {
                boxes[k].push(b);
                placed = true;
                break;
            }
        }
        if !placed {
            return Err(format!(
                "a send from {:?} delivers words or values no contract owes",
                s.base
            ));
        }
    }
    let words = |f: &Fact| f.dims.iter().map(|d| d.2).product::<u64>();
    let sent_words: u64 = parts.iter().map(words).sum();
    let owed_words: u64 = owed.iter().map(words).sum();
    if sent_words != owed_words {
        return Err(format!(
            "{sent_words} words sent where the contract owes {owed_words}"
        ));
    }
    for bs in &boxes {
        for (x, a) in bs.iter().enumerate() {
            for b in &bs[x + 1..] {
                let meet = a
                    .iter()
                    .zip(b)
                    .all(|(&(o1, n1), &(o2, n2))| o1 < o2 + n2 && o2 < o1 + n1);
                if meet {
                    return Err("two sends deliver one owed word".into());
                }
            }
        }
    }
    Ok(())
}

/// `s` cut along each coordinate where an owed fact of the same stride starts or ends inside
/// it (a block sent in one loop, owed as two runs of rows), and along every value of a
/// coordinate no owed fact has (runs stacked into one region): the same words with the same
/// values, in boxes that may each lie inside one owed fact. Unchanged where nothing cuts it.
fn cut_at_owed_edges(e: &mut Eval, s: &Fact, owed: &[Fact]) -> Vec<Fact> {
    let mut out = vec![s.clone()];
    for &(_, stride, _) in &s.dims {
        let mut next = Vec::new();
        for f in out {
            // A coordinate of one value is dropped from a fact: then nothing to cut.
            let Some(k) = f.dims.iter().position(|d| d.1 == stride) else {
                next.push(f);
                continue;
            };
            let (var, _, n) = f.dims[k];
            let mut at: Vec<i64> = Vec::new();
            for o in owed {
                let Some(d) = e
                    .pin(o.base.clone())
                    .minus(&e.pin(f.base.clone()))
                    .as_const()
                else {
                    continue;
                };
                for &(_, os, on) in &o.dims {
                    if os == stride {
                        // The first index of `f` at or past the owed fact's first and last
                        // rows (`f` may start inside a row, at a later column).
                        let at_or_past = |w: i64| (w + stride - 1).div_euclid(stride);
                        for x in [at_or_past(d), at_or_past(d + on as i64 * stride)] {
                            if x > 0 && x < n as i64 {
                                at.push(x);
                            }
                        }
                    }
                }
            }
            // A coordinate no owed fact has (two runs stacked into one region) is taken apart.
            let known = owed.iter().any(|o| o.dims.iter().any(|d| d.1 == stride));
            if !known && n <= 64 {
                at.extend(1..n as i64);
            }
            at.sort_unstable();
            at.dedup();
            if at.is_empty() {
                next.push(f);
                continue;
            }
            let mut from = 0;
            for to in at.into_iter().chain([n as i64]) {
                let w = e.fresh((to - from) as u64);
                let value = e.tm.subst(f.value, var, &Aff::var(w).add_const(from));
                let mut dims = f.dims.clone();
                dims[k] = (w, stride, (to - from) as u64);
                let base = f.base.clone().add_const(from * stride);
                match e.fact(base, dims, value, f.computed) {
                    Ok(mut g) => {
                        g.remote = f.remote;
                        next.push(g);
                    }
                    // Left whole: the comparison then refuses it.
                    Err(_) => return vec![s.clone()],
                }
                from = to;
            }
        }
        out = next;
    }
    out
}

/// Where `s` lies in `o`'s coordinates, per coordinate `(offset, count)`, if it is a box of
/// them holding `o`'s values; `None` otherwise.
fn inside(e: &mut Eval, s: &Fact, o: &Fact) -> Option<Vec<(u64, u64)>> {
    // Each sent coordinate is one owed coordinate (same stride); each owed coordinate is
    // used once.
    let mut of: Vec<Option<usize>> = vec![None; o.dims.len()];
    for (x, d) in s.dims.iter().enumerate() {
        let k = o.dims.iter().position(|od| od.1 == d.1)?;
        if of[k].replace(x).is_some() {
            return None;
        }
    }
    // The base's offset split into whole offsets, largest stride first: the owed coordinates
    // nest (each stride at least the span of the smaller ones), so the split is unique.
    let mut rest = e
        .pin(s.base.clone())
        .minus(&e.pin(o.base.clone()))
        .as_const()?;
    let mut at = Vec::new();
    for (k, od) in o.dims.iter().enumerate() {
        if let Some(next) = o.dims.get(k + 1) {
            if od.1 < next.1 * next.2 as i64 {
                return None;
            }
        }
        let off = rest.div_euclid(od.1);
        rest -= off * od.1;
        let n = of[k].map_or(1, |x| s.dims[x].2);
        if off < 0 || off as u64 + n > od.2 {
            return None;
        }
        at.push((off as u64, n));
    }
    if rest != 0 {
        return None;
    }
    // The owed value with each owed coordinate written in the sent one (plus its offset),
    // through fresh variables so that names shared between the facts are not conflated.
    let mut value = o.value;
    let mut via = Vec::new();
    for (k, od) in o.dims.iter().enumerate() {
        let t = e.fresh(od.2);
        value = e.tm.subst(value, od.0, &Aff::var(t));
        via.push((t, k));
    }
    for (t, k) in via {
        let by = match of[k] {
            Some(x) => Aff::var(s.dims[x].0),
            None => Aff::cst(0),
        }
        .add_const(at[k].0 as i64);
        value = e.tm.subst(value, t, &by);
    }
    (value == s.value).then_some(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compact::prove::Eval;

    fn layout(order: RowOrder, rows: u32, base: u32) -> Layout {
        Layout {
            order,
            rows_per_pe: rows,
            base,
            head_stride: 64,
            row_stride: 4,
        }
    }

    /// The `(row, token)` pairs the one piece covering hop `s` holds there, sorted.
    fn held_at(ps: &[Piece], s: u32, what: &str) -> Vec<(u32, i64)> {
        let mine: Vec<&Piece> = ps.iter().filter(|x| x.lo <= s && s < x.hi).collect();
        assert_eq!(mine.len(), 1, "{what}");
        let mut got: Vec<(u32, i64)> = Vec::new();
        for run in &mine[0].runs {
            for i in 0..run.len {
                let t = run.token0 + run.per_hop * i64::from(s) + i64::from(i);
                got.push((run.row0 + i, t));
            }
        }
        got.sort_unstable();
        got
    }

    /// The pieces' formulas give, at every hop, the tokens the manifest's own layout deals to
    /// the PE the block started on (`Layout::tokens_of`), row for row, and cover every hop once.
    #[test]
    fn pieces_hold_the_origins_tokens_at_every_hop() {
        for order in [RowOrder::Contiguous, RowOrder::Zigzag] {
            for pes in 1..=9u32 {
                for rows in [2u32, 4, 6] {
                    let lay = layout(order, rows, 0);
                    let tokens = pes * rows;
                    for p in 0..pes {
                        let ps = pieces(&lay, pes, tokens, p, &Need::All).unwrap();
                        for s in 0..pes {
                            let what = format!("{order:?} {pes} {rows}: PE {p} hop {s}");
                            let got = held_at(&ps, s, &what);
                            let origin = (p + pes - s) % pes;
                            let mut want: Vec<(u32, i64)> = lay
                                .tokens_of(pes, origin, tokens)
                                .into_iter()
                                .map(|(t, r)| (r, i64::from(t)))
                                .collect();
                            want.sort_unstable();
                            assert_eq!(
                                got, want,
                                "{order:?} {pes} PEs {rows} rows: PE {p} hop {s}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Under a causal mask a row stays in a block, past hop 0, exactly while a PE at that hop
    /// or later on its way owns a query token at or after the row's token (written out from
    /// the manifest's layouts here, PE by PE); every hop is in one piece.
    #[test]
    fn causal_pieces_carry_the_rows_still_needed_ahead() {
        for order in [RowOrder::Contiguous, RowOrder::Zigzag] {
            for pes in 1..=9u32 {
                let lay = layout(order, 4, 0);
                let tokens = pes * 4;
                let last: Vec<i64> = (0..pes)
                    .map(|q| {
                        let ts = lay.tokens_of(pes, q, tokens);
                        ts.iter().map(|&(t, _)| i64::from(t)).max().unwrap()
                    })
                    .collect();
                let need = Need::UpTo(last.clone());
                for p in 0..pes {
                    let ps = pieces(&lay, pes, tokens, p, &need).unwrap();
                    for s in 0..pes {
                        let got = held_at(&ps, s, &format!("{order:?} {pes}: PE {p} hop {s}"));
                        let origin = (p + pes - s) % pes;
                        let mut want: Vec<(u32, i64)> = lay
                            .tokens_of(pes, origin, tokens)
                            .into_iter()
                            .map(|(t, r)| (r, i64::from(t)))
                            .filter(|&(_, t)| {
                                s == 0 || (s..pes).any(|k| t <= last[((origin + k) % pes) as usize])
                            })
                            .collect();
                        want.sort_unstable();
                        assert_eq!(got, want, "{order:?} {pes} PEs: PE {p} hop {s}");
                    }
                }
            }
        }
    }

    /// On the 8k causal layer's ring (1 024 PEs, 8 zigzag rows each) every PE's contracts are
    /// three formulas: the blocks before PE 0's, PE 0's (its second chunk needed by no PE
    /// after it, so only its first chunk travels), and the blocks that wrapped.
    #[test]
    fn a_model_size_ring_has_three_pieces_per_pe() {
        let (pes, rows) = (1024u32, 8u32);
        let lay = layout(RowOrder::Zigzag, rows, 0);
        let tokens = pes * rows;
        let c = i64::from(rows / 2);
        let last = (0..i64::from(pes))
            .map(|q| (2 * i64::from(pes) - q) * c - 1)
            .collect();
        let need = Need::UpTo(last);
        for p in [0, 1, 511, 1023] {
            let ps = pieces(&lay, pes, tokens, p, &need).unwrap();
            let spans: Vec<(u32, u32, usize)> =
                ps.iter().map(|x| (x.lo, x.hi, x.runs.len())).collect();
            let mut want = Vec::new();
            if p > 0 {
                want.push((0, p, 2));
                want.push((p, p + 1, 1));
            } else {
                want.push((0, 1, 2));
            }
            if p + 1 < pes {
                want.push((p + 1, pes, 2));
            }
            assert_eq!(spans, want, "PE {p}");
        }
    }

    #[test]
    fn padded_and_odd_zigzag_layouts_are_refused() {
        let lay = layout(RowOrder::Contiguous, 4, 0);
        assert!(pieces(&lay, 4, 15, 0, &Need::All).is_err());
        assert!(pieces(&lay, 4, 16, 4, &Need::All).is_err());
        let odd = layout(RowOrder::Zigzag, 3, 0);
        assert!(pieces(&odd, 4, 12, 1, &Need::All).is_err());
    }

    /// PE 2 of 8 (zigzag, 8 rows of 4 columns, 2 heads) sends, at its even hops `2j`
    /// (`j < 2`), the key block it holds, into PE 3's odd buffer at 64. Written out by hand:
    /// hop `2j` holds PE `2 − 2j`'s block, tokens `4·(2 − 2j) + r` in rows 0..4 and
    /// `4·(13 + 2j) + r` in rows 4..8.
    struct Case {
        base: [i64; 2],
        row_stride: i64,
        rows: u64,
        token0: [i64; 2],
        per_j: [i64; 2],
        tensor: u8,
        head_shift: i64,
        remote: bool,
        facts: usize,
    }

    const RIGHT: Case = Case {
        base: [64, 80],
        row_stride: 4,
        rows: 4,
        token0: [8, 52],
        per_j: [-8, 8],
        tensor: 1,
        head_shift: 0,
        remote: true,
        facts: 2,
    };

    fn check(case: &Case) -> Result<(), String> {
        let mut e = Eval::new(8, 64, true);
        let (j, x) = (e.fresh(2), e.fresh(2));
        let block = Block {
            tensor: 1,
            heads: 2,
            dim: 4,
            at: [
                layout(RowOrder::Zigzag, 8, 128),
                layout(RowOrder::Zigzag, 8, 64),
            ],
        };
        let ps = pieces(&block.at[0], 8, 64, 3, &Need::All).unwrap();
        let hop = Aff::var(j).scaled(2).add_const(1);
        let owed = owed(&mut e, &block, &ps[0], 1, &hop, &Aff::var(x)).map_err(|_| "owed")?;
        let mut sent = Vec::new();
        for k in 0..case.facts {
            let k2 = k % 2;
            let (r, c) = (e.fresh(case.rows), e.fresh(4));
            let token = Aff::var(j)
                .scaled(case.per_j[k2])
                .add_const(case.token0[k2])
                .add_term(r, 1);
            let head = Aff::var(x).add_const(case.head_shift);
            let value = e.tm.atom(case.tensor, head, token, Aff::var(c));
            let base = Aff::var(x).scaled(64).add_const(case.base[k2]);
            let dims = vec![(r, case.row_stride, case.rows), (c, 1, 4)];
            let mut f = e.fact(base, dims, value, false).map_err(|_| "sent")?;
            f.remote = case.remote;
            sent.push(f);
        }
        discharge(&mut e, &sent, &owed)
    }

    /// A sent fact whose coordinates are the owed fact's variables in the other places is
    /// the same words and values when its value follows the names (accepted), and a diagonal
    /// when it does not (refused): renaming must not conflate the two names.
    #[test]
    fn coordinates_named_alike_are_not_conflated() {
        let mut e = Eval::new(4, 16, true);
        let (r, c) = (e.fresh(4), e.fresh(4));
        let owed_value =
            e.tm.atom(1, Aff::cst(0), Aff::var(r).add_const(4), Aff::var(c));
        let owed = e
            .fact(Aff::cst(0), vec![(r, 4, 4), (c, 1, 4)], owed_value, false)
            .unwrap();
        let sent = |e: &mut Eval, row: Aff, col: Aff| {
            let v = e.tm.atom(1, Aff::cst(0), row.add_const(4), col);
            let mut f = e
                .fact(Aff::cst(0), vec![(c, 4, 4), (r, 1, 4)], v, false)
                .unwrap();
            f.remote = true;
            f
        };
        let same = sent(&mut e, Aff::var(c), Aff::var(r));
        assert!(discharge(&mut e, &[same], std::slice::from_ref(&owed)).is_ok());
        let diagonal = sent(&mut e, Aff::var(r), Aff::var(r));
        assert!(discharge(&mut e, &[diagonal], std::slice::from_ref(&owed)).is_err());
        let transposed = sent(&mut e, Aff::var(r), Aff::var(c));
        assert!(discharge(&mut e, &[transposed], &[owed]).is_err());
    }

    /// One owed run of 4 rows, sent as row boxes by separate loops: halves, or one row and
    /// three, are accepted; boxes that overlap (rows 0..2 and 1..3, as many words as owed), leave
    /// a row out, or hold the right words with a row's values shifted, are refused.
    #[test]
    fn sends_split_into_boxes_discharge_only_when_they_tile() {
        let attempt = |cuts: &[(i64, u64, i64)]| -> Result<(), String> {
            let mut e = Eval::new(4, 16, true);
            let (r, c) = (e.fresh(4), e.fresh(4));
            let owed_value =
                e.tm.atom(1, Aff::cst(0), Aff::var(r).add_const(8), Aff::var(c));
            let owed = e
                .fact(Aff::cst(100), vec![(r, 4, 4), (c, 1, 4)], owed_value, false)
                .unwrap();
            let mut sent = Vec::new();
            // (first row, rows, token shift)
            for &(row, n, shift) in cuts {
                let (a, b) = (e.fresh(n), e.fresh(4));
                let token = Aff::var(a).add_const(8 + row + shift);
                let v = e.tm.atom(1, Aff::cst(0), token, Aff::var(b));
                let base = Aff::cst(100 + 4 * row);
                let mut f = e.fact(base, vec![(a, 4, n), (b, 1, 4)], v, false).unwrap();
                f.remote = true;
                sent.push(f);
            }
            discharge(&mut e, &sent, std::slice::from_ref(&owed))
        };
        assert!(attempt(&[(0, 2, 0), (2, 2, 0)]).is_ok());
        assert!(attempt(&[(3, 1, 0), (0, 3, 0)]).is_ok());
        assert!(attempt(&[(0, 4, 0)]).is_ok());
        assert!(attempt(&[(0, 2, 0), (1, 2, 0)]).is_err());
        assert!(attempt(&[(0, 2, 0), (2, 1, 0)]).is_err());
        assert!(attempt(&[(0, 2, 0), (2, 2, 1)]).is_err());
        assert!(attempt(&[(0, 2, 0), (3, 2, 0)]).is_err());
    }

    #[test]
    fn exact_sends_discharge_the_next_contract() {
        check(&RIGHT).unwrap();
    }

    #[test]
    fn sends_that_differ_anywhere_are_refused() {
        let mutants = [
            Case {
                base: [65, 80],
                ..RIGHT
            },
            // The even buffer, which PE 3 reads at its even hops.
            Case {
                base: [128, 144],
                ..RIGHT
            },
            Case {
                row_stride: 5,
                ..RIGHT
            },
            Case { rows: 3, ..RIGHT },
            // The next chunk's tokens, or the block of the wrong PE.
            Case {
                token0: [12, 52],
                ..RIGHT
            },
            Case {
                token0: [8, 48],
                ..RIGHT
            },
            Case {
                per_j: [8, 8],
                ..RIGHT
            },
            Case {
                per_j: [-8, -8],
                ..RIGHT
            },
            Case {
                per_j: [-4, 8],
                ..RIGHT
            },
            // Values instead of keys, the next head's keys.
            Case { tensor: 2, ..RIGHT },
            Case {
                head_shift: 1,
                ..RIGHT
            },
            // Words kept locally are not sends; a run missing; a run sent twice.
            Case {
                remote: false,
                ..RIGHT
            },
            Case { facts: 1, ..RIGHT },
            Case { facts: 3, ..RIGHT },
        ];
        for (i, m) in mutants.iter().enumerate() {
            assert!(check(m).is_err(), "mutant {i} discharged the contract");
        }
    }
}
