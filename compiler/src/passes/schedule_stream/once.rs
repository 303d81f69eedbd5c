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

/// `p` with every once-run loop that nothing refers to by its index (after [`strip`]) replaced
/// by its body, the deeper levels renumbered one up: the same flattening in fewer records (a
/// loop costs its opening and closing records, three bytes at least).
pub(super) fn inline(mut p: LoopProgram) -> LoopProgram {
    p.body = flatten_once(std::mem::take(&mut p.body), 0);
    p
}

/// `nodes` (their loops at `level`) with the once-run loops inside them inlined.
fn flatten_once(nodes: Vec<Node>, level: u8) -> Vec<Node> {
    let mut out = Vec::with_capacity(nodes.len());
    for node in nodes {
        match node {
            Node::Loop(mut l) => {
                if l.count == 1 && l.step.is_none() && !refers(&l.body, level) {
                    lift(&mut l.body, level);
                    out.extend(flatten_once(l.body, level));
                } else {
                    l.body = flatten_once(l.body, level + 1);
                    out.push(Node::Loop(l));
                }
            }
            bundle => out.push(bundle),
        }
    }
    out
}

/// Whether anything in `nodes` uses the index at `level`: a term, a predicate or a step.
fn refers(nodes: &[Node], level: u8) -> bool {
    nodes.iter().any(|n| match n {
        Node::Loop(l) => l.step.is_some_and(|s| s.level == level) || refers(&l.body, level),
        Node::Bundle(b) => {
            b.terms.iter().any(|t| t.level == level) || b.preds.iter().any(|q| q.level == level)
        }
    })
}

/// Every level below `level` in `nodes` moved one up, the loop at `level` being removed.
fn lift(nodes: &mut [Node], level: u8) {
    for n in nodes {
        match n {
            Node::Loop(l) => {
                if let Some(s) = l.step.as_mut() {
                    if s.level > level {
                        s.level -= 1;
                    }
                }
                lift(&mut l.body, level);
            }
            Node::Bundle(b) => {
                for t in &mut b.terms {
                    if t.level > level {
                        t.level -= 1;
                    }
                }
                for q in &mut b.preds {
                    if q.level > level {
                        q.level -= 1;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use isa::looped::LoopProgram;
    use isa::looped_binary::encoded_len;

    /// Once-run loops go, the levels below them move up, and a loop whose index is still read
    /// (a predicate that never holds, a stepped count) stays: the flattening is the same.
    #[test]
    fn inlined_once_loops_flatten_alike() -> Result<(), String> {
        let src = "\
.format 3
.pe 0
.pes 2
.mem 64
loop 1 {
    loop 3 {
        loop 1 {
            mul m[0 + 1*i1], m8 -> m[16 + 1*i1] | nop | send m[9 + 1*i1] -> m[9 + 1*i1]
            loop 2 + i1 {
                mul m[1 + 1*i3], m8 | add m20 -> m20
            }
        }
    }
    loop 1 {
        mul m0, m8 -> m4 | nop | send m9 -> m10 if i1 >= 1
    }
}
";
        let p: LoopProgram = isa::parse_looped(src).map_err(|e| format!("{e:?}"))?;
        let done = super::inline(super::strip(p.clone()));
        let flat = |q: &LoopProgram| q.flatten(1000).map_err(|e| format!("{e:?}"));
        assert_eq!(flat(&p)?, flat(&done)?);
        let text = done.to_text();
        // The outer and the inner once-run loops are gone; the one read by its predicate stays.
        assert_eq!(text.matches("loop 1 {").count(), 1, "{text}");
        assert!(text.contains("loop 2 + i0 {"), "{text}");
        assert!(encoded_len(&done) < encoded_len(&p));
        Ok(())
    }
}
