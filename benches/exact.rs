//! Exact (SAT) schedules for the paper's small instances: the paper's exhaustive-search figure,
//! attnc's heuristic schedule, and the best schedule `attnc optimal` finds within a time limit
//! per instance, with its proof status. Every schedule reported is run in the interpreter
//! against the reference and proved by the symbolic verifier.
//!
//! Run: `cargo bench --bench exact`. Environment: `ATTNC_EXACT_LIMIT` (seconds per instance,
//! default 120), `ATTNC_EXACT_ONLY` (e.g. `causal:4:4,shared:6:6` to run only those),
//! `ATTNC_EXACT_LONG=1` to add the long runs: a search up from the lower bound with no
//! neighbourhood search, 20 minutes for n = 4 and 70 for causal n = 5.

use compiler::exact::{self, Options, Outcome, Strategy};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

struct Instance {
    scheme: &'static str,
    n: u32,
    m: u32,
    paper_es: &'static str,
    /// A long run: search up from the lower bound, this many seconds.
    long: Option<f64>,
}

fn layer(scheme: &str, n: u32) -> lang::Layer {
    let q = if scheme == "shared" {
        "qkv = shared;"
    } else {
        "mask = causal;"
    };
    let src = format!(
        "layer {scheme}_n{n} {{ tokens = {n}; dim = {n}; scale = 1; softmax = plain; {q} }}"
    );
    let parsed = lang::parse(0, &src);
    assert!(!lang::has_errors(&parsed.diagnostics), "{src}");
    parsed.layers.into_iter().next().expect("one layer")
}

/// Runs the programs on random inputs; returns the error against the reference.
fn run(o: &Outcome) -> f64 {
    let inputs: BTreeMap<String, Vec<f32>> = compiler::exec::random_inputs(&o.manifest, 1);
    let out = compiler::exec::execute(
        isa::F32Domain,
        o.programs.clone(),
        &o.manifest,
        &inputs,
        &mut isa::NoObserver,
    )
    .expect("runs");
    let want = compiler::exec::reference_output(&o.manifest, &inputs).expect("reference");
    compiler::exec::max_abs_err(&out.outputs["y"], &want)
}

fn main() {
    let limit: f64 = std::env::var("ATTNC_EXACT_LIMIT")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120.0);
    let only: Option<Vec<String>> = std::env::var("ATTNC_EXACT_ONLY")
        .ok()
        .map(|s| s.split(',').map(str::to_string).collect());
    let long_runs = std::env::var_os("ATTNC_EXACT_LONG").is_some();
    let i = |scheme, n, m, paper_es| Instance {
        scheme,
        n,
        m,
        paper_es,
        long: None,
    };
    let long = |scheme, n, m, paper_es, seconds| Instance {
        long: Some(seconds),
        ..i(scheme, n, m, paper_es)
    };
    let mut instances = vec![
        i("shared", 3, 3, "21"),
        i("shared", 4, 4, "35"),
        i("shared", 5, 5, "50"),
        i("shared", 6, 3, "142* (TO)"),
        i("shared", 6, 6, "71* (TO)"),
        i("causal", 3, 3, "17 (16 unsat)"),
        i("causal", 4, 4, "26 (25 unsat)"),
        i("causal", 5, 5, "36* (TO)"),
        i("causal", 6, 3, "84* (TO)"),
        i("causal", 6, 6, "42* (TO)"),
    ];
    if long_runs {
        instances.extend([
            long("shared", 4, 4, "35", 1200.0),
            long("causal", 4, 4, "26 (25 unsat)", 1200.0),
            long("causal", 5, 5, "36* (TO)", 4200.0),
        ]);
    }
    println!("Exact schedules, d = n, scale 1, time limit {limit} s per instance.");
    println!();
    println!(
        "| scheme | n | m | LB | paper ES | attnc heuristic | exact | proved optimal | no schedule below | search | from | seconds | SAT calls | verified | max abs err |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut bad = 0;
    for x in &instances {
        let key = format!("{}:{}:{}", x.scheme, x.n, x.m);
        if only.as_ref().is_some_and(|o| !o.contains(&key)) {
            continue;
        }
        let l = layer(x.scheme, x.n);
        let opts = match x.long {
            None => Options {
                time_limit: Some(Duration::from_secs_f64(limit)),
                ..Options::default()
            },
            Some(seconds) => Options {
                time_limit: Some(Duration::from_secs_f64(seconds)),
                strategy: Strategy::Up,
                improve: false,
                sat_only: true,
                ..Options::default()
            },
        };
        let search = match x.long {
            None => format!("default, {limit} s"),
            Some(seconds) => format!("up, no LNS, {seconds} s"),
        };
        let start = Instant::now();
        let o = match exact::optimal(&l, x.m, &opts) {
            Ok(o) => o,
            Err(e) => {
                println!(
                    "| {} | {} | {} | | {} | | error: {e} | | | {search} | | | | | |",
                    x.scheme, x.n, x.m, x.paper_es
                );
                bad += 1;
                continue;
            }
        };
        let secs = start.elapsed().as_secs_f64();
        let err = run(&o);
        let report = verifier::verify(&o.programs, &o.manifest);
        if err > 1e-4 || !report.is_ok() {
            bad += 1;
        }
        let calls: Vec<String> = o
            .attempts
            .iter()
            .map(|a| format!("{}:{}", a.t, a.verdict.name()))
            .collect();
        println!(
            "| {} | {} | {} | {} | {} | {} | **{}** | {} | {} | {} | {} | {:.1} | {} | {} | {:.1e} |",
            x.scheme,
            x.n,
            x.m,
            o.lower_bound,
            x.paper_es,
            o.heuristic_cycles
                .map_or("-".to_string(), |c| c.to_string()),
            o.cycles,
            if o.proved_optimal { "yes" } else { "no" },
            o.proven_bound,
            search,
            o.source.name(),
            secs,
            if calls.is_empty() {
                "-".to_string()
            } else {
                calls.join(" ")
            },
            if report.is_ok() { "yes" } else { "NO" },
            err
        );
    }
    println!();
    println!(
        "`*` = the paper's (#operations)/(#PEs) estimate, TO = its exhaustive search timed out \
         (1 h). LB = ceil(necessary ops / m). \"no schedule below\" is the lower bound raised by \
         every unsatisfiable budget. \"from\": sat = found by the SAT search (neighbourhood search \
         or full), heuristic = compiler::compile's schedule kept."
    );
    if bad > 0 {
        println!("WARNING: {bad} instance(s) failed to run, verify or schedule");
        std::process::exit(1);
    }
}
