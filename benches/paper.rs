//! Reproduces the paper's Tables I and II: for every instance, the paper's cycles, attnc's, the
//! lower bound, cycles/LB, operations by phase and compile time. Every schedule is also run in the
//! interpreter against the f64 reference, so a number here is never from a wrong program.
//!
//! Run: `cargo bench --bench paper`

use compiler::passes::select::Choice;
use std::collections::BTreeMap;
use std::time::Instant;

struct Instance {
    table: &'static str,
    n: u32,
    m: u32,
    paper_algo1: u64,
    paper_es: &'static str,
    paper: u64,
}

fn compile(src: &str, pes: u32) -> (compiler::Compiled, f64) {
    let parsed = lang::parse(0, src);
    assert!(!lang::has_errors(&parsed.diagnostics));
    let layer = &parsed.layers[0];
    let opts = compiler::Options {
        pes,
        schedule: Choice::Auto,
        dump_after: None,
        mem_limit: None,
        reroll: false,
        single_placement: false,
    };
    let t = Instant::now();
    let c = compiler::compile(layer, &opts).expect("compiles");
    (c, t.elapsed().as_secs_f64() * 1e3)
}

fn run(c: &compiler::Compiled) -> f64 {
    let inputs: BTreeMap<String, Vec<f32>> = compiler::exec::random_inputs(&c.manifest, 1);
    let out = compiler::exec::execute(
        isa::F32Domain,
        c.programs.clone(),
        &c.manifest,
        &inputs,
        &mut isa::NoObserver,
    )
    .expect("runs");
    let want = compiler::exec::reference_output(&c.manifest, &inputs).expect("reference");
    compiler::exec::max_abs_err(&out.outputs["y"], &want)
}

fn main() {
    let i = |table, n, m, paper_algo1, paper_es, paper| Instance {
        table,
        n,
        m,
        paper_algo1,
        paper_es,
        paper,
    };
    let instances = [
        i("I shared", 3, 3, 24, "21", 21),
        i("I shared", 4, 4, 40, "35", 36),
        i("I shared", 5, 5, 60, "50", 50),
        i("I shared", 6, 3, 168, "142*", 146),
        i("I shared", 6, 6, 84, "71*", 73),
        i("I shared", 15, 5, 1440, "1134*", 1134),
        i("I shared", 15, 15, 480, "396*", 396),
        i("II causal", 3, 3, 24, "17", 18),
        i("II causal", 4, 4, 40, "26", 32),
        i("II causal", 5, 5, 60, "36*", 40),
        i("II causal", 6, 3, 168, "84*", 120),
        i("II causal", 6, 6, 84, "42*", 60),
        i("II causal", 15, 5, 1440, "768*", 810),
        i("II causal", 15, 15, 480, "256*", 270),
        i("II causal", 17, 17, 612, "324*", 340),
    ];
    println!(
        "| table | n | m | paper Algo 1 | paper ES | paper Algo 2/3 | attnc | LB | attnc/LB | schedule | phase-1 MAC | EXP | DIV | phase-3 MAC | compile ms | max abs err |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut worse = 0;
    for x in &instances {
        let q = if x.table.starts_with("I ") {
            "qkv = shared;"
        } else {
            "mask = causal;"
        };
        let src = format!(
            "layer t {{ tokens = {}; dim = {}; scale = 1; softmax = plain; {q} }}",
            x.n, x.n
        );
        let (c, ms) = compile(&src, x.m);
        let err = run(&c);
        let m = &c.manifest;
        if m.cycles > x.paper || err > 1e-4 {
            worse += 1;
        }
        println!(
            "| {} | {} | {} | {} | {} | {} | **{}** | {} | {:.3} | {} | {} | {} | {} | {} | {:.2} | {:.1e} |",
            x.table,
            x.n,
            x.m,
            x.paper_algo1,
            x.paper_es,
            x.paper,
            m.cycles,
            m.lower_bound,
            m.cycles as f64 / m.lower_bound as f64,
            m.schedule,
            m.ops.phase1_mac,
            m.ops.phase2_exp,
            m.ops.phase2_div,
            m.ops.phase3_mac,
            ms,
            err
        );
    }
    println!();
    println!("`*` = the paper's ops/PEs estimate, not an achieved schedule. LB = ceil(necessary ops / m).");
    if worse > 0 {
        println!("WARNING: {worse} instance(s) above the paper or inaccurate");
        std::process::exit(1);
    }
}
