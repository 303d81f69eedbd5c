//! Sends laid onto the free transfer slots of a stretch that already exists.
//!
//! A stretch of local work (a row's softmax and values) leaves its bundles' transfer slots
//! empty, and the words a PE still has to pass on when its ring pass ends can ride there
//! instead of on sends of their own. Each run is a word per cycle from a given cycle of the
//! stretch on; the loops the runs cover in whole iterations carry the sends on an address
//! affine in their indices, those they cover in part are split (a loop of fewer iterations
//! with its addresses moved on keeps the same level, so nothing deeper changes). The
//! flattening is the stretch's, with the sends added, and its length is unchanged.

use isa::looped::{field, set_field, Loop, Node, Term};
use isa::{Xfer, XferSrc};

use super::{Ad, NAME};

/// Word `i` of a run is sent in cycle `at + i` of the stretch from its own address `src + i`
/// (the next PE's same address).
#[derive(Clone, Debug)]
pub(super) struct Run {
    pub at: u64,
    pub words: u64,
    pub src: Ad,
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
                    send(&mut b, &r.src.clone().plus((t - r.at) as i64))?;
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
                            Some(base.t(level, body_len as i64)),
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
/// from `at` plus its offset in the iteration where `at` is given.
fn piece(l: &Loop, level: u8, from: u32, count: u32, at: Option<Ad>) -> Result<Node, String> {
    let mut body = rebase(&l.body, level, from)?;
    if let Some(at) = at {
        attach(&mut body, level + 1, at)?;
    }
    Ok(Node::Loop(Loop::new(count, body)))
}

/// Every bundle of `nodes` (their loops at `level`) sending from `at` plus its offset in
/// `nodes`' flattening.
fn attach(nodes: &mut [Node], level: u8, at: Ad) -> Result<(), String> {
    let mut o = 0u64;
    for node in nodes {
        match node {
            Node::Bundle(b) => {
                send(b, &at.clone().plus(o as i64))?;
                o += 1;
            }
            Node::Loop(l) => {
                let body_len = len(&l.body)?;
                attach(
                    &mut l.body,
                    level + 1,
                    at.clone().plus(o as i64).t(level, body_len as i64),
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

/// `b` sending the word at `at` to the same address on the next PE.
fn send(b: &mut isa::looped::LBundle, at: &Ad) -> Result<(), String> {
    if b.bundle.xfer != Xfer::Nop || b.preds.iter().any(|p| p.slot == isa::looped::Slot::Xfer) {
        return Err(format!("{NAME}: a laid send on a busy transfer slot"));
    }
    let base = u32::try_from(at.base)
        .map_err(|_| format!("{NAME}: a laid send's address out of range"))?;
    b.bundle.xfer = Xfer::Send {
        src: XferSrc::Mem(base),
        dst: base,
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
