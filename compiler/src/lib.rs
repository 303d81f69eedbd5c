//! attnc's compiler: layer description → dataflow IR → ring schedule → per-PE microcode.
//!
//! The pipeline is a fixed list of passes ([`passes::PASSES`]), each in its own file. This crate
//! does no IO: the CLI reads files, calls [`compile`], and writes what it returns.

pub mod chains;
pub mod exact;
pub mod exec;
pub mod flow;
pub mod ir;
pub mod manifest;
pub mod passes;
pub mod problem;
pub mod reference;
pub mod schedule;

use manifest::{LayerInfo, Manifest, PeFiles, Placement};
use passes::select::{Algorithm, Choice, Refusal};
use passes::{analyze, codegen, lower, select};
use std::collections::BTreeMap;

/// `--dump-after` name for the schedule that won selection, whichever pass made it.
pub const CHOSEN_SCHEDULE: &str = "schedule";

/// How to compile.
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub pes: u32,
    pub schedule: Choice,
    /// Name of a pass whose result to render into [`Compiled::dump`].
    pub dump_after: Option<String>,
}

/// Everything a compile produces; the CLI decides what to write.
pub struct Compiled {
    pub programs: Vec<isa::Program>,
    pub manifest: Manifest,
    pub algorithm: Algorithm,
    pub dump: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum CompileError {
    /// The layer cannot be scheduled as asked; names the field to blame.
    Refused(Refusal),
    /// `--dump-after` named no pass.
    UnknownPass(String),
    /// A bug: a pass produced something the next one cannot take.
    Internal(String),
}

impl std::fmt::Display for CompileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CompileError::Refused(r) => write!(f, "{}", r.message),
            CompileError::UnknownPass(p) => {
                let names: Vec<&str> = passes::PASSES.iter().map(|(n, _)| *n).collect();
                write!(f, "unknown pass `{p}` (passes: {})", names.join(", "))
            }
            CompileError::Internal(s) => write!(f, "internal compiler error: {s}"),
        }
    }
}

/// Compiles one checked layer for a ring of `opts.pes` PEs.
pub fn compile(layer: &lang::Layer, opts: &Options) -> Result<Compiled, CompileError> {
    if let Some(p) = &opts.dump_after {
        if p != CHOSEN_SCHEDULE && !passes::PASSES.iter().any(|(n, _)| n == p) {
            return Err(CompileError::UnknownPass(p.clone()));
        }
    }
    assert!(opts.pes > 0, "the CLI rejects --pes 0");
    let mut dump = None;
    let wants = |name: &str| opts.dump_after.as_deref() == Some(name);

    let graph = lower::run(layer);
    if wants(lower::NAME) {
        dump = Some(graph.to_string());
    }
    let facts = analyze::run(&graph).map_err(|e| CompileError::Internal(e.0))?;
    if wants(analyze::NAME) {
        dump = Some(facts.to_string());
    }
    let problem = facts.problem;
    let candidates =
        select::run(&problem, opts.pes, opts.schedule).map_err(CompileError::Refused)?;
    if wants(select::NAME) {
        let names: Vec<String> = candidates.iter().map(|a| a.to_string()).collect();
        dump = Some(format!("candidates: {}", names.join("; ")));
    }
    // Every candidate is scheduled and the one with the fewest cycles kept (the first on a tie,
    // so the most specialised algorithm wins ties).
    let mut best: Option<(Algorithm, schedule::RingSchedule)> = None;
    for alg in candidates {
        let s = alg
            .schedule(&problem, opts.pes)
            .map_err(|e| CompileError::Internal(format!("{}: {e}", alg.pass_name())))?;
        if wants(alg.pass_name()) {
            dump = Some(s.to_string());
        }
        if best.as_ref().is_none_or(|(_, b)| s.cycles() < b.cycles()) {
            best = Some((alg, s));
        }
    }
    let (algorithm, schedule) = best.expect("select returns at least one candidate");
    if wants(CHOSEN_SCHEDULE) {
        dump = Some(schedule.to_string());
    }
    let emitted = codegen::run(&schedule).map_err(|e| CompileError::Internal(e.to_string()))?;
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
    let manifest = build_manifest(layer, &problem, opts.pes, &schedule, &emitted);
    Ok(Compiled {
        programs: emitted.programs,
        manifest,
        algorithm,
        dump,
    })
}

fn build_manifest(
    layer: &lang::Layer,
    problem: &problem::Problem,
    pes: u32,
    schedule: &schedule::RingSchedule,
    emitted: &codegen::Emitted,
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
    };
    let fill = |map: &mut BTreeMap<String, Placement>, list: &[(schedule::Element, u32, u32)]| {
        for &(e, pe, addr) in list {
            let p = map.entry(e.tensor.name().to_string()).or_insert_with(empty);
            let i = (e.head as usize * n + e.row as usize) * d + e.col as usize;
            p.pe[i] = pe;
            p.addr[i] = addr;
        }
    };
    let mut inputs = BTreeMap::new();
    fill(&mut inputs, &emitted.inputs);
    let mut outputs = BTreeMap::new();
    fill(&mut outputs, &emitted.outputs);
    Manifest {
        format: manifest::FORMAT.into(),
        format_version: manifest::FORMAT_VERSION,
        layer: LayerInfo {
            name: layer.name.clone(),
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
        },
        pes,
        cycles: schedule.cycles() as u64,
        lower_bound: problem.lower_bound(pes),
        schedule: schedule.algorithm.into(),
        necessary_ops: problem.necessary_ops(),
        ops: schedule.ops.into(),
        mem_words: emitted.programs.iter().map(|p| p.mem_words).collect(),
        files: (0..pes)
            .map(|pe| PeFiles {
                pe,
                text: format!("pe{pe}.s"),
                binary: format!("pe{pe}.bin"),
            })
            .collect(),
        inputs,
        outputs,
    }
}
