//! Verification time for the paper's instances and larger ones, next to the paper's SAT times.
//!
//! `cargo bench -p verifier` (release). Each case is compiled once and verified a few times; the
//! best and median wall-clock times are printed.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use compiler::passes::select::Choice;
use std::time::{Duration, Instant};

struct Case {
    what: &'static str,
    tokens: u32,
    pes: u32,
    qkv: &'static str,
    mask: &'static str,
    schedule: Choice,
    /// The paper's SAT verification time for the same instance, if it reports one.
    paper: &'static str,
}

fn main() {
    attnc::alloc::keep_freed_pages();
    let cases = [
        Case {
            what: "causal (Algo 3)",
            tokens: 17,
            pes: 17,
            qkv: "separate",
            mask: "causal",
            schedule: Choice::Named("causal"),
            paper: "8.35 s",
        },
        Case {
            what: "shared (Algo 2)",
            tokens: 15,
            pes: 5,
            qkv: "shared",
            mask: "none",
            schedule: Choice::Named("symmetric"),
            paper: "14.45 s",
        },
        Case {
            what: "baseline (Algo 1)",
            tokens: 15,
            pes: 5,
            qkv: "separate",
            mask: "none",
            schedule: Choice::Named("baseline"),
            paper: "27.38 s",
        },
        Case {
            what: "baseline (Algo 1)",
            tokens: 17,
            pes: 17,
            qkv: "separate",
            mask: "none",
            schedule: Choice::Named("baseline"),
            paper: "timeout (1 h)",
        },
        Case {
            what: "separate baseline",
            tokens: 64,
            pes: 8,
            qkv: "separate",
            mask: "none",
            schedule: Choice::Named("baseline"),
            paper: "-",
        },
        Case {
            what: "shared symmetric",
            tokens: 64,
            pes: 8,
            qkv: "shared",
            mask: "none",
            schedule: Choice::Named("symmetric"),
            paper: "-",
        },
        Case {
            what: "causal",
            tokens: 64,
            pes: 8,
            qkv: "separate",
            mask: "causal",
            schedule: Choice::Named("causal"),
            paper: "-",
        },
    ];
    println!(
        "{:20} {:>4} {:>4} {:>8} {:>10} {:>10} {:>10} {:>12}  paper (SAT)",
        "scheme", "n", "m", "cycles", "exprs", "best", "median", "bundles/s"
    );
    for c in &cases {
        let src = format!(
            "layer b {{ tokens = {n}; dim = {n}; qkv = {}; mask = {}; scale = 1; }}",
            c.qkv,
            c.mask,
            n = c.tokens
        );
        let parsed = lang::parse(0, &src);
        let layer = &parsed.layers[0];
        let opts = compiler::Options {
            pes: c.pes,
            schedule: c.schedule,
            dump_after: None,
            mem_limit: None,
            reroll: false,
            single_placement: false,
        };
        let compiled = match compiler::compile(layer, &opts) {
            Ok(x) => x,
            Err(e) => {
                println!(
                    "{:20} {:>4} {:>4}  not compiled: {e}",
                    c.what, c.tokens, c.pes
                );
                continue;
            }
        };
        let runs = if c.tokens > 32 { 3 } else { 10 };
        let mut times: Vec<Duration> = Vec::new();
        let mut exprs = 0;
        for _ in 0..runs {
            let t = Instant::now();
            let report = verifier::verify(&compiled.programs, &compiled.manifest);
            times.push(t.elapsed());
            assert!(report.is_ok(), "{src}:\n{report}");
            exprs = report.stats.expressions;
        }
        times.sort();
        let bundles: u64 = compiled
            .programs
            .iter()
            .map(|p| p.bundles.len() as u64)
            .sum();
        println!(
            "{:20} {:>4} {:>4} {:>8} {:>10} {:>9.4}s {:>9.4}s {:>12.3e}  {}",
            c.what,
            c.tokens,
            c.pes,
            compiled.manifest.cycles,
            exprs,
            times[0].as_secs_f64(),
            times[runs / 2].as_secs_f64(),
            bundles as f64 / times[0].as_secs_f64(),
            c.paper
        );
    }
}
