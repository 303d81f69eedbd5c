//! What a verification found: the statement proved, or the violations, plus statistics.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// The properties the verifier checks; see the crate documentation for their exact definitions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Invariant {
    /// The manifest describes a layer the verifier understands and is self-consistent.
    Manifest,
    /// The programs are the ones the manifest describes (PE numbering, memory sizes, cycles).
    Setup,
    /// Input words are distinct, output words are distinct and written by the programs.
    Placement,
    /// The machine ran to the end: no uninitialized read, out-of-range address (memory use within
    /// the declared size), write conflict or slot misuse.
    Fault,
    /// Every output element equals the attention formula.
    Output,
    /// No operation forms an expression that involves a masked score.
    Masked,
    /// Every operation's result is part of some output.
    Unnecessary,
    /// No product or quotient is computed twice; no exponential more often than rows use it.
    Duplicate,
    /// Executed operation counts equal the necessary ones and the manifest's claims.
    OpCount,
    /// Every computed word is read before it is overwritten or the run ends, unless it is an output.
    LostValue,
    /// Every word received over the ring is read before it is overwritten or the run ends, unless
    /// it is an output.
    UnreadTransfer,
    /// Every preloaded input word is read before it is overwritten or the run ends.
    UnusedInput,
}

impl Invariant {
    pub const ALL: [Invariant; 12] = [
        Invariant::Manifest,
        Invariant::Setup,
        Invariant::Placement,
        Invariant::Fault,
        Invariant::Output,
        Invariant::Masked,
        Invariant::Unnecessary,
        Invariant::Duplicate,
        Invariant::OpCount,
        Invariant::LostValue,
        Invariant::UnreadTransfer,
        Invariant::UnusedInput,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Invariant::Manifest => "manifest",
            Invariant::Setup => "setup",
            Invariant::Placement => "placement",
            Invariant::Fault => "fault",
            Invariant::Output => "output",
            Invariant::Masked => "masked",
            Invariant::Unnecessary => "unnecessary-op",
            Invariant::Duplicate => "duplicate-op",
            Invariant::OpCount => "op-count",
            Invariant::LostValue => "lost-value",
            Invariant::UnreadTransfer => "unread-transfer",
            Invariant::UnusedInput => "unused-input",
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            Invariant::Manifest => "the manifest describes a supported, self-consistent layer",
            Invariant::Setup => "the programs match the manifest (PEs, memory sizes, cycles)",
            Invariant::Placement => {
                "input words are distinct; output words are distinct and written by the programs"
            }
            Invariant::Fault => {
                "no fault: no uninitialized read, no address outside the declared memory, no write conflict"
            }
            Invariant::Output => "every output element equals the attention formula",
            Invariant::Masked => "no operation involves a masked score",
            Invariant::Unnecessary => "every operation's result is part of some output",
            Invariant::Duplicate => "no operation is repeated",
            Invariant::OpCount => "mul/exp/div counts equal the necessary operations and the manifest",
            Invariant::LostValue => "every computed word is read before it is overwritten or the run ends",
            Invariant::UnreadTransfer => "every word received over the ring is read",
            Invariant::UnusedInput => "every preloaded input word is read",
        }
    }
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One broken invariant, located as precisely as the invariant allows.
#[derive(Clone, Debug, PartialEq)]
pub struct Violation {
    pub invariant: Invariant,
    pub pe: Option<u32>,
    pub cycle: Option<u64>,
    /// The bundle executing at `pe`/`cycle`, as assembly text.
    pub instruction: Option<String>,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}]", self.invariant)?;
        match (self.pe, self.cycle) {
            (Some(p), Some(c)) => write!(f, " PE {p}, cycle {c}")?,
            (Some(p), None) => write!(f, " PE {p}")?,
            (None, Some(c)) => write!(f, " cycle {c}")?,
            (None, None) => {}
        }
        if let Some(i) = &self.instruction {
            write!(f, " `{i}`")?;
        }
        if self.pe.is_some() || self.cycle.is_some() || self.instruction.is_some() {
            f.write_str(":")?;
        }
        write!(f, " {}", self.message)
    }
}

/// Executed operations, by kind and phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpTally {
    /// `mul` of two input elements (phase 1).
    pub phase1_mul: u64,
    pub exp: u64,
    pub div: u64,
    /// Every other `mul` (phase 3: weight times value).
    pub phase3_mul: u64,
    /// `max` (the row maximum of a safe softmax).
    pub max: u64,
    pub add: u64,
    /// A streamed (online) softmax's running-maximum copies, rescale factors and rescaled
    /// partial sums: `ops.online_rescale` in the manifest.
    pub rescale: u64,
}

impl OpTally {
    pub fn total(&self) -> u64 {
        self.phase1_mul + self.exp + self.div + self.phase3_mul + self.max + self.rescale
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    pub time: Duration,
    /// Distinct expression nodes interned (specification and execution together).
    pub expressions: usize,
    /// Total length of all canonical sums' term lists.
    pub sum_terms: usize,
    /// Cycles executed.
    pub cycles: u64,
    pub ops: OpTally,
    pub output_elements: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// What holds for the programs, e.g. `for all inputs, y = attention(...)`; set only when
    /// there are no violations.
    pub proved: Option<String>,
    /// The first violations found, at most [`crate::Options::max_per_invariant`] per invariant,
    /// ordered by invariant and then by discovery.
    pub violations: Vec<Violation>,
    /// Violations found per invariant, including those not listed.
    pub counts: BTreeMap<Invariant, usize>,
    /// The invariants that were checked (some are skipped when an earlier failure makes them
    /// meaningless, e.g. outputs after a fault).
    pub checked: Vec<Invariant>,
    pub stats: Stats,
    /// Operations beyond the necessary ones that the manifest declares and the verifier accepted
    /// (phase-1 products of a shared layer computed once per score by a schedule that does not
    /// exploit q = k); 0 when the work is exactly the necessary.
    pub redundant_ops: u64,
}

/// The listed violations as `attnc verify --json` prints them (both proofs).
pub(crate) fn violations_json(violations: &[Violation]) -> Vec<serde_json::Value> {
    violations
        .iter()
        .map(|v| {
            serde_json::json!({
                "invariant": v.invariant.name(),
                "pe": v.pe,
                "cycle": v.cycle,
                "instruction": v.instruction,
                "message": v.message,
            })
        })
        .collect()
}

/// Violations counted per invariant, by name.
pub(crate) fn counts_json(
    counts: &BTreeMap<Invariant, usize>,
) -> serde_json::Map<String, serde_json::Value> {
    counts
        .iter()
        .map(|(k, v)| (k.name().to_string(), (*v).into()))
        .collect()
}

impl Report {
    pub fn is_ok(&self) -> bool {
        self.total_violations() == 0
    }

    pub fn total_violations(&self) -> usize {
        self.counts.values().sum()
    }

    /// A machine-readable form for `attnc verify --json`.
    pub fn to_json(&self) -> serde_json::Value {
        let violations = violations_json(&self.violations);
        let counts = counts_json(&self.counts);
        let s = &self.stats;
        let mut json = serde_json::json!({
            "ok": self.is_ok(),
            "proved": self.proved,
            "total_violations": self.total_violations(),
            "redundant_ops": self.redundant_ops,
            "violation_counts": counts,
            "violations": violations,
            "invariants_checked": self.checked.iter().map(|i| i.name()).collect::<Vec<_>>(),
            "stats": {
                "time_s": s.time.as_secs_f64(),
                "expressions": s.expressions,
                "sum_terms": s.sum_terms,
                "cycles": s.cycles,
                "output_elements": s.output_elements,
                "ops": {
                    "phase1_mul": s.ops.phase1_mul,
                    "exp": s.ops.exp,
                    "div": s.ops.div,
                    "phase3_mul": s.ops.phase3_mul,
                    "add": s.ops.add,
                },
            },
        });
        // Only an online layer rescales; other reports keep the shape they always had.
        if s.ops.rescale > 0 {
            json["stats"]["ops"]["rescale"] = s.ops.rescale.into();
        }
        json
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.stats;
        if let Some(p) = &self.proved {
            writeln!(f, "proved: {p}")?;
            writeln!(f, "0 violations")?;
        } else {
            let total = self.total_violations();
            writeln!(f, "NOT proved: {total} violation(s)")?;
            for v in &self.violations {
                writeln!(f, "  {v}")?;
            }
            let listed = self.violations.len();
            if listed < total {
                let per: Vec<String> = self
                    .counts
                    .iter()
                    .map(|(k, n)| format!("{k} {n}"))
                    .collect();
                writeln!(
                    f,
                    "  … {} more not listed (by invariant: {})",
                    total - listed,
                    per.join(", ")
                )?;
            }
        }
        let names: Vec<&str> = self.checked.iter().map(|i| i.name()).collect();
        writeln!(f, "invariants checked: {}", names.join(", "))?;
        let secs = s.time.as_secs_f64();
        let time = if secs < 1.0 {
            format!("{:.2} ms", secs * 1e3)
        } else {
            format!("{secs:.3} s")
        };
        write!(
            f,
            "time: {time}; {} expressions ({} sum terms); {} cycles; ops: mul {} + {}, exp {}, div {}, add {}",
            s.expressions,
            s.sum_terms,
            s.cycles,
            s.ops.phase1_mul,
            s.ops.phase3_mul,
            s.ops.exp,
            s.ops.div,
            s.ops.add
        )
    }
}
