//! Which of the split simulation's pending tasks may run, kept up to date as words arrive and
//! chains move on, instead of found by asking every pending task of a PE each cycle.
//!
//! A task runs once its chain has reached the task's segment with the partial sum on the PE, and
//! each operand (a word, or a chain's result) is on the PE. Every one of these conditions is
//! counted down by the event that meets it: a word becoming readable on a PE, a chain entering a
//! segment, a chain's result being known. A task with nothing left to wait for is a candidate.
//! The one condition not tracked is the partial sum of a term just made on the same PE, readable
//! only from the next cycle; nothing looks at that PE again in the same cycle. So the candidates
//! are exactly the tasks that can run, which debug builds check against [`open`](super::open).
//!
//! The simulation's budget counts every pending task the scan over the whole list would have
//! looked at; pending tasks are kept as bits so that count is a popcount.

use super::{Avail, Chain, ChainState, Gate, Task, CHAIN, NONE};
use crate::schedule::Val;
use cranelift_entity::EntityRef;

/// What the tasks of one plan wait for; the same for every run of the plan.
pub(super) struct Readers {
    /// Tasks reading each of the plan's words, once per operand, with their PE, by PE within
    /// each word.
    by_val: Csr<(u32, u32)>,
    /// Tasks reading each chain's result (operand, bias or denominator), once per operand, with
    /// their PE.
    by_chain: Csr<(u32, u32)>,
    /// Conditions each task waits for: its chain's segment, and each operand.
    needs: Vec<u8>,
    /// Tasks per PE.
    per_pe: Vec<u32>,
    /// Tasks of each chain's segments, by segment (the segments of a chain in a row, from
    /// `first_seg` of the chain): read on every segment entered, so kept in one array rather
    /// than behind each chain's own lists.
    seg_tasks: Csr<u32>,
    first_seg: Vec<u32>,
}

/// Lists by key, stored end to end.
struct Csr<T> {
    start: Vec<u32>,
    items: Vec<T>,
}

impl<T: Copy + Default> Csr<T> {
    /// `pairs` are `(key, item)`, every key below `keys`; items keep their order within a key.
    fn new(keys: usize, pairs: &[(u32, T)]) -> Csr<T> {
        let mut start = vec![0u32; keys + 1];
        for &(key, _) in pairs {
            start[key as usize + 1] += 1;
        }
        for k in 0..keys {
            start[k + 1] += start[k];
        }
        let mut fill = start.clone();
        let mut items = vec![T::default(); pairs.len()];
        for &(key, item) in pairs {
            items[fill[key as usize] as usize] = item;
            fill[key as usize] += 1;
        }
        Csr { start, items }
    }

    #[inline]
    fn get(&self, key: usize) -> &[T] {
        match (self.start.get(key), self.start.get(key + 1)) {
            (Some(&a), Some(&b)) => &self.items[a as usize..b as usize],
            _ => &[],
        }
    }
}

impl Readers {
    /// From each task's [`Gate`] (by task index). An operand outside the plan's `vals` words and
    /// `chains` chains is not waited for: the task is then a candidate early, never late.
    pub(super) fn new(tasks: &[Task], gates: &[Gate], chains: &[Chain], vals: usize) -> Readers {
        let mut first_seg = Vec::with_capacity(chains.len() + 1);
        let mut seg_pairs: Vec<(u32, u32)> = Vec::new();
        let mut segs = 0u32;
        for c in chains {
            first_seg.push(segs);
            for (_, ts) in &c.segs {
                seg_pairs.extend(ts.iter().map(|&i| (segs, i as u32)));
                segs += 1;
            }
        }
        first_seg.push(segs);
        let seg_tasks = Csr::new(segs as usize, &seg_pairs);
        let chains = chains.len();
        let mut by_val: Vec<(u32, (u32, u32))> = Vec::new();
        let mut by_chain: Vec<(u32, (u32, u32))> = Vec::new();
        let mut needs = vec![0u8; gates.len()];
        // Tasks are taken by PE, so each word's readers come out by PE and an arrival finds
        // those on its PE by bisection.
        let pes = tasks.iter().map(|t| t.pe as usize + 1).max().unwrap_or(0);
        let by_pe = Csr::new(
            pes,
            &tasks
                .iter()
                .enumerate()
                .map(|(i, t)| (t.pe, i as u32))
                .collect::<Vec<_>>(),
        );
        for &i in &by_pe.items {
            let (g, pe) = (&gates[i as usize], tasks[i as usize].pe);
            let mut n = u8::from(g.chain != NONE);
            for o in [g.bias, g.x, g.y] {
                if o == NONE {
                    continue;
                }
                if o & CHAIN != 0 {
                    if ((o & !CHAIN) as usize) < chains {
                        by_chain.push((o & !CHAIN, (pe, i)));
                        n += 1;
                    }
                } else if (o as usize) < vals {
                    by_val.push((o, (pe, i)));
                    n += 1;
                }
            }
            needs[i as usize] = n;
        }
        Readers {
            by_val: Csr::new(vals, &by_val),
            by_chain: Csr::new(chains, &by_chain),
            needs,
            per_pe: (0..pes).map(|pe| by_pe.get(pe).len() as u32).collect(),
            seg_tasks,
            first_seg,
        }
    }

    /// The tasks of segment `seg` of `chain`.
    #[inline]
    fn seg(&self, chain: usize, seg: usize) -> &[u32] {
        match (self.first_seg.get(chain), self.first_seg.get(chain + 1)) {
            (Some(&a), Some(&b)) if (seg as u32) < b - a => self.seg_tasks.get((a as usize) + seg),
            _ => &[],
        }
    }

    /// The tasks reading word `v` as an operand (once per operand).
    pub(super) fn of_word(&self, v: Val) -> impl Iterator<Item = usize> + '_ {
        self.by_val.get(v.index()).iter().map(|&(_, i)| i as usize)
    }
}

/// A wait for a word to become readable on a PE, in a list per word.
#[derive(Clone, Copy)]
struct Wait {
    pe: u32,
    what: Waiter,
    next: u32,
}

#[derive(Clone, Copy)]
enum Waiter {
    /// A task reading a chain's result.
    Task(u32),
    /// A chain's segment waiting for its partial sum: `(chain, segment)`.
    Seg(u32, u32),
}

const NIL: u32 = u32::MAX;

/// One run's readiness: pending tasks and candidates by position in the run's task order (tasks
/// by PE, then priority), and the waits not yet met.
#[derive(Default)]
pub(super) struct Ready {
    /// Per task (by index): its position in the order, and its conditions still unmet. A
    /// condition met looks up both, so they sit side by side.
    slot: Vec<(u32, u32)>,
    pending: Vec<u64>,
    candidate: Vec<u64>,
    /// First position of each PE's tasks, and the end after the last PE's.
    start: Vec<u32>,
    /// Per PE, a word of `pending` with none of its tasks pending before it: tasks mostly run in
    /// their order, so the words before it are skipped.
    lo: Vec<u32>,
    /// Pending tasks per PE.
    count: Vec<u32>,
    /// Waits on each word (by value index), as lists through `waits`, and the words with any.
    wait_head: Vec<u32>,
    waited: Vec<u32>,
    waits: Vec<Wait>,
    /// Words that become readable on a PE in the next cycle.
    due: Vec<(u32, Val)>,
}

impl Ready {
    /// Every task pending, none a candidate; `order` holds task indices by PE.
    pub(super) fn reset(&mut self, order: &[u32], m: usize, readers: &Readers) {
        let n = order.len();
        self.slot.clear();
        self.slot
            .extend((0..n).map(|i| (0, u32::from(readers.needs.get(i).copied().unwrap_or(0)))));
        for (k, &i) in order.iter().enumerate() {
            if let Some(p) = self.slot.get_mut(i as usize) {
                p.0 = k as u32;
            }
        }
        self.count.clear();
        self.count
            .extend((0..m).map(|pe| readers.per_pe.get(pe).copied().unwrap_or(0)));
        self.start.clear();
        self.start.push(0);
        for pe in 0..m {
            self.start.push(self.start[pe] + self.count[pe]);
        }
        self.lo.clear();
        self.lo.extend(self.start[..m].iter().map(|&a| a / 64));
        let words = n.div_ceil(64);
        self.pending.clear();
        self.pending.resize(words, !0);
        if !n.is_multiple_of(64) {
            if let Some(last) = self.pending.last_mut() {
                *last = (1u64 << (n % 64)) - 1;
            }
        }
        self.candidate.clear();
        self.candidate.resize(words, 0);
        for (k, &i) in order.iter().enumerate() {
            if readers.needs.get(i as usize).copied().unwrap_or(0) == 0 {
                set(&mut self.candidate, k);
            }
        }
        for &v in &self.waited {
            self.wait_head[v as usize] = NIL;
        }
        self.waited.clear();
        self.waits.clear();
        self.due.clear();
    }

    /// One condition of task `i` met.
    #[inline]
    fn lower(&mut self, i: u32) {
        let Some((k, unmet)) = self.slot.get_mut(i as usize) else {
            return;
        };
        *unmet = unmet.saturating_sub(1);
        let k = *k as usize;
        if *unmet == 0 && get(&self.pending, k) {
            set(&mut self.candidate, k);
        }
    }

    fn wait(&mut self, v: Val, pe: u32, what: Waiter) {
        let i = v.index();
        if self.wait_head.len() <= i {
            self.wait_head.resize(i + 1, NIL);
        }
        if self.wait_head[i] == NIL {
            self.waited.push(i as u32);
        }
        self.waits.push(Wait {
            pe,
            what,
            next: self.wait_head[i],
        });
        self.wait_head[i] = self.waits.len() as u32 - 1;
    }

    /// `chain` has entered its current segment in cycle `t`.
    pub(super) fn enter(
        &mut self,
        readers: &Readers,
        chains: &[Chain],
        state: &[ChainState],
        chain: usize,
        avail: &Avail,
        t: usize,
    ) {
        let s = state[chain];
        let Some((pe, _)) = chains[chain].segs.get(s.seg) else {
            return;
        };
        match s.partial {
            Some(v) if !here(avail, v, *pe, t) => {
                self.wait(v, *pe, Waiter::Seg(chain as u32, s.seg as u32))
            }
            _ => readers
                .seg(chain, s.seg)
                .iter()
                .for_each(|&i| self.lower(i)),
        }
    }

    /// `chain`'s result `v` is known in cycle `t`.
    pub(super) fn result(
        &mut self,
        readers: &Readers,
        chain: usize,
        v: Val,
        avail: &Avail,
        t: usize,
    ) {
        for &(pe, i) in readers.by_chain.get(chain) {
            if here(avail, v, pe, t) {
                self.lower(i);
            } else {
                self.wait(v, pe, Waiter::Task(i));
            }
        }
    }

    /// Word `v` is written to `avail` on `pe`, readable from cycle `at`; the simulation hears of
    /// it in that cycle (`at` is always the next cycle, or 0 for a preloaded word).
    #[inline]
    pub(super) fn write(&mut self, avail: &mut Avail, pe: u32, v: Val, at: usize) {
        if avail.insert(v, pe, at) {
            self.due.push((pe, v));
        }
    }

    /// Meets the conditions of the words written in the last cycle, readable from this one.
    pub(super) fn arrivals(&mut self, readers: &Readers) {
        let mut due = std::mem::take(&mut self.due);
        for &(pe, v) in &due {
            self.readable(readers, pe, v);
        }
        due.clear();
        self.due = due;
    }

    fn readable(&mut self, readers: &Readers, pe: u32, v: Val) {
        let all = readers.by_val.get(v.index());
        let from = all.partition_point(|&(at, _)| at < pe);
        for &(at, i) in &all[from..] {
            if at != pe {
                break;
            }
            self.lower(i);
        }
        let mut w = self.wait_head.get(v.index()).copied().unwrap_or(NIL);
        while let Some(&Wait { pe: at, what, next }) = self.waits.get(w as usize) {
            w = next;
            if at != pe {
                continue;
            }
            match what {
                Waiter::Task(i) => self.lower(i),
                Waiter::Seg(c, s) => readers
                    .seg(c as usize, s as usize)
                    .iter()
                    .for_each(|&i| self.lower(i)),
            }
        }
    }

    /// The first candidate of `pe`, by position.
    pub(super) fn first(&self, pe: usize) -> Option<usize> {
        let (a, b) = (self.start[pe] as usize, self.start[pe + 1] as usize);
        let mut word = self.lo[pe] as usize;
        while word * 64 < b {
            let mut bits = self.candidate[word];
            if word == a / 64 {
                bits &= !0u64 << (a % 64);
            }
            if bits != 0 {
                let k = word * 64 + bits.trailing_zeros() as usize;
                return (k < b).then_some(k);
            }
            word += 1;
        }
        None
    }

    /// Pending tasks of `pe` up to and including position `k`, a pending task.
    pub(super) fn rank(&mut self, pe: usize, k: usize) -> u64 {
        let a = self.start[pe] as usize;
        let (wa, wk) = (a / 64, k / 64);
        // Words of tasks that have all run are passed once, here.
        let mut lo = self.lo[pe] as usize;
        while lo < wk {
            let mut bits = self.pending[lo];
            if lo == wa {
                bits &= !0u64 << (a % 64);
            }
            if bits != 0 {
                break;
            }
            lo += 1;
        }
        self.lo[pe] = lo as u32;
        let mut n = 0u64;
        for word in lo..=wk {
            let mut bits = self.pending[word];
            if word == wa {
                bits &= !0u64 << (a % 64);
            }
            if word == wk {
                bits &= !0u64 >> (63 - k % 64);
            }
            n += u64::from(bits.count_ones());
        }
        n
    }

    /// Pending tasks of `pe`.
    pub(super) fn count(&self, pe: usize) -> u64 {
        u64::from(self.count[pe])
    }

    /// The task at position `k` of `pe` runs.
    pub(super) fn take(&mut self, pe: usize, k: usize) {
        clear(&mut self.pending, k);
        clear(&mut self.candidate, k);
        self.count[pe] = self.count[pe].saturating_sub(1);
    }
}

/// Whether `v` is readable in cycle `t`.
fn here(avail: &Avail, v: Val, pe: u32, t: usize) -> bool {
    avail.get(&v, pe).is_some_and(|at| at <= t)
}

fn get(bits: &[u64], k: usize) -> bool {
    bits[k / 64] & (1 << (k % 64)) != 0
}

fn set(bits: &mut [u64], k: usize) {
    bits[k / 64] |= 1 << (k % 64);
}

fn clear(bits: &mut [u64], k: usize) {
    bits[k / 64] &= !(1 << (k % 64));
}
