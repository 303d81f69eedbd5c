//! Large-neighbourhood search: shortens a known schedule by re-solving windows of it with the
//! rest held in place. It proves nothing, but finds good schedules long before the full search
//! does, which then only has to prove them.
//!
//! Moves, all on the machine's rules only (no symmetry breaking or dominance, which a
//! fixed part need not respect), solved incrementally under assumptions so that what one window
//! teaches the solver carries over to the next:
//!
//! * *compress*: to save a cycle, every op before a window keeps its PE and cycle, every op after
//!   it keeps its PE one cycle earlier, and the solver fits the window's ops into one cycle
//!   less, re-routing every transfer and choosing the preloads anew;
//! * *drain*: when no window compresses, empty one more PE's op slot in the last cycle, with the
//!   ops before a window fixed and the window (which reaches the end) free. Once the last cycle
//!   is empty the schedule is a cycle shorter. This gives the search a gradient where
//!   compression alone finds none;
//! * *re-place*: one cycle less with every op on its PE but at any cycle, then with the ops of
//!   one or two rows also free to change PE;
//! * *perturb*: when neither helps, move one op of a random window elsewhere at the same length
//!   and try again from there.
//!
//! Every move gives up after a number of conflicts that doubles each time the search comes back
//! to the same length, so hard windows do not starve easy ones.

use super::decode::decode;
use super::encode::{EncodeOptions, Encoding};
use super::hint;
use super::search::{encoding, Deadline, ExactError};
use crate::problem::Problem;
use crate::schedule::RingSchedule;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::time::Instant;

/// One shortening found.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub cycles: u64,
    /// Since the improvement started.
    pub seconds: f64,
}

/// Window widths tried, narrowest first: narrow windows are quick to refute.
const WIDTHS: [i64; 8] = [4, 6, 9, 13, 18, 25, 35, 50];

/// Conflicts a compress window may take before it counts as failed, on the first pass at a
/// length (doubled on each later pass): most windows are refuted in far fewer, and the few hard
/// ones would otherwise eat the whole budget before the easy ones elsewhere are tried.
const WINDOW_CONFLICTS: i32 = 15_000;

/// Conflicts a re-placing move may take before it counts as failed (doubled likewise).
const REPLACE_CONFLICTS: i32 = 20_000;

/// Random restarts per schedule length before giving up.
const PERTURBATIONS: usize = 200;

/// A small deterministic generator: runs are reproducible.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

struct Solver {
    enc: Encoding,
    sat: cadical::Solver<Deadline>,
}

impl Solver {
    fn new(
        problem: &Problem,
        pes: u32,
        t: u64,
        deadline: Option<Instant>,
    ) -> Result<Self, ExactError> {
        let opts = EncodeOptions {
            symmetry_breaking: false,
            slack_limit: true,
            dominance: false,
        };
        let enc = encoding(problem, pes, t, opts)?;
        let mut sat: cadical::Solver<Deadline> = cadical::Solver::new();
        for clause in enc.cnf.clauses.split(|&l| l == 0) {
            if !clause.is_empty() {
                sat.add_clause(clause.iter().copied());
            }
        }
        sat.set_callbacks(Some(Deadline(deadline)));
        Ok(Solver { enc, sat })
    }

    fn out_of_time(&mut self) -> bool {
        self.sat
            .get_callbacks()
            .is_some_and(|d| d.0.is_some_and(|d| Instant::now() >= d))
    }

    /// `Ok(None)`: refuted, or given up after `conflicts` conflicts (a neighbourhood move may
    /// fail for either reason); `Err(None)`: out of time, or `allowance` (conflicts left to the
    /// whole search, when limited) cannot pay for `conflicts`.
    fn solve_limited(
        &mut self,
        assumptions: Vec<i32>,
        conflicts: Option<i32>,
        allowance: &mut Option<u64>,
    ) -> Result<Option<RingSchedule>, Option<ExactError>> {
        if let (Some(left), Some(limit)) = (allowance.as_mut(), conflicts) {
            // Charged in full whatever the move uses: the solver does not report its count,
            // and a deterministic upper bound is what the limit is for.
            let cost = u64::try_from(limit).unwrap_or(0);
            if *left < cost {
                return Err(None);
            }
            *left -= cost;
        }
        if let Some(limit) = conflicts {
            self.sat
                .set_limit("conflicts", limit)
                .map_err(|e| Some(ExactError::Internal(format!("{e:?}"))))?;
        }
        let answer = self.sat.solve_with(assumptions);
        if answer.is_none() && conflicts.is_some() && !self.out_of_time() {
            return Ok(None);
        }
        match answer {
            Some(true) => {
                let sat = &self.sat;
                decode(&self.enc, |lit| sat.value(lit).unwrap_or(false))
                    .map(Some)
                    .map_err(|e| Some(ExactError::Internal(e)))
            }
            Some(false) => Ok(None),
            None => Err(None),
        }
    }
}

/// Shortens `start` while windows of it can be compressed or drained, stopping at `floor`
/// cycles, the deadline, or once the moves' conflict allowances would exceed `conflict_limit`.
/// Returns the shortest schedule found (if shorter than `start`) and every step.
pub fn improve(
    problem: &Problem,
    pes: u32,
    start: &RingSchedule,
    floor: u64,
    deadline: Option<Instant>,
    conflict_limit: Option<u64>,
) -> Result<(Option<RingSchedule>, Vec<Step>), ExactError> {
    let mut allowance = conflict_limit;
    let began = Instant::now();
    let mut current = start.clone();
    let mut improved = false;
    let mut steps = Vec::new();
    let out_of_time = || deadline.is_some_and(|d| Instant::now() >= d);
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut solvers: HashMap<u64, Solver> = HashMap::new();
    let mut rounds: HashMap<u64, u32> = HashMap::new();
    'levels: loop {
        let c = current.cycles() as u64;
        if c <= floor.max(1) || out_of_time() {
            break;
        }
        // Windows beyond half the schedule are nearly the full problem, the exact search's job.
        let widest = (c as i64 / 2).max(6);
        let widths: Vec<i64> = WIDTHS.iter().copied().filter(|&w| w <= widest).collect();
        // Each return to the same length (after a drain or a perturbation) lets the windows
        // search longer: cheap first, the hard windows only once the cheap ones are exhausted.
        let round = rounds.entry(c).or_insert(0u32);
        let factor = 1i32 << (*round).min(6);
        let window_conflicts = WINDOW_CONFLICTS.saturating_mul(factor);
        let replace_conflicts = REPLACE_CONFLICTS.saturating_mul(factor);
        *round += 1;

        // Compress: the same schedule in one cycle less, a window at a time.
        // Solvers are kept per length: perturbing and draining revisit the same lengths, and an
        // incremental solver keeps what it learnt.
        solvers.retain(|&t, _| t + 1 >= c);
        for t in [c - 1, c] {
            if let Entry::Vacant(slot) = solvers.entry(t) {
                slot.insert(Solver::new(problem, pes, t, deadline)?);
            }
        }
        let [Some(shorter), Some(same)] = solvers.get_disjoint_mut([&(c - 1), &c]) else {
            return Err(ExactError::Internal("neighbourhood solvers missing".into()));
        };
        let Ok(placed) = hint::placement(&shorter.enc.model, &current) else {
            // A schedule the model does not describe op by op cannot be a starting point.
            break;
        };
        // One cycle less: every move is a set of assumptions on the shorter length's solver,
        // tried in order, the first satisfiable one taken.
        let mut moves: Vec<(Vec<i32>, i32)> = Vec::new();
        // Compress: ops before a window keep PE and cycle, ops after it keep PE a cycle earlier.
        let ci = c as i64;
        for &width in &widths {
            let stride = (width / 2).max(1);
            let mut t0 = 0;
            loop {
                let t1 = (t0 + width).min(ci);
                let assumptions = placed
                    .iter()
                    .filter_map(|&(o, p, at)| {
                        if at < t0 {
                            Some(shorter.enc.run[o].at(p, at))
                        } else if at >= t1 {
                            Some(shorter.enc.run[o].at(p, at - 1))
                        } else {
                            None
                        }
                    })
                    .collect();
                moves.push((assumptions, window_conflicts));
                if t1 >= ci {
                    break;
                }
                t0 += stride;
            }
        }
        // Re-place: every op on its PE but at any cycle, then the same with the ops of one row
        // (or of two) free to move to any PE. Time windows cut the schedule across all rows;
        // these cut it along the dataflow instead, which is where causal layers' slack hides
        // (a row's phase 2 waits for its own scores only).
        let rows: Vec<(u32, u32)> = {
            let mut r: Vec<(u32, u32)> = shorter
                .enc
                .model
                .ops
                .iter()
                .map(|o| (o.head, o.a))
                .collect();
            r.sort_unstable();
            r.dedup();
            r
        };
        let mut groups: Vec<Vec<(u32, u32)>> = vec![Vec::new()];
        groups.extend(rows.iter().map(|&r| vec![r]));
        for (i, &r) in rows.iter().enumerate() {
            groups.extend(rows[i + 1..].iter().map(|&s| vec![r, s]));
        }
        for free in &groups {
            let assumptions = placed
                .iter()
                .filter(|&&(o, _, _)| {
                    let op = &shorter.enc.model.ops[o];
                    !free.contains(&(op.head, op.a))
                })
                .map(|&(o, p, _)| shorter.enc.on[o][p as usize])
                .collect();
            moves.push((assumptions, replace_conflicts));
        }
        for (assumptions, conflicts) in moves {
            match shorter.solve_limited(assumptions, Some(conflicts), &mut allowance) {
                Ok(Some(s)) => {
                    steps.push(Step {
                        cycles: s.cycles() as u64,
                        seconds: began.elapsed().as_secs_f64(),
                    });
                    current = s;
                    improved = true;
                    continue 'levels;
                }
                Ok(None) => {}
                Err(None) => break 'levels,
                Err(Some(e)) => return Err(e),
            }
        }

        // Drain: same length, one more idle op slot in the last cycle, until it is empty.
        'drain: loop {
            let Ok(placed) = hint::placement(&same.enc.model, &current) else {
                break 'levels;
            };
            let last = current.cycles() as i64 - 1;
            if last + 1 < c as i64 {
                steps.push(Step {
                    cycles: current.cycles() as u64,
                    seconds: began.elapsed().as_secs_f64(),
                });
                improved = true;
                continue 'levels;
            }
            let busy: Vec<u32> = (0..pes)
                .filter(|&p| current.slots[p as usize][last as usize].work.is_some())
                .collect();
            for &victim in &busy {
                for &width in &widths {
                    let t0 = (last + 1 - width).max(0);
                    let mut assumptions: Vec<i32> = placed
                        .iter()
                        .filter(|&&(_, _, at)| at < t0)
                        .map(|&(o, p, at)| same.enc.run[o].at(p, at))
                        .collect();
                    assumptions.extend(
                        (0..pes)
                            .filter(|p| *p == victim || !busy.contains(p))
                            .map(|p| same.enc.idle.at(p, last)),
                    );
                    match same.solve_limited(assumptions, Some(window_conflicts), &mut allowance) {
                        Ok(Some(s)) => {
                            current = s;
                            continue 'drain;
                        }
                        Ok(None) => {}
                        Err(None) => break 'levels,
                        Err(Some(e)) => return Err(e),
                    }
                }
            }
            break 'drain;
        }

        // Perturb: the same length, with one op of a random window forced elsewhere, so that
        // the next compress and drain start from a different schedule.
        let Ok(placed) = hint::placement(&same.enc.model, &current) else {
            break 'levels;
        };
        for _ in 0..PERTURBATIONS {
            if out_of_time() {
                break 'levels;
            }
            let width = widths[(rng.next() % widths.len() as u64) as usize];
            let t0 = (rng.next() % c) as i64;
            let inside: Vec<&(usize, u32, i64)> = placed
                .iter()
                .filter(|&&(_, _, at)| at >= t0 && at < t0 + width)
                .collect();
            if inside.is_empty() {
                continue;
            }
            let &&(o, p, at) = &inside[(rng.next() % inside.len() as u64) as usize];
            let mut assumptions: Vec<i32> = placed
                .iter()
                .filter(|&&(_, _, x)| x < t0 || x >= t0 + width)
                .map(|&(o, p, x)| same.enc.run[o].at(p, x))
                .collect();
            assumptions.push(-same.enc.run[o].at(p, at));
            match same.solve_limited(assumptions, Some(window_conflicts), &mut allowance) {
                Ok(Some(s)) => {
                    current = s;
                    continue 'levels;
                }
                Ok(None) => {}
                Err(None) => break 'levels,
                Err(Some(e)) => return Err(e),
            }
        }
        break;
    }
    Ok((improved.then_some(current), steps))
}
