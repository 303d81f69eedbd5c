//! The exact (SAT) scheduler: decoded models run correctly, infeasible budgets are refused, the
//! time limit holds, and the heuristic schedules satisfy the encoding.

use compiler::exact::{self, Verdict};
use compiler::passes::select::Choice;
use compiler::problem::Problem;
use std::time::{Duration, Instant};

fn layer(src: &str) -> lang::Layer {
    let parsed = lang::parse(0, src);
    assert!(!lang::has_errors(&parsed.diagnostics), "{src}");
    parsed.layers.into_iter().next().expect("one layer")
}

fn heuristic(l: &lang::Layer, pes: u32) -> compiler::schedule::RingSchedule {
    let problem = exact::problem_of(l).expect("analyzes");
    let candidates = compiler::passes::select::run(&problem, pes, Choice::Auto).expect("applies");
    candidates
        .iter()
        .map(|a| a.schedule(&problem, pes).expect("schedules"))
        .min_by_key(|s| s.cycles())
        .expect("a candidate")
}

fn problem(l: &lang::Layer) -> Problem {
    exact::problem_of(l).expect("analyzes")
}

#[test]
fn heuristic_schedules_satisfy_the_encoding() {
    for (src, pes) in [
        ("layer t { tokens = 3; dim = 3; scale = 1; mask = causal; }", 3),
        ("layer t { tokens = 4; dim = 4; scale = 1; mask = causal; }", 4),
        ("layer t { tokens = 4; dim = 4; scale = 1; qkv = shared; }", 4),
        ("layer t { tokens = 3; dim = 2; scale = 1; }", 2),
    ] {
        let l = layer(src);
        let s = heuristic(&l, pes);
        let deadline = Some(Instant::now() + Duration::from_secs(60));
        let v = exact::search::admits(&problem(&l), pes, s.cycles() as u64, &s, deadline)
            .expect("encodes");
        assert_eq!(v, Verdict::Sat, "{src} on {pes} PEs, {} cycles", s.cycles());
    }
}
