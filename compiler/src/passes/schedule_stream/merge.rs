//! Adjacent loops that continue one another, merged into one.
//!
//! The generators emit the rows of a step in several loops because a bundle has one send:
//! the rows that forward something (a piece of the travelling state, the visiting keys) are
//! loops of their own, though their operations are the next rows' with the row's addresses
//! advanced. Two sibling loops whose operations continue one another affinely become one loop
//! over both ranges, a send that only one of them has kept for its range by a predicate on the
//! loop index (`i < count₁` or `i ≥ count₁`). The flattening, and so the cycles, every operation
//! and every send, is unchanged; only the program gets shorter.

use isa::looped::{
    field, set_field, Cmp, Field, LBundle, Loop, LoopProgram, Node, Pred, Slot, Term,
};
use isa::{Bundle, Xfer};

/// `p` with adjacent loops merged wherever they continue one another.
pub(super) fn merge(mut p: LoopProgram) -> LoopProgram {
    walk(&mut p.body, 0, false);
    p
}

/// [`merge`], where a send of one loop alone that is already kept to part of its range by
/// predicates on the loop's index still joins a loop without one: a send riding a single
/// stretch of a long run of alike loops (a relayed word run) then costs one loop, not three.
pub(super) fn merge_kept(mut p: LoopProgram) -> LoopProgram {
    walk(&mut p.body, 0, true);
    p
}

/// `p` with adjacent loops merged at loop depth `depth` only (their bodies as they are), so
/// that loops whose bodies would merge differently inside still join as wholes first.
pub(super) fn merge_at(mut p: LoopProgram, depth: u8) -> LoopProgram {
    fn down(nodes: &mut Vec<Node>, level: u8, depth: u8) {
        if level == depth {
            join_siblings(nodes, level, false);
            return;
        }
        for node in nodes.iter_mut() {
            if let Node::Loop(l) = node {
                down(&mut l.body, level + 1, depth);
            }
        }
    }
    down(&mut p.body, 0, depth);
    p
}

fn join_siblings(nodes: &mut Vec<Node>, level: u8, kept: bool) {
    let mut out: Vec<Node> = Vec::with_capacity(nodes.len());
    for node in nodes.drain(..) {
        if let (Some(Node::Loop(a)), Node::Loop(b)) = (out.last_mut(), &node) {
            if let Some(joined) = join(a, b, level, kept) {
                // Joining keeps the flattening but may cost more than it saves (a send kept by
                // predicates, terms a side did not need): under `kept` only a shorter joint
                // loop is taken.
                if !kept || size(&joined) < size(a) + size(b) {
                    *a = joined;
                    continue;
                }
            }
        }
        out.push(node);
    }
    *nodes = out;
}

/// The bytes `l`'s records take in the binary (at the widest field widths).
fn size(l: &Loop) -> u64 {
    let p = LoopProgram {
        pe: 0,
        pes: 1,
        mem_words: u32::MAX,
        body: vec![Node::Loop(l.clone())],
    };
    isa::looped_binary::encoded_len(&p)
}

fn walk(nodes: &mut Vec<Node>, level: u8, kept: bool) {
    for node in nodes.iter_mut() {
        if let Node::Loop(l) = node {
            walk(&mut l.body, level + 1, kept);
        }
    }
    join_siblings(nodes, level, kept);
}

/// `a` then `b` as one loop at `level`, if `b`'s iterations continue `a`'s.
fn join(a: &Loop, b: &Loop, level: u8, kept: bool) -> Option<Loop> {
    if a.step.is_some() || b.step.is_some() {
        return None;
    }
    let count = a.count.checked_add(b.count)?;
    let body = bodies(
        &a.body,
        &b.body,
        &Span {
            level,
            a: a.count,
            b: b.count,
            kept,
        },
    )?;
    Some(Loop {
        count,
        step: None,
        body,
    })
}

/// The loop being merged: its level and the two counts.
struct Span {
    level: u8,
    a: u32,
    b: u32,
    /// Whether a send of one side alone may already be kept to part of its loop's range.
    kept: bool,
}

fn bodies(a: &[Node], b: &[Node], sp: &Span) -> Option<Vec<Node>> {
    if a.len() != b.len() {
        return None;
    }
    a.iter()
        .zip(b)
        .map(|pair| match pair {
            (Node::Loop(x), Node::Loop(y)) => {
                // Inner trip counts may not depend on the merged index.
                let same = x.count == y.count
                    && x.step == y.step
                    && x.step.is_none_or(|s| s.level != sp.level);
                same.then(|| {
                    bodies(&x.body, &y.body, sp).map(|body| {
                        Node::Loop(Loop {
                            count: x.count,
                            step: x.step,
                            body,
                        })
                    })
                })?
            }
            (Node::Bundle(x), Node::Bundle(y)) => bundle(x, y, sp).map(Node::Bundle),
            _ => None,
        })
        .collect()
}

fn slot_of(f: Field) -> Slot {
    match f {
        Field::OpA | Field::OpB | Field::OpDst => Slot::Op,
        Field::AccSrc | Field::AccDst => Slot::Acc,
        Field::XferSrc | Field::XferDst => Slot::Xfer,
    }
}

/// `b` with every address field zeroed: what must be equal for two templates to merge.
fn shape(b: &Bundle) -> Bundle {
    let mut s = *b;
    for f in Field::ALL {
        if field(b, f).is_some() {
            set_field(&mut s, f, 0);
        }
    }
    s
}

fn stride_at(t: &LBundle, f: Field, level: u8) -> Option<&Term> {
    t.terms.iter().find(|t| t.field == f && t.level == level)
}

fn others(t: &LBundle, f: Field, level: u8) -> Vec<Term> {
    t.terms
        .iter()
        .filter(|t| t.field == f && t.level != level)
        .copied()
        .collect()
}

fn preds(t: &LBundle, s: Slot) -> Vec<Pred> {
    t.preds.iter().filter(|p| p.slot == s).copied().collect()
}

/// `t`'s predicates on slot `s`: those on the index at `level`, and the others.
fn at_level(t: &LBundle, s: Slot, level: u8) -> (Vec<Pred>, Vec<Pred>) {
    preds(t, s).into_iter().partition(|p| p.level == level)
}

/// `b`'s predicates on its own index `j`, restated on the merged index `a + j`.
fn shifted(b: &[Pred], a: u32) -> Option<Vec<Pred>> {
    b.iter()
        .map(|p| {
            Some(Pred {
                value: p.value.checked_add(a)?,
                ..*p
            })
        })
        .collect()
}

/// Loops up to this many iterations have their predicates on the merged index checked
/// iteration by iteration; longer ones merge only with none.
const PRED_CHECK: u32 = 1 << 16;

/// One set of predicates on the merged index that holds exactly where `px` holds on `a`'s
/// iterations and `py` (already on the merged index) on `b`'s, if the union of both does so
/// (each side's predicates then hold wherever the other side's do on its range); those that
/// add nothing are left out.
fn joined_preds(px: &[Pred], py: &[Pred], sp: &Span) -> Option<Vec<Pred>> {
    if px.is_empty() && py.is_empty() {
        return Some(Vec::new());
    }
    let total = sp.a.checked_add(sp.b).filter(|&t| t <= PRED_CHECK)?;
    let all = |ps: &[Pred], i: u32| ps.iter().all(|p| p.cmp.holds(i, p.value));
    let exact = |ps: &[Pred]| {
        (0..total).all(|i| {
            let want = if i < sp.a { all(px, i) } else { all(py, i) };
            all(ps, i) == want
        })
    };
    essential(px.iter().chain(py).copied().collect(), exact)
}

/// Predicates on the merged index that hold exactly where `own` (already on the merged index)
/// and `range` (the side's own iterations) both do, the ones that add nothing left out.
fn one_side(own: &[Pred], range: Pred, sp: &Span) -> Option<Vec<Pred>> {
    let total = sp.a.checked_add(sp.b).filter(|&t| t <= PRED_CHECK)?;
    let all = |ps: &[Pred], i: u32| ps.iter().all(|p| p.cmp.holds(i, p.value));
    let want: Vec<bool> = (0..total)
        .map(|i| range.cmp.holds(i, range.value) && all(own, i))
        .collect();
    let exact = |ps: &[Pred]| (0..total).all(|i| all(ps, i) == want[i as usize]);
    essential(own.iter().copied().chain([range]).collect(), exact)
}

/// `preds` if they hold exactly where `exact` says, with each predicate that adds nothing left
/// out (tried one by one, first to last).
fn essential(mut preds: Vec<Pred>, exact: impl Fn(&[Pred]) -> bool) -> Option<Vec<Pred>> {
    if !exact(&preds) {
        return None;
    }
    let mut k = 0;
    while k < preds.len() {
        let mut fewer = preds.clone();
        fewer.remove(k);
        if exact(&fewer) {
            preds = fewer;
        } else {
            k += 1;
        }
    }
    Some(preds)
}

/// Whether `base + term(i)` stays in the address space over `count` iterations: a loop
/// program must say where every slot would go in every iteration, the predicated-off ones
/// too, so a term carried on over more iterations (a gap term turned into a stride) may not
/// leave it.
fn addressable(base: i64, term: Option<Term>, count: u32) -> bool {
    let last = term.map_or(0, |t| {
        let n = if t.wrap == 0 {
            count
        } else {
            count.min(t.wrap)
        };
        t.value(n.saturating_sub(1))
    });
    base + last.min(0) >= 0 && base + last.max(0) <= i64::from(u32::MAX)
}

fn bundle(x: &LBundle, y: &LBundle, sp: &Span) -> Option<LBundle> {
    let lv = sp.level;
    // The xfer slot may be one side's alone; every other part must be the same shape.
    let one_sided = match (x.bundle.xfer, y.bundle.xfer) {
        (Xfer::Nop, Xfer::Nop) => None,
        (Xfer::Send { .. }, Xfer::Nop) => Some(true),
        (Xfer::Nop, Xfer::Send { .. }) => Some(false),
        (Xfer::Send { .. }, Xfer::Send { .. }) => None,
    };
    let (mut sx, mut sy) = (shape(&x.bundle), shape(&y.bundle));
    if one_sided.is_some() {
        sx.xfer = Xfer::Nop;
        sy.xfer = Xfer::Nop;
    }
    if sx != sy {
        return None;
    }
    let mut out = x.clone();
    out.terms.clear();
    out.preds.clear();
    for s in Slot::ALL {
        let mine = if s == Slot::Xfer { one_sided } else { None };
        let (px, ox) = at_level(x, s, lv);
        let (py, oy) = at_level(y, s, lv);
        match mine {
            None => {
                if ox != oy {
                    return None;
                }
                out.preds.extend(ox);
                out.preds
                    .extend(joined_preds(&px, &shifted(&py, sp.a)?, sp)?);
            }
            Some(from_x) => {
                // A send kept to part of its own loop's range stays apart: joined here, it
                // could no longer join a loop whose own send continues it.
                let (own, rest) = if from_x { (px, ox) } else { (py, oy) };
                let range = Pred {
                    slot: s,
                    level: lv,
                    cmp: if from_x { Cmp::Lt } else { Cmp::Ge },
                    value: sp.a,
                };
                out.preds.extend(rest);
                if own.is_empty() {
                    out.preds.push(range);
                } else if sp.kept {
                    let own = if from_x { own } else { shifted(&own, sp.a)? };
                    out.preds.extend(one_side(&own, range, sp)?);
                } else {
                    return None;
                }
            }
        }
    }
    if one_sided == Some(false) {
        out.bundle.xfer = y.bundle.xfer;
    }
    for f in Field::ALL {
        let mine = if slot_of(f) == Slot::Xfer {
            one_sided
        } else {
            None
        };
        match mine {
            None => {
                let (Some(va), Some(vb)) = (field(&x.bundle, f), field(&y.bundle, f)) else {
                    continue;
                };
                let rest = others(x, f, lv);
                if rest != others(y, f, lv) {
                    return None;
                }
                // The merged term: the one of a side with more than one iteration (a wrapping
                // one too: the max slots alternate from step to step), else the gap itself.
                let (ta, tb) = (stride_at(x, f, lv), stride_at(y, f, lv));
                let gap = i64::from(vb) - i64::from(va);
                let term = if sp.a > 1 {
                    ta.copied()
                } else if sp.b > 1 {
                    tb.copied()
                } else {
                    (gap != 0).then_some(Term {
                        field: f,
                        level: lv,
                        stride: i32::try_from(gap).ok()?,
                        wrap: 0,
                    })
                };
                let value = |i: u32| term.map_or(0, |t| t.value(i));
                let own_b = |j: u32| tb.map_or(0, |t| t.value(j));
                if sp.b > 1 && tb.copied() != term {
                    return None;
                }
                // Iteration j of `b` is iteration `a + j` of the merged loop; a wrapping term
                // repeats, so its period decides.
                let period = term.map_or(1, |t| if t.wrap == 0 { 1 } else { t.wrap });
                let continues = (0..period.min(sp.b))
                    .all(|j| i64::from(va) + value(sp.a + j) == i64::from(vb) + own_b(j));
                if !continues {
                    return None;
                }
                if !addressable(i64::from(va), term, sp.a + sp.b) {
                    return None;
                }
                set_field(&mut out.bundle, f, va);
                out.terms.extend(rest);
                out.terms.extend(term);
            }
            Some(from_x) => {
                let src = if from_x { x } else { y };
                let Some(v) = field(&src.bundle, f) else {
                    continue;
                };
                let t = stride_at(src, f, lv);
                // `b`'s wrapping term read from `a + j` instead of `j`: the same values only
                // when `a` is a whole number of periods.
                if t.is_some_and(|t| {
                    t.wrap != 0 && !from_x && sp.b > 1 && !sp.a.is_multiple_of(t.wrap)
                }) {
                    return None;
                }
                let mut rest = others(src, f, lv);
                // Iteration j of `b` is iteration `a + j` of the merged loop.
                let (base, kept) = match t {
                    Some(t) if !from_x && sp.b > 1 && t.wrap == 0 => (
                        i64::from(v) - i64::from(t.stride) * i64::from(sp.a),
                        Some(*t),
                    ),
                    Some(t) if from_x && sp.a > 1 || !from_x && sp.b > 1 => {
                        (i64::from(v), Some(*t))
                    }
                    _ => (i64::from(v), None),
                };
                if !addressable(base, kept, sp.a + sp.b) {
                    return None;
                }
                set_field(&mut out.bundle, f, u32::try_from(base).ok()?);
                rest.extend(kept);
                out.terms.extend(rest);
            }
        }
    }
    out.terms.sort_by_key(|t| (t.field, t.level));
    out.preds.sort();
    out.preds.dedup();
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::super::{once, paired};
    use isa::looped::{LoopProgram, Node, Slot};
    use isa::looped_binary::encoded_len;

    /// Whether some bundle of `nodes` has a predicate on its xfer slot at `level`.
    fn sends_kept_by_index(nodes: &[Node], level: u8) -> bool {
        nodes.iter().any(|n| match n {
            Node::Loop(l) => sends_kept_by_index(&l.body, level + 1),
            Node::Bundle(b) => b
                .preds
                .iter()
                .any(|p| p.slot == Slot::Xfer && p.level < level),
        })
    }

    /// Every PE's paired program, stripped and merged, flattens to exactly the bundles of the
    /// program as generated, and is shorter.
    #[test]
    fn merged_paired_programs_flatten_to_the_generated_ones() {
        let mut checked = 0;
        let mut merged_sends = 0;
        for (n, d, m, heads, reuse) in [
            (16u32, 2u32, 4u32, 1u32, false),
            (32, 3, 4, 3, true),
            (31, 2, 4, 1, false),
            (40, 2, 5, 2, false),
            (48, 3, 6, 3, true),
            (46, 2, 6, 1, false),
            (56, 1, 8, 1, false),
            (64, 2, 8, 4, true),
            (45, 2, 3, 3, false),
            (60, 1, 12, 1, false),
            (130, 1, 12, 1, false),
        ] {
            let rows = n.div_ceil(m);
            let last_live = n - (m - 1) * rows;
            let map = paired::PMap::new(rows, d, heads, reuse).expect("a map");
            for pe in 0..m {
                let what = format!("n={n} d={d} m={m} heads={heads} reuse={reuse} pe={pe}");
                let raw = paired::unmerged(&map, pe, m, heads, 0.5, last_live).expect(&what);
                let done = paired::program(&map, pe, m, heads, 0.5, last_live).expect(&what);
                let once_only = once::strip(raw.clone());
                assert_eq!(
                    raw.flatten(1 << 24).expect("flattens"),
                    done.flatten(1 << 24).expect("flattens"),
                    "{what}"
                );
                assert_eq!(
                    raw.flatten(1 << 24).expect("flattens"),
                    once_only.flatten(1 << 24).expect("flattens"),
                    "{what}"
                );
                assert_eq!(raw.cycles(), done.cycles(), "{what}");
                assert!(
                    encoded_len(&done) < encoded_len(&once_only)
                        && encoded_len(&once_only) < encoded_len(&raw),
                    "{what}: {} / {} / {} bytes",
                    encoded_len(&raw),
                    encoded_len(&once_only),
                    encoded_len(&done)
                );
                if sends_kept_by_index(&done.body, 0) {
                    merged_sends += 1;
                }
                checked += 1;
            }
        }
        assert_eq!(checked, 72);
        assert!(merged_sends > 0);
    }

    /// Loops whose operations do not continue one another stay apart.
    #[test]
    fn loops_that_do_not_continue_stay_apart() {
        let src = "\
.format 3
.pe 0
.pes 1
.mem 64
loop 2 {
    mul m[0 + 1*i0], m8 -> m[16 + 1*i0]
}
loop 2 {
    mul m[3 + 1*i0], m8 -> m[18 + 1*i0]
}
loop 2 {
    mul m[5 + 1*i0], m8 -> m[20 + 1*i0]
}
loop 1 {
    max m8, m9 -> m22
}
";
        let p: LoopProgram = isa::parse_looped(src).expect("parses");
        let done = super::merge(p.clone());
        // The first two skip a word (0, 1 then 3, 4): apart. The second and third continue
        // (3, 4, 5, 6): one loop of 4. The last is another op.
        assert_eq!(done.body.len(), 3, "{}", done.to_text());
        assert_eq!(p.flatten(100).unwrap(), done.flatten(100).unwrap());
    }

    /// A loop whose last iterations are off (rows past a layer's end) continues a loop of
    /// rows all on: one predicate on the merged index keeps the same iterations; a loop off in
    /// its middle and on after it cannot be stated so and stays apart.
    #[test]
    fn predicates_on_the_merged_index_merge_when_exact() {
        let src = "\
.format 3
.pe 0
.pes 1
.mem 64
loop 2 {
    mul m[0 + 1*i0], m8 -> m[16 + 1*i0]
}
loop 3 {
    mul m[2 + 1*i0], m8 -> m[18 + 1*i0] if i0 < 1
}
loop 2 {
    mul m[5 + 1*i0], m8 -> m[21 + 1*i0]
}
";
        let p: LoopProgram = isa::parse_looped(src).expect("parses");
        let done = super::merge(p.clone());
        // The first two become one loop of 5 kept by `i0 < 3`; the third would need the
        // iterations 3 and 4 off and 5, 6 on, which no conjunction of predicates on i0 says.
        assert_eq!(done.body.len(), 2, "{}", done.to_text());
        assert!(done.to_text().contains("loop 5"), "{}", done.to_text());
        assert!(done.to_text().contains("if i0 < 3"), "{}", done.to_text());
        assert_eq!(p.flatten(100).unwrap(), done.flatten(100).unwrap());
    }

    /// Slots that alternate (a wrapping term) continue across the loops when the parity does;
    /// a send of the second loop alone is kept for its iterations.
    #[test]
    fn alternating_slots_and_one_sided_sends_merge() {
        let src = "\
.format 3
.pe 0
.pes 2
.mem 64
loop 2 {
    max m[0 + 4*(i0 % 2)], m8 -> m[4 - 4*(i0 % 2)]
}
loop 1 {
    max m0, m8 -> m4 | nop | send m9 -> m10
}
loop 1 {
    max m0, m8 -> m4
}
";
        let p: LoopProgram = isa::parse_looped(src).expect("parses");
        let done = super::merge(p.clone());
        assert_eq!(done.body.len(), 2, "{}", done.to_text());
        assert!(sends_kept_by_index(&done.body, 0), "{}", done.to_text());
        assert_eq!(p.flatten(100).unwrap(), done.flatten(100).unwrap());
    }
}
