//! The stream schedule's tail: it is not a ring schedule (no per-cycle slots to validate and
//! emit), so it bypasses the registry, codegen and the per-element manifest and goes straight
//! from the generator's loop programs to a manifest with affine layouts.

use crate::manifest::{
    self, CandidateInfo, Manifest, OpCountsInfo, Placement, ProgramKind, Selection,
};
use crate::passes::schedule_stream::{self, Place, Stream};
use crate::passes::select::{Culprit, Refusal};
use crate::problem::Problem;
use crate::{CompileError, Internal};
use std::collections::BTreeMap;

/// What building the stream schedule produced, or why it does not apply; a lagged causal
/// layer's working set stays within `mem_limit` words per PE (or the default allowance).
pub fn build(problem: &Problem, pes: u32, mem_limit: Option<u32>) -> Result<Stream, Refusal> {
    let lag = schedule_stream::Lag::Fit(mem_limit);
    let fit = schedule_stream::run_with(problem, pes, problem.safe(), lag);
    // Where rows have fewer keys than `d`, the whole ring's lag with one division per weight
    // may take fewer cycles; it competes within the same words.
    let budget = mem_limit.map_or_else(|| schedule_stream::allowance(problem, pes), u64::from);
    let per_weight = schedule_stream::per_weight_pays(problem)
        .then(|| {
            schedule_stream::run_with(
                problem,
                pes,
                problem.safe(),
                schedule_stream::Lag::PerWeight,
            )
            .ok()
        })
        .flatten()
        .filter(|s| u64::from(max_words(s)) <= budget);
    let fit = match (fit, per_weight) {
        (Ok(f), Some(w)) if (w.cycles, max_words(&w)) < (f.cycles, max_words(&f)) => Ok(w),
        (Err(_), Some(w)) => Ok(w),
        (fit, _) => fit,
    };
    fit.map_err(|why| {
        let culprit = if problem.symmetric != problem.shared_values {
            Culprit::Qkv
        } else {
            Culprit::Tokens
        };
        Refusal {
            culprit,
            message: why,
            note: "the stream schedule deals tokens to PEs in equal blocks (zigzag pairs under a causal mask)"
                .into(),
        }
    })
}

/// Largest memory of any PE's program.
pub fn max_words(s: &Stream) -> u32 {
    s.programs.iter().map(|p| p.mem_words).max().unwrap_or(0)
}

/// The stream as a candidate of the selection (it fits: it was built within the limit).
pub fn candidate(s: &Stream) -> CandidateInfo {
    CandidateInfo {
        schedule: schedule_stream::NAME.into(),
        cycles: s.cycles,
        max_mem_words: max_words(s),
        fits: true,
    }
}

/// The manifest of a stream schedule for the layer `name`: format version 2, loop programs,
/// affine placements, the counts of the stream's normalisation.
pub fn manifest(
    name: &str,
    problem: &Problem,
    pes: u32,
    stream: &Stream,
    reason: String,
) -> Result<Manifest, CompileError> {
    let (h, n, d) = (
        problem.heads as usize,
        problem.tokens as usize,
        problem.dim as usize,
    );
    let placement = |l: &Place| match l {
        Place::Affine(l) => Placement {
            shape: vec![h, n, d],
            pe: Vec::new(),
            addr: Vec::new(),
            layout: Some(*l),
            copies: Vec::new(),
        },
        Place::Listed { pe, addr, .. } => Placement {
            shape: vec![h, n, d],
            pe: pe.clone(),
            addr: addr.clone(),
            layout: None,
            copies: Vec::new(),
        },
    };
    let inputs: BTreeMap<String, Placement> = stream
        .inputs
        .iter()
        .map(|(name, l)| (name.clone(), placement(l)))
        .collect();
    let outputs = BTreeMap::from([("y".to_string(), placement(&stream.output))]);

    // The formulation's own count (deferred: dim divisions per row; per weight: one per
    // weight), so the lower bound is the one these programs can be held to.
    let norm = stream.normalisation;
    let shape = problem.shape();
    let overflow = || {
        CompileError::Internal(Internal::Stream(
            "the layer's operation count overflows".into(),
        ))
    };
    let necessary = shape.necessary_as(norm).ok_or_else(overflow)?;
    let lower_bound = shape.lower_bound_as(pes, norm).ok_or_else(overflow)?;
    let mut ops: OpCountsInfo = stream.ops.into();
    ops.phase2_max = necessary.max;
    // What the programs execute beyond the formulation's counts: the running maxima's extra
    // updates and the rescaling. A generator that executes fewer than the counts it claims is
    // a bug, not a saving.
    ops.online_rescale = stream.total_ops.checked_sub(ops.total()).ok_or_else(|| {
        CompileError::Internal(Internal::Stream(format!(
            "{}: executes {} operations, fewer than the {} its formulation counts",
            schedule_stream::NAME,
            stream.total_ops,
            ops.total()
        )))
    })?;
    Ok(Manifest {
        format: manifest::FORMAT.into(),
        format_version: manifest::LAYOUT_FORMAT_VERSION,
        layer: crate::layer_info(name, problem),
        pes,
        cycles: stream.cycles,
        lower_bound,
        bound: shape.bound(pes, norm),
        schedule: schedule_stream::NAME.into(),
        selection: Selection {
            chosen: schedule_stream::NAME.into(),
            reason,
            candidates: vec![candidate(stream)],
            stopped: Vec::new(),
        },
        necessary_ops: necessary.total(),
        normalisation: norm,
        ops,
        mem_words: stream.programs.iter().map(|p| p.mem_words).collect(),
        buffers: stream.buffers.clone(),
        programs: ProgramKind::Loops,
        files: runtime::manifest::Files::Pattern(runtime::manifest::FilePattern::standard()),
        inputs,
        outputs,
    })
}
