//! Rings larger than the work: `auto` and the split dataflow on rings of up to four PEs per token
//! and up to four heads, both softmax formulations, q = k = v or not, with and without a mask.
//! Every program is proved by the symbolic verifier and run against the f64 reference.

use crate::common;

use common::{compile_src, full_grids, pick, run_emitted};
use compiler::passes::select::Choice;

/// The end-to-end tolerance every grid uses (inputs in [-1, 1], f32 arithmetic).
const TOL: f64 = 1e-4;

fn src(n: u32, d: u32, heads: u32, shared: bool, causal: bool, safe: bool) -> String {
    let s = common::layer_src(n, d, heads, shared, causal);
    if safe {
        s.replace(" softmax = plain;", "")
    } else {
        s
    }
}

fn check(n: u32, d: u32, m: u32, heads: u32, shared: bool, causal: bool, safe: bool) -> (u64, u64) {
    let (auto, split) = check_compiled(n, d, m, heads, shared, causal, safe);
    (auto.manifest.cycles, split.manifest.cycles)
}

/// [`check`], returning both compiles for further checks on them.
fn check_compiled(
    n: u32,
    d: u32,
    m: u32,
    heads: u32,
    shared: bool,
    causal: bool,
    safe: bool,
) -> (compiler::Compiled, compiler::Compiled) {
    let text = src(n, d, heads, shared, causal, safe);
    let what = format!("{text} on {m} PEs");
    let auto = compile_src(&text, m, Choice::Auto);
    let split = compile_src(&text, m, Choice::Named("split"));
    assert_eq!(split.manifest.schedule, "schedule-split", "{what}");
    for c in [&auto, &split] {
        // `run_emitted` proves the programs with the verifier before running them.
        let r = run_emitted(c, u64::from(n * 1000 + d * 10 + m));
        assert!(
            r.max_abs_err <= TOL,
            "{what} ({}): max_abs_err {}",
            c.manifest.schedule,
            r.max_abs_err
        );
        assert_eq!(r.cycles, c.manifest.cycles, "{what}");
        assert!(r.cycles >= c.manifest.lower_bound, "{what}");
    }
    assert!(
        auto.manifest.cycles <= split.manifest.cycles,
        "{what}: auto {} against split {}",
        auto.manifest.cycles,
        split.manifest.cycles
    );
    (auto, split)
}

/// Rings of up to four PEs per token for one scheme (`k` its index, which alternates the
/// formulation so that both meet every size); one test per scheme, run in parallel. Each ring
/// takes one head count of one and four, alternating (`common::pick`), so each size meets one
/// formulation, and each kind of `d` (`n` or 8) meets both with each head count;
/// `ATTNC_FULL_GRIDS=1` takes both head counts.
fn rings_up_to_four_pes_per_token(k: u32, shared: bool, causal: bool) {
    let mut combos = 0;
    for n in [1u32, 2, 3, 4, 6] {
        for d in [n, 8] {
            for m in [n + 1, 2 * n, 4 * n] {
                // Counted by the layers before, not by the sizes: the formulation follows the
                // heads' parity, and a start of `n + d + m` would tie it to `d`'s.
                for heads in pick(&[1u32, 4], 2, (combos + k) as usize) {
                    let safe = (n + m + heads + k).is_multiple_of(2);
                    check(n, d, m, heads, shared, causal, safe);
                    combos += 1;
                }
            }
        }
    }
    assert_eq!(combos, if full_grids() { 60 } else { 30 });
}

#[test]
fn rings_up_to_four_pes_per_token_separate() {
    rings_up_to_four_pes_per_token(0, false, false);
}

#[test]
fn rings_up_to_four_pes_per_token_shared() {
    rings_up_to_four_pes_per_token(1, true, false);
}

#[test]
fn rings_up_to_four_pes_per_token_causal() {
    rings_up_to_four_pes_per_token(2, false, true);
}

#[test]
fn rings_up_to_four_pes_per_token_shared_causal() {
    rings_up_to_four_pes_per_token(3, true, true);
}

/// The paper's causal instances with d = n = m, plain softmax: below what the phase-by-phase
/// schedules reached before (32, 40, 60 cycles; 1.185 × LB at n = 8), and at or below the exact
/// search's best known results for n = 4, 5, 6 (25, proved optimal; 37; 58).
#[test]
fn causal_n_equals_m() {
    for (n, before, best_known) in [(4u32, 32u64, 25u64), (5, 40, 37), (6, 60, 58)] {
        let (auto, _) = check(n, n, n, 1, false, true, false);
        assert!(auto < before, "n = m = {n}: {auto} cycles");
        assert!(auto <= best_known, "n = m = {n}: {auto} cycles");
    }
    // n = 8 is checked with the larger instances (`causal_n_equals_m_within_three_percent`),
    // which compile it once for both.
}

/// The same instances from 8 to 11 tokens and at 13 are within 3 % of the lower bound, proved
/// and run. From 12 tokens (2 028 necessary operations) the local search has its longer allowance
/// for a causal head spanning the ring: n = 13 took 203 cycles with the usual one (1.036 × LB),
/// 199 with it (LB 196). (n = 12, 174 and 172 cycles, LB 169, is left to the grids: each such
/// layer costs seconds.)
#[test]
fn causal_n_equals_m_within_three_percent() {
    for n in (8u32..=11).chain([13]) {
        let c = if n == 8 {
            // The smallest of them also against the split dataflow forced, as [`causal_n_equals_m`]
            // checks the smaller ones, and below 1.185 × its lower bound of 81 (36 weights, 18
            // operations each, on 8 PEs), which the phase-by-phase schedules reached.
            let (auto, _) = check_compiled(n, n, n, 1, false, true, false);
            let eight = auto.manifest.cycles;
            assert!(eight * 1000 < 81 * 1185, "n = m = 8: {eight} cycles");
            auto
        } else {
            let text = src(n, n, 1, false, true, false);
            let c = compile_src(&text, n, Choice::Auto);
            let r = run_emitted(&c, u64::from(n));
            assert!(
                r.max_abs_err <= TOL,
                "n = m = {n}: max_abs_err {}",
                r.max_abs_err
            );
            assert_eq!(r.cycles, c.manifest.cycles, "n = m = {n}");
            c
        };
        let (cycles, lb) = (c.manifest.cycles, c.manifest.lower_bound);
        assert_eq!(lb, u64::from((n + 1) * (n + 1)), "n = m = {n}: LB");
        assert!(
            100 * cycles <= 103 * lb,
            "n = m = {n}: {cycles} cycles, LB {lb}"
        );
    }
}

/// One head of 16 tokens whose 64 columns span 64 PEs (33 520 necessary operations): above the
/// usual search's range, it gets the ring allowance, which takes it from 744 cycles (its plain
/// run, 1.420 × LB) to within 1.30 × LB (524). Proved and run like the rest; forced, since the
/// other candidates would only add compile time here.
#[test]
fn short_sequence_spanning_the_ring_is_searched() {
    let text = src(16, 64, 1, false, false, true);
    let c = compile_src(&text, 64, Choice::Named("split"));
    assert_eq!(c.manifest.schedule, "schedule-split");
    let r = run_emitted(&c, 16);
    assert!(r.max_abs_err <= TOL, "max_abs_err {}", r.max_abs_err);
    assert_eq!(r.cycles, c.manifest.cycles);
    let (cycles, lb) = (c.manifest.cycles, c.manifest.lower_bound);
    assert_eq!(lb, 524, "LB");
    assert!(100 * cycles <= 130 * lb, "{cycles} cycles, LB {lb}");
}

#[test]
fn more_pes_than_weights() {
    // 3 tokens causal: 6 weights, 60 operations; a 16-PE ring is accepted and used.
    for (n, d, m) in [(3u32, 3u32, 16u32), (4, 8, 32), (2, 8, 32)] {
        check(n, d, m, 1, false, true, true);
        check(n, d, m, 2, true, false, false);
    }
}

/// One head of 12 tokens whose 64 columns span 64 PEs, safe softmax: with each row's maximum,
/// exponentials and divisions laid forward in ring order (no trip round the ring for the
/// maximum), 445 cycles (1.51 × LB, all rows' softmax waiting on that trip) became 394; with a
/// mask, 289 (1.81 × LB) became 229. Proved and run like the rest.
#[test]
fn ring_spanning_softmax_laid_forward() {
    for (causal, lb_expected, within) in [(false, 295u64, 140u64), (true, 160, 150)] {
        let text = src(12, 64, 1, false, causal, true);
        let c = compile_src(&text, 64, Choice::Named("split"));
        assert_eq!(c.manifest.schedule, "schedule-split");
        let r = run_emitted(&c, 12);
        assert!(r.max_abs_err <= TOL, "max_abs_err {}", r.max_abs_err);
        assert_eq!(r.cycles, c.manifest.cycles);
        let (cycles, lb) = (c.manifest.cycles, c.manifest.lower_bound);
        assert_eq!(lb, lb_expected, "LB");
        assert!(
            100 * cycles <= within * lb,
            "causal {causal}: {cycles} cycles, LB {lb}"
        );
    }
}
