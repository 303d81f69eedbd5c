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
    count_times, overlap, plan_of, run_plan, Cursor, InitChunks, LoopMachine, Plan, Prog, Stepped,
    MAX_LOOP_DEPTH,
};
use crate::inst::{Acc, Op, Xfer, XferSrc};
use crate::looped::{Cmp, Field, LBundle, Node};
use crate::machine::F32Domain;

/// Most cycles one window covers.
const MAX_WINDOW: u64 = 1 << 16;

/// One stretch: `plan` for `len` cycles.
pub(super) struct Segment {
    pub(super) plan: Plan,
    pub(super) len: u32,
}

/// A PE's part of a window.
pub(super) struct PeWindow {
    head: Vec<Segment>,
    /// The body's stretches in the first whole iteration, with each field's move per iteration.
    body: Vec<(Segment, [i64; 7])>,
    /// How many whole iterations.
    iters: u32,
    /// Each whole iteration is one dot product whose running sum no other iteration touches,
    /// so the iterations' chains may run interleaved.
    free: bool,
    tail: Vec<Segment>,
    /// Where the cursor stands after the window: the planner walked it there already.
    end: Cursor,
}

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
        let bound = if k == 6 { next_len as i64 } else { size };
        if lo < 0 || hi >= bound {
            return false;
        }
        if [0, 1, 3, 5].contains(&k) {
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
    if meets(2, 4) {
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
                && (x.stride != 0 || (a == 2 && c < 2))
        )
    };
    if len > 1 {
        for w in [2usize, 4] {
            for r in [0usize, 1, 3, 5] {
                let own_register = plan.register && w == 4 && r == 3;
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
    let Some(sum) = seg.plan.progs[3] else {
        return false;
    };
    if dot_of(&seg.plan).is_none() || shift[3] == 0 {
        return false;
    }
    let sums = hull(sum, 1, shift[3], reps);
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

impl LoopMachine<F32Domain> {
    fn shape(&mut self, p: usize) -> Option<Shape> {
        let root = &self.progs[p].body;
        let cur = &mut self.cursors[p];
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

    /// A window over whole iterations (see the module's comment) of at least 2 cycles, or the
    /// cycles not to try again for (the window's, once its checks failed). Only tried where
    /// some PE can go past its innermost loop; the single-loop planner takes the rest.
    pub(super) fn plan_nest(&mut self) -> Result<(u32, Vec<Option<PeWindow>>), Stepped> {
        let n = self.progs.len();
        let mut shapes = Vec::with_capacity(n);
        let mut extends = false;
        let mut w = MAX_WINDOW.min(self.len - self.m.cycle());
        for p in 0..n {
            if self.cursors[p].done {
                shapes.push(None);
                continue;
            }
            let s = self.shape(p).ok_or(Stepped(1))?;
            let cur = &self.cursors[p];
            let depth = cur.frames.len() - 1;
            extends |= s.level < depth
                || super::list_at(&self.progs[p].body, &cur.frames, depth).len() > 1;
            // It covers any window up to its alike iterations: the rest of this one, whole
            // ones, and the start of the next.
            w = w.min(
                s.rest
                    .saturating_add(u64::from(s.alike).saturating_mul(s.iter_len)),
            );
            shapes.push(Some(s));
        }
        if !extends || w < 2 {
            return Err(Stepped(1));
        }
        let mut wins: Vec<Option<PeWindow>> = Vec::with_capacity(n);
        for (p, s) in shapes.into_iter().enumerate() {
            let Some(s) = s else {
                wins.push(None);
                continue;
            };
            // A stretch that breaks a rule (often for the whole loop): not again in this window.
            let win = self.pe_window(p, &s, w).ok_or(Stepped(w))?;
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
            for s in win.head.iter().chain(&win.tail) {
                one(s, &[0; 7], 1, &mut out);
            }
            if win.iters > 0 {
                for (s, shift) in &win.body {
                    one(s, shift, i64::from(win.iters), &mut out);
                }
            }
            out
        };
        if sends_meet_receivers(&wins, ranges) {
            // Blocks rotating in place meet their receivers all through the loop.
            return Err(Stepped(w));
        }
        Ok((w as u32, wins))
    }

    /// PE `p`'s part of a window of `w` cycles, checked; `None` if a stretch breaks a rule.
    fn pe_window(&mut self, p: usize, s: &Shape, w: u64) -> Option<PeWindow> {
        let n = self.progs.len();
        let next = if p + 1 == n { 0 } else { p + 1 };
        let root = &self.progs[p].body;
        let head_len = s.rest.min(w);
        let iters = ((w - head_len) / s.iter_len).min(u64::from(s.alike)) as u32;
        let tail_len = w - head_len - u64::from(iters) * s.iter_len;
        let mut probe = self.cursors[p];
        let collect = |probe: &mut Cursor, limit: u64| {
            let mut out = Vec::new();
            probe.walk(root, s.level, limit, |b, idx, len, inner| {
                out.push((b, *idx, len, inner));
                true
            });
            out
        };
        let head = collect(&mut probe, head_len);
        let mut body = Vec::new();
        if iters > 0 {
            body = collect(&mut probe, s.iter_len);
            probe.finish_through(root, s.level, s.first + iters - 1);
        }
        let tail = collect(&mut probe, tail_len);
        let own = (s.level - 1) as u8;
        let mems = self.m.mems();
        let mut at = PeMem {
            mem: &mems[p],
            next_len: mems[next].len(),
            init: &mut self.init[p],
            fresh: &[],
        };
        let mut flat = |v: Vec<(&LBundle, [u32; MAX_LOOP_DEPTH], u32, Option<u8>)>| {
            v.into_iter()
                .map(|(b, idx, len, inner)| {
                    let plan = plan_of(b, &idx, inner);
                    stretch_ok(&plan, i64::from(len), &[0; 7], 1, &mut at)
                        .then_some(Segment { plan, len })
                })
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
            plan.register &= shift[3] == shift[4];
            if !stretch_ok(&plan, i64::from(len), &shift, i64::from(iters), &mut at) {
                return None;
            }
            moved.push((Segment { plan, len }, shift));
        }
        let free = iters >= 2
            && match moved.as_slice() {
                [(seg, shift)] => independent_dots(seg, shift, i64::from(iters)),
                _ => false,
            };
        Some(PeWindow {
            head,
            body: moved,
            iters,
            free,
            tail,
            end: probe,
        })
    }

    pub(super) fn exec_nest(&mut self, w: u32, wins: &[Option<PeWindow>]) {
        let n = wins.len();
        // The planner refused any window whose sends meet their receivers.
        let mut direct = Sink::direct();
        let next = |p: usize| if p + 1 == n { 0 } else { p + 1 };
        let moved = |s: &Segment, shift: &[i64; 7], r: i64| {
            let mut plan = s.plan;
            for (pr, d) in plan.progs.iter_mut().zip(shift) {
                if let Some(pr) = pr {
                    pr.addr += d * r;
                }
            }
            plan
        };
        let mems = self.m.mems_mut();
        // The planner made the PEs independent within the window, so any interleaving of them
        // that keeps each PE's own order gives the cycle-by-cycle result: heads, then the
        // whole iterations, then the tails.
        for (p, win) in wins.iter().enumerate() {
            let Some(win) = win else { continue };
            for s in &win.head {
                run_plan(mems, &mut direct, p, next(p), &s.plan, i64::from(s.len));
            }
        }
        // A PE whose iterations are independent dot products hands every iteration's chain
        // to one pool, run interleaved across PEs and iterations alike.
        let mut chains = std::mem::take(&mut self.chains);
        chains.clear();
        for (p, win) in wins.iter().enumerate() {
            let Some(win) = win.as_ref().filter(|w| w.free) else {
                continue;
            };
            let (s, shift) = &win.body[0];
            if let Some(d) = dot_of(&s.plan) {
                for r in 0..i64::from(win.iters) {
                    chains.push((p, next(p), d.moved(shift, r), s.len));
                }
            }
        }
        self.interleaved += run_chains(mems, &mut direct, &chains);
        self.chains = chains;
        let mems = self.m.mems_mut();
        // Where every other PE runs the same iterations of stretches of the same lengths (one
        // program on every PE), stretch k of iteration r runs on all of them before stretch
        // k + 1, so their dot products interleave.
        let busy: Vec<(usize, &PeWindow)> = wins
            .iter()
            .enumerate()
            .filter_map(|(p, w)| {
                w.as_ref()
                    .filter(|w| w.iters > 0 && !w.free)
                    .map(|w| (p, w))
            })
            .collect();
        let alike = busy.windows(2).all(|x| {
            let (a, b) = (x[0].1, x[1].1);
            a.iters == b.iters
                && a.body.len() == b.body.len()
                && a.body.iter().zip(&b.body).all(|(s, t)| s.0.len == t.0.len)
        });
        if alike && busy.len() > 1 {
            let (iters, stretches) = (busy[0].1.iters, busy[0].1.body.len());
            let mut dots = Vec::with_capacity(busy.len());
            for r in 0..i64::from(iters) {
                for k in 0..stretches {
                    dots.clear();
                    let len = busy[0].1.body[k].0.len;
                    for &(p, win) in &busy {
                        let (s, shift) = &win.body[k];
                        let plan = moved(s, shift, r);
                        match dot_of(&plan) {
                            Some(d) => dots.push((p, next(p), d, len)),
                            None => run_plan(mems, &mut direct, p, next(p), &plan, i64::from(len)),
                        }
                    }
                    self.interleaved += run_chains(mems, &mut direct, &dots);
                }
            }
        } else {
            for &(p, win) in &busy {
                for r in 0..i64::from(win.iters) {
                    for (s, shift) in &win.body {
                        run_plan(
                            mems,
                            &mut direct,
                            p,
                            next(p),
                            &moved(s, shift, r),
                            i64::from(s.len),
                        );
                    }
                }
            }
        }
        for (p, win) in wins.iter().enumerate() {
            let Some(win) = win else { continue };
            for s in &win.tail {
                run_plan(mems, &mut direct, p, next(p), &s.plan, i64::from(s.len));
            }
        }
        for (p, win) in wins.iter().enumerate() {
            let Some(win) = win else { continue };
            let st = &mut self.stats[p];
            let mut add = |s: &Segment, times: u64| {
                count_times(st, &s.plan.bundle, u64::from(s.len) * times);
            };
            for s in win.head.iter().chain(&win.tail) {
                add(s, 1);
            }
            for (s, _) in &win.body {
                add(s, u64::from(win.iters));
            }
            self.cursors[p] = win.end;
        }
        self.m.advance(u64::from(w));
        self.bulk += u64::from(w);
        self.nest += u64::from(w);
    }
}
