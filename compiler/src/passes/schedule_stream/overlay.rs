//! Sends laid onto the free transfer slots of a stretch that already exists.
//!
//! A stretch of local work (a row's softmax and values) leaves its bundles' transfer slots
//! empty, and the words a PE still has to pass on when its ring pass ends can ride there
//! instead of on sends of their own. Each run is a word per cycle from a given cycle of the
//! stretch on; the loops the runs cover in whole iterations carry the sends on an address
//! affine in their indices, those they cover in part are split (a loop of fewer iterations
//! with its addresses moved on keeps the same level, so nothing deeper changes). The
//! flattening is the stretch's, with the sends added, and its length is unchanged.

use isa::looped::{field, set_field, Cmp, Loop, Node, Pred, Slot, Term};
use isa::{Xfer, XferSrc};

use super::{Ad, NAME};

/// Word `i` of a run is sent in cycle `at + i` of the stretch from its own address `src + i`
/// to the next PE's address `src + i + shift`.
#[derive(Clone, Debug)]
pub(super) struct Run {
    pub at: u64,
    pub words: u64,
    pub src: Ad,
    pub shift: i64,
}

/// Flattened length of `nodes`, whose loops the runs touch have fixed counts.
pub(super) fn len(nodes: &[Node]) -> Result<u64, String> {
    nodes.iter().try_fold(0u64, |acc, n| {
        Ok(acc
            + match n {
                Node::Bundle(_) => 1,
                Node::Loop(l) => {
                    if l.step.is_some() {
                        return Err(format!("{NAME}: a stepped loop under laid sends"));
                    }
                    u64::from(l.count) * len(&l.body)?
                }
            })
    })
}

/// `nodes` (their loops at `level`) with the sends of `runs` (in order of `at`, not
/// overlapping) on their transfer slots; the runs must lie within the stretch.
pub(super) fn overlay(nodes: &[Node], level: u8, runs: &[Run]) -> Result<Vec<Node>, String> {
    for w in runs.windows(2) {
        if w[0].at + w[0].words > w[1].at {
            return Err(format!("{NAME}: laid sends overlap"));
        }
    }
    let total = super::head_cycles(nodes);
    if runs.last().is_some_and(|r| r.at + r.words > total) {
        return Err(format!("{NAME}: laid sends past the stretch"));
    }
    let runs: Vec<Run> = runs.iter().filter(|r| r.words > 0).cloned().collect();
    let mut out = Vec::new();
    lay(nodes, level, 0, &runs, &mut out)?;
    Ok(out)
}

/// The first run that ends after cycle `t` (the one covering `t`, if any).
fn first_after(runs: &[Run], t: u64) -> usize {
    runs.partition_point(|r| r.at + r.words <= t)
}

fn lay(
    nodes: &[Node],
    level: u8,
    mut t: u64,
    runs: &[Run],
    out: &mut Vec<Node>,
) -> Result<(), String> {
    for node in nodes {
        match node {
            Node::Bundle(b) => {
                let i = first_after(runs, t);
                let mut b = b.clone();
                if let Some(r) = runs.get(i).filter(|r| r.at <= t) {
                    send(&mut b, &r.src.clone().plus((t - r.at) as i64), r.shift)?;
                }
                out.push(Node::Bundle(b));
                t += 1;
            }
            Node::Loop(l) => {
                // Loops no run touches may have counts stepped by the stretch's own loops.
                let span = if level == 1 {
                    super::head_cycles(std::slice::from_ref(node))
                } else {
                    u64::from(l.count) * len(&l.body)?
                };
                let i = first_after(runs, t);
                if runs.get(i).is_none_or(|r| r.at >= t + span) {
                    out.push(node.clone());
                    t += span;
                    continue;
                }
                if let Some(kept) = guarded_ranges(l, level, t, &runs[i..])? {
                    out.extend(kept);
                    t += span;
                    continue;
                }
                let body_len = len(&l.body)?;
                let mut it = 0u32;
                while it < l.count {
                    let s = t + u64::from(it) * body_len;
                    // The run that touches iteration `it`, if any.
                    let touching = |it: u32| {
                        let s = t + u64::from(it) * body_len;
                        runs.get(first_after(runs, s))
                            .filter(|r| r.at < s + body_len)
                    };
                    let Some(r) = touching(it) else {
                        // Iterations no run touches, as one loop.
                        let mut e = it + 1;
                        while e < l.count && touching(e).is_none() {
                            e += 1;
                        }
                        out.push(piece(l, level, it, e - it, None)?);
                        it = e;
                        continue;
                    };
                    if r.at <= s && r.at + r.words >= s + body_len {
                        // Whole iterations within one run.
                        let whole = (r.at + r.words - s) / body_len;
                        let e = (it + whole as u32).min(l.count);
                        let base = r.src.clone().plus((s - r.at) as i64);
                        out.push(piece(
                            l,
                            level,
                            it,
                            e - it,
                            Some((base.t(level, body_len as i64), r.shift)),
                        )?);
                        it = e;
                        continue;
                    }
                    // One iteration partly covered: its body laid on alone.
                    let body = rebase(&l.body, level, it)?;
                    let mut inner = Vec::new();
                    lay(&body, level + 1, s, runs, &mut inner)?;
                    out.push(Node::Loop(Loop::new(1, inner)));
                    it += 1;
                }
                t += span;
            }
        }
    }
    Ok(())
}

/// Iterations `from … from + count − 1` of `l` as a loop of their own, every bundle sending
/// from `at` plus its offset in the iteration where `at` is given (to `shift` words further on
/// on the next PE).
fn piece(
    l: &Loop,
    level: u8,
    from: u32,
    count: u32,
    at: Option<(Ad, i64)>,
) -> Result<Node, String> {
    let mut body = rebase(&l.body, level, from)?;
    if let Some((at, shift)) = at {
        attach(&mut body, level + 1, at, shift)?;
    }
    Ok(Node::Loop(Loop::new(count, body)))
}

/// Every bundle of `nodes` (their loops at `level`) sending from `at` plus its offset in
/// `nodes`' flattening, to `shift` words further on on the next PE.
fn attach(nodes: &mut [Node], level: u8, at: Ad, shift: i64) -> Result<(), String> {
    let mut o = 0u64;
    for node in nodes {
        match node {
            Node::Bundle(b) => {
                send(b, &at.clone().plus(o as i64), shift)?;
                o += 1;
            }
            Node::Loop(l) => {
                let body_len = len(&l.body)?;
                attach(
                    &mut l.body,
                    level + 1,
                    at.clone().plus(o as i64).t(level, body_len as i64),
                    shift,
                )?;
                o += u64::from(l.count) * body_len;
            }
        }
    }
    Ok(())
}

/// `nodes` as they are in iteration `by` of the loop at `level`, for a loop that starts there:
/// each address term on that level's index moved into the base.
fn rebase(nodes: &[Node], level: u8, by: u32) -> Result<Vec<Node>, String> {
    if by == 0 {
        return Ok(nodes.to_vec());
    }
    nodes
        .iter()
        .map(|n| match n {
            Node::Bundle(b) => {
                let mut b = b.clone();
                if b.preds.iter().any(|p| p.level == level) {
                    return Err(format!("{NAME}: a predicate under laid sends"));
                }
                let mut moved = Vec::new();
                for t in b.terms.iter().filter(|t| t.level == level) {
                    if t.wrap != 0 {
                        return Err(format!("{NAME}: a wrapped term under laid sends"));
                    }
                    moved.push((t.field, t.value(by)));
                }
                for (f, v) in moved {
                    let a = field(&b.bundle, f).map_or(0, i64::from) + v;
                    let a = u32::try_from(a)
                        .map_err(|_| format!("{NAME}: an address out of range under laid sends"))?;
                    set_field(&mut b.bundle, f, a);
                }
                Ok(Node::Bundle(b))
            }
            Node::Loop(l) => {
                if l.step.is_some_and(|s| s.level == level) {
                    return Err(format!("{NAME}: a stepped loop under laid sends"));
                }
                Ok(Node::Loop(Loop {
                    count: l.count,
                    step: l.step,
                    body: rebase(&l.body, level, by)?,
                }))
            }
        })
        .collect()
}

/// `b` sending the word at `at` to the address `shift` words further on on the next PE.
fn send(b: &mut isa::looped::LBundle, at: &Ad, shift: i64) -> Result<(), String> {
    if b.bundle.xfer != Xfer::Nop || b.preds.iter().any(|p| p.slot == isa::looped::Slot::Xfer) {
        return Err(format!("{NAME}: a laid send on a busy transfer slot"));
    }
    let out = || format!("{NAME}: a laid send's address out of range");
    let base = u32::try_from(at.base).map_err(|_| out())?;
    let dst = u32::try_from(at.base + shift).map_err(|_| out())?;
    b.bundle.xfer = Xfer::Send {
        src: XferSrc::Mem(base),
        dst,
    };
    for f in [isa::looped::Field::XferSrc, isa::looped::Field::XferDst] {
        for &(level, stride, wrap) in &at.terms {
            b.terms.push(Term {
                field: f,
                level,
                stride,
                wrap,
            });
        }
    }
    b.terms.sort_by_key(|t| (t.field, t.level));
    Ok(())
}

/// `l` (at `level`, from cycle `t`) as few loops over ranges of its iterations as
/// [`guarded`] keeps whole, from the first on; `None` where some iteration cannot be so kept.
fn guarded_ranges(l: &Loop, level: u8, t: u64, runs: &[Run]) -> Result<Option<Vec<Node>>, String> {
    if l.step.is_some() {
        return Ok(None);
    }
    let body_len = len(&l.body)?;
    let range = |a: u32, e: u32| -> Result<Option<Loop>, String> {
        let sub = Loop::new(e - a, rebase(&l.body, level, a)?);
        guarded(&sub, level, t + u64::from(a) * body_len, runs)
    };
    let mut out = Vec::new();
    let mut a = 0u32;
    while a < l.count {
        // A range that keeps whole stays so with fewer iterations, so the longest from `a`
        // is found by halving.
        let Some(mut best) = range(a, a + 1)? else {
            return Ok(None);
        };
        let (mut lo, mut hi) = (a + 1, l.count + 1);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            match range(a, mid)? {
                Some(k) => {
                    best = k;
                    lo = mid;
                }
                None => hi = mid,
            }
        }
        out.push(Node::Loop(best));
        a = lo;
    }
    Ok(Some(out))
}

/// `l` (at `level`, from cycle `t`) kept whole with the sends of `runs` on it, where every
/// part of its body (a bundle, or a range of an inner loop's iterations) that the runs touch
/// is sent from in a range of `l`'s iterations alone, each of its iterations there covered
/// whole, on an address that moves on by `l`'s body from one iteration to the next: the sends
/// are kept to that range by predicates on `l`'s index. Splitting `l`'s iterations instead
/// repeats its body once for each part; `None` where the runs do not fall so.
fn guarded(l: &Loop, level: u8, t: u64, runs: &[Run]) -> Result<Option<Loop>, String> {
    if l.step.is_some() {
        return Ok(None);
    }
    // Addresses are compared by their bases: the runs must move alike with the outer loops
    // (the heads), and the sends take their terms on those loops.
    let outer = runs
        .first()
        .map(|r| r.src.terms.clone())
        .unwrap_or_default();
    // Words kept elsewhere on the next PE are laid by splitting the loops instead.
    if runs.iter().any(|r| r.src.terms != outer || r.shift != 0) {
        return Ok(None);
    }
    let ad_at = |a: i64| Ad {
        base: a,
        terms: outer.clone(),
    };
    let body_len = len(&l.body)?;
    // The run covering cycle `c` and the word it sends then.
    let word = |c: u64| -> Option<i64> {
        let r = runs.get(first_after(runs, c)).filter(|r| r.at <= c)?;
        Some(r.src.base + (c - r.at) as i64)
    };
    // Where a part spanning cycles `[s, s + n)` of iteration 0 is sent from in each
    // iteration: every cycle covered or none, and the words consecutive; the iterations that
    // send and the words they send, if those move on affinely from iteration to iteration.
    let sends = |s: u64, n: u64| -> Option<Option<Hit>> {
        let mut hits: Vec<(u32, i64)> = Vec::new();
        for it in 0..l.count {
            let c = s + u64::from(it) * body_len;
            let first = word(c);
            let all = (0..n).all(|k| match (first, word(c + k)) {
                (Some(a), Some(b)) => b == a + k as i64,
                (None, None) => true,
                _ => false,
            });
            // A part touched in some cycles but not all.
            if !all {
                return None;
            }
            if let Some(a) = first {
                hits.push((it, a));
            }
        }
        let (&(i0, a), &(last, z)) = match (hits.first(), hits.last()) {
            (Some(f), Some(e)) => (f, e),
            _ => return Some(None),
        };
        // The word as `stride · (i mod wrap)` from iteration `i0`'s (no wrap: `stride · i`):
        // without a wrap where the words move on evenly, else the first wrap that fits them.
        let fits = |wrap: u32| -> Option<i64> {
            let at = |it: u32| i64::from(if wrap == 0 { it } else { it % wrap });
            let span = at(last) - at(i0);
            let stride = if span == 0 { 0 } else { (z - a) / span };
            hits.iter()
                .all(|&(it, w)| w == a + stride * (at(it) - at(i0)))
                .then_some(stride)
        };
        let (stride, wrap) = std::iter::once(0)
            .chain(2..=WRAPS.min(l.count))
            .find_map(|w| fits(w).map(|s| (s, w)))?;
        let gaps: Vec<u32> = (i0..last)
            .filter(|it| hits.binary_search_by_key(it, |h| h.0).is_err())
            .collect();
        // Each iteration left out within the range costs a predicate.
        if gaps.len() > 3 {
            return None;
        }
        Some(Some(Hit {
            i0,
            i1: last + 1,
            a,
            stride,
            wrap,
            gaps,
        }))
    };
    // The predicates keeping a send to the iterations of `h`.
    let keep = |h: &Hit| -> Vec<Pred> {
        let p = |cmp, value| Pred {
            slot: Slot::Xfer,
            level,
            cmp,
            value,
        };
        if h.i1 == h.i0 + 1 {
            return if l.count == 1 {
                Vec::new()
            } else {
                vec![p(Cmp::Eq, h.i0)]
            };
        }
        let mut v: Vec<Pred> = h.gaps.iter().map(|&g| p(Cmp::Ne, g)).collect();
        if h.i0 > 0 {
            v.push(p(Cmp::Ge, h.i0));
        }
        if h.i1 < l.count {
            v.push(p(Cmp::Lt, h.i1));
        }
        v
    };
    // The address of a send in iteration 0 of `l`, moved on by its stride where it sends in
    // more than one iteration; `None` where some iteration's address would leave the space.
    let from = |h: &Hit| -> Option<Ad> {
        if h.i1 == h.i0 + 1 {
            return u32::try_from(h.a).is_ok().then(|| ad_at(h.a));
        }
        let at = |it: u32| i64::from(if h.wrap == 0 { it } else { it % h.wrap });
        let base = h.a - at(h.i0) * h.stride;
        // The farthest the term reaches over the loop's iterations, either way.
        let reach = i64::from(if h.wrap == 0 {
            l.count - 1
        } else {
            h.wrap.min(l.count) - 1
        }) * h.stride;
        let mut ad = ad_at(base);
        ad.terms
            .push((level, i32::try_from(h.stride).ok()?, h.wrap));
        (base.min(base + reach) >= 0 && base.max(base + reach) <= i64::from(u32::MAX)).then_some(ad)
    };
    let mut body = Vec::with_capacity(l.body.len());
    let mut o = t;
    for node in &l.body {
        match node {
            Node::Bundle(b) => {
                if b.preds.iter().any(|p| p.level == level) {
                    return Ok(None);
                }
                let mut b = b.clone();
                let Some(hit) = sends(o, 1) else {
                    return Ok(None);
                };
                if let Some(h) = hit {
                    let Some(at) = from(&h) else { return Ok(None) };
                    send(&mut b, &at, 0)?;
                    b.preds.extend(keep(&h));
                    b.preds.sort();
                }
                body.push(Node::Bundle(b));
                o += 1;
            }
            Node::Loop(c) => {
                if c.step.is_some() {
                    return Ok(None);
                }
                let cb = len(&c.body)?;
                // Ranges of `c`'s iterations that send alike.
                let mut parts: Vec<(u32, u32, Option<Hit>)> = Vec::new();
                for j in 0..c.count {
                    let Some(hit) = sends(o + u64::from(j) * cb, cb) else {
                        return Ok(None);
                    };
                    let go_on = parts.last().is_some_and(|(j0, e, h)| {
                        j == *e
                            && match (h, &hit) {
                                (None, None) => true,
                                (Some(h), Some(k)) => {
                                    (h.i0, h.i1, h.stride, h.wrap, &h.gaps)
                                        == (k.i0, k.i1, k.stride, k.wrap, &k.gaps)
                                        && k.a == h.a + i64::from(j - j0) * cb as i64
                                }
                                _ => false,
                            }
                    });
                    match parts.last_mut() {
                        Some(p) if go_on => p.1 += 1,
                        _ => parts.push((j, j + 1, hit)),
                    }
                }
                for (j0, j1, hit) in parts {
                    let at = match &hit {
                        None => None,
                        Some(h) => {
                            let Some(at) = from(h) else { return Ok(None) };
                            Some((at.t(level + 1, cb as i64), 0))
                        }
                    };
                    let mut p = piece(c, level + 1, j0, j1 - j0, at)?;
                    if let Some(h) = &hit {
                        guard(&mut p, &keep(h));
                    }
                    body.push(p);
                }
                o += u64::from(c.count) * cb;
            }
        }
    }
    Ok(Some(Loop::new(l.count, body)))
}

/// The iterations of a loop that a part of its body is sent from in: `i0 … i1 − 1` but `gaps`,
/// the word it sends first in iteration `i0`, and how far that word moves on per iteration.
#[derive(Clone, Debug)]
struct Hit {
    i0: u32,
    i1: u32,
    a: i64,
    stride: i64,
    /// The period of the iterations' term, 0 for none.
    wrap: u32,
    gaps: Vec<u32>,
}

/// The longest period tried for a send's term where its words do not move on evenly.
const WRAPS: u32 = 64;

/// Every send in `node` kept by `preds` too.
fn guard(node: &mut Node, preds: &[Pred]) {
    match node {
        Node::Loop(l) => l.body.iter_mut().for_each(|n| guard(n, preds)),
        Node::Bundle(b) => {
            if b.bundle.xfer != Xfer::Nop {
                b.preds.extend_from_slice(preds);
                b.preds.sort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::ad;
    use super::{overlay, Run};
    use isa::looped::{LoopProgram, Node};
    use isa::{Xfer, XferSrc};

    fn body(src: &str) -> Result<Vec<Node>, String> {
        Ok(isa::parse_looped(src).map_err(|e| format!("{e:?}"))?.body)
    }

    fn flat(body: Vec<Node>) -> Result<Vec<isa::Bundle>, String> {
        Ok(program(body)
            .flatten(1000)
            .map_err(|e| format!("{e:?}"))?
            .bundles)
    }

    fn program(body: Vec<Node>) -> LoopProgram {
        LoopProgram {
            pe: 0,
            pes: 2,
            mem_words: 4096,
            body,
        }
    }

    /// A run over part of one iteration and part of the next of a loop keeps the loop whole
    /// (the sends kept by predicates on its index), and a second run three iterations later on
    /// the same inner keys too, where its words move on evenly (a stride on the index) and
    /// where they do not (a stride on the index modulo a period); the flattening is the loop's
    /// with each word sent in its cycle.
    #[test]
    fn runs_within_a_loop_keep_it_whole() -> Result<(), String> {
        for second in [1009, 1010] {
            laid_whole(second)?;
        }
        Ok(())
    }

    fn laid_whole(second: u32) -> Result<(), String> {
        let src = "\
.format 3
.pe 0
.pes 2
.mem 4096
loop 8 {
    mul m[0 + 1*i0], m100 | add 0 -> m[200 + 1*i0]
    loop 5 {
        mul m[10 + 1*i0 + 8*i1], m101 | add m[200 + 1*i0] -> m[200 + 1*i0]
    }
}
";
        let nodes = body(src)?;
        let runs = [
            Run {
                at: 6 * 2 + 3,
                words: 6,
                src: ad(1000),
                shift: 0,
            },
            Run {
                at: 6 * 5 + 3,
                words: 3,
                src: ad(second),
                shift: 0,
            },
        ];
        let laid = overlay(&nodes, 0, &runs)?;
        assert_eq!(laid.len(), 1, "{}", program(laid.clone()).to_text());
        let plain = flat(nodes)?;
        let with = flat(laid)?;
        assert_eq!(plain.len(), with.len());
        for (t, (a, b)) in plain.iter().zip(&with).enumerate() {
            let t = t as u64;
            let want = runs
                .iter()
                .find(|r| r.at <= t && t < r.at + r.words)
                .map_or(Xfer::Nop, |r| {
                    let w = (r.src.base + (t - r.at) as i64) as u32;
                    Xfer::Send {
                        src: XferSrc::Mem(w),
                        dst: w,
                    }
                });
            assert_eq!((a.op, a.acc, want), (b.op, b.acc, b.xfer), "cycle {t}");
        }
        Ok(())
    }
}
