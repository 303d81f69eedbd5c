//! `select`: picks the scheduling algorithm from the analysis facts (never from the DSL text), or
//! checks that a forced choice applies to the layer.

use crate::passes::{schedule_baseline, schedule_causal, schedule_rows, schedule_symmetric};
use crate::problem::Problem;
use crate::schedule::RingSchedule;
use std::fmt;

pub const NAME: &str = "select";
pub const DESCRIPTION: &str = "choose the scheduling algorithms that apply, from the facts";

/// What the user asked for with `--schedule`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Choice {
    #[default]
    Auto,
    Baseline,
    Symmetric,
    Causal,
    Rows,
}

impl Choice {
    pub const NAMES: [&'static str; 5] = ["auto", "baseline", "symmetric", "causal", "rows"];

    pub fn parse(s: &str) -> Option<Choice> {
        match s {
            "auto" => Some(Choice::Auto),
            "baseline" => Some(Choice::Baseline),
            "symmetric" => Some(Choice::Symmetric),
            "causal" => Some(Choice::Causal),
            "rows" => Some(Choice::Rows),
            _ => None,
        }
    }
}

/// A scheduling algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    Baseline,
    Symmetric,
    Causal,
    Rows,
}

impl Algorithm {
    /// Why the algorithm cannot schedule this layer on `pes` PEs, if it cannot.
    pub fn unsupported(self, p: &Problem, pes: u32) -> Option<String> {
        match self {
            Algorithm::Baseline => schedule_baseline::unsupported(p, pes),
            Algorithm::Symmetric => schedule_symmetric::unsupported(p, pes),
            Algorithm::Causal => schedule_causal::unsupported(p, pes),
            Algorithm::Rows => schedule_rows::unsupported(p, pes),
        }
    }

    /// The chain schedules implement the paper's formulation of softmax only.
    pub fn plain_only(self) -> bool {
        !matches!(self, Algorithm::Rows)
    }

    /// The `--schedule` value that forces it.
    pub fn choice_name(self) -> &'static str {
        match self {
            Algorithm::Baseline => "baseline",
            Algorithm::Symmetric => "symmetric",
            Algorithm::Causal => "causal",
            Algorithm::Rows => "rows",
        }
    }

    pub fn pass_name(self) -> &'static str {
        match self {
            Algorithm::Baseline => schedule_baseline::NAME,
            Algorithm::Symmetric => schedule_symmetric::NAME,
            Algorithm::Causal => schedule_causal::NAME,
            Algorithm::Rows => schedule_rows::NAME,
        }
    }

    /// Runs the algorithm's scheduling pass; an error is a scheduler bug.
    pub fn schedule(self, p: &Problem, pes: u32) -> Result<RingSchedule, String> {
        match self {
            Algorithm::Baseline => Ok(schedule_baseline::run(p, pes)),
            Algorithm::Symmetric => Ok(schedule_symmetric::run(p, pes)),
            Algorithm::Causal => Ok(schedule_causal::run(p, pes)),
            Algorithm::Rows => schedule_rows::run(p, pes),
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Algorithm::Baseline => write!(f, "baseline (paper Algorithm 1)"),
            Algorithm::Symmetric => write!(f, "symmetric (paper Algorithm 2, improved)"),
            Algorithm::Causal => write!(f, "causal (paper Algorithm 3, improved)"),
            Algorithm::Rows => write!(f, "rows (row-ownership dataflow)"),
        }
    }
}

/// Which layer field a refusal is about, so the CLI can point at it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Culprit {
    Tokens,
    Dim,
    Qkv,
    Mask,
    /// The `softmax` field: the schedule cannot form the softmax as asked.
    Softmax,
    Pes,
    /// The `--mem` limit.
    Memory,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    pub culprit: Culprit,
    pub message: String,
    pub note: String,
}

/// The candidates for a layer, best first by the facts: a mask removes the most work, then
/// symmetry; the baseline always applies where its shape constraints hold.
fn candidates(p: &Problem) -> Vec<Algorithm> {
    let mut v = Vec::new();
    if p.causal {
        v.push(Algorithm::Causal);
    }
    if p.symmetric && !p.causal {
        v.push(Algorithm::Symmetric);
    }
    v.push(Algorithm::Rows);
    v.push(Algorithm::Baseline);
    v
}

fn shape_refusal(p: &Problem, pes: u32, why: String) -> Refusal {
    let culprit = if !p.tokens.is_multiple_of(pes) {
        Culprit::Tokens
    } else {
        Culprit::Dim
    };
    Refusal {
        culprit,
        message: why,
        note: format!(
            "choose `--pes` among the common divisors of tokens ({}) and dim ({}), or change the layer",
            p.tokens, p.dim
        ),
    }
}

/// Picks the algorithms to try (several under `auto`; the caller keeps the fastest).
pub fn run(p: &Problem, pes: u32, choice: Choice) -> Result<Vec<Algorithm>, Refusal> {
    let forced = match choice {
        Choice::Auto => None,
        Choice::Baseline => Some(Algorithm::Baseline),
        Choice::Symmetric => Some(Algorithm::Symmetric),
        Choice::Causal => Some(Algorithm::Causal),
        Choice::Rows => Some(Algorithm::Rows),
    };
    if let Some(alg) = forced {
        return match alg.unsupported(p, pes) {
            None => Ok(vec![alg]),
            Some(why) => Err(match alg {
                Algorithm::Symmetric if !p.symmetric => Refusal {
                    culprit: Culprit::Qkv,
                    message: why,
                    note: "`--schedule symmetric` applies only to layers with `qkv = shared`"
                        .into(),
                },
                Algorithm::Causal if !p.causal => Refusal {
                    culprit: Culprit::Mask,
                    message: why,
                    note: "`--schedule causal` applies only to layers with `mask = causal`".into(),
                },
                // Structure and shape are checked first, so this is the only reason left.
                _ if alg.plain_only()
                    && p.safe()
                    && p.ring_divides_shape(pes, "").is_none() =>
                {
                    Refusal {
                        culprit: Culprit::Softmax,
                        message: why,
                        note: format!(
                            "add `softmax = plain;` to the layer to use `--schedule {}`, or use `--schedule rows`, which computes the safe form",
                            alg.choice_name()
                        ),
                    }
                }
                _ => shape_refusal(p, pes, why),
            }),
        };
    }
    let all = candidates(p);
    let ok: Vec<Algorithm> = all
        .iter()
        .copied()
        .filter(|a| a.unsupported(p, pes).is_none())
        .collect();
    if ok.is_empty() {
        let why = all[0].unsupported(p, pes).unwrap_or_default();
        return Err(shape_refusal(p, pes, why));
    }
    Ok(ok)
}
