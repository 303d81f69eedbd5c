//! Per-template slot rules, over each template's whole iteration space: the acc adds the op
//! result of its bundle, `send acc` sends the acc result of its bundle, no result is dropped on
//! the spot, and the op and the acc do not write one word in one cycle.
//!
//! A slot executes at the indices where its predicates hold; predicates compare one index with a
//! constant, so the set is a product of per-level spans, cut by a stepped trip count that is the
//! same for every slot of a template. Slot `A` executing without slot `B` therefore has a
//! witness exactly when some level's span of `A` holds an index `B`'s lacks; the witness takes
//! the other levels' first indices and is checked against the stepped trip count.

use super::bounds::{feasible, spans, Level, Span};
use isa::looped::{Field, LBundle, Slot};
use isa::{Acc, Op, Xfer, XferSrc};

/// A rule broken at some executing instance, or a conclusion out of reach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// Broken at these loop indices (outermost first): the fault or lost value, described.
    Broken {
        rule: Rule,
        at: Vec<u64>,
    },
    Undecided(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    AccWithoutOp,
    SendAccWithoutAcc,
    OpResultDropped,
    AccResultDropped,
    WriteConflict,
}

impl Rule {
    /// Whether the flattened proof reports it as a fault (otherwise a lost value).
    pub fn is_fault(self) -> bool {
        !matches!(self, Rule::OpResultDropped | Rule::AccResultDropped)
    }

    pub fn message(self) -> &'static str {
        match self {
            Rule::AccWithoutOp => "acc slot used without an op (the acc adds the op result)",
            Rule::SendAccWithoutAcc => "send acc without an acc in the same bundle",
            Rule::OpResultDropped => "the op result is neither written nor accumulated",
            Rule::AccResultDropped => "the acc result is neither written nor sent",
            Rule::WriteConflict => "the op and the acc write one word in one cycle",
        }
    }
}

/// Some index vector at which `a` executes and `b` does not, if one exists; `Err` when the only
/// candidates fall outside a stepped trip count.
fn without(levels: &[Level], a: &[Span], b: Option<&[Span]>) -> Result<Option<Vec<u64>>, ()> {
    let first: Vec<u64> = a.iter().map(|s| s.first().unwrap_or(0)).collect();
    let Some(b) = b else {
        return if feasible(levels, &first) {
            Ok(Some(first))
        } else {
            Err(())
        };
    };
    let mut blocked = false;
    for (k, (sa, sb)) in a.iter().zip(b).enumerate() {
        if let Some(x) = sa.not_in(sb) {
            let mut at = first.clone();
            at[k] = x;
            if feasible(levels, &at) {
                return Ok(Some(at));
            }
            blocked = true;
        }
    }
    if blocked {
        Err(())
    } else {
        Ok(None)
    }
}

/// The rules of this module broken by template `b` inside `levels`.
pub fn check(b: &LBundle, levels: &[Level]) -> Vec<Finding> {
    let mut out = Vec::new();
    let bundle = &b.bundle;
    let on = |slot: Slot, used: bool| {
        if used {
            spans(levels, &b.preds, slot)
        } else {
            None
        }
    };
    let op = on(Slot::Op, bundle.op != Op::Nop);
    let acc = on(Slot::Acc, bundle.acc != Acc::Nop);
    let send_acc = on(
        Slot::Xfer,
        matches!(
            bundle.xfer,
            Xfer::Send {
                src: XferSrc::Acc,
                ..
            }
        ),
    );
    let mut rule = |rule: Rule, r: Result<Option<Vec<u64>>, ()>| match r {
        Ok(None) => {}
        Ok(Some(at)) => out.push(Finding::Broken { rule, at }),
        Err(()) => out.push(Finding::Undecided(format!(
            "{}: possible only outside the stepped trip counts the check bounds",
            rule.message()
        ))),
    };
    if let Some(a) = &acc {
        rule(Rule::AccWithoutOp, without(levels, a, op.as_deref()));
    }
    if let Some(s) = &send_acc {
        rule(Rule::SendAccWithoutAcc, without(levels, s, acc.as_deref()));
    }
    if let Some(o) = &op {
        if bundle.op.dst().is_none() {
            rule(Rule::OpResultDropped, without(levels, o, acc.as_deref()));
        }
    }
    if let (Some(a), Acc::Add { dst: None, .. }) = (&acc, bundle.acc) {
        rule(
            Rule::AccResultDropped,
            without(levels, a, send_acc.as_deref()),
        );
    }
    // The op and acc destinations of one instance: a conflict needs both slots to execute
    // and the destinations' difference, affine in the indices, to be 0.
    if let (Some(o), Some(a), Some(od), Acc::Add { dst: Some(ad), .. }) =
        (&op, &acc, bundle.op.dst(), bundle.acc)
    {
        match difference(b, o, i64::from(od) - i64::from(ad)) {
            Difference::Apart => {}
            Difference::Zero => match together(levels, o, a) {
                Some(at) => out.push(Finding::Broken {
                    rule: Rule::WriteConflict,
                    at,
                }),
                None => out.push(Finding::Undecided(
                    "the op and the acc write one word whenever both execute; whether both ever execute in one instance is not decided".into(),
                )),
            },
            Difference::Maybe => out.push(Finding::Undecided(
                "the op and the acc may write one word in one cycle".into(),
            )),
        }
    }
    out
}

enum Difference {
    /// Never 0.
    Apart,
    /// Always 0.
    Zero,
    Maybe,
}

/// The difference of the op and acc destinations over the iteration space of the op (`spans`),
/// `base` the difference of their base addresses: terms of one level and one wrap combine, the
/// rest are bounded each on its own (an over-approximation, so `Apart` is sound).
fn difference(b: &LBundle, spans: &[Span], base: i64) -> Difference {
    let mut net: Vec<(u8, u32, i64)> = Vec::new();
    for t in &b.terms {
        let sign = match t.field {
            Field::OpDst => 1,
            Field::AccDst => -1,
            _ => continue,
        };
        let s = sign * i64::from(t.stride);
        match net
            .iter_mut()
            .find(|(l, w, _)| *l == t.level && *w == t.wrap)
        {
            Some(e) => e.2 += s,
            None => net.push((t.level, t.wrap, s)),
        }
    }
    net.retain(|e| e.2 != 0);
    if net.is_empty() {
        return if base == 0 {
            Difference::Zero
        } else {
            Difference::Apart
        };
    }
    let (mut lo, mut hi) = (i128::from(base), i128::from(base));
    for (level, wrap, stride) in net {
        let Some(span) = spans.get(usize::from(level)) else {
            return Difference::Maybe;
        };
        let top = span.hi.saturating_sub(1);
        let top = if wrap == 0 {
            top
        } else {
            top.min(u64::from(wrap) - 1)
        };
        let v = i128::from(stride) * i128::from(top);
        lo += v.min(0);
        hi += v.max(0);
    }
    if lo > 0 || hi < 0 {
        Difference::Apart
    } else {
        Difference::Maybe
    }
}

/// An index vector at which both `a` and `b` execute, if a simple search finds one inside the
/// stepped trip counts.
fn together(levels: &[Level], a: &[Span], b: &[Span]) -> Option<Vec<u64>> {
    let mut at = Vec::with_capacity(a.len());
    for (sa, sb) in a.iter().zip(b) {
        let start = sa.lo.max(sb.lo);
        let end = sa.hi.min(sb.hi);
        let reach = (sa.nes.len() + sb.nes.len() + 1) as u64;
        let x = (start..end.min(start.saturating_add(reach)))
            .find(|&x| sa.contains(x) && sb.contains(x))?;
        at.push(x);
    }
    feasible(levels, &at).then_some(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use isa::looped::{Cmp, Pred, Term};
    use isa::Bundle;

    fn levels(counts: &[u32]) -> Vec<Level> {
        counts
            .iter()
            .map(|&count| Level { count, step: None })
            .collect()
    }

    fn pred(slot: Slot, level: u8, cmp: Cmp, value: u32) -> Pred {
        Pred {
            slot,
            level,
            cmp,
            value,
        }
    }

    fn mac(op_dst: Option<u32>, acc_dst: Option<u32>) -> Bundle {
        Bundle {
            op: Op::mul(0, 1, op_dst),
            acc: Acc::Add {
                src: isa::AccSrc::Zero,
                dst: acc_dst,
            },
            xfer: Xfer::Nop,
        }
    }

    #[test]
    fn an_acc_guarded_more_loosely_than_its_op_is_a_fault_with_a_witness() {
        let b = LBundle {
            bundle: mac(None, Some(5)),
            terms: vec![],
            preds: vec![pred(Slot::Op, 1, Cmp::Lt, 3)],
        };
        assert_eq!(
            check(&b, &levels(&[2, 4])),
            vec![Finding::Broken {
                rule: Rule::AccWithoutOp,
                at: vec![0, 3]
            }]
        );
        let b = LBundle {
            preds: vec![
                pred(Slot::Acc, 1, Cmp::Lt, 3),
                pred(Slot::Op, 1, Cmp::Lt, 3),
            ],
            ..b
        };
        assert_eq!(check(&b, &levels(&[2, 4])), vec![]);
    }

    #[test]
    fn a_result_kept_nowhere_is_lost_and_a_send_acc_needs_its_acc() {
        let mut bundle = mac(None, None);
        bundle.xfer = Xfer::Send {
            src: XferSrc::Acc,
            dst: 0,
        };
        let b = LBundle {
            bundle,
            terms: vec![],
            preds: vec![pred(Slot::Xfer, 0, Cmp::Eq, 1)],
        };
        assert_eq!(
            check(&b, &levels(&[2])),
            vec![Finding::Broken {
                rule: Rule::AccResultDropped,
                at: vec![0]
            }]
        );
        let b = LBundle {
            preds: vec![pred(Slot::Acc, 0, Cmp::Eq, 0)],
            ..b
        };
        let found = check(&b, &levels(&[2]));
        assert!(found.contains(&Finding::Broken {
            rule: Rule::SendAccWithoutAcc,
            at: vec![1]
        }));
    }

    #[test]
    fn op_and_acc_destinations_that_meet_conflict() {
        let apart = LBundle {
            bundle: mac(Some(10), Some(0)),
            terms: vec![Term {
                field: Field::AccDst,
                level: 0,
                stride: 1,
                wrap: 0,
            }],
            preds: vec![],
        };
        assert_eq!(check(&apart, &levels(&[10])), vec![]);
        let same = LBundle {
            bundle: mac(Some(3), Some(3)),
            terms: vec![],
            preds: vec![],
        };
        assert_eq!(
            check(&same, &levels(&[2])),
            vec![Finding::Broken {
                rule: Rule::WriteConflict,
                at: vec![0]
            }]
        );
        // 10 − i0 reaches 0 at i0 = 10 only if the loop runs that far: undecided here.
        let meets = LBundle {
            bundle: mac(Some(10), Some(0)),
            terms: apart.terms.clone(),
            preds: vec![],
        };
        assert!(matches!(
            check(&meets, &levels(&[11]))[..],
            [Finding::Undecided(_)]
        ));
    }
}
