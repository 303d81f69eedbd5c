//! A satisfying assignment → [`RingSchedule`], which codegen turns into programs.
//!
//! Ops are read off their PE and cycle variables. Partial sums follow the link sends of their
//! chain from one op to the next. Immutable values are re-derived by simulating the sends the
//! solver chose, keeping only the first arrival at each PE and only the transfers some op
//! actually depends on: the encoding bounds presence from above (a value may be read only where it
//! can be), so a model may carry sends nobody needs, and codegen rejects a transfer whose word is
//! never read.

use super::encode::Encoding;
use super::model::{OpKind, Producer, ValueKind};
use crate::schedule::{Builder, RingSchedule, Val, Work};
use std::collections::HashSet;

/// The name a decoded schedule carries in the manifest.
pub const NAME: &str = "exact";

/// Reads an assignment through `value` (true/false per literal) into a schedule.
///
/// An error means the assignment breaks the machine model, i.e. a bug in the encoding.
pub fn decode(enc: &Encoding, value: impl Fn(i32) -> bool) -> Result<RingSchedule, String> {
    let model = &enc.model;
    let m = model.pes;
    let next = |p: u32| (p + 1) % m;
    let prev = |p: u32| (p + m - 1) % m;

    // Where and when every op runs.
    let mut place: Vec<(u32, i64)> = Vec::with_capacity(model.ops.len());
    for (o, op) in model.ops.iter().enumerate() {
        let p = (0..m)
            .find(|&p| value(enc.on[o][p as usize]))
            .ok_or_else(|| format!("op {o} runs on no PE"))?;
        let t = (op.lo..=op.hi)
            .find(|&t| value(enc.run[o].at(p, t)))
            .ok_or_else(|| format!("op {o} runs in no cycle"))?;
        place.push((p, t));
    }

    let mut b = Builder::new(NAME, m);
    let mut vals: Vec<Option<Val>> = vec![None; model.values.len()];
    for (v, val) in model.values.iter().enumerate() {
        if let ValueKind::Input(element) = val.kind {
            let p = (0..m)
                .find(|&p| value(enc.pre[v][p as usize]))
                .ok_or_else(|| format!("input {v} is preloaded nowhere"))?;
            vals[v] = Some(b.input(element, p));
        } else {
            vals[v] = Some(b.computed());
        }
    }
    let val = |v: usize| vals[v].ok_or_else(|| format!("value {v} was given no Val"));
    let out_of = |op_out: &[Option<Val>], o: usize| {
        op_out[o].ok_or_else(|| format!("chain op {o} has no output"))
    };

    // Chains: ops in time order, each extending the previous partial sum.
    let mut chain_order: Vec<Vec<usize>> = Vec::with_capacity(model.chains.len());
    let mut op_out: Vec<Option<Val>> = vec![None; model.ops.len()];
    let mut op_acc: Vec<Option<Val>> = vec![None; model.ops.len()];
    for (x, ch) in model.chains.iter().enumerate() {
        let mut order = ch.ops.clone();
        order.sort_by_key(|&o| place[o].1);
        for w in order.windows(2) {
            if place[w[0]].1 == place[w[1]].1 {
                return Err(format!("chain {x} runs two ops in cycle {}", place[w[0]].1));
            }
        }
        let mut acc = None;
        for (i, &o) in order.iter().enumerate() {
            let out = match ch.result {
                Some(r) if i + 1 == order.len() => val(r)?,
                _ => b.computed(),
            };
            op_acc[o] = acc;
            op_out[o] = Some(out);
            acc = Some(out);
        }
        chain_order.push(order);
    }

    let mut slots = HashSet::new();
    for (o, &(p, t)) in place.iter().enumerate() {
        if !slots.insert((p, t)) {
            return Err(format!("op {o} shares PE {p}'s op slot in cycle {t}"));
        }
    }
    let scale = model.problem.scale as f32;
    for (o, op) in model.ops.iter().enumerate() {
        let (p, t) = place[o];
        let r = |i: usize| val(op.reads[i]);
        let made = |what: &str| op.produces.ok_or_else(|| format!("op {o} makes no {what}"));
        let (phase, work) = match op.kind {
            OpKind::Mac1 | OpKind::Mac3 => (
                if op.kind == OpKind::Mac1 { 1 } else { 3 },
                Work::Mac {
                    a: r(0)?,
                    b: r(1)?,
                    acc: op_acc[o],
                    out: out_of(&op_out, o)?,
                },
            ),
            OpKind::Exp => (
                2,
                Work::Exp {
                    x: r(0)?,
                    bias: None,
                    scale,
                    acc: op_acc[o],
                    e: val(made("exponent")?)?,
                    sum: out_of(&op_out, o)?,
                },
            ),
            OpKind::Div => (
                2,
                Work::Div {
                    num: r(0)?,
                    den: r(1)?,
                    out: val(made("weight")?)?,
                },
            ),
        };
        b.work(p, t as usize, phase, work);
    }

    // Partial sums travel from each op to the next along the chain's sends.
    let mut sends: Vec<(u32, i64, Val)> = Vec::new();
    for (x, order) in chain_order.iter().enumerate() {
        for w in order.windows(2) {
            let ((mut loc, t0), (p1, t1)) = (place[w[0]], place[w[1]]);
            let token = out_of(&op_out, w[0])?;
            for t in t0..t1 {
                if m > 1 && value(enc.tsend[x].at(loc, t)) {
                    sends.push((loc, t, token));
                    loc = next(loc);
                }
            }
            if loc != p1 {
                return Err(format!(
                    "chain {x}'s partial sum is on PE {loc}, not PE {p1}, at cycle {t1}"
                ));
            }
        }
    }

    // Immutable values: first arrivals from the chosen sends, then only the needed ones.
    let made_at = |v: usize| -> Option<(u32, i64)> {
        match model.values[v].producer {
            Producer::Input => None,
            Producer::Op(o) | Producer::Quotient(o) => Some(place[o]),
            Producer::Chain(x) => chain_order[x].last().map(|&o| place[o]),
        }
    };
    let mut readers: Vec<Vec<(u32, i64)>> = vec![Vec::new(); model.values.len()];
    for (o, op) in model.ops.iter().enumerate() {
        for &v in &op.reads {
            readers[v].push(place[o]);
        }
    }
    for (v, value_info) in model.values.iter().enumerate() {
        let mut avail = vec![i64::MAX; m as usize];
        let acc_made = if value_info.producer.leaves_when_made() {
            made_at(v)
        } else {
            None
        };
        match made_at(v) {
            Some((p, t)) => avail[p as usize] = t + 1,
            None => {
                let p = (0..m)
                    .find(|&p| value(enc.pre[v][p as usize]))
                    .ok_or_else(|| format!("input {v} is preloaded nowhere"))?;
                avail[p as usize] = 0;
            }
        }
        let mut via: Vec<Option<i64>> = vec![None; m as usize];
        if m > 1 {
            for t in value_info.send_lo()..value_info.hi {
                for p in 0..m {
                    if !value(enc.send[v].at(p, t)) {
                        continue;
                    }
                    let can = avail[p as usize] <= t || acc_made == Some((p, t));
                    let q = next(p) as usize;
                    if can && avail[q] > t + 1 {
                        avail[q] = t + 1;
                        via[q] = Some(t);
                    }
                }
            }
        }
        let mut needed = vec![false; m as usize];
        let mut work: Vec<u32> = Vec::new();
        for &(p, t) in &readers[v] {
            if avail[p as usize] > t {
                return Err(format!(
                    "value {v} is read on PE {p} at cycle {t} before it is there"
                ));
            }
            if !needed[p as usize] {
                needed[p as usize] = true;
                work.push(p);
            }
        }
        while let Some(p) = work.pop() {
            if let Some(t) = via[p as usize] {
                let from = prev(p);
                sends.push((from, t, val(v)?));
                if !needed[from as usize] {
                    needed[from as usize] = true;
                    work.push(from);
                }
            }
        }
    }

    // Every output element stays where its last MAC left it.
    for (x, ch) in model.chains.iter().enumerate() {
        if let Some(element) = ch.output {
            let &o = chain_order[x]
                .last()
                .ok_or_else(|| format!("output chain {x} has no op"))?;
            b.output(element, place[o].0, out_of(&op_out, o)?);
        }
    }
    let mut booked = HashSet::new();
    for &(p, t, v) in &sends {
        if !booked.insert((p, t)) {
            return Err(format!("PE {p}'s link carries two words in cycle {t}"));
        }
        b.send(p, t as usize, v);
    }
    b.finish()
        .map_err(|errors| crate::schedule::render_errors(&errors))
}
