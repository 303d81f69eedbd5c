//! Short sequences on rings up to 256 PEs: every shape of n ∈ {1, 2, 3, 4, 8, 12, 16, 32},
//! m ∈ {4, 8, 16, 64, 256}, d ∈ {8, 64, 128}, heads ∈ {1, 4}, each scheme, compiled through
//! `compiler::compile` with `auto` and the default `softmax = safe`, with cycles against the
//! lower bound (LB) and against `bound` (LB, the critical path and the link bound, whichever is
//! largest; docs/scheduling.md). Shapes the `attnc` command refuses are listed as refused, with
//! the reason. Programs of up to `CHECK_OPS` necessary operations are proved by the verifier and
//! run against the f64 reference. A second table gives the paper's causal instances n = m
//! (d = n, one head, `softmax = plain`, the formulation of the exact search's best known results).
//!
//! Run: `cargo bench --bench small` (`-- --quick` for d = 8 only; `-- --only n=16,m=256` for the
//! shapes whose fields match every `key=value` given, keys `n`, `m`, `d`, `heads`, `scheme`, a
//! value being one of several when written `m=16/64/256`;
//! `-- --no-paper` leaves out the paper's instances; `-- --single-placement` compiles as
//! `attnc compile --single-placement` does, every input element on one PE). A filtered run prints
//! its summary over the shapes it ran, so only a full run describes the table. By default a
//! program may preload copies of an input element on several PEs; the column `copies` gives the
//! words it preloads beyond one per element, and `bound` is then the bound for such programs.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod common;

use compiler::passes::select::Choice;
use runtime::bound::Bound;
use std::collections::BTreeMap;
use std::time::Instant;

/// Largest layer (necessary operations) that is also verified and run: the proof and the
/// interpreter take well under a second there, and the larger layers are the ones furthest from
/// the small-ring regime this table is about.
const CHECK_OPS: u64 = 300_000;

/// Largest error accepted against the f64 reference (`attnc run`'s default tolerance).
const TOL: f64 = 1e-4;

const SCHEMES: [(&str, &str); 3] = [
    ("separate", ""),
    ("shared", "qkv = shared;"),
    ("causal", "mask = causal;"),
];

fn layer(src: &str) -> lang::Layer {
    let parsed = lang::parse(0, src);
    assert!(!lang::has_errors(&parsed.diagnostics), "{src}");
    parsed.layers.into_iter().next().expect("one layer")
}

fn compile(layer: &lang::Layer, pes: u32) -> Result<compiler::Compiled, String> {
    attnc::limits::check_ring(layer, pes)?;
    let opts = compiler::Options {
        pes,
        schedule: Choice::Auto,
        dump_after: None,
        mem_limit: None,
        reroll: false,
        single_placement: std::env::args().any(|a| a == "--single-placement"),
    };
    compiler::compile(layer, &opts).map_err(|e| e.to_string())
}

/// The proof and a run against the reference, when the layer is small enough.
fn check(c: &compiler::Compiled) -> Option<bool> {
    if c.manifest.necessary_ops > CHECK_OPS {
        return None;
    }
    let proved = verifier::verify(&c.programs, &c.manifest).is_ok();
    let inputs = compiler::exec::random_inputs(&c.manifest, 3);
    let out = compiler::exec::execute(
        isa::F32Domain,
        c.programs.clone(),
        &c.manifest,
        &inputs,
        &mut isa::NoObserver,
    );
    let close = out.is_ok_and(|out| {
        let want = compiler::exec::reference_output(&c.manifest, &inputs).expect("reference");
        compiler::exec::max_abs_err(&out.outputs["y"], &want) <= TOL
    });
    Some(proved && close)
}

/// What limits the bound: the largest part's name.
fn limited_by(b: &Bound) -> &'static str {
    if b.value == b.lower_bound {
        "LB"
    } else if b.value == b.critical_path {
        "critical path"
    } else {
        "link"
    }
}

#[derive(Default)]
struct Summary {
    shapes: u32,
    refused: BTreeMap<String, u32>,
    log_bound: f64,
    compiled: u32,
    worst_bound: (f64, String),
    plenty: u32,
    plenty_refused: u32,
    worst_plenty: (f64, String),
    plenty_hard: u32,
    worst_plenty_easy: (f64, String),
    above_lb: BTreeMap<&'static str, u32>,
    checked: u32,
    failed: Vec<String>,
    /// Programs shorter than `bound`, which would disprove it.
    below_bound: Vec<String>,
    unchecked: u32,
    /// Programs that preload copies of input elements.
    with_copies: u32,
    /// Whether the bounds are those for programs that may preload copies.
    copies_allowed: bool,
}

fn worse(slot: &mut (f64, String), ratio: f64, what: &str) {
    if ratio > slot.0 {
        *slot = (ratio, what.to_string());
    }
}

/// One shape of the table.
#[derive(Clone, Copy)]
struct Shape {
    n: u32,
    m: u32,
    d: u32,
    heads: u32,
    scheme: usize,
}

/// What compiling one shape gave, as plain data (the compiled programs stay in the worker).
enum Outcome {
    Refused {
        reason: String,
        kind: String,
    },
    Compiled {
        cycles: u64,
        lower_bound: u64,
        bound: Bound,
        schedule: String,
        /// Words preloaded beyond one per input element.
        copies: usize,
        checked: Option<bool>,
        secs: f64,
    },
}

fn measure(sh: Shape) -> Outcome {
    let extra = SCHEMES[sh.scheme].1;
    let l = layer(&format!(
        "layer t {{ tokens = {}; dim = {}; heads = {}; {extra} }}",
        sh.n, sh.d, sh.heads
    ));
    let t = Instant::now();
    match compile(&l, sh.m) {
        Err(why) => Outcome::Refused {
            reason: short_reason(&l, &why),
            kind: why_kind(&why),
        },
        Ok(c) => {
            let secs = t.elapsed().as_secs_f64();
            Outcome::Compiled {
                cycles: c.manifest.cycles,
                lower_bound: c.manifest.lower_bound,
                bound: c.manifest.bound.expect("every compile states its bound"),
                schedule: c.manifest.schedule.clone(),
                copies: c.manifest.inputs.values().map(|p| p.copies.len()).sum(),
                checked: check(&c),
                secs,
            }
        }
    }
}

fn main() {
    attnc::alloc::keep_freed_pages();
    let start = Instant::now();
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let paper = !args.iter().any(|a| a == "--no-paper");
    let only: Vec<(String, String)> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(|f| {
            f.split(',')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .collect()
        })
        .unwrap_or_default();
    let dims: &[u32] = if quick { &[8] } else { &[8, 64, 128] };
    let mut shapes = Vec::new();
    for n in [1u32, 2, 3, 4, 8, 12, 16, 32] {
        for m in [4u32, 8, 16, 64, 256] {
            for &d in dims {
                for heads in [1u32, 4] {
                    for (scheme, &(scheme_name, _)) in SCHEMES.iter().enumerate() {
                        let field = |k: &str| match k {
                            "n" => n.to_string(),
                            "m" => m.to_string(),
                            "d" => d.to_string(),
                            "heads" => heads.to_string(),
                            "scheme" => scheme_name.to_string(),
                            _ => String::new(),
                        };
                        if only
                            .iter()
                            .any(|(k, v)| !v.split('/').any(|alt| field(k) == alt))
                        {
                            continue;
                        }
                        shapes.push(Shape {
                            n,
                            m,
                            d,
                            heads,
                            scheme,
                        });
                    }
                }
            }
        }
    }
    let outcomes = common::par_map(&shapes, |&sh| measure(sh));
    println!("| n | m | d | heads | scheme | cycles | LB | critical path | link | bound | cycles/LB | cycles/bound | auto chose | copies | checked | compile s |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut s = Summary::default();
    for (sh, out) in shapes.iter().zip(&outcomes) {
        let Shape { n, m, d, heads, .. } = *sh;
        let scheme = SCHEMES[sh.scheme].0;
        s.shapes += 1;
        let what = format!("n={n} m={m} d={d} heads={heads} {scheme}");
        let plenty = u64::from(n) * u64::from(d) * u64::from(heads) >= 8 * u64::from(m);
        s.plenty += u32::from(plenty);
        match out {
            Outcome::Refused { reason, kind } => {
                println!("| {n} | {m} | {d} | {heads} | {scheme} | refused: {reason} | | | | | | | | | | |");
                *s.refused.entry(kind.clone()).or_default() += 1;
                s.plenty_refused += u32::from(plenty);
            }
            Outcome::Compiled {
                cycles,
                lower_bound,
                bound: b,
                schedule,
                copies,
                checked,
                secs,
            } => {
                if *copies > 0 {
                    s.with_copies += 1;
                }
                let (to_lb, to_bound) = (
                    *cycles as f64 / *lower_bound as f64,
                    *cycles as f64 / b.value as f64,
                );
                s.compiled += 1;
                s.copies_allowed |= b.copies;
                s.log_bound += to_bound.ln();
                worse(&mut s.worst_bound, to_bound, &what);
                if b.value > b.lower_bound {
                    *s.above_lb.entry(limited_by(b)).or_default() += 1;
                }
                if plenty {
                    worse(&mut s.worst_plenty, to_lb, &what);
                    if 5 * b.critical_path.max(b.link) > 6 * b.lower_bound {
                        s.plenty_hard += 1;
                    } else {
                        worse(&mut s.worst_plenty_easy, to_lb, &what);
                    }
                }
                if *cycles < b.value {
                    // `bound` claims no program is shorter: a shorter one disproves it.
                    s.below_bound
                        .push(format!("{what}: {cycles} cycles, bound {}", b.value));
                }
                let checked = match checked {
                    Some(true) => {
                        s.checked += 1;
                        "yes"
                    }
                    Some(false) => {
                        s.failed.push(what.clone());
                        "FAILED"
                    }
                    None => {
                        s.unchecked += 1;
                        "-"
                    }
                };
                println!(
                    "| {n} | {m} | {d} | {heads} | {scheme} | {cycles} | {lower_bound} | {} | {} | {} | {to_lb:.3} | {to_bound:.3} | {schedule} | {} | {checked} | {secs:.2} |",
                    b.critical_path,
                    b.link,
                    b.value,
                    if *copies > 0 {
                        copies.to_string()
                    } else {
                        "-".into()
                    },
                );
            }
        }
    }
    println!();
    summarise(&s);
    println!();
    if paper {
        paper_instances();
        println!();
    }
    println!(
        "bench time: {:.0} s on {} threads",
        start.elapsed().as_secs_f64(),
        common::workers()
    );
}

/// The refusal as a table cell: the ring check's limit, or the compiler's first line.
fn short_reason(l: &lang::Layer, why: &str) -> String {
    if why.contains("more than this layer can use") {
        format!(
            "at most {} PEs usable ({} weights)",
            attnc::limits::max_pes(l),
            attnc::limits::attention_weights(l)
        )
    } else {
        why.lines().next().unwrap_or(why).replace('|', "/")
    }
}

fn why_kind(why: &str) -> String {
    if why.contains("more than this layer can use") {
        "the ring check (--pes above the PEs the layer can use)".into()
    } else {
        why.lines().next().unwrap_or(why).to_string()
    }
}

fn summarise(s: &Summary) {
    let refused: u32 = s.refused.values().sum();
    let reasons: Vec<String> = s
        .refused
        .iter()
        .map(|(why, k)| format!("{k} by {why}"))
        .collect();
    println!(
        "{} shapes (softmax = safe): {} compiled, {refused} refused ({})",
        s.shapes,
        s.compiled,
        if reasons.is_empty() {
            "none".into()
        } else {
            reasons.join("; ")
        }
    );
    println!();
    println!(
        "preload copies {}: {} of the compiled programs preload copies of input elements",
        if s.copies_allowed {
            "allowed (bound: the one for programs that may preload copies)"
        } else {
            "not allowed (--single-placement)"
        },
        s.with_copies
    );
    println!();
    println!(
        "cycles/bound over the compiled shapes: geometric mean {:.4}, worst {:.4} ({})",
        (s.log_bound / f64::from(s.compiled.max(1))).exp(),
        s.worst_bound.0,
        s.worst_bound.1
    );
    println!();
    let parts: Vec<String> = s
        .above_lb
        .iter()
        .map(|(part, k)| format!("{k} by the {part}"))
        .collect();
    println!(
        "bound above LB in {} compiled shapes ({})",
        s.above_lb.values().sum::<u32>(),
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        }
    );
    println!();
    println!(
        "shapes with n·d·heads >= 8m: {} ({} refused); worst cycles/LB {:.4} ({}); {} of them have a critical-path or link bound above 1.2 × LB; worst cycles/LB among the others {:.4} ({})",
        s.plenty,
        s.plenty_refused,
        s.worst_plenty.0,
        s.worst_plenty.1,
        s.plenty_hard,
        s.worst_plenty_easy.0,
        s.worst_plenty_easy.1
    );
    println!();
    println!(
        "checked (proved by the verifier and run against the f64 reference, layers up to {CHECK_OPS} necessary operations): {} passed, {} failed{}, {} larger ones not checked",
        s.checked,
        s.failed.len(),
        if s.failed.is_empty() {
            String::new()
        } else {
            format!(" ({})", s.failed.join(", "))
        },
        s.unchecked
    );
    println!();
    println!(
        "programs shorter than their bound (each would disprove it): {}",
        if s.below_bound.is_empty() {
            "none".to_string()
        } else {
            s.below_bound.join(", ")
        }
    );
}

/// The paper's causal instances n = m, d = n, one head, in the paper's formulation (the exact
/// search's results are for `softmax = plain`), and the safe one beside it.
fn paper_instances() {
    println!("| n = m | plain cycles | plain LB | plain bound | cycles/LB | cycles/bound | best known (exact search) | auto chose | safe cycles | safe LB | safe bound | checked |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for n in [4u32, 5, 6, 8, 16, 32] {
        let best = match n {
            4 => "25 (proved optimal)",
            5 => "37",
            6 => "50",
            _ => "-",
        };
        let src = |softmax: &str| {
            format!("layer t {{ tokens = {n}; dim = {n}; mask = causal; softmax = {softmax}; }}")
        };
        let (plain, safe) = (
            compile(&layer(&src("plain")), n),
            compile(&layer(&src("safe")), n),
        );
        let cells = |c: &Result<compiler::Compiled, String>| match c {
            Ok(c) => {
                let b = c.manifest.bound.expect("every compile states its bound");
                (
                    c.manifest.cycles.to_string(),
                    c.manifest.lower_bound.to_string(),
                    b.value.to_string(),
                    format!(
                        "{:.3}",
                        c.manifest.cycles as f64 / c.manifest.lower_bound as f64
                    ),
                    format!("{:.3}", c.manifest.cycles as f64 / b.value as f64),
                    c.manifest.schedule.clone(),
                )
            }
            Err(why) => (
                format!("refused: {}", why.lines().next().unwrap_or(why)),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            ),
        };
        let checked = [&plain, &safe]
            .iter()
            .map(|c| match c {
                Ok(c) => match check(c) {
                    Some(true) => "yes",
                    Some(false) => "FAILED",
                    None => "-",
                },
                Err(_) => "-",
            })
            .collect::<Vec<_>>()
            .join(" / ");
        let p = cells(&plain);
        let q = cells(&safe);
        println!(
            "| {n} | {} | {} | {} | {} | {} | {best} | {} | {} | {} | {} | {checked} |",
            p.0, p.1, p.2, p.3, p.4, p.5, q.0, q.1, q.2
        );
    }
}
