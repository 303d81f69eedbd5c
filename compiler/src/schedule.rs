//! The ring schedule: what every PE does in every cycle, over abstract values.
//!
//! A scheduling pass produces a [`RingSchedule`]; codegen turns it into microcode by giving every
//! value a memory address on every PE where it lives. Keeping the schedule free of addresses lets
//! each algorithm be written as index formulas (as in the paper) while one allocator, shared by
//! all of them, decides storage.

use crate::ir::Tensor;
use cranelift_entity::{EntityRef, PrimaryMap};
use std::num::NonZeroU32;

/// An abstract value: an input element, a partial sum, an exponent, a weight or an output element.
///
/// Held as its index plus one, so that `Option<Val>` takes no more room than a `Val`: schedules
/// of millions of operations hold several in every slot and task. It orders and hashes as its
/// index does (what the hashing passes and their iteration orders were built on).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Val(NonZeroU32);

impl Val {
    /// The value of index `x` (below `u32::MAX`).
    pub fn from_u32(x: u32) -> Self {
        Val(NonZeroU32::MIN.saturating_add(x))
    }

    /// Its index.
    pub fn as_u32(self) -> u32 {
        self.0.get() - 1
    }
}

impl EntityRef for Val {
    fn new(index: usize) -> Self {
        debug_assert!(index < u32::MAX as usize);
        Val::from_u32(index as u32)
    }

    fn index(self) -> usize {
        self.as_u32() as usize
    }
}

impl std::hash::Hash for Val {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_u32().hash(state);
    }
}

impl std::fmt::Display for Val {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "v{}", self.as_u32())
    }
}

impl std::fmt::Debug for Val {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

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

    /// The value a send in the same bundle may carry: the accumulate result. A division or a
    /// maximum leaves the acc slot free, so its result can take it with `add 0` and leave in
    /// the cycle it is made, like a partial sum.
    pub fn acc_result(&self) -> Option<Val> {
        match *self {
            Work::Mac { out, .. } | Work::Div { out, .. } | Work::Max { out, .. } => Some(out),
            Work::Exp { sum, .. } => Some(sum),
        }
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

/// Which of the three phases of attention an operation belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// Scores `q·k`.
    Scores,
    /// The softmax: exponentials, row sums, maxima, divisions.
    Softmax,
    /// The weighted sum of values.
    Values,
}

impl Phase {
    /// The paper's phase number, 1 to 3.
    pub fn number(self) -> u8 {
        match self {
            Phase::Scores => 1,
            Phase::Softmax => 2,
            Phase::Values => 3,
        }
    }

    pub fn from_number(n: u8) -> Option<Phase> {
        match n {
            1 => Some(Phase::Scores),
            2 => Some(Phase::Softmax),
            3 => Some(Phase::Values),
            _ => None,
        }
    }
}

/// One PE's bundle in one cycle, before storage is decided.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Slot {
    pub work: Option<Work>,
    /// The phase of `work`, kept so no later stage has to infer it.
    pub phase: Option<Phase>,
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
            online_rescale: 0,
        }
    }
}

impl OpCounts {
    /// Counts one operation of `kind` in `phase` (a pair that can belong to that phase).
    pub fn count(&mut self, phase: Phase, kind: OpKind) {
        match (phase, kind) {
            (Phase::Scores, _) => self.phase1_mac += 1,
            (Phase::Values, _) => self.phase3_mac += 1,
            (_, OpKind::Exp) => self.phase2_exp += 1,
            (_, OpKind::Max) => self.phase2_max += 1,
            (_, _) => self.phase2_div += 1,
        }
    }

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

/// Why a schedule is not a valid program for the ring: always a bug in the pass that made it,
/// reported as an internal error naming the place, never a panic.
#[derive(Clone, Debug, PartialEq)]
pub enum ScheduleError {
    /// Two operations, or two sends, in one slot.
    DoubleBooked {
        pe: u32,
        cycle: usize,
        slot: &'static str,
    },
    /// A work item that cannot belong to the phase it was booked in.
    PhaseMismatch { pe: u32, cycle: usize, phase: u8 },
    /// A PE outside the ring.
    NoSuchPe { pe: u32, pes: u32 },
    /// A PE reads or sends a value that is not on it in that cycle.
    NotPresent { pe: u32, cycle: usize, val: Val },
    /// A value named that no input or work produces.
    UnknownValue { val: Val },
    /// An output element is not on its PE after the last cycle, or is listed twice.
    Output {
        pe: u32,
        val: Val,
        reason: &'static str,
    },
    /// PEs have programs of different lengths.
    Ragged,
    /// The operation counts the schedule claims differ from what its slots hold.
    Counts { claimed: OpCounts, found: OpCounts },
    /// A pass found its own bookkeeping inconsistent.
    Internal { pass: &'static str, what: String },
}

impl std::fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScheduleError::DoubleBooked { pe, cycle, slot } => {
                write!(f, "PE {pe}, cycle {cycle}: {slot} slot booked twice")
            }
            ScheduleError::PhaseMismatch { pe, cycle, phase } => write!(
                f,
                "PE {pe}, cycle {cycle}: work booked in phase {phase}, which cannot hold it"
            ),
            ScheduleError::NoSuchPe { pe, pes } => {
                write!(f, "PE {pe} named on a ring of {pes} PEs")
            }
            ScheduleError::NotPresent { pe, cycle, val } => {
                write!(
                    f,
                    "PE {pe}, cycle {cycle}: {val} is read but is not on this PE"
                )
            }
            ScheduleError::UnknownValue { val } => write!(f, "{val} is never produced"),
            ScheduleError::Output { pe, val, reason } => {
                write!(f, "output {val} on PE {pe}: {reason}")
            }
            ScheduleError::Ragged => f.write_str("PEs have schedules of different lengths"),
            ScheduleError::Counts { claimed, found } => write!(
                f,
                "operation counts claimed {claimed:?} but the slots hold {found:?}"
            ),
            ScheduleError::Internal { pass, what } => write!(f, "{pass}: {what}"),
        }
    }
}

/// Every error of one schedule, for an internal-error report.
pub fn render_errors(errors: &[ScheduleError]) -> String {
    const SHOWN: usize = 10;
    let mut out: Vec<String> = errors.iter().take(SHOWN).map(|e| e.to_string()).collect();
    if errors.len() > SHOWN {
        out.push(format!("... and {} more", errors.len() - SHOWN));
    }
    out.join("; ")
}

/// Builds a [`RingSchedule`], refusing to double-book a slot.
///
/// A booking mistake is a bug in a scheduling pass, not a user error: the builder records it
/// and [`Builder::finish`] returns every one, located, so the compiler reports an internal error
/// instead of panicking.
pub struct Builder {
    sched: RingSchedule,
    errors: Vec<ScheduleError>,
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
            errors: Vec::new(),
        }
    }

    /// Records a pass's own inconsistency (what would otherwise be an `expect`).
    pub fn bug(&mut self, pass: &'static str, what: impl Into<String>) {
        self.errors.push(ScheduleError::Internal {
            pass,
            what: what.into(),
        });
    }

    pub fn pes(&self) -> u32 {
        self.sched.pes
    }

    /// Whether anything has been refused or reported so far ([`Builder::finish`] would fail).
    pub fn failed(&self) -> bool {
        !self.errors.is_empty()
    }

    pub fn input(&mut self, element: Element, pe: u32) -> Val {
        self.sched.vals.push(ValInfo::Input { element, pe })
    }

    /// Values made so far.
    pub fn vals(&self) -> usize {
        self.sched.vals.len()
    }

    /// A copy with room for `cycles` per PE and `vals` more values: a pass that books many
    /// trial schedules from one start would otherwise grow both step by step in every trial.
    pub fn fork(&self, cycles: usize, vals: usize) -> Builder {
        let mut all = PrimaryMap::with_capacity(self.sched.vals.len() + vals);
        for (_, &info) in self.sched.vals.iter() {
            all.push(info);
        }
        let slots = self
            .sched
            .slots
            .iter()
            .map(|row| {
                let mut r = Vec::with_capacity(cycles.max(row.len()));
                r.extend_from_slice(row);
                r
            })
            .collect();
        Builder {
            sched: RingSchedule {
                algorithm: self.sched.algorithm,
                pes: self.sched.pes,
                vals: all,
                slots,
                outputs: self.sched.outputs.clone(),
                ops: self.sched.ops,
            },
            errors: self.errors.clone(),
        }
    }

    pub fn computed(&mut self) -> Val {
        self.sched.vals.push(ValInfo::Computed)
    }

    /// Room for `cycles` cycles on every PE, for a pass that knows about how long its schedule
    /// will be: rows that grow cycle by cycle otherwise copy themselves at every doubling, which
    /// on a schedule of half a million cycles is a good part of its building time. Untouched
    /// room costs address space only.
    pub fn reserve_cycles(&mut self, cycles: usize) {
        for row in &mut self.sched.slots {
            row.reserve(cycles.saturating_sub(row.len()));
        }
    }

    fn slot(&mut self, pe: u32, cycle: usize) -> Option<&mut Slot> {
        let pes = self.sched.pes;
        let Some(row) = self.sched.slots.get_mut(pe as usize) else {
            self.errors.push(ScheduleError::NoSuchPe { pe, pes });
            return None;
        };
        if row.len() <= cycle {
            row.resize(cycle + 1, Slot::default());
        }
        Some(&mut row[cycle])
    }

    /// Puts `work` on `pe` at `cycle`, as part of `phase` (1, 2 or 3).
    pub fn work(&mut self, pe: u32, cycle: usize, phase: u8, work: Work) {
        let Some(ph) = Phase::from_number(phase).filter(|_| accepts(phase, &work)) else {
            self.errors
                .push(ScheduleError::PhaseMismatch { pe, cycle, phase });
            return;
        };
        let Some(slot) = self.slot(pe, cycle) else {
            return;
        };
        if slot.work.is_some() {
            self.errors.push(ScheduleError::DoubleBooked {
                pe,
                cycle,
                slot: "op",
            });
            return;
        }
        slot.work = Some(work);
        slot.phase = Some(ph);
        self.sched.ops.count(ph, work.phase_kind());
    }

    /// Sends `val` from `pe` to the next PE at `cycle`. On a one-PE ring the value is already
    /// where it is going, so no transfer is booked.
    pub fn send(&mut self, pe: u32, cycle: usize, val: Val) {
        if self.sched.pes == 1 {
            return;
        }
        let Some(slot) = self.slot(pe, cycle) else {
            return;
        };
        if slot.send.is_some() {
            self.errors.push(ScheduleError::DoubleBooked {
                pe,
                cycle,
                slot: "link",
            });
            return;
        }
        slot.send = Some(val);
    }

    pub fn output(&mut self, element: Element, pe: u32, val: Val) {
        self.sched.outputs.push((element, pe, val));
    }

    /// Pads every PE to the same length and returns the schedule, or every booking error.
    pub fn finish(mut self) -> Result<RingSchedule, Vec<ScheduleError>> {
        if !self.errors.is_empty() {
            return Err(self.errors);
        }
        let len = self.sched.slots.iter().map(Vec::len).max().unwrap_or(0);
        for row in &mut self.sched.slots {
            row.resize(len, Slot::default());
        }
        Ok(self.sched)
    }
}

/// Whether [`Builder::work`] takes `work` as part of `phase` (1, 2 or 3): for a pass that
/// simulates trial schedules without booking them and must refuse what the builder refuses.
pub(crate) fn accepts(phase: u8, work: &Work) -> bool {
    Phase::from_number(phase).is_some_and(|ph| fits(ph, work.phase_kind()))
}

/// Can work of `kind` be part of `phase`?
fn fits(phase: Phase, kind: OpKind) -> bool {
    matches!(
        (phase, kind),
        (Phase::Scores | Phase::Values, OpKind::Mac)
            | (Phase::Softmax, OpKind::Exp | OpKind::Div | OpKind::Max)
    )
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
