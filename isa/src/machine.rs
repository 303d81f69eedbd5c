//! The lockstep ring interpreter.
//!
//! Execution is generic over a [`Domain`] so that the numeric interpreter
//! and any symbolic checker run the very same scheduling, fault and
//! commit logic; only the arithmetic differs. An [`Observer`] sees every
//! memory access without the interpreter having to know what is checked.

use std::fmt;

use crate::inst::{Acc, AccSrc, Addr, Bundle, Op, OpKind, Program, Xfer, XferSrc, OPS};

/// The values held in memory and the arithmetic on them.
pub trait Domain {
    type Value: Clone;
    /// The op slot: `kind` on its operands. `b` is `Some` exactly for the kinds that read two
    /// operands and `imm` is the immediate of the kinds that take one (0 otherwise), per
    /// [`crate::OPS`].
    fn op(
        &mut self,
        kind: OpKind,
        a: &Self::Value,
        b: Option<&Self::Value>,
        imm: f32,
    ) -> Self::Value;
    /// The accumulator: `a` is the addend read from memory, `b` the op
    /// result.
    fn add(&mut self, a: &Self::Value, b: &Self::Value) -> Self::Value;
}

/// Plain f32 arithmetic, rounding exactly where the hardware would (docs/isa.md gives each
/// kind's rounding steps).
#[derive(Clone, Copy, Default, Debug)]
pub struct F32Domain;

/// `max` as the ISA defines it: a NaN operand yields the other operand, and of two equal
/// operands (including `-0` and `+0`) the first.
pub fn f32_max(a: f32, b: f32) -> f32 {
    if a.is_nan() || b > a {
        b
    } else {
        a
    }
}

impl Domain for F32Domain {
    type Value = f32;
    #[inline]
    fn op(&mut self, kind: OpKind, a: &f32, b: Option<&f32>, imm: f32) -> f32 {
        let b = b.copied().unwrap_or(0.0);
        match kind {
            OpKind::Mul => a * b,
            OpKind::Exp => (imm * a).exp(),
            OpKind::Div => a / b,
            OpKind::Max => f32_max(*a, b),
            OpKind::Expd => (imm * (a - b)).exp(),
        }
    }
    fn add(&mut self, a: &f32, b: &f32) -> f32 {
        a + b
    }
}

/// Hooks called during execution. Reads are reported in operand order (op
/// `a`, op `b`, acc source, send source) as they succeed; writes when the
/// cycle commits (op dst, acc dst, then the word arriving from the ring),
/// under the PE whose memory is written.
pub trait Observer {
    fn on_read(&mut self, _pe: u32, _cycle: u64, _addr: Addr) {}
    fn on_write(&mut self, _pe: u32, _cycle: u64, _addr: Addr) {}
    /// `pe` is the sender.
    fn on_send(&mut self, _pe: u32, _cycle: u64) {}
}

/// An observer that ignores everything; with it the hooks compile away.
#[derive(Clone, Copy, Default, Debug)]
pub struct NoObserver;

impl Observer for NoObserver {}

impl<O: Observer + ?Sized> Observer for &mut O {
    fn on_read(&mut self, pe: u32, cycle: u64, addr: Addr) {
        (**self).on_read(pe, cycle, addr);
    }
    fn on_write(&mut self, pe: u32, cycle: u64, addr: Addr) {
        (**self).on_write(pe, cycle, addr);
    }
    fn on_send(&mut self, pe: u32, cycle: u64) {
        (**self).on_send(pe, cycle);
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FaultKind {
    ReadUninitialized {
        addr: Addr,
    },
    /// For a send destination, out of range of the *receiving* PE.
    AddrOutOfRange {
        addr: Addr,
    },
    WriteConflict {
        addr: Addr,
    },
    AccWithoutOp,
    SendAccWithoutAcc,
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FaultKind::ReadUninitialized { addr } => {
                write!(f, "read of uninitialized word m{addr}")
            }
            FaultKind::AddrOutOfRange { addr } => write!(f, "address m{addr} is out of range"),
            FaultKind::WriteConflict { addr } => {
                write!(f, "two writes to m{addr} in one cycle")
            }
            FaultKind::AccWithoutOp => {
                f.write_str("acc slot used without an op (the acc adds the op result)")
            }
            FaultKind::SendAccWithoutAcc => {
                f.write_str("send acc without an acc in the same bundle")
            }
        }
    }
}

/// A run-time fault. The faulting cycle commits nothing, so memory is as it
/// was at the start of `cycle`.
#[derive(Clone, PartialEq, Debug)]
pub struct Fault {
    /// The PE whose bundle faulted; for a write conflict, the PE whose
    /// memory would have been written twice.
    pub pe: u32,
    pub cycle: u64,
    /// Always equal to `cycle`; kept so reports need not rely on that.
    pub bundle_index: usize,
    pub bundle: Bundle,
    pub kind: FaultKind,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PE {}, cycle {} (bundle {}: {}): {}",
            self.pe, self.cycle, self.bundle_index, self.bundle, self.kind
        )
    }
}

impl std::error::Error for Fault {}

/// Problems putting programs and data into a machine, before any cycle runs.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum LoadError {
    NoPrograms,
    /// A program was compiled for a ring of a different size than the first.
    PesMismatch {
        pe: u32,
        pes: u32,
        expected: u32,
    },
    PeOutOfRange {
        pe: u32,
        pes: u32,
    },
    DuplicatePe {
        pe: u32,
    },
    MissingPe {
        pe: u32,
    },
    /// The local memory could not be allocated.
    MemoryTooLarge {
        pe: u32,
        mem_words: u32,
    },
    /// A preload named a PE the ring does not have.
    NoSuchPe {
        pe: u32,
        pes: u32,
    },
    /// A preload named an address outside the PE's memory.
    AddrOutOfRange {
        pe: u32,
        addr: Addr,
        mem_words: u32,
    },
    /// Preloads must happen before cycle 0.
    AlreadyStarted,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::NoPrograms => f.write_str("no programs to load"),
            LoadError::PesMismatch { pe, pes, expected } => write!(
                f,
                "program for PE {pe} is for a ring of {pes} PEs, but the first program is for {expected}"
            ),
            LoadError::PeOutOfRange { pe, pes } => {
                write!(f, "program for PE {pe} does not fit a ring of {pes} PEs")
            }
            LoadError::DuplicatePe { pe } => write!(f, "two programs for PE {pe}"),
            LoadError::MissingPe { pe } => write!(f, "no program for PE {pe}"),
            LoadError::MemoryTooLarge { pe, mem_words } => {
                write!(f, "cannot allocate {mem_words} words of memory for PE {pe}")
            }
            LoadError::NoSuchPe { pe, pes } => {
                write!(f, "preload to PE {pe}, but the ring has {pes} PEs")
            }
            LoadError::AddrOutOfRange {
                pe,
                addr,
                mem_words,
            } => write!(
                f,
                "preload to m{addr} of PE {pe}, which has {mem_words} words"
            ),
            LoadError::AlreadyStarted => f.write_str("preload after the machine started"),
        }
    }
}

impl std::error::Error for LoadError {}

/// Work done by one PE.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct PeStats {
    /// Executed ops by kind, indexed by [`OpKind::index`].
    pub ops: [u64; OPS.len()],
    pub add: u64,
    pub send: u64,
    /// Cycles whose op slot was not `nop`.
    pub busy: u64,
}

impl PeStats {
    /// Executed ops of `kind`.
    pub fn count(&self, kind: OpKind) -> u64 {
        self.ops[kind.index()]
    }

    /// Executed ops of every kind.
    pub fn total_ops(&self) -> u64 {
        self.ops.iter().sum()
    }

    fn tally(&mut self, b: &Bundle) {
        if let Some(k) = b.op.kind() {
            self.ops[k.index()] += 1;
        }
        self.busy += u64::from(!matches!(b.op, Op::Nop));
        self.add += u64::from(matches!(b.acc, Acc::Add { .. }));
        self.send += u64::from(matches!(b.xfer, Xfer::Send { .. }));
    }
}

#[derive(Clone, PartialEq, Eq, Debug)]
pub struct RunStats {
    /// Cycles completed.
    pub cycles: u64,
    /// Indexed by PE.
    pub per_pe: Vec<PeStats>,
}

impl RunStats {
    /// Fraction of PE-cycles whose op slot did work; 0 for an empty run.
    pub fn utilization(&self) -> f64 {
        let slots = self.cycles as f64 * self.per_pe.len() as f64;
        if slots == 0.0 {
            return 0.0;
        }
        let busy: u64 = self.per_pe.iter().map(|s| s.busy).sum();
        busy as f64 / slots
    }
}

/// Writes produced by one cycle for one PE's memory, held back until every
/// PE has read its operands.
struct Pending<T> {
    op: Option<(Addr, T)>,
    acc: Option<(Addr, T)>,
    recv: Option<(Addr, T)>,
}

impl<T> Pending<T> {
    fn conflict(&self) -> Option<Addr> {
        let a = self.op.as_ref().map(|w| w.0);
        let b = self.acc.as_ref().map(|w| w.0);
        let c = self.recv.as_ref().map(|w| w.0);
        match (a, b, c) {
            (Some(x), Some(y), _) if x == y => Some(x),
            (Some(x), _, Some(y)) if x == y => Some(x),
            (_, Some(x), Some(y)) if x == y => Some(x),
            _ => None,
        }
    }

    fn clear(&mut self) {
        self.op = None;
        self.acc = None;
        self.recv = None;
    }
}

/// A ring of PEs with their programs and memories.
pub struct Machine<D: Domain> {
    domain: D,
    /// Indexed by PE.
    programs: Vec<Vec<Bundle>>,
    mems: Vec<Vec<Option<D::Value>>>,
    pending: Vec<Pending<D::Value>>,
    cycle: u64,
    /// The longest program: the run's length in cycles.
    len: u64,
    /// Once set, the machine is stopped for good.
    fault: Option<Fault>,
}

impl<D: Domain> Machine<D> {
    /// Loads one program per PE, in any order. Memories start uninitialized.
    pub fn new(domain: D, mut programs: Vec<Program>) -> Result<Self, LoadError> {
        let Some(first) = programs.first() else {
            return Err(LoadError::NoPrograms);
        };
        let pes = first.pes;
        for p in &programs {
            if p.pes != pes {
                return Err(LoadError::PesMismatch {
                    pe: p.pe,
                    pes: p.pes,
                    expected: pes,
                });
            }
            if p.pe >= pes {
                return Err(LoadError::PeOutOfRange { pe: p.pe, pes });
            }
        }
        // Sorting rather than a table indexed by PE keeps a huge `pes` in a
        // hostile header from driving an allocation.
        programs.sort_by_key(|p| p.pe);
        for w in programs.windows(2) {
            if w[0].pe == w[1].pe {
                return Err(LoadError::DuplicatePe { pe: w[0].pe });
            }
        }
        for (i, p) in programs.iter().enumerate() {
            if p.pe as usize != i {
                return Err(LoadError::MissingPe { pe: i as u32 });
            }
        }
        if programs.len() < pes as usize {
            return Err(LoadError::MissingPe {
                pe: programs.len() as u32,
            });
        }

        let mut mems = Vec::with_capacity(programs.len());
        for p in &programs {
            let mut mem = Vec::new();
            mem.try_reserve_exact(p.mem_words as usize)
                .map_err(|_| LoadError::MemoryTooLarge {
                    pe: p.pe,
                    mem_words: p.mem_words,
                })?;
            mem.resize_with(p.mem_words as usize, || None);
            mems.push(mem);
        }
        let len = programs.iter().map(|p| p.bundles.len()).max().unwrap_or(0) as u64;
        Ok(Machine {
            domain,
            pending: programs
                .iter()
                .map(|_| Pending {
                    op: None,
                    acc: None,
                    recv: None,
                })
                .collect(),
            programs: programs.into_iter().map(|p| p.bundles).collect(),
            mems,
            cycle: 0,
            len,
            fault: None,
        })
    }

    /// Puts a value into a PE's memory before the first cycle.
    pub fn preload(&mut self, pe: u32, addr: Addr, word: D::Value) -> Result<(), LoadError> {
        if self.cycle > 0 || self.fault.is_some() {
            return Err(LoadError::AlreadyStarted);
        }
        let pes = self.pes();
        let mem = self
            .mems
            .get_mut(pe as usize)
            .ok_or(LoadError::NoSuchPe { pe, pes })?;
        let mem_words = mem.len() as u32;
        let slot = mem
            .get_mut(addr as usize)
            .ok_or(LoadError::AddrOutOfRange {
                pe,
                addr,
                mem_words,
            })?;
        *slot = Some(word);
        Ok(())
    }

    /// Executes one cycle on every PE. Returns whether cycles remain; once
    /// none do, further calls do nothing and return `Ok(false)`. After a
    /// fault every call returns that fault again.
    pub fn step<O: Observer + ?Sized>(&mut self, obs: &mut O) -> Result<bool, Fault> {
        if let Some(f) = &self.fault {
            return Err(f.clone());
        }
        if self.cycle >= self.len {
            return Ok(false);
        }
        let cycle = self.cycle;
        // `len` came from a Vec length, so any cycle below it fits a usize.
        let idx = cycle as usize;
        let pes = self.programs.len();

        // Every PE reads from the memory state at the start of the cycle, so
        // all reads (and the arithmetic) happen before any write lands.
        for p in 0..pes {
            let Some(b) = self.programs[p].get(idx) else {
                continue;
            };
            let r = issue(
                &mut self.domain,
                &self.mems,
                &mut self.pending,
                p,
                cycle,
                b,
                obs,
            );
            if let Err(kind) = r {
                return Err(self.halt(p, kind));
            }
        }
        for p in 0..pes {
            if let Some(addr) = self.pending[p].conflict() {
                return Err(self.halt(p, FaultKind::WriteConflict { addr }));
            }
        }
        for (p, (pend, mem)) in self.pending.iter_mut().zip(&mut self.mems).enumerate() {
            for w in [&mut pend.op, &mut pend.acc, &mut pend.recv] {
                if let Some((addr, word)) = w.take() {
                    // Ranges were checked when the write was issued.
                    if let Some(slot) = mem.get_mut(addr as usize) {
                        *slot = Some(word);
                    }
                    obs.on_write(p as u32, cycle, addr);
                }
            }
        }
        self.cycle += 1;
        Ok(self.cycle < self.len)
    }

    /// Runs to the end of the longest program.
    pub fn run<O: Observer + ?Sized>(&mut self, obs: &mut O) -> Result<RunStats, Fault> {
        while self.step(obs)? {}
        Ok(self.stats())
    }

    fn halt(&mut self, p: usize, kind: FaultKind) -> Fault {
        let bundle_index = self.cycle as usize;
        let fault = Fault {
            pe: p as u32,
            cycle: self.cycle,
            bundle_index,
            // A PE past its program cannot fault: it reads nothing, and a
            // write conflict needs at least one write of its own.
            bundle: self.programs[p]
                .get(bundle_index)
                .copied()
                .unwrap_or(Bundle::NOP),
            kind,
        };
        for pend in &mut self.pending {
            pend.clear();
        }
        self.fault = Some(fault.clone());
        fault
    }

    /// The word at `addr` of PE `pe`; `None` if uninitialized or out of
    /// range.
    pub fn read(&self, pe: u32, addr: Addr) -> Option<&D::Value> {
        self.mems.get(pe as usize)?.get(addr as usize)?.as_ref()
    }

    /// Cycles completed so far.
    pub fn cycle(&self) -> u64 {
        self.cycle
    }

    /// Length of the whole run in cycles: the longest program.
    pub fn total_cycles(&self) -> u64 {
        self.len
    }

    pub fn pes(&self) -> u32 {
        self.programs.len() as u32
    }

    /// The fault that stopped the machine, if any.
    pub fn fault(&self) -> Option<&Fault> {
        self.fault.as_ref()
    }

    pub fn domain(&mut self) -> &mut D {
        &mut self.domain
    }

    /// Work done in the cycles completed so far.
    pub fn stats(&self) -> RunStats {
        // Counted from the executed prefix of each program rather than as
        // cycles commit: the counts are a function of that prefix, and this
        // keeps the bookkeeping out of the per-cycle loop.
        let done = self.cycle as usize;
        let per_pe = self
            .programs
            .iter()
            .map(|prog| {
                let mut s = PeStats::default();
                for b in &prog[..done.min(prog.len())] {
                    s.tally(b);
                }
                s
            })
            .collect();
        RunStats {
            cycles: self.cycle,
            per_pe,
        }
    }
}

/// An op's operands, borrowed from memory so that nothing is cloned before
/// it is known the bundle will not fault.
struct Operands<'m, T> {
    kind: OpKind,
    a: &'m T,
    b: Option<&'m T>,
    imm: f32,
}

#[inline]
fn read<'m, T, O: Observer + ?Sized>(
    mem: &'m [Option<T>],
    pe: u32,
    cycle: u64,
    addr: Addr,
    obs: &mut O,
) -> Result<&'m T, FaultKind> {
    match mem.get(addr as usize) {
        None => Err(FaultKind::AddrOutOfRange { addr }),
        Some(None) => Err(FaultKind::ReadUninitialized { addr }),
        Some(Some(word)) => {
            obs.on_read(pe, cycle, addr);
            Ok(word)
        }
    }
}

#[inline]
fn check_dst<T>(mem: &[Option<T>], addr: Option<Addr>) -> Result<(), FaultKind> {
    match addr {
        Some(addr) if addr as usize >= mem.len() => Err(FaultKind::AddrOutOfRange { addr }),
        _ => Ok(()),
    }
}

/// The read-and-compute half of one PE's cycle: checks the bundle, reads
/// its operands, computes, and queues its writes in `pending`. Faults are
/// found in the order documented in docs/isa.md: slot structure, reads in
/// operand order, then destinations.
#[inline]
fn issue<D: Domain, O: Observer + ?Sized>(
    domain: &mut D,
    mems: &[Vec<Option<D::Value>>],
    pending: &mut [Pending<D::Value>],
    p: usize,
    cycle: u64,
    b: &Bundle,
    obs: &mut O,
) -> Result<(), FaultKind> {
    let pe = p as u32;
    let mem = &mems[p];
    if matches!(b.op, Op::Nop) && !matches!(b.acc, Acc::Nop) {
        return Err(FaultKind::AccWithoutOp);
    }
    let send_acc = matches!(
        b.xfer,
        Xfer::Send {
            src: XferSrc::Acc,
            ..
        }
    );
    if send_acc && matches!(b.acc, Acc::Nop) {
        return Err(FaultKind::SendAccWithoutAcc);
    }

    let (operands, op_dst) = match b.op {
        Op::Nop => (None, None),
        Op::Arith(x) => {
            let a = read(mem, pe, cycle, x.a, obs)?;
            let b = if x.kind.info().reads == 2 {
                Some(read(mem, pe, cycle, x.b, obs)?)
            } else {
                None
            };
            (
                Some(Operands {
                    kind: x.kind,
                    a,
                    b,
                    imm: x.imm,
                }),
                x.dst,
            )
        }
    };
    let (addend, acc_dst) = match b.acc {
        Acc::Nop => (None, None),
        Acc::Add {
            src: AccSrc::Mem(s),
            dst,
        } => (Some(read(mem, pe, cycle, s, obs)?), dst),
        Acc::Add {
            src: AccSrc::Zero,
            dst,
        } => (None, dst),
    };
    let send = match b.xfer {
        Xfer::Nop => None,
        Xfer::Send {
            src: XferSrc::Mem(s),
            dst,
        } => Some((Some(read(mem, pe, cycle, s, obs)?), dst)),
        Xfer::Send {
            src: XferSrc::Acc,
            dst,
        } => Some((None, dst)),
    };
    check_dst(mem, op_dst)?;
    check_dst(mem, acc_dst)?;
    // Not `%`: an integer division per PE per cycle is measurable.
    let next = if p + 1 == mems.len() { 0 } else { p + 1 };
    if let Some((_, dst)) = send {
        check_dst(&mems[next], Some(dst))?;
    }

    let result = operands.map(|o| domain.op(o.kind, o.a, o.b, o.imm));
    let pend = &mut pending[p];
    let mut acc_out = None;
    if let Some(r) = result {
        if let Acc::Add { .. } = b.acc {
            let a = match addend {
                Some(s) => domain.add(s, &r),
                None => r.clone(),
            };
            match (acc_dst, send_acc) {
                (Some(d), true) => {
                    pend.acc = Some((d, a.clone()));
                    acc_out = Some(a);
                }
                (Some(d), false) => pend.acc = Some((d, a)),
                (None, true) => acc_out = Some(a),
                (None, false) => {}
            }
        }
        if let Some(d) = op_dst {
            pend.op = Some((d, r));
        }
    }
    if let Some((word, dst)) = send {
        let word = match word {
            Some(w) => w.clone(),
            // `send acc` without an acc was rejected above, so `acc_out` is set.
            None => match acc_out {
                Some(a) => a,
                None => return Ok(()),
            },
        };
        pending[next].recv = Some((dst, word));
        obs.on_send(pe, cycle);
    }
    Ok(())
}

/// Hooks for the format-2 loop interpreter (`crate::looped_exec`), which
/// supplies each cycle's bundles itself instead of indexing a flat program,
/// and for its bulk path, which works on the memories directly.
impl<D: Domain> Machine<D> {
    /// Executes one cycle in which PE `p` runs `bundles[p]` (`None`: idle),
    /// with exactly the semantics and fault order of [`Machine::step`]. The
    /// reported fault names the supplied bundle.
    pub(crate) fn step_bundles<O: Observer + ?Sized>(
        &mut self,
        bundles: &[Option<Bundle>],
        obs: &mut O,
    ) -> Result<(), Fault> {
        if let Some(f) = &self.fault {
            return Err(f.clone());
        }
        let cycle = self.cycle;
        let pes = self.programs.len();
        for p in 0..pes {
            let Some(Some(b)) = bundles.get(p) else {
                continue;
            };
            let r = issue(
                &mut self.domain,
                &self.mems,
                &mut self.pending,
                p,
                cycle,
                b,
                obs,
            );
            if let Err(kind) = r {
                return Err(self.halt_with(p, kind, bundles));
            }
        }
        for p in 0..pes {
            if let Some(addr) = self.pending[p].conflict() {
                return Err(self.halt_with(p, FaultKind::WriteConflict { addr }, bundles));
            }
        }
        for (p, (pend, mem)) in self.pending.iter_mut().zip(&mut self.mems).enumerate() {
            for w in [&mut pend.op, &mut pend.acc, &mut pend.recv] {
                if let Some((addr, word)) = w.take() {
                    if let Some(slot) = mem.get_mut(addr as usize) {
                        *slot = Some(word);
                    }
                    obs.on_write(p as u32, cycle, addr);
                }
            }
        }
        self.cycle += 1;
        Ok(())
    }

    fn halt_with(&mut self, p: usize, kind: FaultKind, bundles: &[Option<Bundle>]) -> Fault {
        let fault = Fault {
            pe: p as u32,
            cycle: self.cycle,
            bundle_index: self.cycle as usize,
            bundle: bundles.get(p).copied().flatten().unwrap_or(Bundle::NOP),
            kind,
        };
        for pend in &mut self.pending {
            pend.clear();
        }
        self.fault = Some(fault.clone());
        fault
    }

    /// The memories, for a bulk executor that has proved a stretch of
    /// cycles equivalent to stepping them one by one.
    pub(crate) fn mems_mut(&mut self) -> &mut [Vec<Option<D::Value>>] {
        &mut self.mems
    }

    pub(crate) fn mems(&self) -> &[Vec<Option<D::Value>>] {
        &self.mems
    }

    /// Records `n` cycles executed in bulk.
    pub(crate) fn advance(&mut self, n: u64) {
        self.cycle += n;
    }
}
