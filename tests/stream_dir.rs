//! The stream schedule through the whole path a user takes: compile with `--schedule stream`,
//! write the files a compile writes (format-3 loop programs, a format-2 manifest with affine
//! layouts), load them back as `run` does, execute natively and compare with the f64 reference.

use crate::common;

use attnc::rundir;
use common::{layer_src, parse_one};
use compiler::manifest::{Manifest, ProgramKind};
use compiler::passes::schedule_stream::MirroredTiming;
use compiler::passes::select::Choice;
use std::collections::BTreeMap;

fn stream(src: &str, pes: u32) -> Result<compiler::Compiled, compiler::CompileError> {
    let opts = compiler::Options {
        pes,
        schedule: Choice::Stream,
        dump_after: None,
        mem_limit: None,
        reroll: false,
        single_placement: false,
    };
    compiler::compile(&parse_one(src), &opts)
}

/// The files a compile writes for loop programs, in memory (`binary`: with the `.bin` files).
fn files(c: &compiler::Compiled, binary: bool) -> BTreeMap<String, Vec<u8>> {
    let mut f = BTreeMap::new();
    for p in &c.loops {
        f.insert(format!("pe{}.s", p.pe), p.to_text().into_bytes());
        if binary {
            f.insert(format!("pe{}.bin", p.pe), isa::encode_looped(p).unwrap());
        }
    }
    f.insert(
        "manifest.json".into(),
        c.manifest.to_json().unwrap().into_bytes(),
    );
    f
}

fn run_dir(f: &BTreeMap<String, Vec<u8>>, seed: u64) -> (f64, u64, Manifest) {
    let loaded = rundir::load(f).unwrap_or_else(|e| panic!("load: {e}"));
    assert!(
        loaded.programs.is_empty()
            && loaded
                .flat()
                .is_ok_and(|(p, _)| p.len() == loaded.loops.len()),
        "small: flattened"
    );
    let m = loaded.manifest.clone();
    let inputs = compiler::exec::random_inputs(&m, seed);
    let (out, _) = compiler::exec::execute_loops(loaded.loops, &m, &inputs)
        .unwrap_or_else(|e| panic!("run: {e}"));
    let want = compiler::exec::reference_output(&m, &inputs).expect("reference");
    let cmp = rundir::compare(&out.outputs["y"], &want, 1e-4, 1e-5);
    assert!(cmp.pass(), "max abs err {}", cmp.max_abs_err);
    (cmp.max_abs_err, out.stats.cycles, m)
}

#[test]
fn every_kind_of_layer_runs_from_its_files() {
    let mut ran = 0;
    for n in [4u32, 8, 12, 16, 24, 30] {
        for d in [1u32, 2, 3, 8] {
            for m in [1u32, 2, 3, 4] {
                for heads in 1..=3u32 {
                    for shared in [false, true] {
                        for causal in [false, true] {
                            // A causal layer is dealt in 2m chunks of at least 2 tokens; one
                            // without a mask in any case (the last chunks or PEs short or empty).
                            let applies = !causal || n.div_ceil(2 * m) >= 2;
                            let src = layer_src(n, d, heads, shared, causal);
                            let what = format!(
                                "n={n} d={d} m={m} heads={heads} shared={shared} causal={causal}"
                            );
                            let c = match stream(&src, m) {
                                Ok(c) => c,
                                Err(compiler::CompileError::Refused(r)) => {
                                    assert!(!applies, "{what}: refused: {}", r.message);
                                    continue;
                                }
                                Err(e) => panic!("{what}: {e}"),
                            };
                            assert!(applies, "{what}: compiled where it should be refused");
                            assert_eq!(c.manifest.programs, ProgramKind::Loops, "{what}");
                            assert!(c.programs.is_empty() && c.loops.len() == m as usize);
                            // Binary files preferred; the text alone gives the same result.
                            let seed = u64::from(n * 1000 + d * 100 + m * 10 + heads);
                            let (err, cycles, m1) = run_dir(&files(&c, true), seed);
                            let (err2, cycles2, _) = run_dir(&files(&c, false), seed);
                            assert_eq!(err.to_bits(), err2.to_bits(), "{what}");
                            assert_eq!(cycles, c.manifest.cycles, "{what}");
                            assert_eq!(cycles2, cycles, "{what}");
                            assert!(
                                cycles >= c.manifest.lower_bound,
                                "{what}: below the lower bound"
                            );
                            let b = c.manifest.bound.expect("every compile states its bound");
                            assert!(cycles >= b.value, "{what}: below the bound {b:?}");
                            assert_eq!(m1, c.manifest, "{what}: manifest round trip");
                            ran += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(ran > 300, "only {ran} layers applied");
}

/// Causal layers with a safe softmax, whose values trail their keys (by the whole ring within
/// the default allowance, or by 2 steps in groups under a `--mem` limit that allows no more),
/// run from their files against the reference, tokens that do not divide the ring included
/// (within the default allowance those are dealt whole rows, which run here too).
#[test]
fn lagged_values_run_from_their_files() {
    let mut ran = 0;
    for (n, m) in [(16u32, 2u32), (30, 4), (32, 4), (47, 6), (64, 8)] {
        for d in [1u32, 4] {
            for heads in [1u32, 3] {
                let src = layer_src(n, d, heads, false, true).replace("plain", "safe");
                let what = format!("n={n} d={d} m={m} heads={heads}");
                let whole = stream(&src, m).unwrap_or_else(|e| panic!("{what}: {e}"));
                if n.is_multiple_of(2 * m) {
                    assert!(
                        whole
                            .manifest
                            .selection
                            .reason
                            .contains("values trail keys"),
                        "{what}: {}",
                        whole.manifest.selection.reason
                    );
                } else {
                    // Dealt in whole rows instead (no padding; placements listed per element):
                    // the lag of 2 below still runs these tokens padded.
                    assert!(
                        whole.manifest.inputs["q"].layout.is_none(),
                        "{what}: {}",
                        whole.manifest.selection.reason
                    );
                }
                // The memory of a lag of 2: the least a lagged program needs.
                let p = compiler::problem::Problem::attention(
                    n,
                    d,
                    heads,
                    false,
                    true,
                    runtime::layer::Softmax::Safe,
                );
                let two = compiler::passes::schedule_stream::run_with(
                    &p,
                    m,
                    true,
                    compiler::passes::schedule_stream::Lag::Steps(2),
                )
                .unwrap_or_else(|e| panic!("{what}: {e}"));
                let opts = compiler::Options {
                    pes: m,
                    schedule: Choice::Stream,
                    dump_after: None,
                    mem_limit: Some(two.programs[0].mem_words),
                    reroll: false,
                    single_placement: false,
                };
                let grouped = compiler::compile(&parse_one(&src), &opts)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(
                    grouped
                        .manifest
                        .selection
                        .reason
                        .contains("by 2 ring steps"),
                    "{what}: {}",
                    grouped.manifest.selection.reason
                );
                for c in [&whole, &grouped] {
                    let seed = u64::from(n * 1000 + d * 100 + m * 10 + heads);
                    let (_, cycles, _) = run_dir(&files(c, true), seed);
                    assert_eq!(cycles, c.manifest.cycles, "{what}");
                    ran += 1;
                }
            }
        }
    }
    assert_eq!(ran, 40);
}

#[test]
fn placements_are_layouts_and_expand_to_distinct_words() {
    let c = stream(&layer_src(16, 4, 2, false, true), 4).unwrap();
    assert_eq!(c.manifest.format_version, 2);
    let json = c.manifest.to_json().unwrap();
    assert!(json.contains("\"layout\""), "{json}");
    assert!(!json.contains("\"pe\": ["), "no per-element arrays");
    let mut seen = std::collections::BTreeSet::new();
    for p in c.manifest.inputs.values() {
        let e = p.expanded(c.manifest.pes);
        assert_eq!(e.pe.len(), 2 * 16 * 4);
        for (pe, a) in e.pe.iter().zip(&e.addr) {
            assert!(seen.insert((*pe, *a)), "two inputs share PE {pe} m{a}");
        }
    }
    // Zigzag under a causal mask: PE 0 owns the first and the last chunk of 2 tokens.
    let q = &c.manifest.inputs["q"];
    assert_eq!(q.locate(4, 0).0, 0);
    assert_eq!(q.locate(4, 15 * 4).0, 0);
    assert_eq!(q.locate(4, 2 * 4).0, 1);
}

#[test]
fn a_layout_outside_memory_or_overlapping_itself_is_refused() {
    let c = stream(&layer_src(8, 2, 2, false, false), 2).unwrap();
    let good = c.manifest.to_json().unwrap();
    assert!(Manifest::from_json(&good).is_ok());
    let mut m = c.manifest.clone();
    let l = m.inputs.get_mut("q").unwrap().layout.as_mut().unwrap();
    l.base = m.mem_words[0];
    let e = Manifest::from_json(&m.to_json().unwrap()).unwrap_err();
    assert!(e.0.contains("tensor q: layout reaches address"), "{e}");
    let mut m = c.manifest.clone();
    m.inputs
        .get_mut("q")
        .unwrap()
        .layout
        .as_mut()
        .unwrap()
        .row_stride = 1;
    let e = Manifest::from_json(&m.to_json().unwrap()).unwrap_err();
    assert!(e.0.contains("overlap"), "{e}");
    let mut m = c.manifest.clone();
    m.inputs
        .get_mut("k")
        .unwrap()
        .layout
        .as_mut()
        .unwrap()
        .rows_per_pe = 3;
    let e = Manifest::from_json(&m.to_json().unwrap()).unwrap_err();
    assert!(e.0.contains("do not cover 8 tokens"), "{e}");
    // A version-1 manifest cannot hold a layout or loop programs.
    let v1 = good.replace("\"format_version\": 2", "\"format_version\": 1");
    assert!(Manifest::from_json(&v1).is_err());
}

#[test]
fn a_layer_too_large_to_unroll_gets_loop_programs_under_auto() {
    // GPT-2 small's attention: 818M operations, far beyond what attnc unrolls.
    let src = "layer gpt2 { tokens = 1024; dim = 64; heads = 12; mask = causal; }";
    let opts = compiler::Options {
        pes: 16,
        schedule: Choice::Auto,
        dump_after: None,
        mem_limit: None,
        reroll: false,
        single_placement: false,
    };
    let c = compiler::compile(&parse_one(src), &opts).expect("compiles");
    assert_eq!(c.manifest.schedule, "schedule-stream");
    assert_eq!(c.loops.len(), 16);
    let bytes: Vec<usize> = c
        .loops
        .iter()
        .map(|p| isa::encode_looped(p).unwrap().len())
        .collect();
    assert!(bytes.iter().all(|&b| b < 1 << 20), "{bytes:?}");
    assert!(c.manifest.to_json().unwrap().len() < 64 << 10);
    assert_eq!(
        c.loops.iter().map(|p| p.cycles()).max(),
        Some(c.manifest.cycles)
    );
    // A forced unrolled schedule is still refused by size, naming the way out.
    let opts = compiler::Options {
        schedule: Choice::Named("rows"),
        ..opts
    };
    let Err(compiler::CompileError::Refused(r)) = compiler::compile(&parse_one(src), &opts) else {
        panic!("rows on GPT-2 should be refused");
    };
    assert!(r.note.contains("stream"), "{}", r.note);
}

#[test]
fn a_shape_the_stream_cannot_deal_is_refused_on_the_field() {
    // Causal chunks of one token.
    let Err(compiler::CompileError::Refused(r)) = stream(&layer_src(6, 2, 1, false, true), 4)
    else {
        panic!("6 causal tokens on 4 PEs should be refused");
    };
    assert_eq!(r.culprit, compiler::passes::select::Culprit::Tokens);
    assert!(r.message.contains("at least 2 tokens"), "{}", r.message);
}

/// The published manifest schema, compiled for validating.
fn manifest_schema() -> jsonschema::Validator {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/manifest.schema.json");
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    jsonschema::draft202012::new(&schema).expect("a valid schema")
}

#[test]
fn stream_manifests_validate_against_the_published_schema() {
    let v = manifest_schema();
    for (n, d, h, shared, causal, m) in [
        (8, 2, 1, false, false, 2),
        (16, 4, 2, true, false, 4),
        (16, 3, 3, false, true, 2),
        (24, 8, 1, true, true, 3),
    ] {
        let c = stream(&layer_src(n, d, h, shared, causal), m).unwrap();
        let json: serde_json::Value = serde_json::from_str(&c.manifest.to_json().unwrap()).unwrap();
        let errors: Vec<String> = v.iter_errors(&json).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "n={n} m={m}: {errors:#?}");
        // The schema tells the two placement forms apart: a layout plus arrays is invalid.
        let mut both = json.clone();
        both["inputs"]["q"]["pe"] = serde_json::json!([0]);
        both["inputs"]["q"]["addr"] = serde_json::json!([0]);
        if json["inputs"].get("q").is_some() {
            assert!(
                !v.is_valid(&both),
                "layout and arrays together must not validate"
            );
        }
    }
}

/// Separate layers without a mask on rings that do not divide the tokens take the uneven deal
/// (no padding: per-element placements, rows cut between PEs); they run from their files
/// against the reference, in exactly the cycles the manifest states.
#[test]
fn uneven_deals_run_from_their_files() {
    let mut ran = 0;
    for (n, m) in [(13u32, 3u32), (18, 4), (26, 6), (50, 12), (64, 12), (64, 6)] {
        for d in [1u32, 5, 16] {
            for heads in [1u32, 2] {
                let src = layer_src(n, d, heads, false, false).replace("plain", "safe");
                let what = format!("n={n} d={d} m={m} heads={heads}");
                // It keeps every k/v row of a head: more words than the default allowance.
                let opts = compiler::Options {
                    pes: m,
                    schedule: Choice::Stream,
                    dump_after: None,
                    mem_limit: Some(u32::MAX),
                    reroll: false,
                    single_placement: false,
                };
                let c = compiler::compile(&parse_one(&src), &opts)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(
                    c.manifest.inputs["q"].layout.is_none(),
                    "{what}: not the uneven deal"
                );
                let seed = u64::from(n * 1000 + d * 100 + m * 10 + heads);
                let (_, cycles, _) = run_dir(&files(&c, true), seed);
                assert_eq!(cycles, c.manifest.cycles, "{what}");
                ran += 1;
            }
        }
    }
    assert_eq!(ran, 36);
}

/// 64 tokens, `d = 64` and `d = 128` (one and four heads) and 128 tokens, `d = 128` on 6 PEs:
/// passing cut rows' scores on instead of merging them (with rows handed, maxima left loose and,
/// with `d = 128`, one division per weight on 64 tokens) takes the uneven deal below the row
/// dataflow's cycles, so `auto` keeps its loop programs (within 16 KiB per PE); they run from
/// their files against the reference in the cycles stated.
#[test]
fn uneven_deal_with_passed_rows_is_kept_by_auto() {
    for (n, d, heads) in [
        (64u32, 64u32, 1u32),
        (64, 64, 4),
        (64, 128, 1),
        (64, 128, 4),
        (128, 128, 1),
    ] {
        kept_by_auto_below_the_rows(n, d, heads, 6);
    }
}

/// The same on 12 PEs, where blocks of 5 and 6 tokens left the PE after a passed first part
/// or a handed row waiting for blocks until score nests ran after the ring pass and first
/// parts took two keys of step 0: 64 tokens with `d = 64` (one and four heads) and `d = 128`
/// (one and four heads, one division per weight).
#[test]
fn uneven_deal_on_twelve_pes_is_kept_by_auto() {
    for (n, d, heads) in [
        (64u32, 64u32, 1u32),
        (64, 64, 4),
        (64, 128, 1),
        (64, 128, 4),
    ] {
        kept_by_auto_below_the_rows(n, d, heads, 12);
    }
}

/// `auto` keeps the uneven deal's loop programs (within 16 KiB per PE) in fewer cycles than the
/// row dataflow takes, and they run from their files against the reference in the cycles
/// stated.
fn kept_by_auto_below_the_rows(n: u32, d: u32, heads: u32, pes: u32) {
    let what = format!("n={n} d={d} heads={heads} m={pes}");
    let src = format!("layer L {{ tokens = {n}; dim = {d}; heads = {heads}; }}");
    let seed = u64::from(n * heads + d) * 1_286 + u64::from(pes);
    stream_kept_below_the_rows(&src, pes, "q", seed, &what);
}

/// `auto` keeps a stream of per-element placements for `src` on `pes` PEs (input `input`
/// placed element by element, not by an affine layout: the uneven or mirrored deals), within
/// 16 KiB per PE, in fewer cycles than the row dataflow takes, and it runs from its files
/// against the reference in the cycles stated.
fn stream_kept_below_the_rows(src: &str, pes: u32, input: &str, seed: u64, what: &str) {
    let opts = |schedule| compiler::Options {
        pes,
        schedule,
        dump_after: None,
        mem_limit: None,
        reroll: true,
        single_placement: false,
    };
    let rows = compiler::compile(&parse_one(src), &opts(Choice::Named("rows"))).expect("rows");
    let c = compiler::compile(&parse_one(src), &opts(Choice::Auto)).expect("auto");
    assert_eq!(c.manifest.schedule, "schedule-stream", "{what}");
    assert!(
        c.manifest.inputs[input].layout.is_none(),
        "{what}: placed by an affine layout"
    );
    assert!(
        c.manifest.cycles < rows.manifest.cycles,
        "{what}: {} against the row dataflow's {}",
        c.manifest.cycles,
        rows.manifest.cycles
    );
    for p in &c.loops {
        assert!(
            isa::encode_looped(p).unwrap().len() <= 16 << 10,
            "{what}: PE {}",
            p.pe
        );
    }
    let (_, cycles, _) = run_dir(&files(&c, true), seed);
    assert_eq!(cycles, c.manifest.cycles, "{what}");
}

/// Paired shared layers under a limit that only the idle heads' regions meet (their outputs
/// below their x rows, the visiting block and travelling rows moving through both from head to
/// head) run from their files and match the reference.
#[test]
fn paired_scores_in_idle_heads_regions_run_from_their_files() {
    use compiler::passes::schedule_stream::{self, Lag, Pairing};
    let mut ran = 0;
    for (n, d, m, heads) in [
        (32u32, 3u32, 4u32, 3u32),
        (48, 4, 4, 4),
        (47, 4, 4, 3),
        (40, 5, 5, 3),
        (48, 8, 6, 4),
        (70, 6, 6, 3),
        (64, 8, 8, 3),
    ] {
        let src = layer_src(n, d, heads, true, false).replace("plain", "safe");
        let what = format!("n={n} d={d} m={m} heads={heads}");
        let p = compiler::problem::Problem {
            tokens: n,
            dim: d,
            heads,
            scale: 1.0 / f64::from(d).sqrt(),
            symmetric: true,
            shared_values: true,
            causal: false,
            softmax: runtime::layer::Softmax::Safe,
            copies: false,
        };
        let own = schedule_stream::run_pairing(&p, m, true, Lag::Fit(None), Pairing::On)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let b = n.div_ceil(m);
        let limit = own.programs[0].mem_words - 2 * b * d;
        let opts = compiler::Options {
            pes: m,
            schedule: Choice::Stream,
            dump_after: None,
            mem_limit: Some(limit),
            reroll: false,
            single_placement: false,
        };
        let c =
            compiler::compile(&parse_one(&src), &opts).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            c.manifest.ops.phase1_mac < u64::from(n * n * d * heads),
            "{what}: scores not paired"
        );
        let x = c.manifest.inputs["x"].layout.as_ref().expect("a layout");
        assert_eq!(x.base, heads * b * d, "{what}: outputs below the x rows");
        let seed = u64::from(n * 1000 + d * 100 + m * 10 + heads);
        let (_, cycles, man) = run_dir(&files(&c, true), seed);
        assert_eq!(cycles, c.manifest.cycles, "{what}");
        assert_eq!(man.mem_words.iter().max(), Some(&limit), "{what}");
        ran += 1;
    }
    assert_eq!(ran, 7);
}

/// Paired shared layers on 6, 8 and 12 PEs, dealt evenly and padded (the `G` part of each block
/// laid out first where the padded block keeps it, and not), even and odd blocks, run from
/// their files with the cycles the compiler states and match the reference.
#[test]
fn paired_scores_on_larger_rings_run_from_their_files() {
    let mut ran = 0;
    for (n, d, m, heads) in [
        (46u32, 4u32, 6u32, 1u32),
        (68, 3, 6, 2),
        (41, 2, 6, 1),
        (48, 3, 6, 1),
        (62, 2, 8, 1),
        (69, 3, 8, 1),
        (64, 2, 8, 2),
        (130, 2, 12, 1),
        (128, 2, 12, 1),
        (82, 2, 12, 1),
        (96, 2, 12, 1),
    ] {
        let src = layer_src(n, d, heads, true, false).replace("plain", "safe");
        let what = format!("n={n} d={d} m={m} heads={heads}");
        let c = stream(&src, m).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            c.manifest.ops.phase1_mac < u64::from(n * n * d * heads),
            "{what}: scores not paired"
        );
        let seed = u64::from(n * 1000 + d * 100 + m * 10 + heads);
        let (_, cycles, _) = run_dir(&files(&c, true), seed);
        assert_eq!(cycles, c.manifest.cycles, "{what}");
        ran += 1;
    }
    assert_eq!(ran, 11);
}

/// Compiled loop programs of several layers decode, from either binary version, to the program
/// that was encoded; version 4 is the smaller by at least half, and the q = k = v layer of 128
/// tokens, `d = 64`, 4 heads on 12 PEs (over 16 KiB per PE in version 3) fits every PE's file
/// in the 16 KiB of a small accelerator core's program memory.
#[test]
fn compiled_loop_programs_decode_from_both_binary_versions() {
    let shared128 = "layer l { tokens = 128; dim = 64; heads = 4; qkv = shared; }";
    let layers = [
        (shared128.to_string(), 12, Choice::Auto),
        (layer_src(64, 16, 2, false, true), 4, Choice::Stream),
        (layer_src(48, 16, 3, true, false), 6, Choice::Stream),
        (layer_src(40, 8, 1, false, false), 3, Choice::Stream),
        // Rerolled unrolled schedules, whose addresses follow no stream layout.
        (
            layer_src(24, 10, 1, false, false),
            4,
            Choice::parse("rows").expect("a scheduler"),
        ),
        (
            layer_src(16, 8, 2, true, true),
            8,
            Choice::parse("split").expect("a scheduler"),
        ),
    ];
    for (src, pes, schedule) in layers {
        let c = compiler::compile(
            &parse_one(&src),
            &compiler::Options {
                pes,
                schedule,
                reroll: true,
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("{src}: {e:?}"));
        assert!(!c.loops.is_empty(), "{src}: no loop programs");
        let mut largest = 0;
        for p in &c.loops {
            let v4 = isa::encode_looped(p).unwrap();
            let v3 = isa::looped_binary::v3::encode(p).unwrap();
            assert_eq!(&v4[8..10], &4u16.to_le_bytes());
            assert_eq!(&isa::decode_looped(&v4).unwrap(), p, "{src}: PE {}", p.pe);
            assert_eq!(&isa::decode_looped(&v3).unwrap(), p, "{src}: PE {}", p.pe);
            assert_eq!(isa::looped_binary::encoded_len(p), v4.len() as u64);
            assert!(
                2 * v4.len() <= v3.len(),
                "{src}: PE {}: {} against {}",
                p.pe,
                v4.len(),
                v3.len()
            );
            largest = largest.max(v4.len());
        }
        if src == shared128 {
            assert!(largest <= 16 << 10, "{src}: {largest} bytes");
        }
    }
}

/// Causal layers on rings that do not deal the tokens in `2m` equal chunks take whole rows
/// (per-element placements, every k/v row of a head kept); they run from their files against
/// the reference, in exactly the cycles the manifest states.
#[test]
fn whole_rows_under_a_causal_mask_run_from_their_files() {
    let mut ran = 0;
    for (n, m) in [(13u32, 3u32), (19, 4), (29, 6), (50, 12), (64, 6), (64, 10)] {
        for d in [1u32, 5, 16] {
            for heads in [1u32, 3] {
                let src = layer_src(n, d, heads, false, true).replace("plain", "safe");
                let what = format!("n={n} d={d} m={m} heads={heads}");
                // It keeps every k/v row of a head: more words than the default allowance.
                let opts = compiler::Options {
                    pes: m,
                    schedule: Choice::Stream,
                    dump_after: None,
                    mem_limit: Some(u32::MAX),
                    reroll: false,
                    single_placement: false,
                };
                let c = compiler::compile(&parse_one(&src), &opts)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(
                    c.manifest.inputs["q"].layout.is_none(),
                    "{what}: not whole rows"
                );
                let seed = u64::from(n * 1000 + d * 100 + m * 10 + heads);
                let (_, cycles, _) = run_dir(&files(&c, true), seed);
                assert_eq!(cycles, c.manifest.cycles, "{what}");
                ran += 1;
            }
        }
    }
    assert_eq!(ran, 36);
}

/// Causal layers on 6 and 12 PEs where whole rows with rows passed on to the next PE take
/// fewer cycles than the row dataflow: `auto` keeps them, in loop programs of at most 16 KiB per
/// PE, and they run from their files against the reference in the cycles the manifest states.
#[test]
fn whole_rows_passed_on_beat_the_row_dataflow() {
    for (n, d, m, heads) in [
        (64u32, 32u32, 6u32, 1u32),
        (64, 32, 6, 4),
        (64, 64, 6, 1),
        (64, 128, 6, 1),
        (128, 64, 12, 1),
    ] {
        whole_rows_kept_below_the_rows(n, d, m, heads);
    }
}

/// The causal layers on 12 PEs that the row dataflow kept until the ring steps were timed by
/// word and rows could be split by their output columns: `auto` now keeps whole rows there, in
/// fewer cycles than the row dataflow, and they run from their files.
#[test]
fn whole_rows_timed_by_word_and_split_beat_the_row_dataflow() {
    for (n, d, m, heads) in [
        (64u32, 32u32, 12u32, 1u32),
        (64, 32, 12, 4),
        (64, 64, 12, 1),
        (64, 64, 12, 4),
        (64, 128, 12, 4),
        (128, 128, 12, 1),
    ] {
        whole_rows_kept_below_the_rows(n, d, m, heads);
    }
}

/// `auto` keeps whole rows for the causal layer in fewer cycles than the row dataflow, in loop
/// programs of at most 16 KiB per PE, and they run from their files against the reference in
/// the cycles the manifest states.
fn whole_rows_kept_below_the_rows(n: u32, d: u32, m: u32, heads: u32) {
    {
        let src = layer_src(n, d, heads, false, true).replace("plain", "safe");
        let what = format!("n={n} d={d} m={m} heads={heads}");
        let compile = |schedule| {
            let opts = compiler::Options {
                pes: m,
                schedule,
                dump_after: None,
                mem_limit: None,
                reroll: true,
                single_placement: false,
            };
            compiler::compile(&parse_one(&src), &opts).unwrap_or_else(|e| panic!("{what}: {e}"))
        };
        let rows = compile(Choice::Named("rows"));
        let auto = compile(Choice::Auto);
        assert_eq!(auto.manifest.schedule, "schedule-stream", "{what}");
        assert!(
            auto.manifest.inputs["q"].layout.is_none(),
            "{what}: not whole rows"
        );
        assert!(
            auto.manifest.cycles < rows.manifest.cycles,
            "{what}: {} against the row dataflow's {}",
            auto.manifest.cycles,
            rows.manifest.cycles
        );
        for p in &auto.loops {
            let bytes = isa::encode_looped(p).unwrap().len();
            assert!(bytes <= 16 << 10, "{what}: PE {}: {bytes} bytes", p.pe);
        }
        let seed = u64::from(n * 1000 + d * 100 + m * 10 + heads);
        let (_, cycles, _) = run_dir(&files(&auto, true), seed);
        assert_eq!(cycles, auto.manifest.cycles, "{what}");
    }
}

/// Whole rows some of whose rows see fewer keys than `d` divide those rows' weights by their
/// sums instead of their output elements (per row; per weight where every row does): chosen by
/// the stream builder there, they run from their files against the reference in exactly the
/// cycles the manifest states, on 6 and 12 PEs.
#[test]
fn whole_rows_dividing_weights_run_from_their_files() {
    let schema = manifest_schema();
    let mut ran = 0;
    for (n, d, m) in [
        (29u32, 24u32, 6u32),
        (40, 32, 6),
        (64, 48, 6),
        (50, 40, 12),
        (64, 64, 12),
        (64, 16, 6),
        (128, 64, 6),
        (64, 32, 12),
    ] {
        for heads in [1u32, 4] {
            let src = layer_src(n, d, heads, false, true).replace("plain", "safe");
            let what = format!("n={n} d={d} m={m} heads={heads}");
            let opts = compiler::Options {
                pes: m,
                schedule: Choice::Stream,
                dump_after: None,
                mem_limit: Some(u32::MAX),
                reroll: false,
                single_placement: false,
            };
            let c = compiler::compile(&parse_one(&src), &opts)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(
                c.manifest.inputs["q"].layout.is_none(),
                "{what}: not whole rows"
            );
            // Per weight counts no operation beyond its own; per row, as deferred, token 0's
            // maximum is a copy.
            let (norm, copies) = if n <= d {
                (runtime::layer::Normalisation::PerWeight, 0)
            } else {
                (runtime::layer::Normalisation::PerRow, heads)
            };
            // Where rows are passed on to the next PE (their `y` rows placed there, not with
            // their q rows) the normalisation that evens the PEs out best is kept instead.
            let passed = c.manifest.outputs["y"].pe != c.manifest.inputs["q"].pe;
            if passed {
                let copies = match c.manifest.normalisation {
                    runtime::layer::Normalisation::PerWeight => 0,
                    _ => heads,
                };
                assert_eq!(c.manifest.ops.online_rescale, u64::from(copies), "{what}");
            } else {
                assert_eq!(c.manifest.normalisation, norm, "{what}");
                assert_eq!(c.manifest.ops.online_rescale, u64::from(copies), "{what}");
            }
            let json: serde_json::Value =
                serde_json::from_str(&c.manifest.to_json().unwrap()).unwrap();
            let errors: Vec<String> = schema.iter_errors(&json).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{what}: {errors:#?}");
            let seed = u64::from(n * 1000 + d * 100 + m * 10 + heads);
            let (_, cycles, _) = run_dir(&files(&c, true), seed);
            assert_eq!(cycles, c.manifest.cycles, "{what}");
            ran += 1;
        }
    }
    assert_eq!(ran, 16);
}

/// Writes a forced stream's programs (binary, and text too where `text`) and its manifest, runs
/// them from those files against the reference, and checks they take the cycles the schedule
/// and the manifest state.
fn run_forced_stream(
    p: &compiler::problem::Problem,
    m: u32,
    st: &compiler::passes::schedule_stream::Stream,
    text: bool,
    seed: u64,
    what: &str,
) {
    let man = compiler::stream::manifest("stream", p, m, st, "forced".into())
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut f = BTreeMap::new();
    for lp in &st.programs {
        if text {
            f.insert(format!("pe{}.s", lp.pe), lp.to_text().into_bytes());
        }
        f.insert(format!("pe{}.bin", lp.pe), isa::encode_looped(lp).unwrap());
    }
    f.insert("manifest.json".into(), man.to_json().unwrap().into_bytes());
    let (_, cycles, _) = run_dir(&f, seed);
    assert_eq!(cycles, st.cycles, "{what}");
    assert_eq!(cycles, man.cycles, "{what}");
}

/// Shared layers without a mask on rings that do not divide the tokens, rows dealt whole and
/// each score computed once with its mirror carried home: run from their files against the
/// reference, in exactly the cycles the manifest states, on 6 and 12 PEs and other rings.
#[test]
fn mirrored_scores_run_from_their_files() {
    let mut ran = 0;
    for (n, m) in [
        (13u32, 3u32),
        (26, 6),
        (40, 6),
        (64, 6),
        (50, 12),
        (64, 12),
        (45, 8),
    ] {
        for d in [2u32, 5, 16] {
            for (heads, timing) in [
                (1u32, MirroredTiming::OnStep),
                (1, MirroredTiming::Relayed),
                (2, MirroredTiming::Fastest),
            ] {
                let what = format!("n={n} d={d} m={m} heads={heads} {timing:?}");
                let p = compiler::problem::Problem::attention(
                    n,
                    d,
                    heads,
                    true,
                    false,
                    runtime::layer::Softmax::Safe,
                );
                let st = match compiler::passes::schedule_stream::run_mirrored_timed(&p, m, timing)
                {
                    Ok(st) => st,
                    // Two words a step's chain of products on 12 PEs: relaying at half a word a
                    // cycle cannot keep ahead of the steps.
                    Err(e) if d == 2 && m == 12 && e.contains("relayed timing does not apply") => {
                        continue;
                    }
                    Err(e) => panic!("{what}: {e}"),
                };
                let seed = u64::from(n * 1000 + d * 100 + m * 10 + heads);
                run_forced_stream(&p, m, &st, true, seed, &what);
                ran += 1;
            }
        }
    }
    assert_eq!(ran, 7 * 3 * 3 - 2);
    // Four heads relayed, the words left after a PE's ring pass laid on its rows; rows enough
    // per PE that those whose code moves on alike share a loop; one division per weight.
    for (n, d, m, heads, timing) in [
        (26u32, 5u32, 6u32, 4u32, MirroredTiming::Relayed),
        (40, 5, 6, 4, MirroredTiming::Relayed),
        (50, 5, 12, 4, MirroredTiming::Relayed),
        (64, 16, 12, 4, MirroredTiming::Relayed),
        (64, 4, 6, 4, MirroredTiming::OnStep),
        (64, 8, 6, 2, MirroredTiming::Relayed),
        (128, 4, 6, 1, MirroredTiming::OnStep),
        // Fewer keys than columns: each weight divided by its row's sum.
        (26, 32, 6, 1, MirroredTiming::Relayed),
        (50, 64, 12, 4, MirroredTiming::Relayed),
    ] {
        let what = format!("n={n} d={d} m={m} heads={heads} {timing:?}");
        let p = compiler::problem::Problem::attention(
            n,
            d,
            heads,
            true,
            false,
            runtime::layer::Softmax::Safe,
        );
        let st = compiler::passes::schedule_stream::run_mirrored_timed(&p, m, timing)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let seed = u64::from(n * 1000 + d * 100 + m * 10 + heads);
        run_forced_stream(&p, m, &st, false, seed, &what);
    }
}

/// Mirrored scores with each pair's scores kept whole at the homes run from their files against
/// the reference in the cycles stated, on 3, 6 and 12 PEs, one to four heads, deferred and per
/// weight.
#[test]
fn mirrored_scores_kept_whole_run_from_their_files() {
    for (n, d, m, heads) in [
        (13u32, 5u32, 3u32, 1u32),
        (26, 5, 6, 4),
        (40, 16, 6, 2),
        (50, 5, 12, 1),
        (64, 16, 12, 4),
        (50, 64, 12, 2),
    ] {
        let what = format!("n={n} d={d} m={m} heads={heads}");
        let p = compiler::problem::Problem::attention(
            n,
            d,
            heads,
            true,
            false,
            runtime::layer::Softmax::Safe,
        );
        let st =
            compiler::passes::schedule_stream::run_mirrored_timed(&p, m, MirroredTiming::Whole)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
        let seed = u64::from(n * 1000 + d * 100 + m * 10 + heads);
        run_forced_stream(&p, m, &st, false, seed, &what);
    }
}

/// On 12 PEs with 128 tokens the relayed mirrored programs took 17-19 KiB and the row dataflow
/// was kept; with each pair's scores kept whole at the homes their rows fold into loops, and
/// `auto` without a memory limit keeps them, within 16 KiB per PE, in fewer cycles than the row
/// dataflow, running from their files against the reference in the cycles stated. Four heads
/// of `d = 32` (17 761 bytes before) and 256 tokens (45 884) fit only with the relayed words in
/// few long runs: payloads in a transit layout on consecutive chains, x rows in the order they
/// come.
#[test]
fn mirrored_scores_kept_whole_are_kept_by_auto_on_twelve_pes() {
    for (n, d, heads) in [
        (128u32, 32u32, 1u32),
        (128, 64, 1),
        (128, 32, 4),
        (256, 32, 1),
    ] {
        let src = layer_src(n, d, heads, true, false).replace("plain", "safe");
        stream_kept_below_the_rows(
            &src,
            12,
            "x",
            u64::from(n + d + heads),
            &format!("n={n} d={d} heads={heads} m=12"),
        );
    }
}

/// 64 tokens, `d = 64`, four heads on 12 PEs: the row dataflow's busiest PE does as many
/// operations in every head, so no unrolled schedule can take fewer cycles than the stream of
/// mirrored scores takes; `auto` keeps the stream without building them (one candidate
/// tried), in loop programs within 16 KiB per PE, run from their files in the cycles stated.
/// The row dataflow, forced, takes exactly as many cycles.
#[test]
fn a_stream_at_the_rows_floor_is_kept_without_building_them() {
    let src = layer_src(64, 64, 4, true, false).replace("plain", "safe");
    let opts = |schedule| compiler::Options {
        pes: 12,
        schedule,
        dump_after: None,
        mem_limit: None,
        reroll: true,
        single_placement: false,
    };
    let c = compiler::compile(&parse_one(&src), &opts(Choice::Auto)).expect("auto");
    assert_eq!(c.manifest.schedule, "schedule-stream");
    let tried = &c.manifest.selection.candidates;
    assert_eq!(tried.len(), 1, "{tried:?}");
    let rows = compiler::compile(&parse_one(&src), &opts(Choice::Named("rows"))).expect("rows");
    assert_eq!(c.manifest.cycles, rows.manifest.cycles);
    for p in &c.loops {
        assert!(
            isa::encode_looped(p).unwrap().len() <= 16 << 10,
            "PE {}",
            p.pe
        );
    }
    let (_, cycles, _) = run_dir(&files(&c, true), 64);
    assert_eq!(cycles, c.manifest.cycles);
}

/// Where mirrored scores take fewer cycles than every other stream, `--schedule stream` with
/// room for them takes them: 64 tokens, `d = 32` on 6 PEs.
#[test]
fn mirrored_scores_are_taken_where_they_are_fastest() {
    let src = layer_src(64, 32, 1, true, false).replace("plain", "safe");
    let opts = compiler::Options {
        pes: 6,
        schedule: Choice::Stream,
        dump_after: None,
        mem_limit: Some(u32::MAX),
        reroll: false,
        single_placement: false,
    };
    let c = compiler::compile(&parse_one(&src), &opts).unwrap();
    assert!(
        c.manifest.inputs["x"].layout.is_none(),
        "not the mirrored deal"
    );
    let (_, cycles, _) = run_dir(&files(&c, true), 7);
    assert_eq!(cycles, c.manifest.cycles);
    assert_eq!(cycles, 34_646);
}
