//! Reading an existing schedule (a heuristic pass's) as a placement of the model's ops: which
//! op runs on which PE in which cycle. Used to check the encoding (a schedule the machine runs
//! must satisfy it) and to seed the search.

use super::model::{Model, OpId, OpKind};
use crate::ir::Tensor;
use crate::schedule::{RingSchedule, Val, ValInfo, Work};
use std::collections::HashMap;

/// `(op, pe, cycle)` for every op of `model`, as `schedule` runs them.
pub fn placement(model: &Model, schedule: &RingSchedule) -> Result<Vec<(OpId, u32, i64)>, String> {
    let p = &model.problem;
    let mut input: HashMap<Val, (u32, u32, u32)> = HashMap::new();
    let mut is_k: HashMap<Val, bool> = HashMap::new();
    for (v, info) in schedule.vals.iter() {
        if let ValInfo::Input { element, .. } = info {
            input.insert(v, (element.head, element.row, element.col));
            is_k.insert(v, element.tensor == Tensor::K);
        }
    }
    let mut index: HashMap<(OpKind, u32, u32, u32, u32), OpId> = HashMap::new();
    for (o, op) in model.ops.iter().enumerate() {
        index.insert((op.kind, op.head, op.a, op.b, op.c), o);
    }
    let mut works: Vec<(u32, i64, Work)> = Vec::new();
    for (pe, row) in schedule.slots.iter().enumerate() {
        for (t, slot) in row.iter().enumerate() {
            if let Some(w) = slot.work {
                works.push((pe as u32, t as i64, w));
            }
        }
    }
    works.sort_by_key(|&(pe, t, _)| (t, pe));

    // Phase 1: the inputs name the score and the feature; partial sums inherit the score.
    let mut score_of: HashMap<Val, (u32, u32, u32)> = HashMap::new();
    let mut out = Vec::new();
    for &(pe, t, w) in &works {
        if let Work::Mac { a, b, out: o, .. } = w {
            // Operand order is the pass's choice; the k operand names the score's column.
            let (a, b) = if is_k.get(&a) == Some(&true) {
                (b, a)
            } else {
                (a, b)
            };
            let (Some(&(h, ra, c)), Some(&(_, rb, cb))) = (input.get(&a), input.get(&b)) else {
                continue;
            };
            if c != cb {
                continue;
            }
            let (a, b) = if p.causal && rb > ra {
                (rb, ra)
            } else {
                (ra, rb)
            };
            let key = Model::score_key(p, h, a, b);
            score_of.insert(o, key);
            let id = index
                .get(&(OpKind::Mac1, key.0, key.1, key.2, c))
                .ok_or_else(|| format!("no phase-1 op for {key:?}, column {c}"))?;
            out.push((*id, pe, t));
        }
    }
    // Phase 2: a row's EXPs share one running sum, and every row's includes its diagonal.
    let mut parent: HashMap<Val, Val> = HashMap::new();
    let mut exps: Vec<(u32, i64, Val, Val, Val)> = Vec::new();
    for &(pe, t, w) in &works {
        if let Work::Exp { x, acc, e, sum, .. } = w {
            if let Some(a) = acc {
                parent.insert(sum, a);
            }
            exps.push((pe, t, x, e, sum));
        }
    }
    let root = |mut v: Val| {
        while let Some(&u) = parent.get(&v) {
            v = u;
        }
        v
    };
    let mut row_of_chain: HashMap<Val, (u32, u32)> = HashMap::new();
    for &(_, _, x, _, sum) in &exps {
        let &(h, a, b) = score_of.get(&x).ok_or("an EXP reads no score")?;
        if a == b || !p.symmetric || p.causal {
            row_of_chain.insert(root(sum), (h, a));
        }
    }
    let mut exp_of: HashMap<Val, (u32, u32, u32)> = HashMap::new();
    for &(pe, t, x, e, sum) in &exps {
        let (h, ka, kb) = score_of[&x];
        let &(_, a) = row_of_chain
            .get(&root(sum))
            .ok_or("a softmax row without its diagonal")?;
        let b = if ka == a { kb } else { ka };
        let id = index
            .get(&(OpKind::Exp, h, a, b, 0))
            .ok_or_else(|| format!("no EXP for row {a}, column {b}"))?;
        out.push((*id, pe, t));
        exp_of.insert(e, (h, a, b));
    }
    let mut weight_of: HashMap<Val, (u32, u32, u32)> = HashMap::new();
    for &(pe, t, w) in &works {
        if let Work::Div { num, out: o, .. } = w {
            let &(h, a, b) = exp_of.get(&num).ok_or("a DIV of no exponent")?;
            let id = index
                .get(&(OpKind::Div, h, a, b, 0))
                .ok_or_else(|| format!("no DIV for row {a}, column {b}"))?;
            out.push((*id, pe, t));
            weight_of.insert(o, (h, a, b));
        }
    }
    for &(pe, t, w) in &works {
        if let Work::Mac { a, b, .. } = w {
            let (a, b) = if weight_of.contains_key(&b) {
                (b, a)
            } else {
                (a, b)
            };
            let (Some(&(h, ra, rb)), Some(&(_, vb, c))) = (weight_of.get(&a), input.get(&b)) else {
                continue;
            };
            if vb != rb {
                return Err("a phase-3 MAC pairs a weight with the wrong row of v".into());
            }
            let id = index
                .get(&(OpKind::Mac3, h, ra, rb, c))
                .ok_or_else(|| format!("no phase-3 op for y[{ra}][{c}], term {rb}"))?;
            out.push((*id, pe, t));
        }
    }
    if out.len() != model.ops.len() {
        return Err(format!(
            "the schedule runs {} of the model's {} ops",
            out.len(),
            model.ops.len()
        ));
    }
    Ok(out)
}
