//! The search over cycle budgets: one SAT call per budget `T`, each on a fresh encoding (windows
//! depend on `T`), under one deadline for the whole search.

use super::decode::{self, decode};
use super::encode::{encode, EncodeOptions, Encoding};
use super::improve::{self, Step};
use super::model::Model;
use crate::manifest::{CandidateInfo, Manifest, Selection};
use crate::passes::select::{self, Choice};
use crate::passes::{analyze, lower};
use crate::problem::Problem;
use crate::schedule::RingSchedule;
use crate::{CompileError, Options as CompileOptions};
use std::time::{Duration, Instant};

/// Encodings beyond this many `(item, PE, cycle)` triples are refused rather than built: the
/// solver would not finish and the machine might run out of memory first.
pub const MAX_ENCODING_SIZE: u128 = 10_000_000;

/// In which order budgets are tried.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Strategy {
    /// From the lower bound up: the first satisfiable budget is optimal.
    Up,
    /// From just below the best known schedule down: every answer improves the schedule, the
    /// first unsatisfiable one proves the last. The default: the neighbourhood search usually
    /// leaves the best schedule at or near the optimum, so one refutation often settles it.
    #[default]
    Down,
    /// Bisection between the lower bound and the best known schedule.
    Bisect,
}

impl Strategy {
    pub const NAMES: [&'static str; 3] = ["up", "down", "bisect"];

    pub fn parse(s: &str) -> Option<Strategy> {
        match s {
            "up" => Some(Strategy::Up),
            "down" => Some(Strategy::Down),
            "bisect" => Some(Strategy::Bisect),
            _ => None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Options {
    /// Largest budget to try.
    pub max_cycles: Option<u64>,
    /// Wall-clock limit for the whole search, encoding included.
    pub time_limit: Option<Duration>,
    /// Work limit that does not depend on the machine's speed: each budget's SAT call gives up
    /// after this many conflicts (its verdict is then unknown), and the neighbourhood search
    /// stops once the conflict allowances of its moves add up to this many. Without a
    /// `time_limit` it also replaces the neighbourhood search's default wall-clock share, so
    /// the outcome is the same on every machine.
    pub conflict_limit: Option<u64>,
    pub strategy: Strategy,
    pub symmetry_breaking: bool,
    /// Search and report a SAT schedule even when the heuristic schedule is as good (it then
    /// bounds nothing and serves only as the fallback).
    pub sat_only: bool,
    /// Rule out schedules a local change improves (see [`super::encode`]); off only to check
    /// that the rules keep the optimum.
    pub dominance: bool,
    /// Shorten the heuristic schedule by large-neighbourhood search before the full search.
    pub improve: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_cycles: None,
            time_limit: None,
            conflict_limit: None,
            strategy: Strategy::Down,
            symmetry_breaking: true,
            sat_only: false,
            dominance: true,
            improve: true,
        }
    }
}

/// What the solver said about one budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Sat,
    Unsat,
    /// Stopped by the deadline or the conflict limit.
    Unknown,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Sat => "sat",
            Verdict::Unsat => "unsat",
            Verdict::Unknown => "unknown",
        }
    }
}

/// One SAT call.
#[derive(Clone, Debug, PartialEq)]
pub struct Attempt {
    /// The budget: every op runs in a cycle below `t`.
    pub t: u64,
    pub verdict: Verdict,
    /// Encoding plus solving.
    pub seconds: f64,
    pub variables: u64,
    pub clauses: u64,
}

/// Where the reported schedule came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Sat,
    /// `compiler::compile`'s schedule: SAT found nothing better (or proved it optimal).
    Heuristic,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Sat => "sat",
            Source::Heuristic => "heuristic",
        }
    }
}

/// The result of a search.
pub struct Outcome {
    pub programs: Vec<isa::Program>,
    pub manifest: Manifest,
    /// The decoded SAT schedule, when that is what is reported.
    pub schedule: Option<RingSchedule>,
    pub cycles: u64,
    /// `cycles` equals the lower bound, or the budget `cycles − 1` is unsatisfiable.
    pub proved_optimal: bool,
    pub lower_bound: u64,
    /// No schedule has fewer cycles than this: the lower bound raised by every unsatisfiable
    /// budget.
    pub proven_bound: u64,
    pub heuristic_cycles: Option<u64>,
    pub source: Source,
    pub attempts: Vec<Attempt>,
    /// Shortenings of the heuristic schedule by large-neighbourhood search.
    pub improvements: Vec<Step>,
    /// The time limit cut the search short.
    pub timed_out: bool,
    /// Why budgets were left untried: the encoding would be too large.
    pub too_large: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ExactError {
    /// The heuristic compile failed for a reason that also stops the exact search.
    Compile(CompileError),
    /// The instance is too large to encode.
    TooLarge(String),
    /// Nothing was found within the limits and there is no heuristic schedule to fall back on.
    NoSchedule(String),
    /// A bug: a model that does not decode, or a schedule codegen refuses.
    Internal(String),
}

impl std::fmt::Display for ExactError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExactError::Compile(e) => write!(f, "{e}"),
            ExactError::TooLarge(s) | ExactError::NoSchedule(s) => write!(f, "{s}"),
            ExactError::Internal(s) => write!(f, "internal error in the exact scheduler: {s}"),
        }
    }
}

/// Terminates the solver at a deadline.
pub(crate) struct Deadline(pub(crate) Option<Instant>);

impl cadical::Callbacks for Deadline {
    fn terminate(&mut self) -> bool {
        self.0.is_some_and(|d| Instant::now() >= d)
    }
}

/// The problem the compiler derives from `layer`.
pub fn problem_of(layer: &lang::Layer) -> Result<Problem, ExactError> {
    let graph = lower::run(layer);
    analyze::run(&graph)
        .map(|f| f.problem)
        .map_err(|e| ExactError::Internal(e.0))
}

/// Seconds per unit of [`Model::size_estimate`] to build an encoding, hand it to CaDiCaL and free
/// it again (measured on a loaded 2-core machine: 4 s for 376000 units, rounded up). None of
/// that can be interrupted, so a budget whose encoding would not even be built by the deadline
/// is not started.
const BUILD_SECS_PER_UNIT: f64 = 1.2e-5;

/// Whether encodings for the budgets `ts` could not be built before `deadline`.
pub(crate) fn no_time_to_build(
    problem: &Problem,
    pes: u32,
    ts: &[u64],
    deadline: Option<Instant>,
) -> bool {
    let Some(d) = deadline else {
        return false;
    };
    let units: u128 = ts
        .iter()
        .map(|&t| Model::size_estimate(problem, pes, t))
        .sum();
    let left = d.saturating_duration_since(Instant::now()).as_secs_f64();
    units as f64 * BUILD_SECS_PER_UNIT > left
}

/// Builds the encoding for budget `t`, refusing sizes beyond [`MAX_ENCODING_SIZE`].
pub fn encoding(
    problem: &Problem,
    pes: u32,
    t: u64,
    opts: EncodeOptions,
) -> Result<Encoding, ExactError> {
    let size = Model::size_estimate(problem, pes, t);
    if size > MAX_ENCODING_SIZE {
        return Err(ExactError::TooLarge(format!(
            "the exact scheduler handles small layers only: {} tokens, dim {}, {} head(s) on {pes} \
             PEs for {t} cycles would need about {size} variables (limit {MAX_ENCODING_SIZE})",
            problem.tokens, problem.dim, problem.heads
        )));
    }
    let model = Model::build(problem, pes, t as i64);
    Ok(encode(model, opts))
}

/// Decides budget `t`; on SAT also returns the decoded schedule.
pub fn solve_budget(
    problem: &Problem,
    pes: u32,
    t: u64,
    deadline: Option<Instant>,
    opts: &Options,
) -> Result<(Attempt, Option<RingSchedule>), ExactError> {
    let start = Instant::now();
    if problem.necessary_ops() > u64::from(pes).saturating_mul(t) {
        // Fewer op slots than ops: infeasible by counting, no solver needed.
        let attempt = Attempt {
            t,
            verdict: Verdict::Unsat,
            seconds: start.elapsed().as_secs_f64(),
            variables: 0,
            clauses: 0,
        };
        return Ok((attempt, None));
    }
    if no_time_to_build(problem, pes, &[t], deadline) {
        let attempt = Attempt {
            t,
            verdict: Verdict::Unknown,
            seconds: start.elapsed().as_secs_f64(),
            variables: 0,
            clauses: 0,
        };
        return Ok((attempt, None));
    }
    let enc = encoding(
        problem,
        pes,
        t,
        EncodeOptions {
            symmetry_breaking: opts.symmetry_breaking,
            slack_limit: true,
            dominance: opts.dominance,
        },
    )?;
    let (variables, clauses) = (enc.variables(), enc.clauses());
    let mut solver: cadical::Solver<Deadline> = cadical::Solver::new();
    solver.reserve(enc.cnf.vars);
    for clause in enc.cnf.clauses.split(|&l| l == 0) {
        if !clause.is_empty() {
            solver.add_clause(clause.iter().copied());
        }
    }
    solver.set_callbacks(Some(Deadline(deadline)));
    if let Some(limit) = opts.conflict_limit {
        let limit = i32::try_from(limit).unwrap_or(i32::MAX);
        solver
            .set_limit("conflicts", limit)
            .map_err(|e| ExactError::Internal(format!("{e:?}")))?;
    }
    let verdict = if deadline.is_some_and(|d| Instant::now() >= d) {
        Verdict::Unknown
    } else {
        match solver.solve() {
            Some(true) => Verdict::Sat,
            Some(false) => Verdict::Unsat,
            None => Verdict::Unknown,
        }
    };
    let schedule = if verdict == Verdict::Sat {
        let s =
            decode(&enc, |lit| solver.value(lit).unwrap_or(false)).map_err(ExactError::Internal)?;
        Some(s)
    } else {
        None
    };
    let attempt = Attempt {
        t,
        verdict,
        seconds: start.elapsed().as_secs_f64(),
        variables,
        clauses,
    };
    Ok((attempt, schedule))
}

/// Is `schedule` (of `cycles` cycles or fewer) a model of the encoding for budget `cycles`, once
/// the solver completes the transfers and preloads? Fixes only where and when every op runs.
/// A schedule that runs correctly must pass, so this checks the encoding against the heuristic
/// schedulers.
pub fn admits(
    problem: &Problem,
    pes: u32,
    cycles: u64,
    schedule: &RingSchedule,
    deadline: Option<Instant>,
) -> Result<Verdict, ExactError> {
    // Only the machine's rules: the heuristics' schedules need not be in normal form.
    let plain = EncodeOptions {
        symmetry_breaking: false,
        slack_limit: false,
        dominance: false,
    };
    let enc = encoding(problem, pes, cycles, plain)?;
    let placed = super::hint::placement(&enc.model, schedule).map_err(ExactError::Internal)?;
    let mut solver: cadical::Solver<Deadline> = cadical::Solver::new();
    for clause in enc.cnf.clauses.split(|&l| l == 0) {
        if !clause.is_empty() {
            solver.add_clause(clause.iter().copied());
        }
    }
    solver.set_callbacks(Some(Deadline(deadline)));
    let assumptions: Vec<i32> = placed
        .iter()
        .map(|&(o, p, t)| enc.run[o].at(p, t))
        .collect();
    Ok(match solver.solve_with(assumptions) {
        Some(true) => Verdict::Sat,
        Some(false) => Verdict::Unsat,
        None => Verdict::Unknown,
    })
}

/// The best heuristic schedule that runs only the necessary ops (the model's ops), as a start
/// for the neighbourhood search.
fn heuristic_start(problem: &Problem, pes: u32) -> Option<RingSchedule> {
    let candidates = select::run(problem, pes, Choice::Auto).ok()?;
    candidates
        .iter()
        .filter_map(|a| a.schedule(problem, pes).ok())
        .filter(|s| s.ops.total() == problem.necessary_ops())
        .min_by_key(RingSchedule::cycles)
}

/// Finds a schedule with the fewest cycles for `layer` on `pes` PEs, with a proof when the limits
/// allow. Falls back on `compiler::compile`'s schedule when SAT finds nothing better.
pub fn optimal(layer: &lang::Layer, pes: u32, opts: &Options) -> Result<Outcome, ExactError> {
    optimal_with_progress(layer, pes, opts, &mut |_| {})
}

/// Where a running search is, for a progress display.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// The budget about to be decided; `None` while the heuristic schedule is being shortened.
    pub budget: Option<u64>,
    /// Cycles of the best schedule known so far.
    pub best: u64,
    /// No schedule has fewer cycles than this (the lower bound or a refuted budget + 1).
    pub proven: u64,
}

/// [`optimal`], calling `progress` before each stage of the search.
pub fn optimal_with_progress(
    layer: &lang::Layer,
    pes: u32,
    opts: &Options,
    progress: &mut dyn FnMut(Progress),
) -> Result<Outcome, ExactError> {
    let started = Instant::now();
    let deadline = opts.time_limit.map(|d| started + d);
    if pes == 0 {
        return Err(ExactError::Compile(CompileError::Internal(
            crate::Internal::Usage("a ring needs at least one PE".into()),
        )));
    }
    let problem = problem_of(layer)?;
    if let Some(why) = problem.needs_plain("the exact scheduler") {
        // The model (docs/exact.md) knows the paper's operations only: no row maximum.
        return Err(ExactError::Compile(CompileError::Refused(
            crate::passes::select::Refusal {
                culprit: crate::passes::select::Culprit::Softmax,
                message: why,
                note: "add `softmax = plain;` to the layer for `attnc optimal`; `attnc compile` schedules the safe form".into(),
            },
        )));
    }
    let lb = problem.lower_bound(pes);
    let copts = CompileOptions {
        pes,
        ..Default::default()
    };
    let heuristic = crate::compile(layer, &copts).ok();
    let heuristic_cycles = heuristic.as_ref().map(|c| c.manifest.cycles);
    // Every op in sequence on one PE is always a schedule, so this budget is always enough.
    let serial = problem.necessary_ops().max(1);
    let known = match heuristic_cycles {
        Some(c) if opts.sat_only => c + 1,
        Some(c) => c,
        None => serial + 1,
    };
    let mut best: Option<RingSchedule> = None;
    let mut best_cycles = known;
    let mut improvements = Vec::new();
    let mut too_large = None;
    if opts.improve && !opts.sat_only && lb < known {
        if let Some(start) = heuristic_start(&problem, pes) {
            progress(Progress {
                budget: None,
                best: best_cycles,
                proven: lb,
            });
            // Three quarters of the time limit at most (a minute without one): on layers where it
            // matters the full search rarely settles a budget, and a shorter schedule found here
            // is the one it has to refute below.
            let until = match (opts.time_limit, opts.conflict_limit) {
                (Some(limit), _) => Some(started + limit * 3 / 4),
                // The conflict limit bounds the work instead, deterministically.
                (None, Some(_)) => None,
                (None, None) => Some(started + Duration::from_secs(60)),
            };
            match improve::improve(&problem, pes, &start, lb, until, opts.conflict_limit) {
                Ok((found, steps)) => {
                    improvements = steps;
                    if let Some(s) = found {
                        best_cycles = s.cycles() as u64;
                        best = Some(s);
                    }
                }
                Err(ExactError::TooLarge(msg)) => too_large = Some(msg),
                Err(e) => return Err(e),
            }
        }
    }
    let cap = opts
        .max_cycles
        .unwrap_or(u64::MAX)
        .min(best_cycles.saturating_sub(1));

    let mut attempts = Vec::new();
    let mut proven = lb;
    let mut timed_out = false;
    let mut run = |t: u64,
                   attempts: &mut Vec<Attempt>,
                   best: &mut Option<RingSchedule>,
                   best_cycles: &mut u64,
                   proven: &mut u64,
                   too_large: &mut Option<String>|
     -> Result<Verdict, ExactError> {
        progress(Progress {
            budget: Some(t),
            best: *best_cycles,
            proven: *proven,
        });
        let (attempt, schedule) = match solve_budget(&problem, pes, t, deadline, opts) {
            Err(ExactError::TooLarge(msg)) => {
                *too_large = Some(msg);
                return Ok(Verdict::Unknown);
            }
            other => other?,
        };
        let verdict = attempt.verdict;
        attempts.push(attempt);
        match verdict {
            Verdict::Sat => {
                let s = schedule.ok_or_else(|| {
                    ExactError::Internal("a satisfiable model gave no schedule".into())
                })?;
                let c = s.cycles() as u64;
                if c < *best_cycles {
                    *best_cycles = c;
                    *best = Some(s);
                }
            }
            Verdict::Unsat => *proven = (*proven).max(t + 1),
            Verdict::Unknown => {}
        }
        Ok(verdict)
    };

    if lb <= cap {
        match opts.strategy {
            Strategy::Up => {
                let mut t = lb;
                while t <= cap && t < best_cycles {
                    match run(
                        t,
                        &mut attempts,
                        &mut best,
                        &mut best_cycles,
                        &mut proven,
                        &mut too_large,
                    )? {
                        Verdict::Unsat => t += 1,
                        Verdict::Sat => break,
                        Verdict::Unknown => {
                            timed_out = too_large.is_none();
                            break;
                        }
                    }
                }
            }
            Strategy::Down => {
                let mut t = cap;
                while t >= proven && t < best_cycles {
                    match run(
                        t,
                        &mut attempts,
                        &mut best,
                        &mut best_cycles,
                        &mut proven,
                        &mut too_large,
                    )? {
                        Verdict::Sat => t = best_cycles.saturating_sub(1).min(cap),
                        Verdict::Unsat => break,
                        Verdict::Unknown => {
                            timed_out = too_large.is_none();
                            break;
                        }
                    }
                }
            }
            Strategy::Bisect => {
                let mut hi = cap + 1;
                while proven < hi.min(best_cycles) {
                    let top = hi.min(best_cycles);
                    let t = proven + (top - proven) / 2;
                    match run(
                        t,
                        &mut attempts,
                        &mut best,
                        &mut best_cycles,
                        &mut proven,
                        &mut too_large,
                    )? {
                        Verdict::Sat | Verdict::Unsat => {}
                        Verdict::Unknown => {
                            timed_out = too_large.is_none();
                            break;
                        }
                    }
                    hi = hi.min(best_cycles);
                }
            }
        }
    }

    if best.is_none() {
        best_cycles = best_cycles.min(heuristic_cycles.unwrap_or(u64::MAX));
    }
    timed_out |= deadline.is_some_and(|d| Instant::now() >= d);
    let proved_optimal = proven >= best_cycles;
    let candidates: Vec<CandidateInfo> = heuristic
        .as_ref()
        .map(|c| CandidateInfo {
            schedule: c.manifest.schedule.clone(),
            cycles: c.manifest.cycles,
            max_mem_words: c.manifest.mem_words.iter().copied().max().unwrap_or(0),
            fits: true,
        })
        .into_iter()
        .collect();
    match best {
        Some(schedule) => {
            let reason = if proved_optimal {
                format!(
                    "SAT: fewest cycles possible in the exact model (a budget of {} cycles is {})",
                    best_cycles.saturating_sub(1),
                    if best_cycles == lb {
                        "below the lower bound"
                    } else {
                        "unsatisfiable"
                    }
                )
            } else {
                "SAT: best schedule found within the limits (not proved optimal)".into()
            };
            let mut candidates = candidates;
            candidates.push(CandidateInfo {
                schedule: decode::NAME.into(),
                cycles: best_cycles,
                max_mem_words: 0,
                fits: true,
            });
            let selection = Selection {
                chosen: decode::NAME.into(),
                reason,
                candidates,
                stopped: Vec::new(),
            };
            let (programs, manifest) = crate::finish(layer, &problem, pes, &schedule, selection)
                .map_err(|e| ExactError::Internal(e.to_string()))?;
            let max_mem = programs.iter().map(|p| p.mem_words).max().unwrap_or(0);
            let mut manifest = manifest;
            if let Some(c) = manifest.selection.candidates.last_mut() {
                c.max_mem_words = max_mem;
            }
            Ok(Outcome {
                programs,
                manifest,
                schedule: Some(schedule),
                cycles: best_cycles,
                proved_optimal,
                lower_bound: lb,
                proven_bound: proven.min(best_cycles),
                heuristic_cycles,
                source: Source::Sat,
                attempts,
                improvements,
                timed_out,
                too_large,
            })
        }
        None => {
            let Some(c) = heuristic else {
                if let Some(msg) = too_large {
                    return Err(ExactError::TooLarge(msg));
                }
                return Err(ExactError::NoSchedule(format!(
                    "no schedule found within {} cycles{}, and the heuristic schedulers do not \
                     apply to this layer",
                    cap,
                    if timed_out {
                        " before the time limit"
                    } else {
                        ""
                    }
                )));
            };
            let mut manifest = c.manifest;
            if proved_optimal {
                manifest.selection.reason = format!(
                    "{}; proved optimal by SAT (a budget of {} cycles is unsatisfiable)",
                    manifest.selection.reason,
                    best_cycles.saturating_sub(1)
                );
            }
            Ok(Outcome {
                programs: c.programs,
                manifest,
                schedule: None,
                cycles: best_cycles,
                proved_optimal,
                lower_bound: lb,
                proven_bound: proven.min(best_cycles),
                heuristic_cycles,
                source: Source::Heuristic,
                attempts,
                improvements,
                timed_out,
                too_large,
            })
        }
    }
}
