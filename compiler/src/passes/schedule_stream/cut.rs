//! A loop cut in two at an iteration, the second part's sends kept from some iterations of an
//! enclosing loop.
//!
//! The paired generator runs the steps of a ring pass that differ only in which words a few
//! sends forward (a padded block's missing rows are not sent) as one loop over the steps: the
//! loop over keys whose sends stop early in one step is cut where they stop, and the part past
//! the cut sends only in the other steps. The flattening of each step is what the step alone
//! would have been.

use isa::looped::{field, set_field, Cmp, Field, LBundle, Loop, Node, Pred, Slot};
use isa::{Acc, Op, Xfer};

/// `l` (its index at `level`) as two loops, iterations `0 .. at` and `at ..`, the second with
/// `extra` added to every send it keeps (one loop when either part is empty). `None` when a
/// term of the second part cannot be restated (a wrapping one, a stepped trip count) or would
/// leave the address space.
pub(super) fn cut(l: &Loop, level: u8, at: u32, extra: Pred) -> Option<Vec<Node>> {
    if at >= l.count {
        return Some(vec![Node::Loop(l.clone())]);
    }
    if l.step.is_some() {
        return None;
    }
    if at == 0 {
        let mut all = l.clone();
        shift(&mut all.body, level, 0, extra)?;
        return Some(vec![Node::Loop(all)]);
    }
    let first = Loop {
        count: at,
        step: None,
        body: l.body.clone(),
    };
    let mut second = Loop {
        count: l.count - at,
        step: None,
        body: l.body.clone(),
    };
    shift(&mut second.body, level, at, extra)?;
    Some(vec![Node::Loop(first), Node::Loop(second)])
}

/// Restates `nodes` for iterations `at ..` of the loop at `level`: its terms start `at`
/// iterations on, its predicates count from `at` (a slot off in all of them becomes a no-op).
fn shift(nodes: &mut [Node], level: u8, at: u32, extra: Pred) -> Option<()> {
    for n in nodes {
        match n {
            Node::Loop(l) => {
                if l.step.is_some_and(|s| s.level == level) {
                    return None;
                }
                shift(&mut l.body, level, at, extra)?;
            }
            Node::Bundle(b) => shift_bundle(b, level, at, extra)?,
        }
    }
    Some(())
}

fn slot_of(f: Field) -> Slot {
    match f {
        Field::OpA | Field::OpB | Field::OpDst => Slot::Op,
        Field::AccSrc | Field::AccDst => Slot::Acc,
        Field::XferSrc | Field::XferDst => Slot::Xfer,
    }
}

fn shift_bundle(b: &mut LBundle, level: u8, at: u32, extra: Pred) -> Option<()> {
    for t in b.terms.iter().filter(|t| t.level == level) {
        if t.wrap != 0 {
            return None;
        }
        let base = field(&b.bundle, t.field)?;
        let moved = i64::from(base) + i64::from(t.stride) * i64::from(at);
        set_field(&mut b.bundle, t.field, u32::try_from(moved).ok()?);
    }
    let mut dead = Vec::new();
    let mut kept = Vec::new();
    for p in &b.preds {
        if p.level != level {
            kept.push(*p);
            continue;
        }
        // The predicate on `at + j`, restated on `j`.
        let on = match p.cmp {
            Cmp::Lt => p
                .value
                .checked_sub(at)
                .filter(|&v| v > 0)
                .map(|v| Some((Cmp::Lt, v))),
            Cmp::Ge => Some(
                p.value
                    .checked_sub(at)
                    .filter(|&v| v > 0)
                    .map(|v| (Cmp::Ge, v)),
            ),
            Cmp::Eq => p.value.checked_sub(at).map(|v| Some((Cmp::Eq, v))),
            Cmp::Ne => Some(p.value.checked_sub(at).map(|v| (Cmp::Ne, v))),
        };
        match on {
            None => dead.push(p.slot),
            Some(None) => {}
            Some(Some((cmp, value))) => kept.push(Pred { cmp, value, ..*p }),
        }
    }
    b.preds = kept;
    for s in dead {
        match s {
            Slot::Op => b.bundle.op = Op::Nop,
            Slot::Acc => b.bundle.acc = Acc::Nop,
            Slot::Xfer => b.bundle.xfer = Xfer::Nop,
        }
        b.terms.retain(|t| slot_of(t.field) != s);
        b.preds.retain(|p| p.slot != s);
    }
    if b.bundle.xfer != Xfer::Nop {
        b.preds.push(Pred {
            slot: Slot::Xfer,
            ..extra
        });
    }
    b.preds.sort();
    b.preds.dedup();
    Some(())
}
