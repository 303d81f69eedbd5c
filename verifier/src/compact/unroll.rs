//! A run of a loop's iterations regrouped `m` at a time: iterations `a + m·j + p` (`p < m`)
//! become iteration `j` of a loop whose body is the `m` original bodies in order, with the
//! index fixed to `a + p` in each copy and moving `m` per iteration. The bundle instances
//! and their order are exactly the original ones; only the index the symbolic evaluation
//! names changes.
//!
//! Why: a read that walks a block in chunks (`32·i` over a region of rows of 64) meets the
//! rows' coordinates only every other iteration, so no range of iterations reads one fact in
//! one shape; two iterations at a time (`64·j + 32·p`) read row `j`, half `p`.

use isa::looped::{set_field, Cmp, Field, LBundle, Pred};
use isa::{Acc, Loop, Node};

/// Iterations `a .. a + m·q` of `l` (at nesting `level`) as `q` iterations of `m` bodies, or
/// `None` when a regrouped address, predicate or count does not fit its field.
pub(super) fn unrolled(l: &Loop, level: usize, a: u64, m: u64, q: u64) -> Option<Loop> {
    let mut body = Vec::new();
    for p in 0..m {
        for n in &l.body {
            body.push(node(n, level, a + p, m)?);
        }
    }
    Some(Loop {
        count: u32::try_from(q).ok()?,
        step: None,
        body,
    })
}

/// Whether regrouping the loop at `level` keeps the forms of what it computes: no word its
/// body writes stays put across its iterations. (A sum or maximum carried across the loop
/// would become a range over pairs of terms, which no specification has.)
pub(super) fn regroupable(nodes: &[Node], level: usize) -> bool {
    nodes.iter().all(|n| match n {
        Node::Bundle(b) => {
            let moves = |f: Field| {
                b.terms
                    .iter()
                    .any(|t| t.field == f && usize::from(t.level) == level)
            };
            let op = b.bundle.op.dst().is_none() || moves(Field::OpDst);
            let acc =
                !matches!(b.bundle.acc, Acc::Add { dst: Some(_), .. }) || moves(Field::AccDst);
            op && acc
        }
        Node::Loop(l) => regroupable(&l.body, level),
    })
}

/// `n` with the index at `level` replaced by `at + m·j`.
fn node(n: &Node, level: usize, at: u64, m: u64) -> Option<Node> {
    match n {
        Node::Bundle(b) => Some(Node::Bundle(bundle(b, level, at, m)?)),
        Node::Loop(l) => {
            let mut step = l.step;
            let mut count = l.count;
            if let Some(s) = &mut step {
                if usize::from(s.level) == level {
                    let shift = i64::from(s.per) * i64::try_from(at).ok()?;
                    count = u32::try_from(i64::from(count) + shift).ok()?;
                    s.per = i16::try_from(i64::from(s.per) * i64::try_from(m).ok()?).ok()?;
                }
            }
            let body = l
                .body
                .iter()
                .map(|c| node(c, level, at, m))
                .collect::<Option<Vec<_>>>()?;
            Some(Node::Loop(Loop { count, step, body }))
        }
    }
}

fn bundle(b: &LBundle, level: usize, at: u64, m: u64) -> Option<LBundle> {
    let mut out = b.clone();
    let (at_i, m_i) = (i64::try_from(at).ok()?, i64::try_from(m).ok()?);
    let mut terms = Vec::with_capacity(out.terms.len());
    for mut t in std::mem::take(&mut out.terms) {
        if usize::from(t.level) != level {
            terms.push(t);
            continue;
        }
        let base = isa::looped::field(&out.bundle, t.field).map_or(0, i64::from);
        if t.wrap != 0 {
            // `(at + m·j) mod w` is `at mod w` for every `j` when `w` divides `m` (a double
            // buffer regrouped by two): a constant, folded into the base. Any other wrapped
            // term keeps its loop concrete.
            let w = i64::from(t.wrap);
            if m_i % w != 0 {
                return None;
            }
            let moved = base + i64::from(t.stride) * at_i.rem_euclid(w);
            set_field(&mut out.bundle, t.field, isa::Addr::try_from(moved).ok()?);
            continue;
        }
        let moved = base + i64::from(t.stride) * at_i;
        set_field(&mut out.bundle, t.field, isa::Addr::try_from(moved).ok()?);
        t.stride = i32::try_from(i64::from(t.stride) * m_i).ok()?;
        terms.push(t);
    }
    out.terms = terms;
    let mut preds = Vec::with_capacity(out.preds.len());
    for p in &b.preds {
        if usize::from(p.level) != level {
            preds.push(*p);
            continue;
        }
        // `at + m·j cmp v` as a predicate on `j`: `j ≥ ⌈(v − at)/m⌉` and the like; a slot that
        // never executes keeps `j < 0`, one that always does drops the predicate.
        let v = i64::from(p.value) - at_i;
        let first = if v <= 0 { 0 } else { (v + m_i - 1) / m_i };
        let exact = (v >= 0 && v % m_i == 0).then_some(v / m_i);
        let never = Pred {
            cmp: Cmp::Lt,
            value: 0,
            ..*p
        };
        let with = |cmp, value: i64| -> Option<Pred> {
            Some(Pred {
                cmp,
                value: u32::try_from(value).ok()?,
                ..*p
            })
        };
        match (p.cmp, exact) {
            (Cmp::Lt, _) => preds.push(with(Cmp::Lt, first)?),
            (Cmp::Ge, _) if first == 0 => {}
            (Cmp::Ge, _) => preds.push(with(Cmp::Ge, first)?),
            (Cmp::Eq, Some(x)) => preds.push(with(Cmp::Eq, x)?),
            (Cmp::Eq, None) => preds.push(never),
            (Cmp::Ne, Some(x)) => preds.push(with(Cmp::Ne, x)?),
            (Cmp::Ne, None) => {}
        }
    }
    preds.sort_unstable();
    preds.dedup();
    out.preds = preds;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(src: &str) -> isa::LoopProgram {
        let text = format!(".format 3\n.pe 0\n.pes 1\n.mem 4096\n{src}");
        isa::looped_text::parse_looped(&text).unwrap_or_else(|e| panic!("{e:?}"))
    }

    /// Every instance, in order, of the nodes at `idx`.
    fn instances(nodes: &[Node], idx: &mut Vec<u32>, out: &mut Vec<isa::Bundle>) {
        for n in nodes {
            match n {
                Node::Bundle(b) => out.push(b.instance(idx)),
                Node::Loop(l) => {
                    for k in 0..l.trips(idx) {
                        idx.push(k);
                        instances(&l.body, idx, out);
                        idx.pop();
                    }
                }
            }
        }
    }

    /// Regrouping `outer` from iteration `a`, `m` at a time for `q` groups, gives the instances
    /// of iterations `a .. a + m·q` in order, for each `(a, m, q)` of `cases`.
    fn regroups_exactly(outer: &Loop, cases: &[(u64, u64, u64)]) {
        for &(a, m, q) in cases {
            let mut want = Vec::new();
            for k in a..a + m * q {
                let mut idx = vec![k as u32];
                instances(&outer.body, &mut idx, &mut want);
            }
            let u = unrolled(outer, 0, a, m, q).expect("fits");
            let mut got = Vec::new();
            instances(&[Node::Loop(u)], &mut Vec::new(), &mut got);
            assert_eq!(got, want, "a = {a}, m = {m}, q = {q}");
        }
    }

    #[test]
    fn regrouped_iterations_are_the_same_instances_in_the_same_order() {
        let p = program(
            "loop 9 {\n  loop 12 {\n    mul m[0 + 32*i0 + 1*i1], m[1000 + 1*i0] -> m[2000 + 64*i0 + 1*i1] | nop | send m[5 + 3*i0] -> m[7 + 3*i0] if i0 >= 3 && i0 != 5\n    loop 2 + i0 {\n      max m[3000 + 1*i0], m[3100 + 1*i2] -> m[3000 + 1*i0] if i0 < 7\n    }\n    nop | add m[4000 + 2*i0] -> m[4001 + 2*i0] if i0 == 4\n  }\n}\n",
        );
        let Node::Loop(outer) = &p.body[0] else {
            panic!("expected a loop, found {:?}", p.body[0])
        };
        regroups_exactly(
            outer,
            &[(0, 2, 4), (1, 2, 4), (0, 3, 3), (2, 3, 2), (3, 2, 3)],
        );
    }

    /// A double buffer's `i mod 2` regrouped by two (or four) is a constant in each copy:
    /// the same instances in the same order; by three it stays concrete.
    #[test]
    fn wrapped_terms_regroup_by_a_multiple_of_their_period() {
        let p = program(
            "loop 7 {\n  loop 3 {\n    mul m[0 + 64*(i0 % 2) + 1*i1], m[200 - 64*(i0 % 2)] -> m[300 + 4*i0 + 1*i1] | nop | send m[0 + 64*(i0 % 2)] -> m[500 + 64*(i0 % 2)] if i0 < 5\n  }\n}\n",
        );
        let Node::Loop(outer) = &p.body[0] else {
            panic!("expected a loop, found {:?}", p.body[0])
        };
        regroups_exactly(
            outer,
            &[(0, 2, 3), (1, 2, 3), (3, 2, 2), (0, 4, 1), (2, 4, 1)],
        );
        assert!(unrolled(outer, 0, 0, 3, 2).is_none());
    }
}
