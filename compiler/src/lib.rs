//! attnc's compiler: layer description → dataflow IR → ring schedule → per-PE microcode.
//!
//! The pipeline is a fixed list of passes ([`passes::list`]), each in its own file; the scheduling
//! passes come from the registry in [`scheduler`]. This crate does no IO: the CLI reads files,
//! calls [`compile`], and writes what it returns.
//!
//! # Example
//!
//! Compile a layer for a ring of two PEs, run the programs in the interpreter and compare the
//! result with the f64 reference:
//!
//! ```
//! let parsed = lang::parse(0, "layer t { tokens = 4; dim = 2; mask = causal; }");
//! assert!(parsed.diagnostics.is_empty());
//! let options = compiler::Options {
//!     pes: 2,
//!     ..Default::default()
//! };
//! let compiled = compiler::compile(&parsed.layers[0], &options).expect("compiles");
//! assert_eq!(compiled.programs.len(), 2);
//!
//! let inputs = runtime::exec::random_inputs(&compiled.manifest, 7);
//! let run = runtime::exec::execute(
//!     isa::F32Domain,
//!     compiled.programs.clone(),
//!     &compiled.manifest,
//!     &inputs,
//!     &mut isa::NoObserver,
//! )
//! .expect("runs");
//! assert_eq!(run.stats.cycles, compiled.manifest.cycles);
//! let want = runtime::exec::reference_output(&compiled.manifest, &inputs).expect("reference");
//! assert!(runtime::exec::max_abs_err(&run.outputs["y"], &want) < 1e-4);
//! ```

pub mod chains;
#[cfg(feature = "exact")]
pub mod exact;
pub mod flow;
pub mod ir;
pub mod passes;
pub(crate) mod pe_map;
pub mod problem;
pub mod schedule;
pub mod scheduler;
pub mod stream;
pub mod validate;

// The manifest and execution live in the runtime crate (the verifier uses them without the
// compiler); re-exported because a compile produces a manifest.
pub use runtime::{exec, manifest, reference};

use manifest::{LayerInfo, Manifest, PeFiles, Placement};
use passes::select::{Choice, Refusal};
use scheduler::Scheduler;

use passes::{analyze, codegen, lower, select};
use std::collections::{BTreeMap, HashSet};

/// Largest layer, in necessary operations, that `compile` takes. Compiling holds every
/// candidate's schedule and programs at once: about 320 bytes per operation at peak (measured:
/// 2.0 GB for 6.4M operations on 8 PEs), so this keeps a compile under about 2 GB.
pub const MAX_OPS: u64 = 6_000_000;

/// Above this many necessary operations a stream at the lower bound is kept without building
/// the unrolled candidates, which can at best tie it (scheduling and unrolling them takes about
/// a second and more from here: 64 tokens, `d = 32` on 4 PEs, 266 240 operations, about 1 s).
const TIE_UNBUILT_OPS: u64 = 100_000;

/// Peak compile memory per necessary operation, in bytes, for the refusal message.
const PEAK_BYTES_PER_OP: u64 = 320;

/// `--dump-after` name for the schedule that won selection, whichever pass made it.
pub const CHOSEN_SCHEDULE: &str = "schedule";

/// How to compile.
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub pes: u32,
    pub schedule: Choice,
    /// Name of a pass whose result to render into [`Compiled::dump`].
    pub dump_after: Option<String>,
    /// Largest memory, in words per PE, a schedule may use (`--mem`).
    pub mem_limit: Option<u32>,
    /// Preload every input element on one PE only: no schedule may use preload copies (an
    /// element written to several PEs before cycle 0, listed in the manifest's `copies`), and
    /// the manifest's `bound` is the one for single placements. Off by default.
    pub single_placement: bool,
    /// Fold an unrolled schedule's programs into loop programs (the `reroll` pass) and emit
    /// those when their binaries are smaller in total than the flat ones; values are packed by
    /// kind (`codegen::Packing::ByKind`, repeating addresses) where that folds further and its
    /// words fit `mem_limit`, or without one 5 % over the tight packing. With it, `auto` also
    /// weighs the stream schedule (loop programs only) against the unrolled candidates below
    /// the unrolling limit. Off by default for library callers, who get flat, tightly packed
    /// programs; `attnc compile` turns it on unless `--flat`.
    pub reroll: bool,
}

/// Everything a compile produces; the CLI decides what to write.
pub struct Compiled {
    /// One flat program per PE from an unrolled schedule (also when the rerolled form is what
    /// the manifest describes: both mean the same run); empty for the stream schedule.
    pub programs: Vec<isa::Program>,
    /// One loop program per PE when the manifest's `programs` is `loops` (the stream schedule,
    /// or a rerolled unrolled one); empty otherwise. What a writer emits when not empty.
    pub loops: Vec<isa::LoopProgram>,
    pub manifest: Manifest,
    /// The ring scheduler whose schedule was kept; `None` for the stream schedule.
    pub scheduler: Option<&'static dyn Scheduler>,
    pub dump: Option<String>,
    /// Wall time of each pass run, in order (`--time-passes`).
    pub timings: Vec<(String, f64)>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum CompileError {
    /// The layer cannot be scheduled as asked; names the field to blame.
    Refused(Refusal),
    /// `--dump-after` named no pass.
    UnknownPass(String),
    /// A bug: a pass produced something the next one cannot take.
    Internal(Internal),
}

/// Which pass failed its contract, with its typed, located errors.
#[derive(Clone, Debug, PartialEq)]
pub enum Internal {
    /// Analysis found a graph lowering should not have produced.
    Analyze(analyze::AnalyzeError),
    /// A scheduling pass (named) made a schedule the validator rejects; each error names its PE
    /// and cycle.
    Schedule {
        pass: String,
        errors: Vec<schedule::ScheduleError>,
    },
    /// Codegen refused a schedule that validated (the validator's contract broken).
    Codegen(codegen::CodegenError),
    /// The stream schedule's counts do not add up.
    Stream(String),
    /// A caller passed something the compiler's entry points exclude.
    Usage(String),
}

impl std::fmt::Display for Internal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Internal::Analyze(e) => write!(f, "analyze: {}", e.0),
            Internal::Schedule { pass, errors } => {
                write!(f, "{pass}: {}", schedule::render_errors(errors))
            }
            Internal::Codegen(e) => write!(f, "{e}"),
            Internal::Stream(s) | Internal::Usage(s) => f.write_str(s),
        }
    }
}

impl std::fmt::Display for CompileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CompileError::Refused(r) => write!(f, "{}", r.message),
            CompileError::UnknownPass(p) => {
                let names: Vec<&str> = passes::list().iter().map(|(n, _)| *n).collect();
                write!(f, "unknown pass `{p}` (passes: {})", names.join(", "))
            }
            CompileError::Internal(e) => write!(f, "internal compiler error: {e}"),
        }
    }
}

/// Compiles one checked layer for a ring of `opts.pes` PEs.
pub fn compile(layer: &lang::Layer, opts: &Options) -> Result<Compiled, CompileError> {
    let first = compile_as(layer, opts);
    // Copies cost memory: where no schedule with them meets a memory limit, the schedules with
    // one placement per element may.
    match first {
        Err(CompileError::Refused(ref r))
            if matches!(r.culprit, select::Culprit::Memory)
                && opts.mem_limit.is_some()
                && !opts.single_placement =>
        {
            let single = Options {
                single_placement: true,
                ..opts.clone()
            };
            compile_as(layer, &single).or(first)
        }
        other => other,
    }
}

/// [`compile`] as `opts` say, without the retry.
fn compile_as(layer: &lang::Layer, opts: &Options) -> Result<Compiled, CompileError> {
    if let Some(p) = &opts.dump_after {
        if p != CHOSEN_SCHEDULE && !passes::list().iter().any(|(n, _)| n == p) {
            return Err(CompileError::UnknownPass(p.clone()));
        }
    }
    if opts.pes == 0 {
        return Err(CompileError::Refused(Refusal {
            culprit: select::Culprit::Pes,
            message: "a ring needs at least one PE".into(),
            note: "pass `--pes 1` or more".into(),
        }));
    }
    let mut dump = None;
    let wants = |name: &str| opts.dump_after.as_deref() == Some(name);
    let mut timings: Vec<(String, f64)> = Vec::new();
    let mut clock = std::time::Instant::now();
    let mut lap = |name: &str, timings: &mut Vec<(String, f64)>| {
        timings.push((name.to_string(), clock.elapsed().as_secs_f64()));
        clock = std::time::Instant::now();
    };

    let graph = lower::run(layer);
    lap(lower::NAME, &mut timings);
    if wants(lower::NAME) {
        dump = Some(graph.to_string());
    }
    let facts = analyze::run(&graph).map_err(|e| CompileError::Internal(Internal::Analyze(e)))?;
    if wants(analyze::NAME) {
        dump = Some(facts.to_string());
    }
    let problem = problem::Problem {
        copies: !opts.single_placement,
        ..facts.problem
    };
    lap(analyze::NAME, &mut timings);
    let too_big = problem.necessary_ops() > MAX_OPS;
    if opts.schedule == Choice::Stream || (too_big && opts.schedule == Choice::Auto) {
        return compile_stream(layer, &problem, opts, too_big, dump, timings);
    }
    if too_big {
        return Err(CompileError::Refused(Refusal {
            culprit: select::Culprit::Tokens,
            message: format!(
                "this layer needs {} operations; compiling it would take about {:.1} GB of memory",
                problem.necessary_ops(),
                (problem.necessary_ops().saturating_mul(PEAK_BYTES_PER_OP)) as f64 / 1e9
            ),
            note: format!("attnc unrolls layers of up to {MAX_OPS} operations; `--schedule auto` or `stream` emits loop programs for larger ones"),
        }));
    }
    let candidates =
        select::run(&problem, opts.pes, opts.schedule).map_err(CompileError::Refused)?;
    // The stream competes below the unrolling limit too: its loop programs are built in
    // microseconds, and where its deferred normalisation (`d` divisions per row instead of one
    // per weight) outweighs its rescaling it takes fewer cycles than any unrolled schedule can.
    // Only with loop output allowed (not `--flat`) and no pass dump asked for. `tight` keeps to
    // `--mem` or the stream's default allowance; without `--mem`, `ample` (below) takes the
    // longest lag and `roomy` (built once the unrolled candidates are known) lets values trail
    // keys as far as the words the unrolled winner takes allow, so choosing it never costs
    // memory.
    let competes = opts.schedule == Choice::Auto && opts.reroll && opts.dump_after.is_none();
    let build_stream = |limit: Option<u32>| {
        stream::build(&problem, opts.pes, limit)
            .ok()
            .filter(|s| opts.mem_limit.is_none_or(|l| stream::max_words(s) <= l))
    };
    let tight = competes.then(|| build_stream(opts.mem_limit)).flatten();
    // Without `--mem`, the fewest cycles is what was asked for: `ample` lets values trail keys
    // by as many ring steps as help (the whole ring: no rescaling at all), whatever words that
    // takes. The layer is below the unrolling limit, so those words are bounded by its size.
    let ample = (competes && opts.mem_limit.is_none())
        .then(|| build_stream(Some(u32::MAX)))
        .flatten()
        .filter(|a| tight.as_ref().is_none_or(|t| a.cycles < t.cycles));
    if competes {
        lap(passes::schedule_stream::NAME, &mut timings);
    }
    let fastest = tight
        .iter()
        .chain(&ample)
        .min_by_key(|s| (s.cycles, stream::max_words(s)));
    if let Some(s) = fastest {
        // No unrolled schedule takes fewer cycles than its formulation's lower bound, and a
        // candidate may know a floor above the bound from its work per PE alone (the row
        // dataflow: its busiest PE's operations). A stream below every candidate's floor wins
        // whatever building them would give, so they are not built. At the floor one could
        // only tie, and a tie goes to fewer words, which only building it tells; on a layer of
        // more than `TIE_UNBUILT_OPS` operations that takes a second or more and emits flat
        // programs far beyond a program memory, so there the stream's loop programs are kept
        // unbuilt-against (`--mem` is how to ask for fewer words).
        let lb = problem.lower_bound(opts.pes);
        let floor = candidates
            .iter()
            .map(|a| a.floor(&problem, opts.pes))
            .min()
            .unwrap_or(lb)
            .max(lb);
        if s.cycles < floor || (s.cycles == floor && problem.necessary_ops() > TIE_UNBUILT_OPS) {
            let reason = if s.cycles < lb {
                format!(
                    "fewest cycles: the stream's {} is below the {lb} every unrolled schedule needs (one division per weight); loop programs",
                    s.cycles
                )
            } else if s.cycles < floor {
                format!(
                    "fewest cycles: the stream's {} is below the {floor} that the unrolled candidates' work per PE needs; loop programs",
                    s.cycles
                )
            } else if floor == lb {
                format!(
                    "fewest cycles: the stream reaches the lower bound {lb}, which no unrolled schedule can beat; loop programs"
                )
            } else {
                format!(
                    "fewest cycles: the stream reaches the {floor} that the unrolled candidates' work per PE needs, which none of them can beat; loop programs"
                )
            };
            let tried = vec![stream::candidate(s)];
            return finish_stream(
                layer,
                &problem,
                opts,
                s.clone(),
                reason,
                (tried, Vec::new()),
                dump,
                timings,
            );
        }
    }
    if wants(select::NAME) {
        let names: Vec<&str> = candidates.iter().map(|a| a.title()).collect();
        dump = Some(format!("candidates: {}", names.join("; ")));
    }
    // Every candidate is scheduled and emitted, and the one with the fewest cycles among those
    // within the memory limit kept; ties go to less memory, then to the more specialised one.
    // Only the words a candidate's packing takes are weighed; its microcode is written only if
    // it is kept, or ties a stream in cycles (then the sizes of the two decide). The first field
    // is the candidate's place in preference order.
    type Best = (
        usize,
        &'static dyn Scheduler,
        schedule::RingSchedule,
        codegen::Packed,
    );
    let mut best: Option<Best> = None;
    // Passes that can stop once they are sure to lose are built after the others, with the
    // fewest cycles so far as their limit (a tie could still win on memory, so it is allowed).
    // The winner is the same as building them in preference order: the key orders equal cycles
    // and memory by that order, and a stopped pass would have taken more cycles than the best.
    let mut order: Vec<(usize, &'static dyn Scheduler)> =
        candidates.into_iter().enumerate().collect();
    order.sort_by_key(|(i, alg)| (alg.stops_early(), *i));
    let mut stopped: Vec<manifest::StoppedInfo> = Vec::new();
    let mut built: Vec<(usize, manifest::CandidateInfo)> = Vec::new();
    for (at, alg) in order {
        let internal = |errors: Vec<schedule::ScheduleError>| {
            CompileError::Internal(Internal::Schedule {
                pass: alg.pass().to_string(),
                errors,
            })
        };
        let limit = best.as_ref().map_or(usize::MAX, |(_, _, b, _)| b.cycles());
        let Some(s) = alg
            .schedule_within(&problem, opts.pes, limit)
            .map_err(internal)?
        else {
            lap(alg.pass(), &mut timings);
            stopped.push(manifest::StoppedInfo {
                schedule: alg.pass().to_string(),
                above: limit as u64,
            });
            continue;
        };
        // The contract with codegen: a schedule that validates can always be emitted.
        validate::validate(&s).map_err(internal)?;
        lap(alg.pass(), &mut timings);
        if wants(alg.pass()) {
            dump = Some(s.to_string());
        }
        let e = codegen::pack(&s, codegen::Packing::Tight)
            .map_err(|e| CompileError::Internal(Internal::Codegen(e)))?;
        lap(&format!("{} ({})", codegen::NAME, alg.pass()), &mut timings);
        let max_mem = packed_words(&e);
        let fits = opts.mem_limit.is_none_or(|limit| max_mem <= limit);
        built.push((
            at,
            manifest::CandidateInfo {
                schedule: s.algorithm.to_string(),
                cycles: s.cycles() as u64,
                max_mem_words: max_mem,
                fits,
            },
        ));
        let key = (s.cycles(), max_mem, at);
        if fits
            && best
                .as_ref()
                .is_none_or(|(b_at, _, b, be)| key < (b.cycles(), packed_words(be), *b_at))
        {
            best = Some((at, alg, s, e));
        }
    }
    built.sort_by_key(|(at, _)| *at);
    let mut tried: Vec<manifest::CandidateInfo> = built.into_iter().map(|(_, c)| c).collect();
    let unrolled = best
        .as_ref()
        .map(|(_, _, b, e)| (b.cycles() as u64, packed_words(e)));
    let roomy = unrolled
        .filter(|_| competes && opts.mem_limit.is_none())
        .and_then(|(_, words)| build_stream(Some(words)))
        .filter(|r| tight.as_ref().is_none_or(|t| r.cycles < t.cycles));
    let streams: Vec<passes::schedule_stream::Stream> =
        tight.into_iter().chain(ample).chain(roomy).collect();
    tried.extend(streams.iter().map(stream::candidate));
    // A tie in cycles goes to the stream only if its loop programs are smaller than the
    // unrolled candidate's flat ones and it needs no more words: on a layer small enough to tie
    // the flat programs can be the smaller.
    let flat_bytes =
        |e: &codegen::Emitted| -> u64 { e.programs.iter().map(isa::binary::encoded_len).sum() };
    let loop_bytes = |s: &passes::schedule_stream::Stream| -> u64 {
        s.programs.iter().map(isa::looped_binary::encoded_len).sum()
    };
    let among = |tried: &[manifest::CandidateInfo]| {
        format!(
            "fewest cycles among {} candidates{}{}",
            tried.len() + stopped.len(),
            if stopped.is_empty() {
                String::new()
            } else {
                format!(" ({} stopped once sure to lose)", stopped.len())
            },
            if opts.mem_limit.is_some() {
                " within the memory limit"
            } else {
                ""
            }
        )
    };
    let stream_reason =
        |tried: &[manifest::CandidateInfo]| format!("{}; loop programs", among(tried));
    let fastest = streams
        .into_iter()
        .min_by_key(|s| (s.cycles, stream::max_words(s)));
    let Some((_, chosen, schedule, packed)) = best else {
        if let Some(s) = fastest {
            let reason = stream_reason(&tried);
            return finish_stream(
                layer,
                &problem,
                opts,
                s,
                reason,
                (tried, stopped),
                dump,
                timings,
            );
        }
        let smallest = tried.iter().min_by_key(|c| c.max_mem_words).map_or_else(
            || "no schedule was built".to_string(),
            |c| format!("the smallest, {}, needs {}", c.schedule, c.max_mem_words),
        );
        return Err(CompileError::Refused(Refusal {
            culprit: select::Culprit::Memory,
            message: format!(
                "no schedule fits in {} words per PE ({smallest})",
                opts.mem_limit.unwrap_or(0),
            ),
            note: "raise --mem, or use more PEs".into(),
        }));
    };
    let cycles = schedule.cycles() as u64;
    let fastest = match fastest {
        Some(s) if s.cycles < cycles => {
            let reason = stream_reason(&tried);
            return finish_stream(
                layer,
                &problem,
                opts,
                s,
                reason,
                (tried, stopped),
                dump,
                timings,
            );
        }
        other => other,
    };
    let mut emitted = packed
        .emit(&schedule)
        .map_err(|e| CompileError::Internal(Internal::Codegen(e)))?;
    drop(packed);
    let ties = |s: &passes::schedule_stream::Stream| {
        s.cycles == cycles
            && stream::max_words(s) <= max_words(&emitted)
            && loop_bytes(s) < flat_bytes(&emitted)
    };
    if let Some(s) = fastest.filter(ties) {
        let reason = stream_reason(&tried);
        return finish_stream(
            layer,
            &problem,
            opts,
            s,
            reason,
            (tried, stopped),
            dump,
            timings,
        );
    }
    if wants(CHOSEN_SCHEDULE) {
        dump = Some(schedule.to_string());
    }
    let mut loops = Vec::new();
    if opts.reroll || wants(passes::reroll::NAME) {
        let reroll_all = |e: &codegen::Emitted| -> Vec<isa::LoopProgram> {
            e.programs.iter().map(passes::reroll::run).collect()
        };
        let size =
            |l: &[isa::LoopProgram]| -> u64 { l.iter().map(isa::looped_binary::encoded_len).sum() };
        let mut rerolled = reroll_all(&emitted);
        lap(passes::reroll::NAME, &mut timings);
        // Packing values by kind repeats addresses, so the programs fold further, but it costs
        // words: spent within `--mem`, or without one within 5 % of the tight packing, so that
        // loop programs never cost memory a user did not allow.
        if opts.reroll {
            let tight = max_words(&emitted);
            let allowance = opts
                .mem_limit
                .unwrap_or_else(|| tight.saturating_add(tight / 20));
            let by_kind = codegen::run(
                &schedule,
                codegen::Packing::ByKind {
                    limit: Some(allowance),
                },
            )
            .map_err(|e| CompileError::Internal(Internal::Codegen(e)))?;
            let words = max_words(&by_kind);
            if words <= allowance {
                let folded = reroll_all(&by_kind);
                if size(&folded) < size(&rerolled) {
                    emitted = by_kind;
                    rerolled = folded;
                    if let Some(c) = tried.iter_mut().find(|c| c.schedule == schedule.algorithm) {
                        c.max_mem_words = words;
                    }
                }
            }
            lap(
                &format!("{} (by kind), reroll", codegen::NAME),
                &mut timings,
            );
        }
        if wants(passes::reroll::NAME) {
            dump = Some(
                rerolled
                    .iter()
                    .map(|p| p.to_text())
                    .collect::<Vec<_>>()
                    .join("\n"),
            );
        }
        let flat: u64 = emitted.programs.iter().map(isa::binary::encoded_len).sum();
        if opts.reroll && size(&rerolled) < flat {
            loops = rerolled;
        }
    }
    if wants(codegen::NAME) {
        dump = Some(
            emitted
                .programs
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join("\n"),
        );
    }
    let reason = if tried.len() + stopped.len() == 1 {
        "the only schedule that applies (or the one forced with --schedule)".to_string()
    } else {
        among(&tried)
    };
    let selection = manifest::Selection {
        chosen: schedule.algorithm.to_string(),
        reason,
        candidates: tried,
        stopped,
    };
    let mut manifest = build_manifest(layer, &problem, opts.pes, &schedule, &emitted, selection);
    if !loops.is_empty() {
        manifest.format_version = manifest.format_version.max(manifest::LAYOUT_FORMAT_VERSION);
        manifest.programs = manifest::ProgramKind::Loops;
        manifest.files =
            runtime::manifest::Files::Pattern(runtime::manifest::FilePattern::standard());
    }
    lap("manifest", &mut timings);
    Ok(Compiled {
        programs: emitted.programs,
        loops,
        manifest,
        scheduler: Some(chosen),
        dump,
        timings,
    })
}

/// The stream schedule: forced, or the only one for a layer too large to unroll.
fn compile_stream(
    layer: &lang::Layer,
    problem: &problem::Problem,
    opts: &Options,
    too_big: bool,
    mut dump: Option<String>,
    mut timings: Vec<(String, f64)>,
) -> Result<Compiled, CompileError> {
    let clock = std::time::Instant::now();
    let built = stream::build(problem, opts.pes, opts.mem_limit).map_err(|mut r| {
        if too_big && opts.schedule == Choice::Auto {
            r.message = format!(
                "this layer needs {} operations, more than the {MAX_OPS} attnc unrolls, and the stream schedule (loop programs, any size) does not apply: {}",
                problem.necessary_ops(),
                r.message
            );
        }
        CompileError::Refused(r)
    })?;
    timings.push((
        passes::schedule_stream::NAME.to_string(),
        clock.elapsed().as_secs_f64(),
    ));
    let words = stream::max_words(&built);
    if let Some(limit) = opts.mem_limit.filter(|&l| words > l) {
        return Err(CompileError::Refused(Refusal {
            culprit: select::Culprit::Memory,
            message: format!(
                "no schedule fits in {limit} words per PE ({} needs {words})",
                passes::schedule_stream::NAME
            ),
            note: "raise --mem, or use more PEs".into(),
        }));
    }
    let wants = |name: &str| opts.dump_after.as_deref() == Some(name);
    if [
        CHOSEN_SCHEDULE,
        passes::schedule_stream::NAME,
        codegen::NAME,
    ]
    .iter()
    .any(|n| wants(n))
    {
        dump = Some(
            built
                .programs
                .iter()
                .map(|p| p.to_text())
                .collect::<Vec<_>>()
                .join("\n"),
        );
    }
    let reason = if too_big {
        format!("the layer is larger than the {MAX_OPS} operations attnc unrolls; loop programs")
    } else {
        "forced with --schedule stream".to_string()
    };
    let tried = vec![stream::candidate(&built)];
    finish_stream(
        layer,
        problem,
        opts,
        built,
        reason,
        (tried, Vec::new()),
        dump,
        timings,
    )
}

/// The candidates built, and those stopped once they were sure to lose (the manifest's
/// `selection`).
type Weighed = (Vec<manifest::CandidateInfo>, Vec<manifest::StoppedInfo>);

/// The compile's result when the stream schedule was kept, with the candidates weighed.
#[allow(clippy::too_many_arguments)]
fn finish_stream(
    layer: &lang::Layer,
    problem: &problem::Problem,
    opts: &Options,
    built: passes::schedule_stream::Stream,
    mut reason: String,
    (candidates, stopped): Weighed,
    dump: Option<String>,
    timings: Vec<(String, f64)>,
) -> Result<Compiled, CompileError> {
    if built.lag > 0 {
        reason += &format!("; values trail keys by {} ring steps", built.lag);
    }
    let mut manifest = stream::manifest(&layer.name, problem, opts.pes, &built, reason)?;
    manifest.selection.candidates = candidates;
    manifest.selection.stopped = stopped;
    Ok(Compiled {
        programs: Vec::new(),
        loops: built.programs,
        manifest,
        scheduler: None,
        dump,
        timings,
    })
}

fn max_words(e: &codegen::Emitted) -> u32 {
    e.programs.iter().map(|p| p.mem_words).max().unwrap_or(0)
}

fn packed_words(p: &codegen::Packed) -> u32 {
    p.mem_words().iter().copied().max().unwrap_or(0)
}

/// The manifest's file list: `pe<N>.s` and `pe<N>.bin` for every PE.
pub(crate) fn pe_files(pes: u32) -> Vec<PeFiles> {
    (0..pes)
        .map(|pe| PeFiles {
            pe,
            text: format!("pe{pe}.s"),
            binary: format!("pe{pe}.bin"),
        })
        .collect()
}

/// The manifest's description of the layer.
pub(crate) fn layer_info(name: &str, problem: &problem::Problem) -> LayerInfo {
    LayerInfo {
        name: name.to_string(),
        tokens: problem.tokens,
        dim: problem.dim,
        heads: problem.heads,
        qkv: if problem.symmetric {
            "shared"
        } else {
            "separate"
        }
        .into(),
        mask: if problem.causal { "causal" } else { "none" }.into(),
        scale: problem.scale,
        softmax: problem.softmax.name().into(),
    }
}

fn build_manifest(
    layer: &lang::Layer,
    problem: &problem::Problem,
    pes: u32,
    schedule: &schedule::RingSchedule,
    emitted: &codegen::Emitted,
    selection: manifest::Selection,
) -> Manifest {
    let (h, n, d) = (
        problem.heads as usize,
        problem.tokens as usize,
        problem.dim as usize,
    );
    let empty = || Placement {
        shape: vec![h, n, d],
        pe: vec![0; h * n * d],
        addr: vec![0; h * n * d],
        layout: None,
        copies: Vec::new(),
    };
    // The first place an element is listed is its placement; any other is a preload copy.
    let fill = |map: &mut BTreeMap<String, Placement>, list: &[(schedule::Element, u32, u32)]| {
        let mut placed: HashSet<schedule::Element> = HashSet::new();
        for &(e, pe, addr) in list {
            let p = map.entry(e.tensor.name().to_string()).or_insert_with(empty);
            let i = (e.head as usize * n + e.row as usize) * d + e.col as usize;
            if placed.insert(e) {
                p.pe[i] = pe;
                p.addr[i] = addr;
            } else {
                p.copies.push(manifest::PreloadCopy {
                    index: i as u64,
                    pe,
                    addr,
                });
            }
        }
    };
    let mut inputs = BTreeMap::new();
    fill(&mut inputs, &emitted.inputs);
    let mut outputs = BTreeMap::new();
    fill(&mut outputs, &emitted.outputs);
    let copies = inputs.values().any(|p| !p.copies.is_empty());
    Manifest {
        format: manifest::FORMAT.into(),
        format_version: if copies {
            manifest::COPIES_FORMAT_VERSION
        } else {
            manifest::FORMAT_VERSION
        },
        layer: layer_info(&layer.name, problem),
        pes,
        cycles: schedule.cycles() as u64,
        lower_bound: problem.lower_bound(pes),
        bound: problem.shape().bound_for(
            pes,
            runtime::layer::Normalisation::PerWeight,
            problem.copies,
        ),
        schedule: schedule.algorithm.into(),
        selection,
        necessary_ops: problem.necessary_ops(),
        normalisation: runtime::layer::Normalisation::PerWeight,
        ops: schedule.ops.into(),
        mem_words: emitted.programs.iter().map(|p| p.mem_words).collect(),
        buffers: Vec::new(),
        programs: manifest::ProgramKind::Flat,
        files: runtime::manifest::Files::List(pe_files(pes)),
        inputs,
        outputs,
    }
}

/// Codegen and manifest for a schedule made outside the pass pipeline (the exact scheduler's):
/// the same tail [`compile`] runs on the schedule it picks.
pub fn finish(
    layer: &lang::Layer,
    problem: &problem::Problem,
    pes: u32,
    schedule: &schedule::RingSchedule,
    selection: manifest::Selection,
) -> Result<(Vec<isa::Program>, Manifest), CompileError> {
    validate::validate(schedule).map_err(|errors| {
        CompileError::Internal(Internal::Schedule {
            pass: schedule.algorithm.to_string(),
            errors,
        })
    })?;
    let emitted = codegen::run(schedule, codegen::Packing::Tight)
        .map_err(|e| CompileError::Internal(Internal::Codegen(e)))?;
    let manifest = build_manifest(layer, problem, pes, schedule, &emitted, selection);
    Ok((emitted.programs, manifest))
}
