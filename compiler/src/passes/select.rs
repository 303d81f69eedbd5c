//! `select`: picks the scheduling algorithm from the analysis facts (never from the DSL text), or
//! checks that a forced choice applies to the layer.

use crate::problem::Problem;
use crate::scheduler::{self, Scheduler, SCHEDULERS};

pub const NAME: &str = "select";

/// `--schedule` name of the stream schedule.
pub const STREAM: &str = "stream";
pub const DESCRIPTION: &str = "choose the scheduling algorithms that apply, from the facts";

/// What the user asked for with `--schedule`: `auto`, or one scheduler of the registry by its
/// name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Choice {
    #[default]
    Auto,
    Named(&'static str),
    /// The stream schedule: loop programs, built by [`crate::stream`] rather than a pass of the
    /// ring-schedule registry.
    Stream,
}

impl Choice {
    /// Every value `--schedule` accepts, `auto` first.
    pub fn names() -> Vec<&'static str> {
        std::iter::once("auto")
            .chain(SCHEDULERS.iter().map(|s| s.name()))
            .chain(std::iter::once(STREAM))
            .collect()
    }

    pub fn parse(s: &str) -> Option<Choice> {
        if s == "auto" {
            return Some(Choice::Auto);
        }
        if s == STREAM {
            return Some(Choice::Stream);
        }
        scheduler::by_name(s).map(|sch| Choice::Named(sch.name()))
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

/// A refusal of one of the paper's schedules, whose last requirement is the plain softmax: blames
/// `softmax` when the shape fits the ring (so that is the only reason left), else tokens or dim.
pub fn chain_refusal(p: &Problem, pes: u32, name: &str, why: String) -> Refusal {
    if p.safe() && p.ring_divides_shape(pes, "").is_none() {
        return Refusal {
            culprit: Culprit::Softmax,
            message: why,
            note: format!(
                "add `softmax = plain;` to the layer to use `--schedule {name}`, or use `--schedule rows`, which computes the safe form"
            ),
        };
    }
    shape_refusal(p, pes, why)
}

/// A refusal for a shape a pair schedule cannot divide over the ring: blames tokens or dim.
pub fn shape_refusal(p: &Problem, pes: u32, why: String) -> Refusal {
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

/// Picks the schedulers to try (several under `auto`; the caller keeps the fastest).
pub fn run(p: &Problem, pes: u32, choice: Choice) -> Result<Vec<&'static dyn Scheduler>, Refusal> {
    if choice == Choice::Stream {
        // Not a ring schedule: the caller builds it (see `crate::stream`).
        return Ok(Vec::new());
    }
    if let Choice::Named(name) = choice {
        let Some(sch) = scheduler::by_name(name) else {
            return Err(Refusal {
                culprit: Culprit::Pes,
                message: format!("no scheduler is named `{name}`"),
                note: format!("`--schedule` takes one of: {}", Choice::names().join(", ")),
            });
        };
        return match sch.refusal(p, pes) {
            None => Ok(vec![sch]),
            Some(r) => Err(r),
        };
    }
    let tried: Vec<&'static dyn Scheduler> = SCHEDULERS
        .iter()
        .copied()
        .filter(|s| s.tried_by_auto(p, pes))
        .collect();
    let ok: Vec<&'static dyn Scheduler> = tried
        .iter()
        .copied()
        .filter(|s| s.refusal(p, pes).is_none())
        .collect();
    if ok.is_empty() {
        return Err(tried
            .first()
            .and_then(|s| s.refusal(p, pes))
            .unwrap_or_else(|| Refusal {
                culprit: Culprit::Pes,
                message: "no scheduler applies to this layer".into(),
                note: String::new(),
            }));
    }
    Ok(ok)
}
