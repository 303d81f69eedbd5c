//! Every layer of the grid (n = 1..16, m | n, heads 1–3, all qkv/mask combinations, d = n)
//! compiles, its emitted programs run in the interpreter, and the result matches the f64
//! reference; cycle counts follow the paper's Algorithm 1 formula.

mod common;
use common::*;
use compiler::passes::select::Choice;

const TOL: f64 = 1e-4;

#[test]
fn baseline_grid_matches_reference_and_cycle_formula() {
    let mut checked = 0;
    for n in 1..=16u32 {
        for m in divisors(n) {
            for heads in 1..=3u32 {
                for shared in [false, true] {
                    for causal in [false, true] {
                        let d = n;
                        let src = layer_src(n, d, heads, shared, causal);
                        let c = compile_src(&src, m, Choice::Baseline);
                        let r = run_emitted(&c, u64::from(n * 100 + m));
                        let (n64, d64, h64, m64) = (n as u64, d as u64, heads as u64, m as u64);
                        let formula = h64 * (2 * d64 * n64 * n64 + 2 * n64 * n64) / m64;
                        let what = format!("n={n} m={m} heads={heads} shared={shared} causal={causal}");
                        assert!(r.max_abs_err <= TOL, "{what}: max_abs_err {}", r.max_abs_err);
                        assert_eq!(r.cycles, c.manifest.cycles, "{what}: manifest cycles");
                        if causal {
                            assert!(r.cycles <= formula, "{what}: {} > {formula}", r.cycles);
                        } else {
                            assert_eq!(r.cycles, formula, "{what}");
                        }
                        assert!(r.cycles >= c.manifest.lower_bound, "{what}: below the lower bound?");
                        checked += 1;
                    }
                }
            }
        }
    }
    assert_eq!(checked, 50 * 3 * 4);
}

#[test]
fn paper_algorithm_1_column() {
    // Paper Tables I/II, Algo 1 column (d = n, one head).
    for (n, m, want) in [(3, 3, 24), (4, 4, 40), (5, 5, 60), (6, 3, 168), (6, 6, 84), (15, 5, 1440), (15, 15, 480), (17, 17, 612)] {
        let c = compile_src(&layer_src(n, n, 1, false, false), m, Choice::Baseline);
        let r = run_emitted(&c, 7);
        assert_eq!(r.cycles, want, "n={n} m={m}");
        assert!(r.max_abs_err <= TOL, "n={n} m={m}: {}", r.max_abs_err);
    }
}

#[test]
fn causal_baseline_touches_no_masked_element() {
    for (n, m) in [(4, 2), (6, 3), (5, 5)] {
        let c = compile_src(&layer_src(n, n, 2, false, true), m, Choice::Baseline);
        let n64 = n as u64;
        let d64 = n64;
        let tri = n64 * (n64 + 1) / 2;
        let ops = c.manifest.ops;
        assert_eq!(ops.phase1_mac, 2 * d64 * tri);
        assert_eq!(ops.phase2_exp, 2 * tri);
        assert_eq!(ops.phase2_div, 2 * tri);
        assert_eq!(ops.phase3_mac, 2 * d64 * tri);
        let r = run_emitted(&c, 3);
        let executed: u64 = r.stats.per_pe.iter().map(|p| p.mul + p.exp + p.div).sum();
        assert_eq!(executed, ops.phase1_mac + ops.phase2_exp + ops.phase2_div + ops.phase3_mac);
    }
}
