//! `codegen`: gives every value a memory address on every PE where it lives, then emits one
//! microcode program per PE.
//!
//! A value lives on a PE from the cycle after it is written (computed there, or arrived over the
//! link) to the last cycle that reads it there; a value that arrives again later gets a new
//! lifetime. Lifetimes are packed into addresses greedily in start order: tightly (interval
//! colouring, optimal for interval graphs: memory per PE is the peak number of live values), or
//! by kind of value, which costs words but repeats addresses so that the programs reroll (see
//! [`Packing`]). An address is reused only by a value written after the previous occupant's last
//! read, so no write can clobber a live word and no two writes to one address fall in one cycle.

use crate::pe_map::PeValMap;
use crate::schedule::{Element, RingSchedule, Slot, Val, ValInfo, Work};
use isa::{Acc, AccSrc, Addr, Bundle, Op, Program, Xfer, XferSrc};

pub const NAME: &str = "codegen";
pub const DESCRIPTION: &str =
    "allocate per-PE memory for every value's lifetime and emit microcode";

/// Microcode for every PE plus where inputs and outputs live.
#[derive(Clone, Debug)]
pub struct Emitted {
    pub programs: Vec<Program>,
    /// `(element, pe, address)` of every preloaded input element.
    pub inputs: Vec<(Element, u32, Addr)>,
    /// `(element, pe, address)` of every output element after the last cycle.
    pub outputs: Vec<(Element, u32, Addr)>,
}

/// One stretch of a value's life on one PE.
#[derive(Clone, Copy, Debug)]
struct Life {
    /// Cycles are kept in `u32` ([`pack`] refuses longer schedules): a layer has millions of
    /// lifetimes, and a smaller one is fewer pages to fault in.
    start: u32,
    /// Last cycle reading it; [`NO_END`] while nothing does (such a value is never stored).
    end: u32,
    /// Kept to the end: an output, or a preloaded input (which must have a home).
    pinned: bool,
    addr: Addr,
    /// The previous lifetime of the same value on this PE (`NONE` if none): values that come
    /// back to a PE are rare and short-listed, so a chain beats a vector per value.
    prev: u32,
    /// A lifetime (`NONE` if none) whose word this one should take over if it is free when
    /// this one starts: the running sum or maximum it updates, so that an accumulation stays
    /// in one word (`add mA -> mA`) and repeats with the same addresses.
    heir_of: u32,
    /// What made the value ([`kind_of`]), for [`Packing::ByKind`].
    kind: u8,
}

/// How values are packed into words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packing {
    /// As few words as possible: the peak number of live values. A freed word goes to whatever
    /// value starts next, so the addresses of repeated work wander and a program barely
    /// rerolls.
    Tight,
    /// Each kind of value ([`kind_of`]) reuses only words its own kind freed and otherwise takes
    /// fresh ones: every kind then cycles through a region of its own, repeated work repeats
    /// its addresses (or advances them by a constant), and the reroll pass folds a layer's
    /// program into a few kilobytes to a few hundred. Costs words: measured 5–50% more than
    /// `Tight` on the rows schedule. A PE whose packing exceeds the memory limit is packed
    /// tightly instead.
    ByKind { limit: Option<u32> },
}

/// The kind of a value written by `work` (as its `k`-th write) or, for `None`, arrived over the
/// link; preloaded inputs are [`INPUT_KIND`].
fn kind_of(work: Option<&Work>, k: usize) -> u8 {
    let op = match work {
        None => return 0,
        Some(Work::Mac { acc, .. }) => 1 + u8::from(acc.is_some()),
        Some(Work::Exp { acc, .. }) => 3 + u8::from(acc.is_some()),
        Some(Work::Div { .. }) => 5,
        Some(Work::Max { .. }) => 6,
    };
    op * 2 + u8::from(k > 0)
}

const INPUT_KIND: u8 = 15;
const KINDS: usize = 16;

const NONE: u32 = u32::MAX;

/// A lifetime nothing reads.
const NO_END: u32 = u32::MAX;

/// Lifetimes on every PE (`on[pe]`), indexed by value for lookups at a cycle.
struct Lives {
    on: Vec<Vec<Life>>,
    /// Per PE, per value: its latest lifetime there.
    latest: PeValMap<u32>,
}

impl Lives {
    fn new(pes: usize, vals: usize) -> Self {
        Lives {
            on: vec![Vec::new(); pes],
            latest: PeValMap::new(pes, vals, NONE),
        }
    }

    fn start(&mut self, pe: usize, val: Val, start: usize, pinned: bool, heir_of: u32, kind: u8) {
        let idx = self.on[pe].len() as u32;
        let prev = self.latest.insert(pe, val, idx).unwrap_or(NONE);
        self.on[pe].push(Life {
            start: start as u32,
            end: NO_END,
            pinned,
            addr: Addr::MAX,
            prev,
            heir_of,
            kind,
        });
    }

    /// Lifetimes of `val` on `pe`, latest first.
    fn chain(&self, pe: usize, val: Val) -> impl Iterator<Item = usize> + '_ {
        let mut next = self.latest.get(pe, val).unwrap_or(NONE);
        let lives = &self.on[pe];
        std::iter::from_fn(move || {
            (next != NONE).then(|| {
                let i = next as usize;
                next = lives[i].prev;
                i
            })
        })
    }

    /// The lifetime of `val` on `pe` holding at `cycle`: the latest one started at or before it.
    fn at(&self, pe: usize, val: Val, cycle: usize) -> Option<usize> {
        self.chain(pe, val)
            .find(|&i| self.on[pe][i].start as usize <= cycle)
    }

    fn starting(&self, pe: usize, val: Val, cycle: usize) -> Option<&Life> {
        self.chain(pe, val)
            .map(|i| &self.on[pe][i])
            .find(|l| l.start as usize == cycle)
    }

    fn stored(&self, pe: usize, val: Val, cycle: usize) -> Option<Addr> {
        self.starting(pe, val, cycle)
            .filter(|l| l.end != NO_END || l.pinned)
            .map(|l| l.addr)
    }
}

/// A schedule that codegen cannot turn into microcode: always a bug in a scheduling pass.
#[derive(Debug, Clone, PartialEq)]
pub struct CodegenError(pub String);

impl std::fmt::Display for CodegenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "internal scheduling error: {}", self.0)
    }
}

pub fn run(s: &RingSchedule, packing: Packing) -> Result<Emitted, CodegenError> {
    pack(s, packing)?.emit(s)
}

/// Every value's addresses on every PE, before any microcode is written: enough to know the
/// words each PE needs, which is all a candidate that loses on cycles is asked for.
pub struct Packed {
    lives: Lives,
    mem_words: Vec<u32>,
}

impl Packed {
    /// Words of memory each PE uses.
    pub fn mem_words(&self) -> &[u32] {
        &self.mem_words
    }

    /// The programs and input and output addresses of `s`, the schedule this packing was made
    /// for.
    pub fn emit(&self, s: &RingSchedule) -> Result<Emitted, CodegenError> {
        let (m, cycles, pes) = (s.pes as usize, s.cycles(), &self.lives);
        let mut programs = Vec::with_capacity(m);
        for (pe, &mem_words) in self.mem_words.iter().enumerate() {
            let next = (pe + 1) % m;
            let mut bundles = Vec::with_capacity(cycles);
            for t in 0..cycles {
                bundles.push(bundle(pes, s.slots[pe][t], pe, next, t)?);
            }
            programs.push(Program {
                pe: pe as u32,
                pes: s.pes,
                mem_words,
                bundles,
            });
        }

        let mut inputs = Vec::new();
        for (val, info) in s.vals.iter() {
            if let ValInfo::Input { element, pe } = *info {
                let life = pes.starting(pe as usize, val, 0).ok_or_else(|| {
                    CodegenError(format!(
                        "input {val:?} on PE {pe} has no lifetime from cycle 0"
                    ))
                })?;
                inputs.push((element, pe, life.addr));
            }
        }
        let mut outputs = Vec::new();
        for &(element, pe, val) in &s.outputs {
            let i = pes.at(pe as usize, val, cycles).ok_or_else(|| {
                CodegenError(format!("output {val} is not on PE {pe} at the end"))
            })?;
            outputs.push((element, pe, pes.on[pe as usize][i].addr));
        }
        Ok(Emitted {
            programs,
            inputs,
            outputs,
        })
    }
}

/// Lifetimes and addresses of every value of `s` (the first half of [`run`]).
pub fn pack(s: &RingSchedule, packing: Packing) -> Result<Packed, CodegenError> {
    let m = s.pes as usize;
    let cycles = s.cycles();
    // Lifetimes start up to one cycle past the end and keep cycles in `u32` below `NO_END`.
    if cycles >= (NO_END - 1) as usize {
        return Err(CodegenError(format!(
            "{cycles} cycles are more than codegen can address"
        )));
    }
    let mut pes = Lives::new(m, s.vals.len());
    // Every lifetime starts with a write, an arrival or a preload: counted first, so that a
    // PE's list of half a million lifetimes is not copied at every doubling.
    let mut starts = vec![0usize; m];
    for (pe, row) in s.slots.iter().enumerate().take(m) {
        for slot in row {
            if let Some(work) = slot.work {
                starts[pe] += work.writes().count();
            }
            if slot.send.is_some() {
                starts[(pe + 1) % m] += 1;
            }
        }
    }
    for info in s.vals.values() {
        if let ValInfo::Input { pe, .. } = info {
            if let Some(n) = starts.get_mut(*pe as usize) {
                *n += 1;
            }
        }
    }
    for (lives, n) in pes.on.iter_mut().zip(starts) {
        lives.reserve_exact(n);
    }

    for (val, info) in s.vals.iter() {
        if let ValInfo::Input { pe, .. } = info {
            pes.start(*pe as usize, val, 0, true, NONE, INPUT_KIND);
        }
    }
    // Asked of every value written, so a dense map rather than a hash set of (PE, value).
    let mut output_at = PeValMap::new(m, s.vals.len(), ());
    for &(_, pe, v) in s.outputs.iter().filter(|o| (o.1 as usize) < m) {
        output_at.insert(pe as usize, v, ());
    }

    // Discover lifetimes in time order; reads extend the lifetime they fall in.
    let read = |pes: &mut Lives, pe: usize, val: Val, t: usize| -> Result<(), CodegenError> {
        let i = pes.at(pe, val, t).ok_or_else(|| {
            CodegenError(format!(
                "PE {pe} reads {val} at cycle {t} but it is not there"
            ))
        })?;
        pes.on[pe][i].end = t as u32;
        Ok(())
    };
    for t in 0..cycles {
        for pe in 0..m {
            let slot = s.slots[pe][t];
            if let Some(work) = slot.work {
                for v in work.reads() {
                    read(&mut pes, pe, v, t)?;
                }
            }
            if let Some(v) = slot.send {
                let from_acc = slot.work.as_ref().and_then(Work::acc_result) == Some(v);
                if !from_acc {
                    read(&mut pes, pe, v, t)?;
                }
            }
        }
        for pe in 0..m {
            let slot = s.slots[pe][t];
            if let Some(work) = slot.work {
                let updated = match work {
                    Work::Mac { acc, out, .. } => acc.map(|a| (a, out)),
                    Work::Exp { acc, sum, .. } => acc.map(|a| (a, sum)),
                    Work::Max { a, out, .. } => Some((a, out)),
                    Work::Div { .. } => None,
                };
                for (k, v) in work.writes().enumerate() {
                    let pinned = output_at.get(pe, v).is_some();
                    let heir_of = match updated {
                        Some((old, new)) if new == v => {
                            pes.at(pe, old, t).map_or(NONE, |i| i as u32)
                        }
                        _ => NONE,
                    };
                    pes.start(pe, v, t + 1, pinned, heir_of, kind_of(Some(&work), k));
                }
            }
            if let Some(v) = slot.send {
                let to = (pe + 1) % m;
                let pinned = output_at.get(to, v).is_some();
                pes.start(to, v, t + 1, pinned, NONE, kind_of(None, 0));
            }
        }
    }

    let mut mem_words = Vec::with_capacity(m);
    for lives in pes.on.iter_mut() {
        mem_words.push(match packing {
            Packing::Tight => allocate(lives, false),
            Packing::ByKind { limit } => {
                let words = allocate(lives, true);
                if limit.is_some_and(|l| words > l) {
                    allocate(lives, false)
                } else {
                    words
                }
            }
        });
    }

    Ok(Packed {
        lives: pes,
        mem_words,
    })
}

/// Packs lifetimes into addresses (see [`Packing`]; `by_kind` for `ByKind`); returns the number
/// of words used.
fn allocate(lives: &mut [Life], by_kind: bool) -> u32 {
    let mut order: Vec<usize> = (0..lives.len())
        .filter(|&i| lives[i].end != NO_END || lives[i].pinned)
        .collect();
    order.sort_by_key(|&i| lives[i].start);
    let mut busy = Busy::default();
    // Tight: last freed, first reused. Any free word keeps memory at the peak of live values,
    // and taking the most recent one makes a stretch of work that repeats reuse its own
    // temporaries, where lowest-address-first would drag in words freed long before.
    // By kind: each kind has its own queue of the words it freed, reused in the order they were
    // freed, so a row of values takes the words of the row before in the same order (a stack
    // would reverse it every time).
    // Stack and queues may hold words taken since they were pushed (by an heir); `is_free` says
    // which entries still stand.
    let mut free: Vec<Addr> = Vec::new();
    let mut own: Vec<std::collections::VecDeque<Addr>> =
        vec![std::collections::VecDeque::new(); KINDS];
    let mut kind_at: Vec<u8> = Vec::new();
    let mut is_free: Vec<bool> = Vec::new();
    let mut words: Addr = 0;
    for i in order {
        let start = lives[i].start as usize;
        // An address read for the last time at cycle e may be written at the end of cycle e,
        // i.e. reused by a lifetime starting at e + 1.
        for addr in busy.ending_before(start) {
            if by_kind {
                own[usize::from(kind_at[addr as usize])].push_back(addr);
            } else {
                free.push(addr);
            }
            is_free[addr as usize] = true;
        }
        let inherited = lives
            .get(lives[i].heir_of as usize)
            .map(|h| h.addr)
            .filter(|&a| is_free.get(a as usize).copied().unwrap_or(false));
        let kind = usize::from(lives[i].kind).min(KINDS - 1);
        let addr = match inherited {
            Some(a) => a,
            None => loop {
                let next = if by_kind {
                    own[kind].pop_front()
                } else {
                    free.pop()
                };
                match next {
                    Some(a) if is_free[a as usize] => break a,
                    Some(_) => continue,
                    None => {
                        words += 1;
                        is_free.push(false);
                        kind_at.push(0);
                        break words - 1;
                    }
                }
            },
        };
        is_free[addr as usize] = false;
        kind_at[addr as usize] = kind as u8;
        lives[i].addr = addr;
        if !lives[i].pinned {
            let end = if lives[i].end == NO_END {
                start
            } else {
                lives[i].end as usize
            };
            busy.push(end, addr);
        }
    }
    words
}

/// The words held by lifetimes not yet over, by the cycle of their last read, released in the
/// order of a priority queue on `(end, address)`: cycle after cycle, and within one cycle by
/// address. A lifetime's end is never before its start, and starts are visited in order, so a
/// bucket per cycle is never filled after it was released; a priority queue of all live words
/// spends its time sifting (a pinned lifetime, never released, is not held at all). Buckets are
/// lists threaded through one vector: a vector per cycle costs an allocation for nearly every
/// lifetime.
#[derive(Default)]
struct Busy {
    /// `head[e]`: the last word pushed whose lifetime's last read is in cycle `e`, as an index
    /// into `words` (`NONE` if none).
    head: Vec<u32>,
    /// Each pushed word and the index of the one pushed before it into the same cycle.
    words: Vec<(Addr, u32)>,
    /// Cycles below this have been released.
    released: usize,
    out: Vec<Addr>,
}

impl Busy {
    fn push(&mut self, end: usize, addr: Addr) {
        debug_assert!(end >= self.released, "a lifetime ends before its start");
        if end >= self.head.len() {
            self.head.resize((end + 1).max(2 * self.head.len()), NONE);
        }
        let next = std::mem::replace(&mut self.head[end], self.words.len() as u32);
        self.words.push((addr, next));
    }

    /// Releases every word whose lifetime ended before cycle `start`, in queue order.
    fn ending_before(&mut self, start: usize) -> std::vec::Drain<'_, Addr> {
        self.out.clear();
        let upto = start.min(self.head.len());
        for e in self.released..upto {
            let from = self.out.len();
            let mut i = std::mem::replace(&mut self.head[e], NONE);
            while i != NONE {
                let (addr, next) = self.words[i as usize];
                self.out.push(addr);
                i = next;
            }
            self.out[from..].sort_unstable();
        }
        self.released = self.released.max(upto);
        self.out.drain(..)
    }
}

/// The acc slot of an op that does not accumulate: idle, unless the bundle sends the op's result,
/// which then goes through the acc slot (`add 0`, the result itself) to leave in its own cycle.
fn rides_acc(send: Option<Val>, out: Val) -> Acc {
    if send == Some(out) {
        Acc::Add {
            src: AccSrc::Zero,
            dst: None,
        }
    } else {
        Acc::Nop
    }
}

fn bundle(
    lives: &Lives,
    slot: Slot,
    pe: usize,
    next: usize,
    t: usize,
) -> Result<Bundle, CodegenError> {
    let addr = |v: Val| -> Result<Addr, CodegenError> {
        lives
            .at(pe, v, t)
            .map(|i| lives.on[pe][i].addr)
            .filter(|&a| a != Addr::MAX)
            .ok_or_else(|| CodegenError(format!("{v} has no address on PE {pe} at cycle {t}")))
    };
    let dst = |v: Val| lives.stored(pe, v, t + 1);
    let acc_src = |acc: Option<Val>| -> Result<AccSrc, CodegenError> {
        Ok(match acc {
            Some(v) => AccSrc::Mem(addr(v)?),
            None => AccSrc::Zero,
        })
    };
    let (op, acc) = match slot.work {
        None => (Op::Nop, Acc::Nop),
        Some(Work::Mac { a, b, acc, out }) => (
            Op::mul(addr(a)?, addr(b)?, None),
            Acc::Add {
                src: acc_src(acc)?,
                dst: dst(out),
            },
        ),
        Some(Work::Exp {
            x,
            bias,
            scale,
            acc,
            e,
            sum,
        }) => (
            match bias {
                None => Op::exp(addr(x)?, scale, dst(e)),
                Some(m) => Op::expd(addr(x)?, addr(m)?, scale, dst(e)),
            },
            Acc::Add {
                src: acc_src(acc)?,
                dst: dst(sum),
            },
        ),
        Some(Work::Div { num, den, out }) => (
            Op::div(addr(num)?, addr(den)?, dst(out)),
            rides_acc(slot.send, out),
        ),
        Some(Work::Max { a, b, out }) => (
            Op::max(addr(a)?, addr(b)?, dst(out)),
            rides_acc(slot.send, out),
        ),
    };
    let xfer = match slot.send {
        None => Xfer::Nop,
        Some(v) => {
            let src = if slot.work.as_ref().and_then(Work::acc_result) == Some(v) {
                XferSrc::Acc
            } else {
                XferSrc::Mem(addr(v)?)
            };
            let dst = lives.stored(next, v, t + 1).ok_or_else(|| {
                CodegenError(format!(
                    "PE {pe} sends {v} at cycle {t} but the next PE never reads it"
                ))
            })?;
            Xfer::Send { src, dst }
        }
    };
    Ok(Bundle { op, acc, xfer })
}
