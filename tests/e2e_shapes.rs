//! Real layer shapes: any d, any n, any m (m > n included). Every layer compiles under `auto`,
//! its programs run correctly, and exactly the necessary operations are executed — plus, where
//! `auto` keeps the wide dataflow on a shared layer, exactly the mirrored phase-1 products it
//! declares (every row computes all of its own scores).

use crate::common;
use common::*;
use compiler::passes::select::Choice;

const TOL: f64 = 1e-4;

fn check(n: u32, d: u32, m: u32, heads: u32, shared: bool, causal: bool) {
    let src = format!(
        "layer t {{ tokens = {n}; dim = {d}; heads = {heads}; qkv = {}; mask = {}; }}",
        if shared { "shared" } else { "separate" },
        if causal { "causal" } else { "none" }
    );
    let what = format!("n={n} d={d} m={m} heads={heads} shared={shared} causal={causal}");
    let c = compile_src(&src, m, Choice::Auto);
    let r = run_emitted(&c, u64::from(n * 7919 + d * 31 + m));
    assert!(
        r.max_abs_err <= TOL,
        "{what}: max_abs_err {}",
        r.max_abs_err
    );
    assert!(
        r.cycles >= c.manifest.lower_bound,
        "{what}: below the lower bound"
    );
    let b = c.manifest.bound.expect("every compile states its bound");
    assert!(r.cycles >= b.value, "{what}: below the bound {b:?}");
    let (n, d, h) = (u64::from(n), u64::from(d), u64::from(heads));
    let weights = if causal { n * (n + 1) / 2 } else { n * n };
    let distinct = if shared && !causal {
        n * (n + 1) / 2
    } else {
        weights
    };
    let computed = if c.manifest.schedule == "schedule-wide" {
        assert!(
            shared && !causal,
            "{what}: the wide dataflow on a layer it refuses"
        );
        weights
    } else {
        distinct
    };
    let ops = c.manifest.ops;
    assert_eq!(
        (
            ops.phase1_mac,
            ops.phase2_exp,
            ops.phase2_div,
            ops.phase3_mac
        ),
        (h * d * computed, h * weights, h * weights, h * d * weights),
        "{what}: operation counts"
    );
    let executed: u64 = r.stats.per_pe.iter().map(|p| p.total_ops()).sum();
    assert_eq!(
        executed,
        c.manifest.necessary_ops + h * d * (computed - distinct),
        "{what}: executed operations"
    );
}

/// Every ring up to n + 2 PEs for every layer up to 8 tokens of one scheme (one test per scheme,
/// so the harness runs them in parallel), with the head dims that matter to the schedulers: the
/// smallest (one to four columns, fewer than the PEs or a few per PE), around the token count,
/// and twice it. (The dims in between took half of the test's time and exercised no other case.)
/// On 7 and 8 tokens, which took most of the rest, each ring takes every other dim, in pairs of
/// rings (1, 2–3, 4–5, …) alternately, so every dim still meets rings of both parities, with
/// fewer and more PEs than tokens, and every head count (`every_dim`: all of them on every ring;
/// `cargo test --release --test suite e2e_shapes::every_small_shape_every_dim -- --ignored`).
/// Of those, each ring then takes a third (`common::pick`, at least one, rotating with the ring
/// and the scheme, so that the four schemes' tests together still compile every (tokens, dim,
/// ring) above, though each scheme alone no longer meets every pairing named above);
/// `ATTNC_FULL_GRIDS=1` takes them all.
fn every_small_shape(shared: bool, causal: bool, every_dim: bool) {
    for n in 1..=8u32 {
        let mut dims: Vec<u32> = [1, 2, 3, 4, n.saturating_sub(1), n, n + 1, 2 * n]
            .into_iter()
            .filter(|&d| (1..=2 * n).contains(&d))
            .collect();
        dims.sort_unstable();
        dims.dedup();
        let scheme = usize::from(shared) + 2 * usize::from(causal);
        for m in 1..=n + 2 {
            let dims: Vec<u32> = dims
                .iter()
                .enumerate()
                .filter(|&(i, _)| every_dim || n < 7 || (i as u32 + m / 2).is_multiple_of(2))
                .map(|(_, &d)| d)
                .collect();
            let dims = if every_dim {
                dims
            } else {
                pick(&dims, 3, m as usize + scheme)
            };
            for d in dims {
                check(n, d, m, 1 + (n + m + d) % 3, shared, causal);
            }
        }
    }
}

#[test]
fn every_small_shape_separate() {
    every_small_shape(false, false, false);
}

#[test]
fn every_small_shape_shared() {
    every_small_shape(true, false, false);
}

#[test]
fn every_small_shape_causal() {
    every_small_shape(false, true, false);
}

#[test]
fn every_small_shape_shared_causal() {
    every_small_shape(true, true, false);
}

/// Every ring and dim of up to 8 tokens.
#[test]
#[ignore = "every dim of 7 and 8 tokens on every ring takes minutes; the tests above sample them"]
fn every_small_shape_every_dim() {
    for (shared, causal) in [(false, false), (true, false), (false, true), (true, true)] {
        every_small_shape(shared, causal, true);
    }
}

/// Shapes of 9 to 16 tokens, sampled, of one scheme: each ring of the small ones (one to three
/// PEs, one fewer than the tokens, as many, one or two more) with two of the four head dims (one
/// column, about the tokens, twice them), the other two on the next pair of token counts
/// (`every_dim`: all four on each). So every ring meets every dim on four of the eight token
/// counts, odd and even ones, and on the rings of one to three PEs with one head and with two
/// (the heads alternate with the ring as before).
/// `cargo test --release --test suite e2e_shapes::larger_shapes_every_dim -- --ignored` runs
/// all four dims on every ring. Of the two, each ring then takes one (`common::pick`, rotating
/// with the ring, the token count and the scheme, so that the four schemes' tests together still
/// compile every (tokens, dim, ring) of the grid); `ATTNC_FULL_GRIDS=1` takes both.
fn larger_shapes_sampled(shared: bool, causal: bool, every_dim: bool) {
    let scheme = usize::from(shared) + 2 * usize::from(causal);
    for n in 9..=16u32 {
        for (i, m) in [1, 2, 3, n - 1, n, n + 1, n + 2].into_iter().enumerate() {
            let dims = [[1, n], [n - 1, 2 * n]];
            let picked = if every_dim {
                dims.concat()
            } else {
                pick(&dims[(n as usize / 2 + i) % 2], 2, n as usize + i + scheme)
            };
            for d in picked {
                check(n, d, m, 1 + (n + m) % 2, shared, causal);
            }
        }
    }
}

#[test]
fn larger_shapes_sampled_separate() {
    larger_shapes_sampled(false, false, false);
}

#[test]
fn larger_shapes_sampled_shared() {
    larger_shapes_sampled(true, false, false);
}

#[test]
fn larger_shapes_sampled_causal() {
    larger_shapes_sampled(false, true, false);
}

#[test]
fn larger_shapes_sampled_shared_causal() {
    larger_shapes_sampled(true, true, false);
}

/// Every ring of the larger shapes with all four head dims.
#[test]
#[ignore = "all dims of the larger shapes take minutes; the sampled tests above run by default"]
fn larger_shapes_every_dim() {
    for (shared, causal) in [(false, false), (true, false), (false, true), (true, true)] {
        larger_shapes_sampled(shared, causal, true);
    }
}

/// Rings up to four times the tokens and four heads, sampled, of one scheme: every program
/// runs against the reference with exactly its operations (`check`), as on the smaller rings.
fn large_rings_sampled(shared: bool, causal: bool) {
    for n in 1..=8u32 {
        for k in [2u32, 3, 4] {
            let m = k * n;
            for d in [1, 4, 2 * n] {
                // Every third of the ring × dim pairs, a different third per scheme.
                let pick = (n + k + d + u32::from(shared) + 2 * u32::from(causal)) % 3 == 0;
                if pick {
                    check(n, d, m, 1 + (n + d) % 4, shared, causal);
                }
            }
        }
    }
}

#[test]
fn large_rings_sampled_separate() {
    large_rings_sampled(false, false);
}

#[test]
fn large_rings_sampled_shared() {
    large_rings_sampled(true, false);
}

#[test]
fn large_rings_sampled_causal() {
    large_rings_sampled(false, true);
}

#[test]
fn large_rings_sampled_shared_causal() {
    large_rings_sampled(true, true);
}

#[test]
fn rows_dataflow_is_near_the_lower_bound_when_rows_are_plenty() {
    // n ≥ 4m: within 5% of the lower bound for every scheme.
    for (n, d, m) in [
        (32, 8, 4),
        (24, 5, 6),
        (40, 16, 8),
        (48, 12, 12),
        (33, 7, 5),
    ] {
        for (shared, causal) in [(false, false), (true, false), (false, true), (true, true)] {
            let src = format!(
                "layer t {{ tokens = {n}; dim = {d}; qkv = {}; mask = {}; }}",
                if shared { "shared" } else { "separate" },
                if causal { "causal" } else { "none" }
            );
            let c = compile_src(&src, m, Choice::Auto);
            let ratio = c.manifest.cycles as f64 / c.manifest.lower_bound as f64;
            assert!(
                ratio <= 1.05,
                "n={n} d={d} m={m} shared={shared} causal={causal}: cycles/LB {ratio:.3}"
            );
        }
    }
}

/// Where the stream takes fewer cycles than the row dataflow's busiest PE has operations (its
/// floor, counted from its cut), `auto` (loop programs allowed, as `attnc compile` runs it) keeps
/// the stream without building the unrolled candidates: the manifest weighs the stream alone,
/// forcing the row dataflow confirms it would have been slower, and the kept programs run
/// against the reference with exactly the formulation's operations plus the merges they declare.
#[test]
fn a_stream_below_the_row_dataflows_floor_is_kept_unbuilt_against() {
    let layers = [
        (64, 64, 5),
        (64, 64, 12),
        (40, 40, 6),
        (32, 32, 6),
        (36, 36, 8),
    ];
    kept_unbuilt_against(&layers, "", 2);
}

/// The same with q = k = v (mirrored scores against a row dataflow that computes each pair
/// once): the floor follows which holder computes each pair. Layers above the sizes at which
/// the other unrolled candidates apply, so the row dataflow is the only one, and where the
/// stream is above the lower bound, so that the floor alone keeps it; 40 tokens `d = 128` on 6
/// PEs is one the row dataflow wins, so there it is built and weighed.
#[test]
fn a_shared_stream_below_the_row_dataflows_floor_is_kept_unbuilt_against() {
    let layers = [(64, 80, 6), (64, 96, 6), (64, 128, 6), (40, 128, 6)];
    kept_unbuilt_against(&layers, "qkv = shared;", 3);
}

fn kept_unbuilt_against(layers: &[(u32, u32, u32)], qkv: &str, at_least: usize) {
    let mut skipped = 0;
    for &(n, d, m) in layers {
        let src = format!("layer t {{ tokens = {n}; dim = {d}; {qkv} }}");
        let what = format!("n={n} d={d} m={m} {qkv}");
        let opts = compiler::Options {
            pes: m,
            schedule: Choice::Auto,
            dump_after: None,
            mem_limit: None,
            reroll: true,
            single_placement: false,
        };
        let auto = compiler::compile(&parse_one(&src), &opts).expect(&what);
        let rows = compile_src(&src, m, Choice::Named("rows"));
        let sel = &auto.manifest.selection;
        if sel.candidates.len() + sel.stopped.len() == 1 {
            skipped += 1;
            assert_eq!(auto.manifest.schedule, "schedule-stream", "{what}");
            assert!(
                sel.reason.contains("work per PE"),
                "{what}: kept by the floor, not the bound: {}",
                sel.reason
            );
            assert!(
                auto.manifest.cycles < rows.manifest.cycles,
                "{what}: the stream's {} against the row dataflow's {}",
                auto.manifest.cycles,
                rows.manifest.cycles
            );
        } else {
            // Built and weighed: never slower than the row dataflow.
            assert!(auto.manifest.cycles <= rows.manifest.cycles, "{what}");
        }
        let r = run_emitted(&auto, u64::from(n + d + m));
        assert!(
            r.max_abs_err <= TOL,
            "{what}: max_abs_err {}",
            r.max_abs_err
        );
        assert_eq!(r.cycles, auto.manifest.cycles, "{what}: predicted cycles");
        let executed: u64 = r.stats.per_pe.iter().map(|p| p.total_ops()).sum();
        let declared = auto.manifest.necessary_ops + auto.manifest.ops.online_rescale;
        assert_eq!(executed, declared, "{what}: executed operations");
    }
    assert!(
        skipped >= at_least,
        "only {skipped} layers kept the stream unbuilt-against"
    );
}
