//! The verifier proves everything the compiler emits.

use crate::verifier_common as common;

use common::{build, source, try_build};
use compiler::passes::select::Choice;

fn assert_proved(src: &str, pes: u32, schedule: Choice) -> bool {
    let Some(c) = build(src, pes, schedule) else {
        return false;
    };
    assert_compiled_proved(src, pes, schedule, &c);
    true
}

fn assert_compiled_proved(src: &str, pes: u32, schedule: Choice, c: &compiler::Compiled) {
    // Only a scheduler that declares redundant work (the baseline does not exploit q = k) may do
    // more than the necessary work; every other must compute each distinct product once.
    let opts = verifier::Options {
        exact_ops: c.scheduler.is_some_and(|s| s.necessary_only()),
        ..Default::default()
    };
    let report = verifier::verify_with(&c.programs, &c.manifest, &opts);
    assert!(
        report.is_ok(),
        "{src} on {pes} PEs ({schedule:?}, {}):\n{report}",
        c.manifest.schedule
    );
    assert!(report.proved.is_some());
    let l = &c.manifest.layer;
    let may_be_redundant = !c.scheduler.is_some_and(|s| s.necessary_only())
        && l.qkv == "shared"
        && l.mask == "none"
        && l.tokens > 1;
    assert_eq!(
        report.redundant_ops > 0,
        may_be_redundant,
        "{src} on {pes} PEs ({})",
        c.manifest.schedule
    );
}

// The grid of d = n, m | n layers (n up to 16, one to three heads, every scheme) under `auto`
// and the baseline is proved, with the same checks as `assert_compiled_proved`, by
// tests/e2e_grid.rs, which compiles exactly those layers and runs them too.

#[test]
fn general_shapes() {
    // d ≠ n and rings that do not divide the sizes, each ring with one head count of one and
    // two, alternating (both under `ATTNC_FULL_GRIDS=1`). `auto` always has the row dataflow to fall
    // back on; the baseline applies exactly when the ring divides tokens and dim. An internal
    // compiler error fails the test like a failed proof does.
    for (n, d) in [(5, 3), (7, 8), (6, 4), (9, 2), (10, 16), (3, 1), (1, 5)] {
        for m in [1, 2, 3, 4, 8, 11] {
            for heads in crate::common::pick(&[1, 2], 2, (n + d + m) as usize) {
                for shared in [false, true] {
                    for causal in [false, true] {
                        let src = source(n, d, heads, shared, causal);
                        for schedule in [Choice::Auto, Choice::Named("baseline")] {
                            let applies = schedule == Choice::Auto || (n % m == 0 && d % m == 0);
                            match try_build(&src, m, schedule) {
                                Ok(Some(c)) => {
                                    assert!(applies, "{src} on {m} PEs: {schedule:?} accepted");
                                    assert_compiled_proved(&src, m, schedule, &c);
                                }
                                Ok(None) => {
                                    assert!(!applies, "{src} on {m} PEs: {schedule:?} refused")
                                }
                                Err(e) => panic!("{src} on {m} PEs ({schedule:?}): {e}"),
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn paper_instances() {
    let shared = [(3, 3), (4, 4), (5, 5), (6, 3), (6, 6), (15, 5), (15, 15)];
    for (n, m) in shared {
        for schedule in [
            Choice::Auto,
            Choice::Named("symmetric"),
            Choice::Named("baseline"),
        ] {
            let src = source(n, n, 1, true, false);
            assert!(assert_proved(&src, m, schedule), "{src} refused on {m} PEs");
        }
    }
    for (n, m) in shared.into_iter().chain([(17, 17)]) {
        for schedule in [
            Choice::Auto,
            Choice::Named("causal"),
            Choice::Named("baseline"),
        ] {
            let src = source(n, n, 1, false, true);
            assert!(assert_proved(&src, m, schedule), "{src} refused on {m} PEs");
        }
    }
}

#[test]
fn examples_directory_layers() {
    for file in ["paper.attn", "encoder.attn", "gpt_head.attn"] {
        let path = format!("{}/examples/{file}", env!("CARGO_MANIFEST_DIR"));
        let src = std::fs::read_to_string(&path).unwrap();
        let parsed = lang::parse(0, &src);
        for layer in &parsed.layers {
            for pes in [1, 2, 3, 4, 5, 8, 15, 16, 17] {
                if layer.tokens % pes != 0 || layer.dim % pes != 0 || layer.tokens > 64 {
                    continue;
                }
                let opts = compiler::Options {
                    pes,
                    ..Default::default()
                };
                let Ok(c) = compiler::compile(layer, &opts) else {
                    continue;
                };
                let report = verifier::verify(&c.programs, &c.manifest);
                assert!(
                    report.is_ok(),
                    "{file} {} on {pes} PEs:\n{report}",
                    layer.name
                );
            }
        }
    }
}
