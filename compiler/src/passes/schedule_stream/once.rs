//! Address terms and predicates on the index of a loop that runs once.
//!
//! Such an index is always 0, so a term on it adds nothing and a predicate on it is decided;
//! each still costs its bytes in the binary (12 per term, 8 per predicate). The generators
//! wrap runs of steps in loops whose count is the run's length, often 1, and give every
//! template the terms the general count needs; this strips what the count of 1 makes dead.

use isa::looped::{LoopProgram, Node};

/// `p` with every term and every holding predicate on a once-run loop's index removed; the
/// program's meaning (its flattening) is unchanged.
pub(super) fn strip(mut p: LoopProgram) -> LoopProgram {
    let mut once = Vec::new();
    walk(&mut p.body, &mut once);
    p
}

/// `once[level]`: whether the loop at that depth around `nodes` runs exactly once.
fn walk(nodes: &mut [Node], once: &mut Vec<bool>) {
    for node in nodes {
        match node {
            Node::Loop(l) => {
                once.push(l.count == 1 && l.step.is_none());
                walk(&mut l.body, once);
                once.pop();
            }
            Node::Bundle(b) => {
                let dead = |level: u8| once.get(usize::from(level)).copied().unwrap_or(false);
                b.terms.retain(|t| !dead(t.level));
                b.preds
                    .retain(|q| !(dead(q.level) && q.cmp.holds(0, q.value)));
            }
        }
    }
}
