//! The ring schedule: what every PE does in every cycle, over abstract values.
//!
//! A scheduling pass produces a [`RingSchedule`]; codegen turns it into microcode by giving every
//! value a memory address on every PE where it lives. Keeping the schedule free of addresses lets
//! each algorithm be written as index formulas (as in the paper) while one allocator, shared by
//! all of them, decides storage.

use crate::ir::Tensor;
use cranelift_entity::{entity_impl, PrimaryMap};

/// An abstract value: an input element, a partial sum, an exponent, a weight or an output element.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Val(u32);
entity_impl!(Val, "v");

/// Which element of which tensor a value stands for, when it is one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Element {
    pub tensor: Tensor,
    pub head: u32,
    pub row: u32,
    pub col: u32,
}

/// One PE's arithmetic work in one cycle (the op slot plus the accumulate slot).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Work {
    /// `out = acc + a·b` (`out = a·b` without `acc`).
    Mac {
        a: Val,
        b: Val,
        acc: Option<Val>,
        out: Val,
    },
    /// `e = exp(scale·(x − bias))` (`exp(scale·x)` without `bias`), `sum = acc + e` (`sum = e`
    /// without `acc`).
    Exp {
        x: Val,
        /// The row maximum a safe softmax subtracts.
        bias: Option<Val>,
        scale: f32,
        acc: Option<Val>,
        e: Val,
        sum: Val,
    },
    /// `out = num / den`.
    Div { num: Val, den: Val, out: Val },
    /// `out = max(a, b)`: one step of a row maximum (safe softmax).
    Max { a: Val, b: Val, out: Val },
}

impl Work {
    /// Values read by the work, in operand order.
    pub fn reads(&self) -> impl Iterator<Item = Val> {
        let ops = match *self {
            Work::Mac { a, b, acc, .. } => [Some(a), Some(b), acc],
            Work::Exp { x, bias, acc, .. } => [Some(x), bias, acc],
            Work::Div { num, den, .. } => [Some(num), Some(den), None],
            Work::Max { a, b, .. } => [Some(a), Some(b), None],
        };
        ops.into_iter().flatten()
    }

    /// Values produced by the work: the op result (if it is a value of its own) and the
    /// accumulate result.
    pub fn writes(&self) -> impl Iterator<Item = Val> {
        let outs = match *self {
            Work::Mac { out, .. } => [Some(out), None],
            Work::Exp { e, sum, .. } => [Some(e), Some(sum)],
            Work::Div { out, .. } | Work::Max { out, .. } => [Some(out), None],
        };
        outs.into_iter().flatten()
    }

    pub fn phase_kind(&self) -> OpKind {
        match self {
            Work::Mac { .. } => OpKind::Mac,
            Work::Exp { .. } => OpKind::Exp,
            Work::Div { .. } => OpKind::Div,
            Work::Max { .. } => OpKind::Max,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    Mac,
    Exp,
    Div,
    Max,
}

/// One PE's bundle in one cycle, before storage is decided.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Slot {
    pub work: Option<Work>,
    /// A value sent to the next PE; it is resident there from the next cycle on.
    pub send: Option<Val>,
}

/// Where a value came from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ValInfo {
    /// Preloaded into `pe` before cycle 0.
    Input { element: Element, pe: u32 },
    /// Computed by some `Work`.
    Computed,
}

/// Operation counts by phase, as the schedule executes them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct OpCounts {
    pub phase1_mac: u64,
    pub phase2_exp: u64,
    pub phase2_div: u64,
    pub phase3_mac: u64,
    /// Row maxima (safe softmax only).
    pub phase2_max: u64,
}

impl From<OpCounts> for runtime::manifest::OpCountsInfo {
    fn from(o: OpCounts) -> Self {
        runtime::manifest::OpCountsInfo {
            phase1_mac: o.phase1_mac,
            phase2_exp: o.phase2_exp,
            phase2_div: o.phase2_div,
            phase3_mac: o.phase3_mac,
            phase2_max: o.phase2_max,
        }
    }
}

impl OpCounts {
    pub fn total(&self) -> u64 {
        self.phase1_mac + self.phase2_exp + self.phase2_div + self.phase3_mac + self.phase2_max
    }
}

/// A complete schedule for all heads of one layer.
#[derive(Clone, Debug)]
pub struct RingSchedule {
    /// Name of the algorithm that produced it.
    pub algorithm: &'static str,
    pub pes: u32,
    pub vals: PrimaryMap<Val, ValInfo>,
    /// `slots[pe][cycle]`; every PE has the same number of cycles.
    pub slots: Vec<Vec<Slot>>,
    /// Output elements and the (pe, value) holding each at the end.
    pub outputs: Vec<(Element, u32, Val)>,
    pub ops: OpCounts,
}

impl RingSchedule {
    pub fn cycles(&self) -> usize {
        self.slots.first().map_or(0, Vec::len)
    }
}

/// Builds a [`RingSchedule`], refusing to double-book a slot.
///
/// Double booking is a bug in a scheduling pass, not a user error, so it panics with the place it
/// happened; the test grid runs every pass over many shapes to keep it from happening.
pub struct Builder {
    sched: RingSchedule,
}

impl Builder {
    pub fn new(algorithm: &'static str, pes: u32) -> Self {
        Builder {
            sched: RingSchedule {
                algorithm,
                pes,
                vals: PrimaryMap::new(),
                slots: vec![Vec::new(); pes as usize],
                outputs: Vec::new(),
                ops: OpCounts::default(),
            },
        }
    }

    pub fn pes(&self) -> u32 {
        self.sched.pes
    }

    pub fn input(&mut self, element: Element, pe: u32) -> Val {
        self.sched.vals.push(ValInfo::Input { element, pe })
    }

    pub fn computed(&mut self) -> Val {
        self.sched.vals.push(ValInfo::Computed)
    }

    fn slot(&mut self, pe: u32, cycle: usize) -> &mut Slot {
        let row = &mut self.sched.slots[pe as usize];
        if row.len() <= cycle {
            row.resize(cycle + 1, Slot::default());
        }
        &mut row[cycle]
    }

    /// Puts `work` on `pe` at `cycle`; `phase` (1, 2 or 3) only feeds the operation counts.
    pub fn work(&mut self, pe: u32, cycle: usize, phase: u8, work: Work) {
        let slot = self.slot(pe, cycle);
        assert!(
            slot.work.is_none(),
            "scheduler bug: op slot of PE {pe} at cycle {cycle} booked twice"
        );
        slot.work = Some(work);
        let ops = &mut self.sched.ops;
        match (phase, work.phase_kind()) {
            (1, OpKind::Mac) => ops.phase1_mac += 1,
            (3, OpKind::Mac) => ops.phase3_mac += 1,
            (_, OpKind::Exp) => ops.phase2_exp += 1,
            (_, OpKind::Div) => ops.phase2_div += 1,
            (_, OpKind::Max) => ops.phase2_max += 1,
            (p, k) => panic!("scheduler bug: {k:?} counted in phase {p}"),
        }
    }

    /// Sends `val` from `pe` to the next PE at `cycle`. On a one-PE ring the value is already
    /// where it is going, so no transfer is booked.
    pub fn send(&mut self, pe: u32, cycle: usize, val: Val) {
        if self.sched.pes == 1 {
            return;
        }
        let slot = self.slot(pe, cycle);
        assert!(
            slot.send.is_none(),
            "scheduler bug: link of PE {pe} at cycle {cycle} booked twice"
        );
        slot.send = Some(val);
    }

    pub fn output(&mut self, element: Element, pe: u32, val: Val) {
        self.sched.outputs.push((element, pe, val));
    }

    /// Pads every PE to the same length and returns the schedule.
    pub fn finish(mut self) -> RingSchedule {
        let len = self.sched.slots.iter().map(Vec::len).max().unwrap_or(0);
        for row in &mut self.sched.slots {
            row.resize(len, Slot::default());
        }
        self.sched
    }
}

impl std::fmt::Display for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let acc = |a: Option<Val>| a.map_or(String::new(), |v| format!("{v} + "));
        match *self {
            Work::Mac { a, b, acc: s, out } => write!(f, "{out} = {}{a}*{b}", acc(s)),
            Work::Exp {
                x,
                bias: None,
                scale,
                acc: s,
                e,
                sum,
            } => write!(f, "{e} = exp({scale:?}*{x}), {sum} = {}{e}", acc(s)),
            Work::Exp {
                x,
                bias: Some(m),
                scale,
                acc: s,
                e,
                sum,
            } => write!(f, "{e} = exp({scale:?}*({x}-{m})), {sum} = {}{e}", acc(s)),
            Work::Div { num, den, out } => write!(f, "{out} = {num}/{den}"),
            Work::Max { a, b, out } => write!(f, "{out} = max({a}, {b})"),
        }
    }
}

impl std::fmt::Display for RingSchedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "schedule {} on {} PEs, {} cycles {{",
            self.algorithm,
            self.pes,
            self.cycles()
        )?;
        for (val, info) in self.vals.iter() {
            if let ValInfo::Input { element: e, pe } = info {
                writeln!(
                    f,
                    "    {val} = {}[{}][{}][{}] @ pe{pe}",
                    e.tensor.name(),
                    e.head,
                    e.row,
                    e.col
                )?;
            }
        }
        for t in 0..self.cycles() {
            writeln!(f, "  cycle {t}:")?;
            for (pe, row) in self.slots.iter().enumerate() {
                let slot = row[t];
                if slot == Slot::default() {
                    continue;
                }
                let work = slot.work.map_or("-".to_string(), |w| w.to_string());
                let send = slot.send.map_or(String::new(), |v| format!("; send {v}"));
                writeln!(f, "    pe{pe}: {work}{send}")?;
            }
        }
        for (e, pe, v) in &self.outputs {
            writeln!(f, "    y[{}][{}][{}] = {v} @ pe{pe}", e.head, e.row, e.col)?;
        }
        write!(f, "}}")
    }
}
