//! Checks of loop programs (ISA format 3) without unrolling them.
//!
//! The symbolic proof ([`crate::verify_with`]) executes one bundle per cycle, so its time grows
//! with the operations a loop program stands for (10^8–10^11 for real models). What follows
//! derives facts from the loop structure alone, in time that grows with the programs' size:
//! every loop count, stride, base address, wrap and guard is taken into account in closed form,
//! nothing is sampled. It is **not a proof of the outputs**: [`Compact`] never reports a layer
//! as proved, and [`COVERAGE`] says exactly which parts of which invariants are established
//! here and which only the flattened proof establishes (docs/verifier.md, "Loop programs too
//! large to flatten").
//!
//! Soundness is one-sided by construction: a violation is reported only with a witness (an
//! executing instance whose address leaves memory, a count that differs from a claim), so a
//! program the flattened proof accepts never gets one; a check that cannot conclude either way
//! says so in [`Compact::undecided`] instead of guessing.

mod aff;
mod bounds;
pub mod contract;
pub mod induct;
pub mod prove;
pub mod ring;
mod slots;
pub mod steps;
mod term;
mod unroll;
mod workers;

pub use bounds::{extent, Extent, Level};

use crate::report::Invariant;
use crate::{plain, Options, Verification, Violation};
use isa::looped::Field;
use isa::{LoopProgram, Node, OpKind};
use runtime::manifest::{Layout, Manifest};
use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

/// How much of an invariant the compact checks establish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coverage {
    /// As the flattened proof checks it.
    Full,
    /// The part described; the rest only the flattened proof checks.
    Partial(&'static str),
    /// Only the flattened proof checks it; why it needs execution.
    Not(&'static str),
}

/// Every invariant and how much of it [`check_loops`] establishes.
pub const COVERAGE: [(Invariant, Coverage); 12] = [
    (Invariant::Manifest, Coverage::Full),
    (Invariant::Setup, Coverage::Full),
    (
        Invariant::Placement,
        Coverage::Partial(
            "input words distinct and output words distinct, from the layouts in closed form; not that every output word is last written by the programs",
        ),
    ),
    (
        Invariant::Fault,
        Coverage::Partial(
            "every address every executing slot uses (transfer destinations in the receiver's memory) lies inside the declared memory; no acc without its op, no send acc without its acc, no op and acc writing one word in one instance; not reads of unwritten words, nor a transfer arriving in a word written in the same cycle",
        ),
    ),
    (
        Invariant::Output,
        Coverage::Not("needs the values, i.e. execution"),
    ),
    (
        Invariant::Masked,
        Coverage::Not("needs the values' lineage"),
    ),
    (
        Invariant::Unnecessary,
        Coverage::Not("needs the values"),
    ),
    (Invariant::Duplicate, Coverage::Not("needs the values")),
    (
        Invariant::OpCount,
        Coverage::Partial(
            "executed div equals the necessary count and the claim, all executed ops together equal the claims' total, mul/exp/max at least their claims, claims equal the necessary counts; not the split of mul between phase 1, phase 3 and rescaling, nor of exp and max between necessary and rescaling work",
        ),
    ),
    (
        Invariant::LostValue,
        Coverage::Partial(
            "no op or acc result dropped on the spot (neither written, accumulated nor sent); not that every written word is read before it is overwritten",
        ),
    ),
    (
        Invariant::UnreadTransfer,
        Coverage::Not("needs which arrival each read sees"),
    ),
    (
        Invariant::UnusedInput,
        Coverage::Not("needs which preload each read sees"),
    ),
];

/// What the compact checks found. Never a proof: see [`COVERAGE`].
#[derive(Clone, Debug, PartialEq)]
pub struct Compact {
    /// The first violations, at most [`Options::max_per_invariant`] per invariant.
    pub violations: Vec<Violation>,
    /// Violations per invariant, including those not listed.
    pub counts: BTreeMap<Invariant, usize>,
    /// Invariants checked, fully or in part ([`COVERAGE`]).
    pub checked: Vec<Invariant>,
    /// Checks that could not conclude either way (no violation is claimed for them).
    pub undecided: Vec<String>,
    /// Bundles the programs stand for, summed over PEs (what flattening would produce).
    pub bundles: u64,
    /// Bundle templates, summed over PEs (the programs' size).
    pub templates: u64,
    pub time: Duration,
}

impl Compact {
    pub fn total_violations(&self) -> usize {
        self.counts.values().sum()
    }

    /// Never proved: the outputs are not checked ([`COVERAGE`]).
    pub fn proved(&self) -> bool {
        false
    }

    /// The invariants the compact checks do not establish at all.
    pub fn not_covered(&self) -> Vec<Invariant> {
        COVERAGE
            .iter()
            .filter(|(_, c)| matches!(c, Coverage::Not(_)))
            .map(|(i, _)| *i)
            .collect()
    }

    pub fn to_json(&self) -> serde_json::Value {
        let violations = crate::report::violations_json(&self.violations);
        let counts = crate::report::counts_json(&self.counts);
        let coverage: serde_json::Map<String, serde_json::Value> = COVERAGE
            .iter()
            .map(|(i, c)| {
                let v = match c {
                    Coverage::Full => serde_json::json!("full"),
                    Coverage::Partial(what) => serde_json::json!({ "partial": what }),
                    Coverage::Not(why) => serde_json::json!({ "not": why }),
                };
                (i.name().to_string(), v)
            })
            .collect();
        serde_json::json!({
            "ok": false,
            "proved": null,
            "compact": true,
            "total_violations": self.total_violations(),
            "violation_counts": counts,
            "violations": violations,
            "invariants_checked": self.checked.iter().map(|i| i.name()).collect::<Vec<_>>(),
            "coverage": coverage,
            "undecided": self.undecided,
            "stats": {
                "time_s": self.time.as_secs_f64(),
                "bundles": self.bundles,
                "templates": self.templates,
            },
        })
    }
}

impl fmt::Display for Compact {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.total_violations();
        writeln!(
            f,
            "NOT proved: outputs are proved only by flattening; checks without unrolling found {total} violation(s)"
        )?;
        for v in &self.violations {
            writeln!(f, "  {v}")?;
        }
        if self.violations.len() < total {
            writeln!(f, "  … {} more not listed", total - self.violations.len())?;
        }
        let names: Vec<String> = self
            .checked
            .iter()
            .map(|i| match COVERAGE.iter().find(|(j, _)| j == i) {
                Some((_, Coverage::Partial(_))) => format!("{} (in part)", i.name()),
                _ => i.name().to_string(),
            })
            .collect();
        writeln!(f, "checked without unrolling: {}", names.join(", "))?;
        let not: Vec<&str> = self.not_covered().iter().map(|i| i.name()).collect();
        writeln!(
            f,
            "not checked (needs the flattened proof): {}",
            not.join(", ")
        )?;
        for u in &self.undecided {
            writeln!(f, "undecided: {u}")?;
        }
        let secs = self.time.as_secs_f64();
        write!(
            f,
            "time: {:.2} ms; {} bundle templates standing for {} bundles",
            secs * 1e3,
            self.templates,
            self.bundles
        )
    }
}

/// Why layout `l` cannot place one `[heads, tokens, dim]` tensor of `m`'s layer, one element per
/// word, inside every PE's memory, if it cannot. Mirrors the manifest reader's own check, for
/// manifests built in memory.
pub(crate) fn layout_problem(l: &Layout, m: &Manifest, shape: &crate::Shape) -> Option<String> {
    if !l.covers(m.pes, u64::from(shape.tokens)) {
        return Some(format!(
            "layout of {} rows per PE on {} PEs does not cover {} tokens",
            l.rows_per_pe, m.pes, shape.tokens
        ));
    }
    let Some((_, last)) = span(l, shape) else {
        return Some(
            "layout rows or heads overlap (a stride smaller than what it steps over)".into(),
        );
    };
    if m.mem_words.len() != m.pes as usize {
        return Some(format!(
            "mem_words has {} entries for {} PEs",
            m.mem_words.len(),
            m.pes
        ));
    }
    if let Some((pe, &w)) = m
        .mem_words
        .iter()
        .enumerate()
        .find(|(_, &w)| u64::from(w) <= last)
    {
        return Some(format!(
            "layout reaches m{last} on PE {pe}, which has {w} words"
        ));
    }
    None
}

/// `(row span, last address)` of a layout whose elements are distinct words, or `None` if rows
/// or heads overlap. Every PE holds the same local rows, so one extent serves all.
fn span(l: &Layout, shape: &crate::Shape) -> Option<(u64, u64)> {
    let r = u64::from(l.rows_per_pe);
    let d = u64::from(shape.dim);
    if r == 0 || d == 0 || shape.heads == 0 || u64::from(l.row_stride) < d {
        return None;
    }
    let row_span = (r - 1) * u64::from(l.row_stride) + d;
    if shape.heads > 1 && u64::from(l.head_stride) < row_span {
        return None;
    }
    let last =
        u64::from(l.base) + u64::from(shape.heads - 1) * u64::from(l.head_stride) + row_span - 1;
    Some((row_span, last))
}

/// Whether two valid layouts provably share no word: their extents are apart, or both repeat
/// with one head stride and their per-head spans occupy disjoint arcs modulo it.
fn disjoint(a: &Layout, b: &Layout, shape: &crate::Shape) -> bool {
    let (Some((sa, la)), Some((sb, lb))) = (span(a, shape), span(b, shape)) else {
        return false;
    };
    let (a0, b0) = (u64::from(a.base), u64::from(b.base));
    if la < b0 || lb < a0 {
        return true;
    }
    let hs = u64::from(a.head_stride);
    if hs == 0 || hs != u64::from(b.head_stride) || sa > hs || sb > hs {
        return false;
    }
    let off = (b0 % hs + hs - a0 % hs) % hs;
    off >= sa && hs - off >= sb
}

/// Checks `programs` against `manifest` without unrolling (see the module documentation).
/// Never panics, whatever the inputs.
pub fn check_loops(programs: &[LoopProgram], manifest: &Manifest, opts: &Options) -> Compact {
    let start = Instant::now();
    let mut v = Verification {
        sink: crate::sym::Sink::new(opts.max_per_invariant),
        checked: Vec::new(),
        stats: crate::Stats::default(),
        proved: None,
        redundant_ops: 0,
    };
    let mut undecided = Vec::new();
    let bundles = programs
        .iter()
        .map(LoopProgram::cycles)
        .fold(0u64, u64::saturating_add);
    let templates = programs.iter().map(|p| p.bundle_count() as u64).sum();
    let shape = v.shape(manifest);
    v.check(Invariant::Setup);
    let mut setup_ok = true;
    if let Err(e) = runtime::exec::check_loop_programs(programs, manifest) {
        v.fail(Invariant::Setup, e.to_string());
        setup_ok = false;
    }
    for p in programs {
        if let Err(e) = p.validate() {
            v.fail(
                Invariant::Setup,
                format!("PE {}: invalid loop program: {e}", p.pe),
            );
            setup_ok = false;
        }
    }
    if let Some(shape) = &shape {
        placement(&mut v, manifest, shape, &mut undecided);
    }
    if setup_ok {
        v.check(Invariant::Fault);
        v.check(Invariant::LostValue);
        for p in programs {
            let next = if p.pe + 1 >= manifest.pes {
                0
            } else {
                p.pe + 1
            };
            let own = u64::from(p.mem_words);
            let theirs = manifest
                .mem_words
                .get(next as usize)
                .map_or(0, |&w| u64::from(w));
            let mut levels = Vec::new();
            ranges(
                &mut v,
                p.pe,
                &p.body,
                &mut levels,
                (own, theirs),
                &mut undecided,
            );
        }
        if let Some(shape) = &shape {
            op_counts(&mut v, programs, manifest, shape, bundles, opts);
        }
    }
    let mut kept = v.sink.kept;
    let mut violations = Vec::new();
    for inv in Invariant::ALL {
        if let Some(vs) = kept.remove(&inv) {
            violations.extend(vs);
        }
    }
    violations.truncate(opts.max_listed);
    let mut checked = v.checked;
    checked.sort();
    Compact {
        violations,
        counts: v.sink.counts.into_iter().collect(),
        checked,
        undecided,
        bundles,
        templates,
        time: start.elapsed(),
    }
}

fn placement(
    v: &mut Verification,
    m: &Manifest,
    shape: &crate::Shape,
    undecided: &mut Vec<String>,
) {
    v.check(Invariant::Placement);
    let inputs: Vec<(&String, Option<&Layout>)> = m
        .inputs
        .iter()
        .map(|(n, p)| (n, p.layout.as_ref()))
        .collect();
    for (i, (na, la)) in inputs.iter().enumerate() {
        for (nb, lb) in &inputs[i + 1..] {
            match (la, lb) {
                (Some(a), Some(b)) if disjoint(a, b, shape) => {}
                _ => undecided.push(format!(
                    "placement: inputs `{na}` and `{nb}` are not shown to occupy distinct words"
                )),
            }
        }
    }
    // One tensor's own elements are distinct words: the manifest check established it for
    // every layout, and explicit placements are not what loop programs come with.
    for (name, p) in m.inputs.iter().chain(&m.outputs) {
        if p.layout.is_none() {
            undecided.push(format!(
                "placement: `{name}` is placed element by element; only layouts are checked without unrolling"
            ));
        }
        // Copies are listed word by word and take words the closed forms do not know of.
        if !p.copies.is_empty() {
            undecided.push(format!(
                "placement: `{name}` has preload copies; only layouts without copies are checked without unrolling"
            ));
        }
    }
}

fn ranges(
    v: &mut Verification,
    pe: u32,
    nodes: &[Node],
    levels: &mut Vec<Level>,
    (own, theirs): (u64, u64),
    undecided: &mut Vec<String>,
) {
    for n in nodes {
        match n {
            Node::Loop(l) => {
                levels.push(Level {
                    count: l.count,
                    step: l.step,
                });
                ranges(v, pe, &l.body, levels, (own, theirs), undecided);
                levels.pop();
            }
            Node::Bundle(b) => {
                for found in slots::check(b, levels) {
                    match found {
                        slots::Finding::Broken { rule, at } => {
                            let inv = if rule.is_fault() {
                                Invariant::Fault
                            } else {
                                Invariant::LostValue
                            };
                            let msg = format!("{} (at {})", rule.message(), indices(&at));
                            let text = b.to_string();
                            v.sink.report(inv, || Violation {
                                pe: Some(pe),
                                instruction: Some(text),
                                ..plain(inv, msg)
                            });
                        }
                        slots::Finding::Undecided(why) => {
                            undecided.push(format!("PE {pe} `{b}`: {why}"))
                        }
                    }
                }
                for f in Field::ALL {
                    let limit = if f == Field::XferDst { theirs } else { own };
                    match extent(b, f, levels, limit) {
                        None | Some(Extent::Never) | Some(Extent::Inside { .. }) => {}
                        Some(Extent::Outside { addr, at }) => {
                            let whose = if f == Field::XferDst {
                                "the next PE's"
                            } else {
                                "its"
                            };
                            let msg = format!(
                                "{} reaches m{addr} at {}, outside {whose} {limit} words",
                                f.name(),
                                indices(&at)
                            );
                            let text = b.to_string();
                            v.sink.report(Invariant::Fault, || Violation {
                                pe: Some(pe),
                                instruction: Some(text),
                                ..plain(Invariant::Fault, msg)
                            });
                        }
                        Some(Extent::Unknown { lo, hi }) => undecided.push(format!(
                            "fault: PE {pe} `{b}`: {} lies in {lo}..={hi} over the loop bounds, but no executing instance outside 0..{limit} was found",
                            f.name()
                        )),
                    }
                }
            }
        }
    }
}

/// Loop indices as the text form names them.
fn indices(at: &[u64]) -> String {
    if at.is_empty() {
        return "every run".into();
    }
    let at: Vec<String> = at
        .iter()
        .enumerate()
        .map(|(k, i)| format!("i{k} = {i}"))
        .collect();
    at.join(", ")
}

fn op_counts(
    v: &mut Verification,
    programs: &[LoopProgram],
    m: &Manifest,
    shape: &crate::Shape,
    bundles: u64,
    opts: &Options,
) {
    v.check(Invariant::OpCount);
    let Some(need) = shape.counting().necessary_as(m.normalisation) else {
        return;
    };
    if need.total() > bundles {
        v.fail(
            Invariant::OpCount,
            format!(
                "the layer needs {} operations but the programs stand for only {bundles} bundles",
                need.total()
            ),
        );
        return;
    }
    if let Some(b) = &m.bound {
        let want = shape.counting().bound(m.pes, m.normalisation);
        if want.as_ref() != Some(b) {
            v.fail(
                Invariant::Manifest,
                format!(
                    "bound is {b:?}, but the layer's is {}",
                    want.map_or("undefined".into(), |w| format!("{w:?}"))
                ),
            );
        }
    }
    let mut got = [0u64; isa::OPS.len()];
    for p in programs {
        for (g, c) in got.iter_mut().zip(p.op_counts()) {
            *g = g.saturating_add(c);
        }
    }
    let of = |k: OpKind| got.get(k.index()).copied().unwrap_or(0);
    let mul = of(OpKind::Mul);
    let exp = of(OpKind::Exp).saturating_add(of(OpKind::Expd));
    let div = of(OpKind::Div);
    let max = of(OpKind::Max);
    let all = got.iter().fold(0u64, |a, &c| a.saturating_add(c));
    let ops = &m.ops;
    let online = crate::is_online(m);
    let mut fail = |msg: String| v.fail(Invariant::OpCount, msg);
    if div != need.div {
        fail(format!(
            "executed {div} div, the layer needs exactly {}",
            need.div
        ));
    }
    if div != ops.phase2_div {
        fail(format!(
            "executed {div} div, the manifest's ops claim {}",
            ops.phase2_div
        ));
    }
    if all != ops.total() {
        fail(format!(
            "executed {all} operations in all, the manifest's ops claim {} in all",
            ops.total()
        ));
    }
    for (what, got, claim) in [
        ("mul", mul, ops.phase1_mac.saturating_add(ops.phase3_mac)),
        ("exp", exp, ops.phase2_exp),
        ("max", max, ops.phase2_max),
    ] {
        if got < claim {
            fail(format!(
                "executed {got} {what}, fewer than the manifest's ops claim ({claim})"
            ));
        }
    }
    // The phase-1 exception of the flattened proof: a shared unmasked layer may declare
    // products computed once per score.
    let per_score = !opts.exact_ops && shape.shared && !shape.causal;
    for (what, claim, need, extra_ok) in [
        ("phase-1 mul", ops.phase1_mac, need.phase1_mul, per_score),
        ("exp", ops.phase2_exp, need.exp, false),
        ("phase-3 mul", ops.phase3_mac, need.phase3_mul, false),
        ("max", ops.phase2_max, need.max, false),
    ] {
        if claim != need && !(extra_ok && claim > need) {
            fail(format!(
                "the manifest's ops claim {claim} {what}, the layer needs exactly {need}"
            ));
        }
    }
    if !online && ops.online_rescale != 0 {
        fail(format!(
            "the manifest claims {} online rescale operations for a layer that does not declare the online formulation",
            ops.online_rescale
        ));
    }
}

/// The outcome of [`prove_loops`].
#[derive(Debug)]
pub struct Proof {
    /// The checks without unrolling, which run first.
    pub checks: Compact,
    /// The statement proved, or why the programs are not proved without unrolling.
    pub outcome: Result<String, String>,
    /// Bundle evaluations the proof performed (its work, against `checks.bundles`).
    pub evaluations: u64,
    pub expressions: usize,
    pub time: Duration,
}

impl Proof {
    pub fn proved(&self) -> bool {
        self.outcome.is_ok()
    }

    pub fn to_json(&self) -> serde_json::Value {
        let mut j = self.checks.to_json();
        j["ok"] = self.proved().into();
        j["proved"] = self.outcome.as_ref().ok().cloned().into();
        if let Err(why) = &self.outcome {
            j["not_proved"] = why.clone().into();
        }
        j["stats"]["time_s"] = self.time.as_secs_f64().into();
        j["stats"]["evaluations"] = self.evaluations.into();
        j["stats"]["expressions"] = self.expressions.into();
        j
    }
}

/// What the proof without unrolling establishes beyond [`COVERAGE`] when it succeeds.
pub const PROOF_COVERS: [Invariant; 9] = [
    Invariant::Manifest,
    Invariant::Setup,
    Invariant::Placement,
    Invariant::Fault,
    Invariant::Output,
    Invariant::Masked,
    Invariant::Unnecessary,
    Invariant::Duplicate,
    Invariant::OpCount,
];

impl fmt::Display for Proof {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.outcome {
            Ok(statement) => {
                writeln!(f, "proved without unrolling: {statement}")?;
                writeln!(f, "0 violations")?;
                let names: Vec<&str> = PROOF_COVERS.iter().map(|i| i.name()).collect();
                writeln!(f, "invariants proved: {}", names.join(", "))?;
                writeln!(
                    f,
                    "not checked without unrolling: lost-value (only results dropped on the spot), unread-transfer, unused-input"
                )?;
            }
            Err(why) => {
                writeln!(f, "{}", self.checks)?;
                writeln!(f, "not proved without unrolling: {why}")?;
            }
        }
        write!(
            f,
            "time: {:.2} ms; {} bundle evaluations and {} expressions for {} bundle templates standing for {} bundles",
            self.time.as_secs_f64() * 1e3,
            self.evaluations,
            self.expressions,
            self.checks.templates,
            self.checks.bundles
        )
    }
}

/// Rings of at least this many PEs try the induction over ring steps before the lockstep
/// evaluation (whose work grows with PEs × steps); smaller ones the other way round.
const INDUCTION_FIRST: u32 = 32;

/// Proves loop programs without unrolling where [`prove`] (every PE running one program, no
/// mask) or [`ring`] (PEs running different programs, causal or not) covers them — separate q,
/// k, v and the online formulation either way; otherwise says why not, after the checks of
/// [`check_loops`]. Never panics, whatever the inputs.
pub fn prove_loops(programs: &[LoopProgram], manifest: &Manifest, opts: &Options) -> Proof {
    prove_with(programs, manifest, opts, Route::Any)
}

/// As [`prove_loops`], with rings of different programs proved only by the induction over
/// ring steps ([`induct`]), whatever their size: what the tests of that proof use.
pub fn prove_loops_by_induction(
    programs: &[LoopProgram],
    manifest: &Manifest,
    opts: &Options,
) -> Proof {
    prove_with(programs, manifest, opts, Route::Induction)
}

/// Which proofs a ring of different programs may take.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    Any,
    Induction,
}

fn prove_with(
    programs: &[LoopProgram],
    manifest: &Manifest,
    opts: &Options,
    route: Route,
) -> Proof {
    let start = Instant::now();
    let checks = check_loops(programs, manifest, opts);
    let mut proof = Proof {
        outcome: Err(String::new()),
        evaluations: 0,
        expressions: 0,
        time: Duration::ZERO,
        checks,
    };
    proof.outcome = outcome(programs, manifest, route, opts.threads, &mut proof);
    proof.time = start.elapsed();
    proof
}

fn outcome(
    programs: &[LoopProgram],
    m: &Manifest,
    route: Route,
    threads: usize,
    proof: &mut Proof,
) -> Result<String, String> {
    if proof.checks.total_violations() > 0 {
        return Err("the checks without unrolling found violations".into());
    }
    if !proof.checks.undecided.is_empty() {
        return Err("some checks without unrolling are undecided".into());
    }
    // One program on every PE: PE 0 and the rotation symmetry; otherwise every PE in phases.
    let uniform = prove::applies(programs, m).is_ok();
    // Rings of different programs: every PE in lockstep phases, or each PE alone with its
    // ring steps by induction. The lockstep evaluation's work grows with PEs × steps, the
    // induction's with PEs; on large rings the induction goes first. Both share one time
    // bound, and a proof with output rows off the specification is a proof that did not go
    // through (the other is tried), never a verdict of its own.
    let mut inducted = false;
    let ev = if uniform {
        prove::evaluate(programs, m)
    } else {
        let until = Instant::now() + prove::MAX_TIME;
        let by_induction = || {
            induct::evaluate_until(programs, m, Some(until), threads).and_then(|ev| {
                match ev.wrong_count {
                    0 => Ok(ev),
                    n => Err(format!("{n} output row(s) not in the specification's form")),
                }
            })
        };
        let in_lockstep = || ring::evaluate_until(programs, m, Some(until));
        if route == Route::Induction {
            inducted = true;
            by_induction()
        } else if m.pes >= INDUCTION_FIRST {
            match by_induction() {
                Ok(ev) => {
                    inducted = true;
                    Ok(ev)
                }
                Err(why) => in_lockstep().map_err(|also| {
                    format!(
                        "each PE alone, its steps by induction: {why}; in lockstep phases: {also}"
                    )
                }),
            }
        } else {
            match in_lockstep() {
                Ok(ev) if ev.wrong_count == 0 => Ok(ev),
                first => match (by_induction(), first) {
                    (Ok(ev), _) => {
                        inducted = true;
                        Ok(ev)
                    }
                    (Err(_), Ok(ev)) => Ok(ev),
                    (Err(why), Err(also)) => Err(format!(
                        "in lockstep phases: {also}; each PE alone, its steps by induction: {why}"
                    )),
                },
            }
        }
    }
    .map_err(|why| format!("not covered: {why}"))?;
    proof.evaluations = ev.evaluations;
    proof.expressions = ev.expressions;
    if ev.wrong_count > 0 {
        return Err(format!(
            "{} output row(s){} differ from the specification, e.g. {}",
            ev.wrong_count,
            if uniform { " of PE 0" } else { "" },
            ev.wrong.join("; ")
        ));
    }
    let l = &m.layer;
    let shape = crate::Shape {
        heads: l.heads,
        tokens: l.tokens,
        dim: l.dim,
        shared: false,
        causal: l.mask == "causal",
        scale: l.scale as f32,
        softmax: l.softmax().unwrap_or_default(),
    };
    let need = shape
        .counting()
        .necessary_as(m.normalisation)
        .ok_or("the layer is too large to count")?;
    let o = &ev.ops;
    let c = &m.ops;
    for (what, got, need, claim) in [
        ("phase-1 mul", o.phase1_mul, need.phase1_mul, c.phase1_mac),
        ("exp", o.exp, need.exp, c.phase2_exp),
        ("div", o.div, need.div, c.phase2_div),
        ("phase-3 mul", o.phase3_mul, need.phase3_mul, c.phase3_mac),
        ("max", o.max, need.max, c.phase2_max),
        (
            "online rescale",
            o.rescale,
            c.online_rescale,
            c.online_rescale,
        ),
    ] {
        if got != need || got != claim {
            return Err(format!(
                "executed {got} {what}; the layer needs {need} and the manifest claims {claim}"
            ));
        }
    }
    // The classes add up to what the loop structure says in closed form.
    let mut closed = 0u64;
    for p in programs {
        closed = p
            .op_counts()
            .iter()
            .fold(closed, |a, &x| a.saturating_add(x));
    }
    let total = o.phase1_mul + o.phase3_mul + o.exp + o.div + o.max + o.rescale;
    if total != closed {
        return Err(format!(
            "the evaluation counted {total} operations, the loop structure has {closed}"
        ));
    }
    Ok(format!(
        "for all inputs, y = attention(q, k, v, mask = {}, scale = {}, softmax = {}, online: y = (Σ e·v) / Σ e{}) for {} head(s) × {} tokens × dim {}, on {} PEs in {} cycles, with {} operations: mul {} + {}, exp {}, div {} (one per output element), max {}, and {} running-maximum copies, rescale factors and rescaled partial sums, as the manifest declares; {}",
        l.mask,
        l.scale as f32,
        l.softmax,
        if l.softmax == "safe" { " with e = exp(s·(S − M)), M exactly each row's maximum" } else { "" },
        l.heads,
        l.tokens,
        l.dim,
        m.pes,
        m.cycles,
        total,
        o.phase1_mul,
        o.phase3_mul,
        o.exp,
        o.div,
        o.max,
        o.rescale,
        if uniform {
            "PE 0 evaluated with symbolic loop indices, every other PE by the ring's rotation symmetry (all run one program)"
        } else if inducted {
            "every PE evaluated alone with symbolic loop indices, its ring steps by induction: at each step's start its receive buffers hold the contract for the hop, which the predecessor's sends in the step before deliver exactly, every PE starting each step in the same cycle"
        } else {
            "every PE evaluated with symbolic loop indices, in phases whose ring arrivals are apart from every word the receiver uses in them"
        }
    ))
}
