//! Bulk windows over whole iterations of a loop whose body is bundles and one-bundle loops
//! (a score's first product and its run of accumulating ones, a row's maximum and its
//! exponentials), not only over the innermost one-bundle loop.
//!
//! A PE's part of a window is the rest of the loop's current iteration, then `k` whole
//! iterations, then the start of the next, each a list of *stretches*: one template's instance
//! repeated with its addresses advancing by the innermost strides. The whole iterations share
//! one list, each iteration's addresses moved by the loop's own strides, so planning costs the
//! body, not the iterations. A PE's stretches run one after another, which is its
//! cycle-by-cycle order; the PEs run one after another, which is only allowed because the
//! planner shows that no word a PE's predecessor sends in the window is read or written by the
//! PE in the window. Each stretch keeps the rules of the single-loop window (no fault possible,
//! no word written read by another slot of the same run), shown for every iteration at once.

use super::defer::Sink;
use super::dot::{dot_of, run_chains};
use super::{
    count_times, fx, overlap, plan_of, run_plan, Cursor, InitChunks, LoopMachine, Plan, Prog,
    Stepped, MAX_LOOP_DEPTH,
};
use crate::inst::{Acc, AccSrc, Op, Xfer, XferSrc};
use crate::looped::{Cmp, Field, LBundle, Node};
use crate::machine::F32Domain;

/// Most cycles one window covers.
const MAX_WINDOW: u64 = 1 << 16;

/// One stretch: `plan` for `len` cycles.
pub(super) struct Segment {
    pub(super) plan: Plan,
    pub(super) len: u32,
}

impl Segment {
    fn plan_len(&self) -> (Plan, u32) {
        (self.plan, self.len)
    }
}

/// One loop's part of a PE's window: the rest of its current iteration, whole iterations
/// that look alike, and the start of the next.
pub(super) struct Block {
    head: Vec<Segment>,
    /// The body's stretches in the first whole iteration, with each field's move per iteration.
    body: Vec<(Segment, [i64; 7])>,
    /// How many whole iterations.
    iters: u32,
    /// Each whole iteration is one dot product whose running sum no other iteration touches,
    /// so the iterations' chains may run interleaved.
    free: bool,
    /// Some stretch of the body is a dot product.
    dots: bool,
    tail: Vec<Segment>,
}

/// A PE's part of a window: up to [`MAX_BLOCKS`] blocks, one after another in its own order
/// (where a loop ends, the window goes on in the next one the cursor reaches).
pub(super) struct PeWindow {
    blocks: Vec<Block>,
    /// Where the cursor stands after the window: the planner walked it there already.
    end: Cursor,
}

/// A whole-iteration window: its cycles and each PE's part (`None`: the PE has finished).
type NestWindow = (u32, Vec<Option<PeWindow>>);

/// Most loops one PE's part of a window goes through. A window ends where the first PE
/// reaches the end of its part, and a ring's PEs leave their loops at different cycles, so
/// with one loop each a window of many PEs would end at every PE's every loop end.
const MAX_BLOCKS: usize = 4;

/// Whether a loop body takes whole-iteration windows: bundles and one-bundle loops only.
fn simple(list: &[Node]) -> bool {
    list.iter().all(|n| match n {
        Node::Bundle(_) => true,
        Node::Loop(l) => matches!(l.body.as_slice(), [Node::Bundle(_)]),
    })
}

/// Cycles one iteration of `body` takes at loop indices `idx`.
fn body_cycles(body: &[Node], idx: &[u32; MAX_LOOP_DEPTH]) -> u64 {
    body.iter()
        .map(|n| match n {
            Node::Bundle(_) => 1,
            Node::Loop(l) => u64::from(l.trips(idx)),
        })
        .sum()
}

/// Every template of `body` (directly or in its one-bundle loops).
fn templates(body: &[Node]) -> impl Iterator<Item = &LBundle> {
    body.iter().filter_map(|n| match n {
        Node::Bundle(b) => Some(b),
        Node::Loop(l) => match l.body.as_slice() {
            [Node::Bundle(b)] => Some(b),
            _ => None,
        },
    })
}

/// Iterations from index `i` before a predicate on `level` may turn.
fn turns(p: &crate::looped::Pred, i: u32) -> u32 {
    match p.cmp {
        Cmp::Lt | Cmp::Ge if i < p.value => p.value - i,
        Cmp::Eq | Cmp::Ne if i < p.value => p.value - i,
        Cmp::Eq | Cmp::Ne if i == p.value => 1,
        _ => u32::MAX,
    }
}

impl Cursor {
    /// The frame of the loop a window may run in, if the cursor's list is simple: its own
    /// loop, or the one around it when this is a one-bundle loop in a simple body.
    fn window_level(&self, root: &[Node]) -> Option<usize> {
        let k = self.frames.len() - 1;
        if k == 0 {
            return None;
        }
        let list = super::list_at(root, &self.frames, k);
        if !simple(list) {
            return None;
        }
        if list.len() == 1 && k >= 2 && simple(super::list_at(root, &self.frames, k - 1)) {
            return Some(k - 1);
        }
        Some(k)
    }

    /// Advances by `limit` cycles inside loop frame `level` (at most what is left of it),
    /// calling `seg` with each stretch: the template, its loop indices, its length, and for a
    /// run of a one-bundle loop the level of that loop's index. A run stops where one of its
    /// slot predicates may turn or an address term wraps, so a stretch is one instance whose
    /// addresses advance evenly. Stops early, after a stretch, where `seg` returns false.
    pub(super) fn walk<'a>(
        &mut self,
        root: &'a [Node],
        level: usize,
        limit: u64,
        mut seg: impl FnMut(&'a LBundle, &[u32; MAX_LOOP_DEPTH], u32, Option<u8>) -> bool,
    ) {
        let mut walked = 0u64;
        let mut idx = [0u32; MAX_LOOP_DEPTH];
        while walked < limit {
            let Some((b, body_len)) = self.current(root) else {
                return;
            };
            let depth = self.frames.len() - 1;
            if depth < level {
                return;
            }
            self.indices(&mut idx);
            let top = self.frames[depth];
            if body_len == 1 && depth > 0 {
                let inner = depth - 1;
                let i = idx[inner];
                let mut k = u64::from(top.count - top.iter).min(limit - walked);
                for p in b.preds.iter().filter(|p| usize::from(p.level) == inner) {
                    k = k.min(u64::from(turns(p, i)));
                }
                for t in b.terms.iter().filter(|t| usize::from(t.level) == inner) {
                    if t.wrap != 0 {
                        k = k.min(u64::from(t.wrap - i % t.wrap));
                    }
                }
                // Within the loop's count, so it fits.
                let k32 = k as u32;
                let go_on = seg(b, &idx, k32, Some(inner as u8));
                if let Some(f) = self.frames.last_mut() {
                    f.iter += k32 - 1;
                    f.pos = 1;
                }
                walked += k;
                if !go_on {
                    return;
                }
            } else {
                let go_on = seg(b, &idx, 1, None);
                self.advance();
                walked += 1;
                if !go_on {
                    return;
                }
            }
        }
    }

    /// Marks iterations up to `last` of loop frame `level` done, wherever in it the cursor was.
    fn finish_through(&mut self, root: &[Node], level: usize, last: u32) {
        let len = super::list_at(root, &self.frames, level).len();
        self.frames.truncate(level + 1);
        let f = &mut self.frames[level];
        f.iter = last;
        f.pos = len;
    }
}

/// Whether, in some PE's part of a window, a word its predecessor sends in the window is one
/// the PE reads or writes in it: then the PEs cannot run one after another. `ranges(win,
/// fields)` gives the address ranges a PE's part reaches in those fields of its plans.
pub(super) fn sends_meet_receivers<W>(
    wins: &[Option<W>],
    ranges: impl Fn(&W, std::ops::Range<usize>) -> Vec<(i64, i64)>,
) -> bool {
    let n = wins.len();
    (0..n).any(|p| {
        let prev = if p == 0 { n - 1 } else { p - 1 };
        let (Some(mine), Some(theirs)) = (&wins[p], &wins[prev]) else {
            return false;
        };
        let sends = ranges(theirs, 6..7);
        !sends.is_empty()
            && ranges(mine, 0..6)
                .iter()
                .any(|&t| sends.iter().any(|&s| overlap(s, t)))
    })
}

pub(super) fn term_stride(b: &LBundle, f: Field, level: u8) -> i64 {
    b.terms
        .iter()
        .find(|t| t.field == f && t.level == level)
        .map_or(0, |t| i64::from(t.stride))
}

/// The addresses field `k` of a stretch takes over `reps` repetitions, each moved by `shift`.
pub(super) fn hull(pr: Prog, len: i64, shift: i64, reps: i64) -> (i64, i64) {
    let (lo, hi) = pr.span(len);
    let m = shift * (reps - 1);
    (lo.min(lo + m), hi.max(hi + m))
}

/// The single-loop window's rules for a stretch of `len` cycles repeated `reps` times, each
/// repetition's field `k` moved by `shift[k]`: no slot-structure fault, reads in range and
/// initialized, writes and the send in range, no two writes to one word in a cycle, and no
/// word written in a run read by another slot of that run (a running sum kept in a register
/// excepted). Pairs of fields that move alike are checked on the first repetition, which
/// decides them all; others on their whole ranges.
/// Whether every word `pr` reads in `len` steps is initialized now or written by one of the
/// stretches `fresh` (each a write progression and its length) that run before it.
fn reads_fresh(pr: Prog, len: i64, mem: &[Option<f32>], fresh: &[(Prog, i64)]) -> bool {
    !fresh.is_empty()
        && (0..len).all(|t| {
            let a = pr.addr + pr.stride * t;
            mem[a as usize].is_some()
                || fresh.iter().any(|&(w, l)| {
                    let off = a - w.addr;
                    if w.stride == 0 {
                        off == 0
                    } else {
                        off % w.stride == 0 && (0..l).contains(&(off / w.stride))
                    }
                })
        })
}

/// What a PE's stretches are checked against: its memory and which of it is initialized, the
/// receiver's memory size, and the words earlier stretches of the window write (each a write
/// progression and its length), initialized by the time the stretch runs.
pub(super) struct PeMem<'a> {
    pub(super) mem: &'a [Option<f32>],
    pub(super) next_len: usize,
    pub(super) init: &'a mut InitChunks,
    pub(super) fresh: &'a [(Prog, i64)],
}

pub(super) fn stretch_ok(
    plan: &Plan,
    len: i64,
    shift: &[i64; 7],
    reps: i64,
    at: &mut PeMem<'_>,
) -> bool {
    let PeMem {
        mem,
        next_len,
        ref mut init,
        fresh,
    } = *at;
    let b = &plan.bundle;
    if matches!(b.op, Op::Nop) && !matches!(b.acc, Acc::Nop) {
        return false;
    }
    if matches!(
        b.xfer,
        Xfer::Send {
            src: XferSrc::Acc,
            ..
        }
    ) && matches!(b.acc, Acc::Nop)
    {
        return false;
    }
    let size = mem.len() as i64;
    for (k, pr) in plan.progs.iter().enumerate() {
        let Some(pr) = *pr else { continue };
        let (lo, hi) = hull(pr, len, shift[k], reps);
        let bound = if k == fx::XFER_DST {
            next_len as i64
        } else {
            size
        };
        if lo < 0 || hi >= bound {
            return false;
        }
        if fx::READS.contains(&k) && !(plan.fresh_sum && k == fx::ACC_SRC) {
            let dense = Prog {
                addr: lo,
                stride: 1,
            };
            let initialized = init.covers(mem, dense, hi - lo + 1)
                || (0..reps).all(|r| {
                    let moved = Prog {
                        addr: pr.addr + shift[k] * r,
                        stride: pr.stride,
                    };
                    init.covers(mem, moved, len)
                })
                || (reps == 1 && reads_fresh(pr, len, mem, fresh));
            if !initialized {
                return false;
            }
        }
    }
    let meets = |a: usize, c: usize| -> bool {
        let (Some(x), Some(y)) = (plan.progs[a], plan.progs[c]) else {
            return false;
        };
        if shift[a] == shift[c] {
            overlap(x.span(len), y.span(len))
        } else {
            overlap(hull(x, len, shift[a], reps), hull(y, len, shift[c], reps))
        }
    };
    if meets(fx::OP_DST, fx::ACC_DST) {
        return false;
    }
    // A slot that reads the very word it writes, cycle by cycle (`mul m[a + t], c -> m[a + t]`),
    // reads it before the write in each cycle, in bulk as in the machine, and no other cycle
    // of the stretch touches that word. An operation's running value in one word (`max mX,
    // m[b + t] -> mX`) is read back each cycle in bulk as in the machine too; an add's is not
    // (a running sum may live in a register), so there the word must move.
    let in_place = |a: usize, c: usize| {
        matches!(
            (plan.progs[a], plan.progs[c]),
            (Some(x), Some(y)) if x.addr == y.addr && x.stride == y.stride
                && shift[a] == shift[c]
                && (x.stride != 0 || (a == fx::OP_DST && (c == fx::OP_A || c == fx::OP_B)))
        )
    };
    if len > 1 {
        for w in fx::WRITES {
            for r in fx::READS {
                let own_register = plan.register && w == fx::ACC_DST && r == fx::ACC_SRC;
                if !own_register && !in_place(w, r) && meets(w, r) {
                    return false;
                }
            }
        }
    }
    true
}

/// Whether `reps` repetitions of `seg`, each moved by `shift`, are dot products that run in any
/// interleaving with the same results: each keeps its sum in a word of its own that no
/// repetition reads as an operand or sends.
fn independent_dots(seg: &Segment, shift: &[i64; 7], reps: i64) -> bool {
    let Some(sum) = seg.plan.progs[fx::ACC_SRC] else {
        return false;
    };
    if dot_of(&seg.plan).is_none() || shift[fx::ACC_SRC] == 0 {
        return false;
    }
    let sums = hull(sum, 1, shift[fx::ACC_SRC], reps);
    [0usize, 1, 5].iter().all(|&k| {
        seg.plan.progs[k]
            .is_none_or(|pr| !overlap(hull(pr, i64::from(seg.len), shift[k], reps), sums))
    })
}

/// A PE's window plan before its length is known: its loop, the rest of the current iteration,
/// the index of the first whole iteration, the whole iterations that look alike from there and
/// their length.
struct Shape {
    level: usize,
    rest: u64,
    first: u32,
    alike: u32,
    iter_len: u64,
}

impl Shape {
    /// The cycles from the cursor to the end of the last alike iteration.
    fn reach(&self) -> u64 {
        self.rest
            .saturating_add(u64::from(self.alike).saturating_mul(self.iter_len))
    }
}

/// The shape of the window a PE's part may take from cursor `cur`, if its loop allows one.
fn shape(root: &[Node], cur: &mut Cursor) -> Option<Shape> {
    cur.current(root)?;
    let level = cur.window_level(root)?;
    let body = super::list_at(root, &cur.frames, level);
    let mut idx = [0u32; MAX_LOOP_DEPTH];
    cur.indices(&mut idx);
    let w = cur.frames[level];
    let at_start = w.pos == 0
        && cur.frames[level + 1..]
            .iter()
            .all(|f| f.iter == 0 && f.pos == 0);
    let (rest, first) = if at_start {
        (0, w.iter)
    } else {
        let rest = match cur.frames.get(level + 1) {
            Some(inner) => {
                u64::from(inner.count - inner.iter) + body_cycles(&body[w.pos + 1..], &idx)
            }
            None => body_cycles(&body[w.pos..], &idx),
        };
        (rest, w.iter + 1)
    };
    let own = (level - 1) as u8;
    let mut alike = w.count.saturating_sub(first);
    idx[level - 1] = first;
    let iter_len = body_cycles(body, &idx);
    // An inner loop whose count steps with this loop's index: one iteration at a time.
    let stepped = body
        .iter()
        .any(|n| matches!(n, Node::Loop(l) if l.step.is_some_and(|s| s.level == own)));
    if stepped {
        alike = alike.min(1);
    }
    for b in templates(body) {
        for pr in b.preds.iter().filter(|pr| pr.level == own) {
            alike = alike.min(turns(pr, first));
        }
        for t in b.terms.iter().filter(|t| t.level == own && t.wrap != 0) {
            alike = alike.min(t.wrap - first % t.wrap);
        }
    }
    Some(Shape {
        level,
        rest,
        first,
        alike,
        iter_len: iter_len.max(1),
    })
}

/// One loop's part of a window of `w` cycles from `probe`'s position (its shape `s`), each
/// stretch checked against `at`; `probe` ends where the part does. `None` if a stretch breaks
/// a rule.
fn block(
    root: &[Node],
    probe: &mut Cursor,
    s: &Shape,
    w: u64,
    at: &mut PeMem<'_>,
) -> Option<Block> {
    let head_len = s.rest.min(w);
    let iters = ((w - head_len) / s.iter_len).min(u64::from(s.alike)) as u32;
    let tail_len = w - head_len - u64::from(iters) * s.iter_len;
    let collect = |probe: &mut Cursor, limit: u64| {
        let mut out = Vec::new();
        probe.walk(root, s.level, limit, |b, idx, len, inner| {
            out.push((b, *idx, len, inner));
            true
        });
        out
    };
    let head = collect(probe, head_len);
    let mut body = Vec::new();
    if iters > 0 {
        body = collect(probe, s.iter_len);
        probe.finish_through(root, s.level, s.first + iters - 1);
    }
    let tail = collect(probe, tail_len);
    let own = (s.level - 1) as u8;
    let mut flat = |v: Vec<(&LBundle, [u32; MAX_LOOP_DEPTH], u32, Option<u8>)>| {
        let segs = v
            .into_iter()
            .map(|(b, idx, len, inner)| {
                (
                    Segment {
                        plan: plan_of(b, &idx, inner),
                        len,
                    },
                    [0; 7],
                )
            })
            .collect();
        join_chains(segs)
            .into_iter()
            .map(|(s, _)| stretch_ok(&s.plan, i64::from(s.len), &[0; 7], 1, at).then_some(s))
            .collect::<Option<Vec<_>>>()
    };
    let head = flat(head)?;
    let tail = flat(tail)?;
    let mut moved = Vec::with_capacity(body.len());
    for (b, idx, len, inner) in body {
        let mut plan = plan_of(b, &idx, inner);
        let mut shift = [0i64; 7];
        for (k, f) in Field::ALL.into_iter().enumerate() {
            shift[k] = term_stride(b, f, own);
        }
        // A running sum stays in one word only if its source and destination move alike.
        plan.register &= shift[fx::ACC_SRC] == shift[fx::ACC_DST];
        moved.push((Segment { plan, len }, shift));
    }
    let moved = join_chains(moved);
    for (s, shift) in &moved {
        if !stretch_ok(&s.plan, i64::from(s.len), shift, i64::from(iters), at) {
            return None;
        }
    }
    let free = iters >= 2
        && match moved.as_slice() {
            [(seg, shift)] => independent_dots(seg, shift, i64::from(iters)),
            _ => false,
        };
    let dots = moved.iter().any(|(seg, _)| dot_of(&seg.plan).is_some());
    Some(Block {
        head,
        body: moved,
        iters,
        free,
        dots,
        tail,
    })
}

/// A chain's first product `a` (one cycle: `mul … | add 0 -> mS`) joined to the stretch `b`
/// that continues it (`mul … | add mS -> mS`, every operand and send one step on, the sum in a
/// register): one stretch a cycle longer whose first cycle takes its product as the sum. Each
/// cycle's instance is the one the two stretches had, so results, sends and counts are theirs;
/// the point is that a loop of such chains becomes a loop of one dot product each, whose
/// iterations can run side by side.
fn joined(a: &Plan, b: &Plan) -> Option<Plan> {
    if !b.register || a.fresh_sum || b.fresh_sum {
        return None;
    }
    let (Op::Arith(x), Op::Arith(y)) = (a.bundle.op, b.bundle.op) else {
        return None;
    };
    if x.kind != y.kind || x.dst.is_some() || y.dst.is_some() || x.imm.to_bits() != y.imm.to_bits()
    {
        return None;
    }
    let (
        Acc::Add {
            src: AccSrc::Zero,
            dst: Some(_),
        },
        Acc::Add {
            src: AccSrc::Mem(_),
            dst: Some(_),
        },
    ) = (a.bundle.acc, b.bundle.acc)
    else {
        return None;
    };
    let same_slot = matches!(
        (a.bundle.xfer, b.bundle.xfer),
        (Xfer::Nop, Xfer::Nop)
            | (
                Xfer::Send {
                    src: XferSrc::Mem(_),
                    ..
                },
                Xfer::Send {
                    src: XferSrc::Mem(_),
                    ..
                },
            )
    );
    let sums = (a.progs[fx::ACC_DST], b.progs[fx::ACC_DST]);
    if !same_slot || !matches!(sums, (Some(s), Some(t)) if s.addr == t.addr) {
        return None;
    }
    let mut progs = b.progs;
    for k in [fx::OP_A, fx::OP_B, fx::XFER_SRC, fx::XFER_DST] {
        match (a.progs[k], b.progs[k]) {
            (None, None) => {}
            (Some(pa), Some(pb)) if pa.addr == pb.addr - pb.stride => {
                progs[k] = Some(Prog {
                    addr: pa.addr,
                    stride: pb.stride,
                });
            }
            _ => return None,
        }
    }
    Some(Plan {
        bundle: b.bundle,
        progs,
        register: true,
        fresh_sum: true,
    })
}

/// `segs` with every chain's first product joined to the stretch that continues it
/// ([`joined`]), where each field of the two moves alike from iteration to iteration
/// (`shift`).
fn join_chains(mut segs: Vec<(Segment, [i64; 7])>) -> Vec<(Segment, [i64; 7])> {
    // In place: `kept` stretches stay at the front, each later one joined to the last of them
    // or moved up behind it.
    let mut kept = 0;
    for r in 0..segs.len() {
        if kept > 0 {
            let ((last, last_shift), (seg, shift)) = (&segs[kept - 1], &segs[r]);
            // Every field but the first bundle's absent acc source moves alike.
            let alike = || (0..shift.len()).all(|k| k == fx::ACC_SRC || last_shift[k] == shift[k]);
            if last.len == 1 && alike() {
                if let Some(plan) = joined(&last.plan, &seg.plan) {
                    let joint = (
                        Segment {
                            plan,
                            len: seg.len + 1,
                        },
                        *shift,
                    );
                    segs[kept - 1] = joint;
                    continue;
                }
            }
        }
        segs.swap(kept, r);
        kept += 1;
    }
    segs.truncate(kept);
    segs
}

/// Moves `cur` past `s`'s reach: the rest of the iteration and its alike ones.
fn skip(root: &[Node], cur: &mut Cursor, s: &Shape) {
    cur.walk(root, s.level, s.rest, |_, _, _, _| true);
    if s.alike > 0 {
        cur.finish_through(root, s.level, s.first + s.alike - 1);
    }
}

impl LoopMachine<F32Domain> {
    /// A window over whole iterations (see the module's comment) of at least 2 cycles, or the
    /// cycles not to try again for (the window's, once its checks failed). Only tried where
    /// some PE can go past its innermost loop; the single-loop planner takes the rest. Each PE
    /// may go on through up to [`MAX_BLOCKS`] loops; where that window fails its checks (a
    /// later loop reads a word first written earlier in the window, or the longer window's
    /// sends meet their receivers), one loop each is tried, as the window always was.
    pub(super) fn plan_nest(&mut self) -> Result<NestWindow, Stepped> {
        match self.plan_nest_through(MAX_BLOCKS) {
            Ok(win) => Ok(win),
            // Only a window longer than one loop each can fail where one loop each would not.
            Err((stepped, false)) => Err(stepped),
            Err((_, true)) => self.plan_nest_through(1).map_err(|(stepped, _)| stepped),
        }
    }

    /// [`LoopMachine::plan_nest`] with up to `max_blocks` loops per PE; a failure also says
    /// whether the window was longer than one loop per PE would have made it.
    fn plan_nest_through(&mut self, max_blocks: usize) -> Result<NestWindow, (Stepped, bool)> {
        let n = self.progs.len();
        let mut extends = false;
        let mut w = MAX_WINDOW.min(self.len - self.m.cycle());
        // The least window of one loop per PE, and each PE's loops' shapes.
        let mut one = w;
        let mut shapes: Vec<Vec<Shape>> = Vec::with_capacity(n);
        for p in 0..n {
            let mut mine = Vec::new();
            if !self.cursors[p].done {
                let root = &self.progs[p].body;
                let mut probe = self.cursors[p];
                let s = shape(root, &mut probe).ok_or((Stepped(1), false))?;
                let depth = probe.frames.len() - 1;
                extends |= s.level < depth || super::list_at(root, &probe.frames, depth).len() > 1;
                // Each loop covers any window up to its alike iterations: the rest of this one,
                // whole ones, and the start of the next; then the next loop the cursor reaches.
                let mut reach = s.reach();
                one = one.min(reach);
                skip(root, &mut probe, &s);
                mine.push(s);
                while mine.len() < max_blocks && reach < w {
                    let Some(t) = shape(root, &mut probe) else {
                        break;
                    };
                    reach = reach.saturating_add(t.reach());
                    skip(root, &mut probe, &t);
                    mine.push(t);
                }
                w = w.min(reach);
            }
            shapes.push(mine);
        }
        let longer = w > one;
        if !extends || w < 2 {
            return Err((Stepped(1), longer));
        }
        let mut wins: Vec<Option<PeWindow>> = Vec::with_capacity(n);
        for (p, mine) in shapes.iter().enumerate() {
            if self.cursors[p].done {
                wins.push(None);
                continue;
            }
            // A stretch that breaks a rule (often for the whole loop): not again in this window.
            let win = self.pe_window(p, w, mine).ok_or((Stepped(w), longer))?;
            wins.push(Some(win));
        }
        // What a PE's predecessor sends in the window never meets what the PE touches in it.
        let ranges = |win: &PeWindow, fields: std::ops::Range<usize>| -> Vec<(i64, i64)> {
            let one = |s: &Segment, shift: &[i64; 7], reps: i64, out: &mut Vec<(i64, i64)>| {
                for k in fields.clone() {
                    if let Some(pr) = s.plan.progs[k] {
                        out.push(hull(pr, i64::from(s.len), shift[k], reps));
                    }
                }
            };
            let mut out = Vec::new();
            for b in &win.blocks {
                for s in b.head.iter().chain(&b.tail) {
                    one(s, &[0; 7], 1, &mut out);
                }
                if b.iters > 0 {
                    for (s, shift) in &b.body {
                        one(s, shift, i64::from(b.iters), &mut out);
                    }
                }
            }
            out
        };
        if sends_meet_receivers(&wins, ranges) {
            // Blocks rotating in place meet their receivers all through the loop.
            return Err((Stepped(w), longer));
        }
        Ok((w as u32, wins))
    }

    /// PE `p`'s part of a window of `w` cycles, loop after loop (`shapes`, as the planner found
    /// them from the PE's cursor), checked; `None` if a stretch breaks a rule.
    fn pe_window(&mut self, p: usize, w: u64, shapes: &[Shape]) -> Option<PeWindow> {
        let n = self.progs.len();
        let next = if p + 1 == n { 0 } else { p + 1 };
        let root = &self.progs[p].body;
        let mems = self.m.mems();
        let mut at = PeMem {
            mem: &mems[p],
            next_len: mems[next].len(),
            init: &mut self.init[p],
            fresh: &[],
        };
        let mut probe = self.cursors[p];
        let mut blocks = Vec::new();
        let mut left = w;
        // Every loop but the window's last is run to its reach, so the cursor stands where the
        // planner found the next loop's shape.
        for s in shapes {
            if left == 0 {
                break;
            }
            let span = s.reach().min(left);
            if span == 0 {
                return None;
            }
            blocks.push(block(root, &mut probe, s, span, &mut at)?);
            left -= span;
        }
        (left == 0).then_some(PeWindow { blocks, end: probe })
    }

    pub(super) fn exec_nest(&mut self, w: u32, wins: &[Option<PeWindow>]) {
        // Round `j` runs every PE's `j`-th loop, which keeps each PE's own order.
        let rounds = wins
            .iter()
            .flatten()
            .map(|win| win.blocks.len())
            .max()
            .unwrap_or(0);
        for j in 0..rounds {
            let blocks: Vec<Option<&Block>> = wins
                .iter()
                .map(|win| win.as_ref().and_then(|win| win.blocks.get(j)))
                .collect();
            self.exec_blocks(&blocks);
        }
        for (p, win) in wins.iter().enumerate() {
            let Some(win) = win else { continue };
            let st = &mut self.stats[p];
            for b in &win.blocks {
                let mut add = |s: &Segment, times: u64| {
                    count_times(st, &s.plan.bundle, u64::from(s.len) * times);
                };
                for s in b.head.iter().chain(&b.tail) {
                    add(s, 1);
                }
                for (s, _) in &b.body {
                    add(s, u64::from(b.iters));
                }
            }
            self.cursors[p] = win.end;
        }
        if rounds > 1 {
            self.nest_through += u64::from(w);
        }
        self.m.advance(u64::from(w));
        self.bulk += u64::from(w);
        self.nest += u64::from(w);
    }

    /// Runs one loop's part of the window on every PE that has one.
    fn exec_blocks(&mut self, wins: &[Option<&Block>]) {
        let n = wins.len();
        let next = |p: usize| if p + 1 == n { 0 } else { p + 1 };
        // The planner made the PEs independent within the window, so any interleaving of them
        // that keeps each PE's own order gives the cycle-by-cycle result: heads, then the
        // whole iterations, then the tails, each in rounds (round `t` runs every PE's `t`-th
        // stretch) so that the PEs' dot products go side by side.
        self.rounds(wins, |b, t| b.head.get(t).map(|s| s.plan_len()));
        // A PE whose iterations are independent dot products hands every iteration's chain
        // to one pool, run interleaved across PEs and iterations alike.
        let mut chains = std::mem::take(&mut self.chains);
        chains.clear();
        for (p, win) in wins.iter().enumerate() {
            let Some(win) = win.filter(|w| w.free) else {
                continue;
            };
            let (s, shift) = &win.body[0];
            if let Some(d) = dot_of(&s.plan) {
                for r in 0..i64::from(win.iters) {
                    chains.push((p, next(p), d.moved(shift, r), s.len));
                }
            }
        }
        let mems = self.m.mems_mut();
        // The planner refused any window whose sends meet their receivers.
        self.interleaved += run_chains(mems, &mut Sink::direct(), &chains);
        self.chains = chains;
        // A PE whose iterations hold no dot product gains nothing from the rounds (their
        // bookkeeping is most of the cost of its one-cycle stretches): it runs on its own.
        let mems = self.m.mems_mut();
        let mut direct = Sink::direct();
        for (p, win) in wins.iter().enumerate() {
            let Some(win) = win.filter(|w| !w.free && !w.dots) else {
                continue;
            };
            for r in 0..i64::from(win.iters) {
                for (s, shift) in &win.body {
                    let plan = s.plan.moved(shift, r);
                    run_plan(mems, &mut direct, p, next(p), &plan, i64::from(s.len));
                }
            }
        }
        self.rounds(wins, |b, t| {
            let k = b.body.len();
            if b.free || !b.dots || k == 0 || t >= k * b.iters as usize {
                return None;
            }
            let (s, shift) = &b.body[t % k];
            Some((s.plan.moved(shift, (t / k) as i64), s.len))
        });
        self.rounds(wins, |b, t| b.tail.get(t).map(|s| s.plan_len()));
    }

    /// Runs `at(block, t)` of every PE's block for `t = 0, 1, …` until none has one, round by
    /// round: a round's dot products side by side (they belong to different PEs), the rest
    /// one after another.
    fn rounds(
        &mut self,
        wins: &[Option<&Block>],
        at: impl Fn(&Block, usize) -> Option<(Plan, u32)>,
    ) {
        let n = wins.len();
        let mut chains = std::mem::take(&mut self.chains);
        let mems = self.m.mems_mut();
        let mut direct = Sink::direct();
        for t in 0.. {
            chains.clear();
            let mut any = false;
            for (p, win) in wins.iter().enumerate() {
                let Some((plan, len)) = win.and_then(|b| at(b, t)) else {
                    continue;
                };
                any = true;
                let next = if p + 1 == n { 0 } else { p + 1 };
                match dot_of(&plan) {
                    Some(d) => chains.push((p, next, d, len)),
                    None => run_plan(mems, &mut direct, p, next, &plan, i64::from(len)),
                }
            }
            if !any {
                break;
            }
            // Chains of one length go side by side; a round holds one chain per PE, so their
            // order is free.
            chains.sort_unstable_by_key(|c| c.3);
            self.interleaved += run_chains(mems, &mut direct, &chains);
        }
        self.chains = chains;
    }
}
