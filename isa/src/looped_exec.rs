//! The native loop interpreter: executes format-3 programs without
//! flattening them.
//!
//! Every cycle goes through the flat machine's issue/commit code
//! ([`Machine`]) with the bundle instance the loop cursor yields, so the
//! semantics and fault order are those of the flattened program by
//! construction. For `f32`, [`LoopMachine::run_fast`] additionally executes
//! stretches of cycles in bulk when every PE is inside a one-bundle innermost
//! loop and it can show, before touching anything, that the stretch cannot
//! fault and that no word written in the stretch is read or written by
//! another slot in it; otherwise it steps one cycle and tries again.

use crate::inst::{Acc, AccSrc, Addr, Bundle, Op, Xfer, XferSrc};
use crate::looped::{field, Cmp, Field, LBundle, LoopError, LoopProgram, Node, MAX_LOOP_DEPTH};
use crate::machine::{
    Domain, F32Domain, Fault, LoadError, Machine, NoObserver, Observer, PeStats, RunStats,
};
use crate::Program;

mod defer;
mod dot;
mod general;
mod nest;

/// Positions in [`Plan::progs`] and in the planners' per-field arrays: the order of
/// [`Field::ALL`], named so that the planners say which slot they mean.
mod fx {
    use crate::looped::Field;

    pub(super) const OP_A: usize = Field::OpA as usize;
    pub(super) const OP_B: usize = Field::OpB as usize;
    pub(super) const OP_DST: usize = Field::OpDst as usize;
    pub(super) const ACC_SRC: usize = Field::AccSrc as usize;
    pub(super) const ACC_DST: usize = Field::AccDst as usize;
    pub(super) const XFER_SRC: usize = Field::XferSrc as usize;
    /// The one field that writes another PE's memory (the successor's).
    pub(super) const XFER_DST: usize = Field::XferDst as usize;
    /// The fields that read the PE's own memory.
    pub(super) const READS: [usize; 4] = [OP_A, OP_B, ACC_SRC, XFER_SRC];
    /// The fields that write the PE's own memory.
    pub(super) const WRITES: [usize; 2] = [OP_DST, ACC_DST];
}

use defer::{meet, Access, Meet, Sink};

use dot::{dot_of, run_chains, Chain};

/// Why a set of loop programs could not be loaded.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum LoopLoadError {
    Load(LoadError),
    Invalid { pe: u32, error: LoopError },
}

impl std::fmt::Display for LoopLoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoopLoadError::Load(e) => e.fmt(f),
            LoopLoadError::Invalid { pe, error } => write!(f, "program for PE {pe}: {error}"),
        }
    }
}

impl std::error::Error for LoopLoadError {}

#[derive(Clone, Copy, Debug)]
struct Frame {
    pos: usize,
    iter: u32,
    count: u32,
}

/// A stack of frames, one per open loop and one for the top-level list. Inline, so that a
/// planner's probe copy of a cursor costs no allocation.
#[derive(Clone, Copy, Debug)]
struct Frames {
    buf: [Frame; MAX_LOOP_DEPTH + 1],
    len: usize,
}

impl Frames {
    fn push(&mut self, f: Frame) {
        // Validation bounds the nesting depth, so the stack never outgrows its buffer.
        self.buf[self.len] = f;
        self.len += 1;
    }
    fn pop(&mut self) {
        self.len = self.len.saturating_sub(1);
    }
    fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}

impl std::ops::Deref for Frames {
    type Target = [Frame];
    fn deref(&self) -> &[Frame] {
        &self.buf[..self.len]
    }
}

impl std::ops::DerefMut for Frames {
    fn deref_mut(&mut self) -> &mut [Frame] {
        &mut self.buf[..self.len]
    }
}

/// Position of one PE in its loop tree. Frame 0 is the top-level list.
#[derive(Clone, Copy, Debug)]
struct Cursor {
    frames: Frames,
    done: bool,
}

fn list_at<'a>(root: &'a [Node], frames: &[Frame], k: usize) -> &'a [Node] {
    let mut list = root;
    for f in &frames[..k] {
        match &list[f.pos] {
            Node::Loop(l) => list = &l.body,
            // A frame above the top always sits on a loop.
            Node::Bundle(_) => return &[],
        }
    }
    list
}

impl Cursor {
    fn new() -> Cursor {
        let top = Frame {
            pos: 0,
            iter: 0,
            count: 1,
        };
        Cursor {
            frames: Frames {
                buf: [top; MAX_LOOP_DEPTH + 1],
                len: 1,
            },
            done: false,
        }
    }

    /// Moves to the next bundle to execute (if not already on one) and
    /// returns it with the body length of the innermost loop.
    fn current<'a>(&mut self, root: &'a [Node]) -> Option<(&'a LBundle, usize)> {
        if self.done {
            return None;
        }
        // The innermost list, carried along as the cursor moves instead of found from the
        // root on every move.
        let mut list = list_at(root, &self.frames, self.frames.len() - 1);
        loop {
            let k = self.frames.len() - 1;
            let top = self.frames[k];
            if top.pos < list.len() {
                match &list[top.pos] {
                    Node::Bundle(b) => return Some((b, list.len())),
                    Node::Loop(l) => {
                        list = &l.body;
                        let count = match l.step {
                            None => l.count,
                            Some(_) => {
                                let mut idx = [0u32; MAX_LOOP_DEPTH];
                                self.indices(&mut idx);
                                l.trips(&idx)
                            }
                        };
                        self.frames.push(Frame {
                            pos: 0,
                            iter: 0,
                            count,
                        })
                    }
                }
            } else if top.iter + 1 < top.count {
                self.frames[k].iter += 1;
                self.frames[k].pos = 0;
            } else if k == 0 {
                self.done = true;
                return None;
            } else {
                self.frames.pop();
                self.frames[k - 1].pos += 1;
                list = list_at(root, &self.frames, k - 1);
            }
        }
    }

    fn advance(&mut self) {
        if let Some(top) = self.frames.last_mut() {
            top.pos += 1;
        }
    }

    /// Cycles, counting the current one, that the cursor certainly stays among the bundles of
    /// its innermost list: to the end of that loop when the list holds bundles only (it cannot
    /// enter an inner loop), else just this one.
    fn stay(&self, root: &[Node]) -> u64 {
        let k = self.frames.len() - 1;
        let list = list_at(root, &self.frames, k);
        let top = self.frames[k];
        if k == 0 || !list.iter().all(|n| matches!(n, Node::Bundle(_))) {
            return 1;
        }
        let len = list.len() as u64;
        let pos = top.pos as u64;
        (len - pos) + u64::from(top.count - top.iter - 1) * len
    }

    fn indices(&self, out: &mut [u32; MAX_LOOP_DEPTH]) -> usize {
        let d = self.frames.len() - 1;
        for (o, f) in out.iter_mut().zip(&self.frames[1..]) {
            *o = f.iter;
        }
        d
    }
}

/// A ring running format-2 programs natively.
pub struct LoopMachine<D: Domain> {
    m: Machine<D>,
    /// Indexed by PE.
    progs: Vec<LoopProgram>,
    cursors: Vec<Cursor>,
    len: u64,
    stats: Vec<PeStats>,
    scratch: Vec<Option<Bundle>>,
    bulk: u64,
    /// Of `bulk`, the cycles run in windows over whole loop iterations.
    nest: u64,
    /// Of `nest`, the cycles of windows in which some PE went on from one loop into another.
    nest_through: u64,
    /// Of `bulk`, the cycles run in windows over any structure.
    general: u64,
    /// No whole-iteration window is planned before this cycle (one failed over these).
    nest_after: u64,
    /// No window over any structure is planned before this cycle.
    general_after: u64,
    /// Per PE, the chunks of [`CHUNK`] words known to be initialized
    /// throughout. Words never become uninitialized again, so a chunk once
    /// seen whole stays whole; it spares the bulk planner rescanning the
    /// words a window reads.
    init: Vec<InitChunks>,
    /// Dot-product chains of a window, kept between windows so that collecting them allocates
    /// nothing.
    chains: Vec<Chain>,
    /// PE-cycles of dot products run side by side with others.
    interleaved: u64,
    /// Of `bulk`, the cycles run in windows whose sends were held back to the window's end.
    held: u64,
    /// The buffer of a window's held-back sends, kept between windows.
    held_buf: Vec<(usize, usize, f32)>,
}

fn count(s: &mut PeStats, b: &Bundle) {
    count_times(s, b, 1);
}

/// Counts `b` as executed `k` times.
fn count_times(s: &mut PeStats, b: &Bundle, k: u64) {
    if let Some(kind) = b.op.kind() {
        s.ops[kind.index()] += k;
    }
    s.busy += k * u64::from(!matches!(b.op, Op::Nop));
    s.add += k * u64::from(matches!(b.acc, Acc::Add { .. }));
    s.send += k * u64::from(matches!(b.xfer, Xfer::Send { .. }));
}

impl<D: Domain> LoopMachine<D> {
    /// Loads one program per PE (in any order), with the checks of
    /// [`Machine::new`] plus format-2 validation.
    pub fn new(domain: D, mut progs: Vec<LoopProgram>) -> Result<Self, LoopLoadError> {
        let mut len = 0u64;
        for p in &progs {
            let c = p
                .validate()
                .map_err(|error| LoopLoadError::Invalid { pe: p.pe, error })?;
            len = len.max(c);
        }
        let shells: Vec<Program> = progs
            .iter()
            .map(|p| Program {
                pe: p.pe,
                pes: p.pes,
                mem_words: p.mem_words,
                bundles: Vec::new(),
            })
            .collect();
        let m = Machine::new(domain, shells).map_err(LoopLoadError::Load)?;
        progs.sort_by_key(|p| p.pe);
        let n = progs.len();
        Ok(LoopMachine {
            m,
            progs,
            cursors: vec![Cursor::new(); n],
            len,
            stats: vec![PeStats::default(); n],
            scratch: vec![None; n],
            bulk: 0,
            nest: 0,
            nest_through: 0,
            general: 0,
            nest_after: 0,
            general_after: 0,
            init: vec![InitChunks::default(); n],
            chains: Vec::new(),
            interleaved: 0,
            held: 0,
            held_buf: Vec::new(),
        })
    }

    pub fn preload(&mut self, pe: u32, addr: Addr, word: D::Value) -> Result<(), LoadError> {
        self.m.preload(pe, addr, word)
    }

    pub fn read(&self, pe: u32, addr: Addr) -> Option<&D::Value> {
        self.m.read(pe, addr)
    }

    pub fn cycle(&self) -> u64 {
        self.m.cycle()
    }

    /// The run length, known statically from the loop structure.
    pub fn total_cycles(&self) -> u64 {
        self.len
    }

    pub fn pes(&self) -> u32 {
        self.m.pes()
    }

    pub fn fault(&self) -> Option<&Fault> {
        self.m.fault()
    }

    pub fn domain(&mut self) -> &mut D {
        self.m.domain()
    }

    /// Cycles executed by the bulk path of [`LoopMachine::run_fast`].
    pub fn bulk_cycles(&self) -> u64 {
        self.bulk
    }

    /// Of [`LoopMachine::bulk_cycles`], those run in windows over whole iterations of a loop
    /// whose body is bundles and one-bundle loops.
    pub fn nest_cycles(&self) -> u64 {
        self.nest
    }

    /// Of [`LoopMachine::nest_cycles`], those of windows in which some PE went on from the end
    /// of one loop into the next.
    pub fn nest_through_cycles(&self) -> u64 {
        self.nest_through
    }

    /// Of [`LoopMachine::bulk_cycles`], those run in windows over any loop structure, planned
    /// stretch by stretch.
    pub fn general_cycles(&self) -> u64 {
        self.general
    }

    /// PE-cycles of [`LoopMachine::bulk_cycles`] spent in dot products that ran side by side
    /// with others (other PEs', or other iterations' of a loop whose iterations are
    /// independent), each still adding in its own order.
    pub fn interleaved_cycles(&self) -> u64 {
        self.interleaved
    }

    /// Of [`LoopMachine::bulk_cycles`], those run in windows whose sends were held back to the
    /// window's end because a receiver read the words they overwrite no later than that
    /// (blocks rotating in place).
    pub fn held_cycles(&self) -> u64 {
        self.held
    }

    /// Where a window of `w` cycles puts its sends (counting it when they are held back).
    fn sink(&mut self, held: bool, w: u32) -> Sink {
        if held {
            self.held += u64::from(w);
            Sink::held(std::mem::take(&mut self.held_buf))
        } else {
            Sink::direct()
        }
    }

    pub fn stats(&self) -> RunStats {
        RunStats {
            cycles: self.m.cycle(),
            per_pe: self.stats.clone(),
        }
    }

    /// Executes one cycle; returns whether cycles remain.
    #[inline(never)]
    pub fn step<O: Observer + ?Sized>(&mut self, obs: &mut O) -> Result<bool, Fault> {
        if let Some(f) = self.m.fault() {
            return Err(f.clone());
        }
        if self.m.cycle() >= self.len {
            return Ok(false);
        }
        let mut idx = [0u32; MAX_LOOP_DEPTH];
        for (p, cur) in self.cursors.iter_mut().enumerate() {
            self.scratch[p] = cur.current(&self.progs[p].body).map(|(b, _)| {
                cur.indices(&mut idx);
                b.instance(&idx)
            });
        }
        self.m.step_bundles(&self.scratch, obs)?;
        for (p, cur) in self.cursors.iter_mut().enumerate() {
            if let Some(b) = &self.scratch[p] {
                count(&mut self.stats[p], b);
                cur.advance();
            }
        }
        Ok(self.m.cycle() < self.len)
    }

    /// Runs to the end, one cycle at a time (works for every domain and
    /// reports every access to `obs`).
    pub fn run<O: Observer + ?Sized>(&mut self, obs: &mut O) -> Result<RunStats, Fault> {
        while self.step(obs)? {}
        Ok(self.stats())
    }
}

/// One memory operand's progression over a bulk window: `addr + stride·t`.
#[derive(Clone, Copy, Debug)]
struct Prog {
    addr: i64,
    stride: i64,
}

impl Prog {
    fn at(&self, t: i64) -> usize {
        (self.addr + self.stride * t) as usize
    }
    /// Inclusive range of addresses over `w` steps.
    fn span(&self, w: i64) -> (i64, i64) {
        let last = self.addr + self.stride * (w - 1);
        (self.addr.min(last), self.addr.max(last))
    }
}

/// What one PE does in a bulk window.
#[derive(Clone, Copy, Debug)]
struct Plan {
    bundle: Bundle,
    progs: [Option<Prog>; 7],
    /// The acc adds into a word it also writes back, unmoving: the running
    /// sum lives in a register for the window.
    register: bool,
    /// The stretch's first cycle takes its product as the running sum, as `add 0 -> mS`
    /// does, and the others go on as `add mS -> mS`: the stretch never reads mS before
    /// writing it (a chain's first product joined to the loop that continues it).
    fresh_sum: bool,
}

impl Plan {
    /// The plan `r` repetitions on, each moving field `k` by `shift[k]`.
    fn moved(&self, shift: &[i64; 7], r: i64) -> Plan {
        let mut plan = *self;
        for (pr, d) in plan.progs.iter_mut().zip(shift) {
            if let Some(pr) = pr {
                pr.addr += d * r;
            }
        }
        plan
    }
}

/// The running sum before a stretch's first product where the plan's `fresh_sum` holds:
/// `add 0` takes the product itself, and −0 + x is x for every x, signed zeros and NaN too.
const FRESH_SUM: f32 = -0.0;

/// Cycles stepped one by one after a window over any structure failed its checks.
const GENERAL_BACKOFF: u64 = 32;

/// Words per initialization chunk.
const CHUNK: usize = 64;

/// A bit per chunk of [`CHUNK`] words of one PE's memory: set once every
/// word of the chunk is initialized.
#[derive(Clone, Default, Debug)]
struct InitChunks(Vec<u64>);

impl InitChunks {
    fn whole(&mut self, mem: &[Option<f32>], c: usize) -> bool {
        let (word, bit) = (c / 64, 1u64 << (c % 64));
        if self.0.get(word).is_some_and(|w| w & bit != 0) {
            return true;
        }
        let end = ((c + 1) * CHUNK).min(mem.len());
        if !mem[c * CHUNK..end].iter().all(Option::is_some) {
            return false;
        }
        if self.0.len() <= word {
            self.0.resize(word + 1, 0);
        }
        self.0[word] |= bit;
        true
    }

    /// Whether every word `pr` reads in `w` steps is initialized (its
    /// addresses are in range).
    fn covers(&mut self, mem: &[Option<f32>], pr: Prog, w: i64) -> bool {
        let (lo, hi) = pr.span(w);
        let (c0, c1) = (lo as usize / CHUNK, hi as usize / CHUNK);
        // Dense progressions by chunks; sparse ones (and any chunk not yet whole) word by word.
        if (c1 - c0) as i64 <= w && (c0..=c1).all(|c| self.whole(mem, c)) {
            return true;
        }
        (0..w).all(|t| mem[pr.at(t)].is_some())
    }
}

/// Why no bulk window starts now: the cycles to step one by one before planning again.
struct Stepped(u64);

/// The plan of a stretch of template `b` from loop indices `idx`: the instance there, each
/// address advancing by its term's stride on the loop `inner` (none: a single cycle).
fn plan_of(b: &LBundle, idx: &[u32; MAX_LOOP_DEPTH], inner: Option<u8>) -> Plan {
    let bundle = b.instance(idx);
    let mut progs = [None; 7];
    for (k, f) in Field::ALL.into_iter().enumerate() {
        if let Some(a) = field(&bundle, f) {
            let stride = inner.map_or(0, |lv| nest::term_stride(b, f, lv));
            progs[k] = Some(Prog {
                addr: i64::from(a),
                stride,
            });
        }
    }
    // The running sum of `add mS -> mS` stays in a register over the stretch.
    let register = matches!(
        bundle.acc,
        Acc::Add { src: AccSrc::Mem(s), dst: Some(d) } if s == d
    ) && progs[fx::ACC_SRC].is_some_and(|p| p.stride == 0)
        && progs[fx::ACC_DST].is_some_and(|p| p.stride == 0);
    Plan {
        bundle,
        progs,
        register,
        fresh_sum: false,
    }
}

fn overlap(a: (i64, i64), b: (i64, i64)) -> bool {
    a.0 <= b.1 && b.0 <= a.1
}

impl LoopMachine<F32Domain> {
    /// Runs to the end like [`LoopMachine::run`] with no observer, executing
    /// eligible stretches in bulk. Result, cycle count, statistics and any
    /// fault are exactly those of the cycle-by-cycle run.
    pub fn run_fast(&mut self) -> Result<RunStats, Fault> {
        loop {
            if let Some(f) = self.m.fault() {
                return Err(f.clone());
            }
            if self.m.cycle() >= self.len {
                return Ok(self.stats());
            }
            if self.m.cycle() >= self.nest_after {
                match self.plan_nest() {
                    Ok((w, wins)) => {
                        self.exec_nest(w, &wins);
                        continue;
                    }
                    // Planning a whole-iteration window that fails costs about as much as one
                    // that runs: not again over the cycles it would have covered.
                    Err(Stepped(k)) => self.nest_after = self.m.cycle() + k,
                }
            }
            let stay = match self.plan_window() {
                Ok((w, plans, held)) => {
                    self.exec_window(w, &plans, held);
                    continue;
                }
                Err(Stepped(k)) => k,
            };
            if self.m.cycle() >= self.general_after {
                match self.plan_general() {
                    Ok((w, segs, held)) => {
                        self.exec_general(w, &segs, held);
                        continue;
                    }
                    // Some stretch broke a rule (often one that stays broken for a while, such
                    // as a word read before its first write): step a little before planning.
                    Err(Stepped(k)) => {
                        self.general_after = self.m.cycle() + k.max(stay).max(GENERAL_BACKOFF)
                    }
                }
            }
            // No window can start while a PE is still in a multi-bundle body: step through it
            // without planning again each cycle.
            for _ in 0..stay {
                if !self.step(&mut NoObserver)? {
                    break;
                }
            }
        }
    }

    /// A bulk window of at least 2 cycles and a plan per PE (`None`: idle),
    /// or `None` if this cycle must be stepped.
    #[inline(never)]
    fn plan_window(&mut self) -> Result<(u32, Vec<Option<Plan>>, bool), Stepped> {
        let n = self.progs.len();
        let mut w = u32::MAX;
        let progs = &self.progs;
        let mut tmpl: Vec<Option<(&LBundle, [u32; MAX_LOOP_DEPTH], usize)>> = Vec::with_capacity(n);
        let mut stay = 0u64;
        for (cur, prog) in self.cursors.iter_mut().zip(progs) {
            match cur.current(&prog.body) {
                None => tmpl.push(None),
                Some((b, body_len)) => {
                    let depth = cur.frames.len() - 1;
                    if body_len != 1 || depth == 0 {
                        stay = stay.max(cur.stay(&prog.body));
                        continue;
                    }
                    let Some(top) = cur.frames.last() else {
                        return Err(Stepped(1));
                    };
                    w = w.min(top.count - top.iter);
                    let mut idx = [0u32; MAX_LOOP_DEPTH];
                    cur.indices(&mut idx);
                    tmpl.push(Some((b, idx, depth)));
                }
            }
        }
        if stay > 0 {
            return Err(Stepped(stay));
        }
        let remaining = self.len - self.m.cycle();
        w = w.min(u32::try_from(remaining).unwrap_or(u32::MAX));
        if w < 2 || tmpl.iter().all(Option::is_none) {
            return Err(Stepped(1));
        }
        let mut plans = Vec::with_capacity(n);
        for t in &tmpl {
            let Some((b, idx, depth)) = t else {
                plans.push(None);
                continue;
            };
            let inner = (*depth - 1) as u8;
            // Wraps on the innermost index can change the bundle inside the window; a
            // predicate on it only where it turns, so the window ends before that.
            if b.terms.iter().any(|t| t.level == inner && t.wrap != 0) {
                return Err(Stepped(1));
            }
            let i = idx[usize::from(inner)];
            for p in b.preds.iter().filter(|p| p.level == inner) {
                let turns = match p.cmp {
                    Cmp::Lt | Cmp::Ge if i < p.value => p.value - i,
                    Cmp::Eq | Cmp::Ne if i < p.value => p.value - i,
                    Cmp::Eq | Cmp::Ne if i == p.value => 1,
                    _ => u32::MAX,
                };
                w = w.min(turns);
            }
            if w < 2 {
                return Err(Stepped(1));
            }
            plans.push(Some(plan_of(b, idx, Some(inner))));
        }
        let w64 = i64::from(w);
        let mems = self.m.mems();
        let mut held = false;
        for p in 0..n {
            let Some(plan) = &plans[p] else { continue };
            let b = &plan.bundle;
            // Slot-structure faults: leave them to the exact path.
            if matches!(b.op, Op::Nop) && !matches!(b.acc, Acc::Nop) {
                return Err(Stepped(1));
            }
            if matches!(
                b.xfer,
                Xfer::Send {
                    src: XferSrc::Acc,
                    ..
                }
            ) && matches!(b.acc, Acc::Nop)
            {
                return Err(Stepped(1));
            }
            let mem = &mems[p];
            let size = mem.len() as i64;
            let next = if p + 1 == n { 0 } else { p + 1 };
            let prev = if p == 0 { n - 1 } else { p - 1 };
            // Reads: in range and initialized for every step.
            let mut reads = Vec::with_capacity(4);
            for k in fx::READS {
                if let Some(pr) = plan.progs[k] {
                    let span = pr.span(w64);
                    if span.1 >= size {
                        return Err(Stepped(1));
                    }
                    if !self.init[p].covers(mem, pr, w64) {
                        return Err(Stepped(1));
                    }
                    reads.push((k, span));
                }
            }
            let mut writes = Vec::with_capacity(3);
            for k in fx::WRITES {
                if let Some(pr) = plan.progs[k] {
                    let span = pr.span(w64);
                    if span.1 >= size {
                        return Err(Stepped(1));
                    }
                    writes.push((k, span));
                }
            }
            // The predecessor's sends: never onto a word this PE writes in the window, and
            // onto a word it reads only if every read comes first (then they are held back).
            if let Some(Some(pp)) = plans.get(prev) {
                if let Some(pr) = pp.progs[fx::XFER_DST] {
                    if pr.span(w64).1 >= size {
                        return Err(Stepped(1));
                    }
                    let at = |ks: &[usize]| -> Vec<Access> {
                        ks.iter()
                            .filter_map(|&k| plan.progs[k].map(|q| (0, q, w64)))
                            .collect()
                    };
                    match meet(&[(0, pr, w64)], &at(&fx::READS), &at(&fx::WRITES)) {
                        Meet::Apart => {}
                        Meet::ReadsFirst => held = true,
                        Meet::Clash => return Err(Stepped(1)),
                    }
                }
            }
            // The send's destination is checked against the receiver.
            if let Some(pr) = plan.progs[fx::XFER_DST] {
                if pr.span(w64).1 >= mems[next].len() as i64 {
                    return Err(Stepped(1));
                }
            }
            for (i, &(kw, ws)) in writes.iter().enumerate() {
                for &(_, ws2) in &writes[i + 1..] {
                    if overlap(ws, ws2) {
                        return Err(Stepped(1));
                    }
                }
                for &(kr, rs) in &reads {
                    let own_register = plan.register && kw == fx::ACC_DST && kr == fx::ACC_SRC;
                    if !own_register && overlap(ws, rs) {
                        return Err(Stepped(1));
                    }
                }
            }
        }
        Ok((w, plans, held))
    }

    #[inline(never)]
    fn exec_window(&mut self, w: u32, plans: &[Option<Plan>], held: bool) {
        let n = plans.len();
        let w64 = i64::from(w);
        let mut sink = self.sink(held, w);
        let mems = self.m.mems_mut();
        let mut dots = Vec::new();
        for (p, plan) in plans.iter().enumerate() {
            let Some(plan) = plan else { continue };
            let next = if p + 1 == n { 0 } else { p + 1 };
            if let Some(d) = dot_of(plan) {
                dots.push((p, next, d, w));
                continue;
            }
            run_plan(mems, &mut sink, p, next, plan, w64);
        }
        self.interleaved += run_chains(mems, &mut sink, &dots);
        self.held_buf = sink.flush(mems);
        for (p, plan) in plans.iter().enumerate() {
            if let Some(plan) = plan {
                count_times(&mut self.stats[p], &plan.bundle, u64::from(w));
                let cur = &mut self.cursors[p];
                if let Some(top) = cur.frames.last_mut() {
                    top.iter += w - 1;
                    top.pos = 1;
                }
            }
        }
        self.m.advance(u64::from(w));
        self.bulk += u64::from(w);
    }
}

#[inline(always)]
fn get(mem: &[Option<f32>], i: usize) -> f32 {
    // Every read address was checked initialized before the window.
    mem[i].unwrap_or(0.0)
}

/// Executes one PE's window. The planner proved that no word written here
/// is read here (other than the register), so in-place writes equal the
/// deferred commits of cycle-by-cycle execution.
fn run_plan(
    mems: &mut [Vec<Option<f32>>],
    sink: &mut Sink,
    p: usize,
    next: usize,
    plan: &Plan,
    w: i64,
) {
    let b = plan.bundle;
    let pr = plan.progs;
    // Fast kernel: a dot product into a register word.
    if let Some(d) = dot_of(plan) {
        dot::run_chain(mems, sink, (p, next, d, w as u32));
        return;
    }
    let mut reg = if plan.register && plan.fresh_sum {
        Some(FRESH_SUM)
    } else if plan.register {
        pr[fx::ACC_SRC].map(|s| get(&mems[p], s.at(0)))
    } else {
        None
    };
    for t in 0..w {
        let mem = &mems[p];
        // The numeric domain's own arithmetic, so results are bit-identical.
        let r = match b.op {
            Op::Nop => None,
            Op::Arith(x) => pr[fx::OP_A].map(|a| {
                let y = pr[fx::OP_B].map(|c| get(mem, c.at(t)));
                F32Domain.op(x.kind, &get(mem, a.at(t)), y.as_ref(), x.imm)
            }),
        };
        let acc = match (b.acc, r) {
            (
                Acc::Add {
                    src: AccSrc::Zero, ..
                },
                Some(r),
            ) => Some(r),
            (
                Acc::Add {
                    src: AccSrc::Mem(_),
                    ..
                },
                Some(r),
            ) => {
                let addend = match reg {
                    Some(v) => v,
                    None => pr[fx::ACC_SRC].map_or(0.0, |s| get(mem, s.at(t))),
                };
                Some(addend + r)
            }
            _ => None,
        };
        let sent = match b.xfer {
            Xfer::Send {
                src: XferSrc::Mem(_),
                ..
            } => pr[fx::XFER_SRC].map(|s| get(mem, s.at(t))),
            Xfer::Send {
                src: XferSrc::Acc, ..
            } => acc,
            Xfer::Nop => None,
        };
        let mem = &mut mems[p];
        if let (Some(r), Some(d)) = (r, pr[fx::OP_DST]) {
            mem[d.at(t)] = Some(r);
        }
        if let Some(a) = acc {
            if plan.register {
                reg = Some(a);
            } else if let Some(d) = pr[fx::ACC_DST] {
                mem[d.at(t)] = Some(a);
            }
        }
        if let (Some(v), Some(d)) = (sent, pr[fx::XFER_DST]) {
            sink.put(mems, next, d.at(t), v);
        }
    }
    if let (Some(v), Some(s)) = (reg, pr[fx::ACC_DST]) {
        mems[p][s.at(0)] = Some(v);
    }
}

/// Convenience: runs loop programs on `f32` with preloads, in bulk where
/// possible.
pub fn run_f32(
    progs: Vec<LoopProgram>,
    preloads: &[(u32, Addr, f32)],
) -> Result<(LoopMachine<F32Domain>, RunStats), Box<dyn std::error::Error>> {
    let mut m = LoopMachine::new(F32Domain, progs)?;
    for &(pe, a, v) in preloads {
        m.preload(pe, a, v)?;
    }
    let s = m.run_fast()?;
    Ok((m, s))
}
