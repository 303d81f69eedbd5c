//! The wide dataflow (q = k = v rows decoupled, mirrored scores recomputed) forced over rings
//! of one to four PEs per token, up to 64 PEs, one to four heads, both softmax formulations,
//! and the near pairs shared on rings where each head has a part of its own. Every program is
//! proved by the symbolic verifier (the recomputed products only as declared) and run against
//! the f64 reference.

use crate::common;

use common::{compile_src, run_emitted};
use compiler::passes::select::Choice;

/// The end-to-end tolerance every grid uses (inputs in [-1, 1], f32 arithmetic).
const TOL: f64 = 1e-4;

fn src(n: u32, d: u32, heads: u32, safe: bool) -> String {
    let s = common::layer_src(n, d, heads, true, false);
    if safe {
        s.replace(" softmax = plain;", "")
    } else {
        s
    }
}

/// Proves and runs the wide dataflow's program of the layer; returns its manifest.
fn check(n: u32, d: u32, m: u32, heads: u32, safe: bool) -> runtime::manifest::Manifest {
    let text = src(n, d, heads, safe);
    let what = format!("{text} on {m} PEs");
    let wide = compile_src(&text, m, Choice::Named("wide"));
    assert_eq!(wide.manifest.schedule, "schedule-wide", "{what}");
    // Every row computes all of its scores, both halves of each pair once each; or, with near
    // pairs shared, some pairs once and the others once per row.
    let products = wide.manifest.ops.phase1_mac;
    let (necessary, mirrored) = (
        u64::from(heads * d * n * (n + 1) / 2),
        u64::from(heads * d * n * n),
    );
    assert!(
        products == mirrored || (heads > 1 && necessary < products && products < mirrored),
        "{what}: {products} phase-1 products"
    );
    // `run_emitted` proves the programs (accepting exactly the declared recomputed products).
    let r = run_emitted(&wide, u64::from(n * 1000 + d * 10 + m));
    assert!(
        r.max_abs_err <= TOL,
        "{what}: max_abs_err {}",
        r.max_abs_err
    );
    assert_eq!(r.cycles, wide.manifest.cycles, "{what}");
    assert!(r.cycles >= wide.manifest.lower_bound, "{what}");
    // With two or more tokens the products are redundant, and a proof that insists on the
    // necessary ones alone must say so.
    if n > 1 {
        let strict = verifier::Options {
            exact_ops: true,
            ..Default::default()
        };
        let report = verifier::verify_with(&wide.programs, &wide.manifest, &strict);
        assert!(
            !report.is_ok(),
            "{what}: recomputed products went unnoticed"
        );
    }
    let auto = compile_src(&text, m, Choice::Auto);
    assert!(
        auto.manifest.cycles <= wide.manifest.cycles,
        "{what}: auto {} against wide {}",
        auto.manifest.cycles,
        wide.manifest.cycles
    );
    wide.manifest
}

/// Rings of `n + 1`, `2n` and `4n` PEs (at most 64) for each token count of `ns`; the number of
/// layers checked.
fn rings_up_to_four_pes_per_token(ns: &[u32]) -> u32 {
    let mut combos = 0;
    for &n in ns {
        for d in [3u32, 8] {
            for m in [n + 1, 2 * n, (4 * n).min(64)] {
                // Cycle the heads and alternate the formulation so every size meets both.
                let heads = 1 + (n + d + m) % 4;
                let safe = (n + m + d).is_multiple_of(2);
                check(n, d, m, heads, safe);
                combos += 1;
            }
        }
    }
    combos
}

// In two parts, so the harness runs the second (about 40 % of the CPU time of the first) after
// `large_rings` beside the first, rather than one test alone at the end. The harness starts tests
// in the order of their names: the longer part's must come first.
#[test]
fn rings_up_to_four_pes_per_token_up_to_12_tokens() {
    assert_eq!(rings_up_to_four_pes_per_token(&[1, 2, 3, 5, 8, 12]), 36);
}

#[test]
fn rings_up_to_four_pes_per_token_with_16_tokens() {
    assert_eq!(rings_up_to_four_pes_per_token(&[16]), 6);
}

#[test]
fn large_rings() {
    for (n, d, m, heads) in [(8u32, 8u32, 64u32, 1u32), (4, 16, 64, 2), (6, 5, 48, 3)] {
        check(n, d, m, heads, true);
        check(n, d, m, heads, false);
    }
}

/// With several heads and two PEs or more per row, each head's rows lie on a part of the ring
/// that is not a ring: sharing only the pairs at most half a head apart (the rest computed by
/// both rows) beats every row computing all of its scores, which took 273 and 342 cycles here
/// (1.29 and 1.45 × LB).
#[test]
fn near_pairs_shared_where_heads_have_parts_of_the_ring() {
    for (n, d, m, heads) in [(8u32, 32u32, 64u32, 4u32), (12, 32, 128, 4)] {
        let text = src(n, d, heads, true);
        let wide = check(n, d, m, heads, true);
        assert!(
            wide.ops.phase1_mac < u64::from(heads * d * n * n),
            "{text} on {m} PEs: every pair mirrored"
        );
        assert!(
            4 * wide.cycles <= 5 * wide.lower_bound,
            "{text} on {m} PEs: {} cycles, LB {}",
            wide.cycles,
            wide.lower_bound
        );
    }
}

#[test]
fn refuses_what_it_cannot_take() {
    let layer = common::parse_one(&common::layer_src(4, 4, 1, false, false));
    let opts = compiler::Options {
        pes: 8,
        schedule: Choice::Named("wide"),
        ..Default::default()
    };
    let err = compiler::compile(&layer, &opts)
        .err()
        .map(|e| e.to_string());
    assert!(
        err.as_deref().is_some_and(|e| e.contains("one tensor")),
        "{err:?}"
    );
    let causal = common::parse_one(&common::layer_src(4, 4, 1, true, true));
    let err = compiler::compile(&causal, &opts)
        .err()
        .map(|e| e.to_string());
    assert!(
        err.as_deref().is_some_and(|e| e.contains("causal mask")),
        "{err:?}"
    );
}
