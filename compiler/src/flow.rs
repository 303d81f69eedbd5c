//! A cycle-by-cycle list scheduler for dataflows that are easier to state as "what each PE does,
//! in roughly this order, and what each link forwards" than as index formulas.
//!
//! Each PE has a task list and each link a forwarding list, both in a preferred order. Every
//! cycle, each PE runs the first task among its next [`WINDOW`] pending ones whose operands are on
//! the PE, and each link sends, of the values on its list that are already on the PE, the one
//! earliest in the list — a value still on its way never holds up one that is here. A value
//! computed or received in cycle `t` is usable from cycle `t + 1`, exactly as the ISA says, so
//! the simulated timeline *is* the schedule and its length is the exact cycle count.

use crate::pe_map::PeValMap;
use crate::schedule::{Builder, Val, Work};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// How far past a blocked task the scheduler looks for ready work.
pub const WINDOW: usize = 48;

/// One PE's arithmetic task and the phase it counts in (1, 2 or 3).
#[derive(Clone, Copy, Debug)]
pub struct Task {
    pub work: Work,
    pub phase: u8,
}

/// The plan for a whole ring.
pub struct Flow {
    pub tasks: Vec<Vec<Task>>,
    /// `forward[p]`: values PE `p` sends to PE `p + 1`, in preferred order (each at most once).
    pub forward: Vec<Vec<Val>>,
    /// Values present before cycle 0 (preloaded inputs), per PE.
    pub preloaded: Vec<Vec<Val>>,
}

/// Per PE: the first cycle each value can be read there. Cycles and list positions are kept in
/// `u32` (see [`simulate_within`]): these maps hold an entry per value of a layer of millions,
/// and half the words is fewer pages to fault in.
type Avail = PeValMap<u32>;
/// Per PE: positions in its forwarding list of values that are present and not yet sent.
type Ready = Vec<BinaryHeap<Reverse<usize>>>;

/// Runs the plan; returns the number of cycles or, if some task can never run, a description.
pub fn simulate(b: &mut Builder, flow: &Flow) -> Result<usize, String> {
    simulate_within(b, flow, usize::MAX).map(|t| t.unwrap_or(usize::MAX))
}

/// [`simulate`], giving up (`Ok(None)`) as soon as the schedule is sure to take more than `limit`
/// cycles: a caller keeping the shortest of several runs need not finish the ones that lose.
pub fn simulate_within(
    b: &mut Builder,
    flow: &Flow,
    limit: usize,
) -> Result<Option<usize>, String> {
    let m = flow.tasks.len();
    // A PE runs at most one task and sends at most one value a cycle, so the longest list is a
    // floor on the length; an eighth more covers the waits of the dataflows built so far.
    let lists = || (flow.tasks.iter().map(Vec::len)).chain(flow.forward.iter().map(Vec::len));
    let floor = lists().max().unwrap_or(0);
    b.reserve_cycles(floor.saturating_add(floor / 8));
    // Each cycle does some work or sends a value, or the run stops three idle cycles later, so
    // cycles and positions stay below four times the work and sends.
    let work: usize = lists().sum();
    if work >= (u32::MAX / 4) as usize {
        return Err(format!("{work} tasks and sends are too many to simulate"));
    }
    // avail[p][v] = first cycle at which v can be read on p.
    let mut avail: Avail = PeValMap::new(m, b.vals(), 0);
    // Where each value sits in each PE's forwarding list, and the listed values already present.
    // Asked on every arrival, so a dense map like `avail`.
    let mut listed: PeValMap<u32> = PeValMap::new(m, b.vals(), 0);
    for (p, f) in flow.forward.iter().enumerate() {
        for (i, &v) in f.iter().enumerate() {
            listed.insert(p, v, i as u32);
        }
    }
    let mut ready: Ready = vec![BinaryHeap::new(); m];
    let arrive = |avail: &mut Avail, ready: &mut Ready, p: usize, v: Val, at: u32| {
        if avail.get(p, v).is_none_or(|old| at < old) && avail.insert(p, v, at).is_none() {
            if let Some(i) = listed.get(p, v) {
                ready[p].push(Reverse(i as usize));
            }
        }
    };
    for (p, vals) in flow.preloaded.iter().enumerate() {
        for &v in vals {
            arrive(&mut avail, &mut ready, p, v, 0);
        }
    }
    let mut pending: Vec<VecDeque<u32>> = flow
        .tasks
        .iter()
        .map(|t| (0..t.len() as u32).collect())
        .collect();
    let mut unrun: usize = flow.tasks.iter().map(Vec::len).sum();
    let mut unsent: usize = flow.forward.iter().map(Vec::len).sum();
    // Per PE, whether its window needs looking at: a window in which no task could run stays so
    // until a value reaches the PE (its pending tasks and the values it holds are otherwise
    // those of the cycle before), so the look is skipped until then.
    let mut look = vec![true; m];
    let mut events: Vec<(usize, Val)> = Vec::new();
    let mut t = 0usize;
    let mut idle = 0;
    while unrun > 0 || unsent > 0 {
        // Work left for cycle `t` means at least `t + 1` cycles.
        if t >= limit {
            return Ok(None);
        }
        let mut progressed = false;
        let now = t as u32;
        // The most tasks left on one PE after this cycle: each takes a cycle of its own.
        let mut most = 0usize;
        for p in 0..m {
            let here = |v: Val| avail.get(p, v).is_some_and(|at| at <= now);
            let found = if look[p] {
                pending[p]
                    .iter()
                    .take(WINDOW)
                    .position(|&i| flow.tasks[p][i as usize].work.reads().all(here))
            } else {
                None
            };
            look[p] = found.is_some();
            if let Some(pos) = found {
                let Some(i) = pending[p].remove(pos) else {
                    break;
                };
                unrun -= 1;
                let task = flow.tasks[p][i as usize];
                b.work(p as u32, t, task.phase, task.work);
                events.extend(task.work.writes().map(|v| (p, v)));
                progressed = true;
            }
            most = most.max(pending[p].len());
            if let Some(Reverse(i)) = ready[p].pop() {
                let v = flow.forward[p][i];
                b.send(p as u32, t, v);
                events.push(((p + 1) % m, v));
                unsent -= 1;
                progressed = true;
            }
        }
        for (p, v) in events.drain(..) {
            arrive(&mut avail, &mut ready, p, v, now + 1);
            look[p] = true;
        }
        t += 1;
        // The tasks left take at least `most` more cycles.
        if t.saturating_add(most) > limit {
            return Ok(None);
        }
        idle = if progressed { 0 } else { idle + 1 };
        if idle > 2 {
            let stuck: Vec<String> = (0..m)
                .filter_map(|p| {
                    let i = *pending[p].front()? as usize;
                    Some(format!("PE {p} waits to run {}", flow.tasks[p][i].work))
                })
                .take(4)
                .collect();
            return Err(format!(
                "dataflow deadlock at cycle {t} ({unsent} values never reached the PE that forwards them): {}",
                stuck.join("; ")
            ));
        }
    }
    Ok(Some(t))
}
