//! What a user sees of the emitted files: the manifest against its published schema, the numeric
//! and text-format contracts of docs/isa.md, and `inspect`, `run --trace` and `show` on a grid of
//! compiled directories.

use crate::common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn attnc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attnc"))
        .args(args)
        .output()
        .expect("attnc runs")
}

fn ok(args: &[&str]) -> Output {
    let o = attnc(args);
    assert!(
        o.status.success(),
        "attnc {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn schema() -> jsonschema::Validator {
    let text = std::fs::read_to_string(repo("docs/manifest.schema.json")).unwrap();
    let schema: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        schema["$schema"], "https://json-schema.org/draft/2020-12/schema",
        "the schema declares its draft"
    );
    jsonschema::draft202012::new(&schema).expect("the schema is a valid 2020-12 schema")
}

fn assert_valid(v: &jsonschema::Validator, manifest: &Value, what: &str) {
    let errors: Vec<String> = v
        .iter_errors(manifest)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{what}: {errors:#?}");
}

/// The layers of the grid: (tokens, dim, heads, shared, causal, pes).
const GRID: [(u32, u32, u32, bool, bool, u32); 9] = [
    (4, 4, 1, false, false, 1),
    (4, 4, 2, true, true, 4),
    (5, 3, 1, true, false, 5),
    (6, 6, 1, false, true, 3),
    (8, 4, 2, false, false, 8),
    (3, 2, 2, true, true, 7),
    (16, 16, 2, true, true, 4),
    (12, 8, 3, false, true, 6),
    // A ring where the row dataflow stops once sure to lose (`selection.stopped`).
    (16, 8, 1, false, false, 64),
];

fn compile_dir(root: &Path, i: usize, src: &str, pes: u32) -> PathBuf {
    let file = root.join(format!("l{i}.attn"));
    std::fs::write(&file, src).unwrap();
    let out = root.join(format!("out{i}"));
    ok(&[s(&file), "--pes", &pes.to_string(), "-o", s(&out)]);
    out
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Work per PE straight from the programs on disk: (non-nop ops, adds, sends).
fn program_counts(dir: &Path, pes: usize) -> Vec<(u64, u64, u64)> {
    (0..pes)
        .map(|p| {
            let text = std::fs::read_to_string(dir.join(format!("pe{p}.s"))).unwrap();
            // Flat or rerolled; either way the bundles are the flattening.
            let prog = match isa::parse_any(&text).unwrap() {
                isa::AnyProgram::Flat(p) => p,
                isa::AnyProgram::Looped(l) => l.flatten(u64::MAX).unwrap(),
            };
            let mut c = (0, 0, 0);
            for b in &prog.bundles {
                c.0 += u64::from(!matches!(b.op, isa::Op::Nop));
                c.1 += u64::from(!matches!(b.acc, isa::Acc::Nop));
                c.2 += u64::from(!matches!(b.xfer, isa::Xfer::Nop));
            }
            c
        })
        .collect()
}

#[test]
fn every_manifest_validates_against_the_published_schema() {
    let v = schema();
    let choices = [
        compiler::passes::select::Choice::Auto,
        compiler::passes::select::Choice::Named("baseline"),
        compiler::passes::select::Choice::Named("rows"),
    ];
    let mut checked = 0;
    let mut with_stopped = 0;
    for (n, d, h, shared, causal, pes) in GRID {
        for choice in choices {
            let src = common::layer_src(n, d, h, shared, causal);
            let layer = common::parse_one(&src);
            let opts = compiler::Options {
                pes,
                schedule: choice,
                ..Default::default()
            };
            let Ok(c) = compiler::compile(&layer, &opts) else {
                continue;
            };
            let json: Value = serde_json::from_str(&c.manifest.to_json().unwrap()).unwrap();
            assert_valid(&v, &json, &src);
            checked += 1;
            with_stopped += usize::from(!c.manifest.selection.stopped.is_empty());
            // docs/manifest.md: no two placed elements (of any input or output) share a word.
            let mut seen = std::collections::HashSet::new();
            for p in c
                .manifest
                .inputs
                .values()
                .chain(c.manifest.outputs.values())
            {
                for w in p.pe.iter().zip(&p.addr) {
                    assert!(seen.insert(w), "{src} {choice:?}: word {w:?} placed twice");
                }
            }
            // docs/manifest.md promises that preloaded input words keep their values.
            let walk = timeline::walk(&c.programs, &c.manifest, |_, _| {}).unwrap();
            for p in c.manifest.inputs.values() {
                for (&pe, &addr) in p.pe.iter().zip(&p.addr) {
                    let bits = walk.per_pe[pe as usize].written[addr as usize];
                    assert_eq!(
                        bits, 0,
                        "{src} {choice:?}: input word PE {pe} m{addr} overwritten"
                    );
                }
            }
        }
    }
    assert!(
        checked >= GRID.len() * 2,
        "only {checked} manifests checked"
    );
    assert!(with_stopped > 0, "no manifest names a pass stopped early");

    // The schema is closed and typed: what it accepts is what attnc writes, nothing looser.
    let c = common::compile_src(
        &common::layer_src(4, 4, 1, false, false),
        2,
        Default::default(),
    );
    let good: Value = serde_json::from_str(&c.manifest.to_json().unwrap()).unwrap();
    let mut bad = good.clone();
    bad.as_object_mut().unwrap().remove("cycles");
    assert!(!v.is_valid(&bad), "missing cycles accepted");
    let mut bad = good.clone();
    bad["surprise"] = Value::from(1);
    assert!(!v.is_valid(&bad), "unknown key accepted");
    let mut bad = good.clone();
    bad["format_version"] = Value::from(4);
    assert!(!v.is_valid(&bad), "another version accepted");
    let mut bad = good.clone();
    bad["programs"] = Value::from("coroutines");
    assert!(!v.is_valid(&bad), "unknown program kind accepted");
    let mut bad = good.clone();
    bad["outputs"]["y"]["shape"] = serde_json::json!([4, 4]);
    assert!(!v.is_valid(&bad), "2-D shape accepted");
    let mut bad = good;
    bad["inputs"]["q"]["pe"][0] = Value::from(-1);
    assert!(!v.is_valid(&bad), "negative PE accepted");
}

/// Preload copies: typed, closed, on inputs only, and only in version 3 (any manifest attnc
/// writes with copies must validate, and nothing looser).
#[test]
fn preload_copies_validate_against_the_published_schema() {
    let v = schema();
    let c = common::compile_src(
        &common::layer_src(4, 4, 1, false, false),
        2,
        Default::default(),
    );
    let plain: Value = serde_json::from_str(&c.manifest.to_json().unwrap()).unwrap();
    // A copy the reader accepts: q's element 0 also in a word past PE 1's memory so far.
    let mut m = c.manifest.clone();
    m.format_version = runtime::manifest::COPIES_FORMAT_VERSION;
    m.mem_words[1] += 1;
    m.inputs.get_mut("q").unwrap().copies = vec![runtime::manifest::PreloadCopy {
        index: 0,
        pe: 1,
        addr: m.mem_words[1] - 1,
    }];
    let json = m.to_json().unwrap();
    runtime::manifest::Manifest::from_json(&json).unwrap();
    let good: Value = serde_json::from_str(&json).unwrap();
    assert_valid(&v, &good, "a manifest with a copy");
    // Version 3 without copies is valid too (the reader takes it).
    let mut v3 = plain.clone();
    v3["format_version"] = Value::from(3);
    assert_valid(&v, &v3, "version 3 without copies");

    let refused = |edit: &dyn Fn(&mut Value), what: &str| {
        let mut bad = good.clone();
        edit(&mut bad);
        assert!(!v.is_valid(&bad), "{what} accepted");
    };
    for version in [1, 2] {
        refused(
            &|m| m["format_version"] = Value::from(version),
            "a copy in an older version",
        );
    }
    refused(
        &|m| m["inputs"]["q"]["copies"][0]["surprise"] = Value::from(1),
        "an unknown key in a copy",
    );
    refused(
        &|m| {
            m["inputs"]["q"]["copies"][0]
                .as_object_mut()
                .unwrap()
                .remove("pe");
        },
        "a copy without its PE",
    );
    refused(
        &|m| m["inputs"]["q"]["copies"][0]["index"] = Value::from(-1),
        "a negative index",
    );
    refused(
        &|m| m["inputs"]["q"]["copies"][0]["addr"] = Value::from("m3"),
        "an address that is not a number",
    );
    refused(
        &|m| m["outputs"]["y"]["copies"] = m["inputs"]["q"]["copies"].clone(),
        "copies on an output",
    );
}

/// `inspect` lists an input's preload copies in the memory map of the PE that holds them, under
/// the input's name; `run` loads them; `verify` sees them as input words (this one is read by
/// no program, so it is an unused input).
#[test]
fn inspect_run_and_verify_see_preload_copies() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("l.attn");
    std::fs::write(&file, common::layer_src(4, 4, 1, false, false)).unwrap();
    let dir = tmp.path().join("out");
    ok(&[s(&file), "--pes", "2", "--flat", "-o", s(&dir)]);
    let q_on = |m: &Value, pe: u64| -> u64 {
        let q = &m["inputs"]["q"]["pe"];
        q.as_array().unwrap().iter().filter(|&p| p == pe).count() as u64
    };
    // q's element 5 also at one more word of PE 1, named in the manifest and the program.
    let mut m = read_json(&dir.join("manifest.json"));
    let word = m["mem_words"][1].as_u64().unwrap();
    m["format_version"] = Value::from(3);
    m["mem_words"][1] = Value::from(word + 1);
    m["inputs"]["q"]["copies"] = serde_json::json!([{ "index": 5, "pe": 1, "addr": word }]);
    std::fs::write(dir.join("manifest.json"), m.to_string()).unwrap();
    for pe in 0..2 {
        std::fs::remove_file(dir.join(format!("pe{pe}.bin"))).unwrap();
    }
    let text = std::fs::read_to_string(dir.join("pe1.s")).unwrap();
    let mem = format!(".mem {word}\n");
    assert!(text.contains(&mem), "{text}");
    let text = text.replace(&mem, &format!(".mem {}\n", word + 1));
    std::fs::write(dir.join("pe1.s"), text).unwrap();

    let report: Value =
        serde_json::from_slice(&ok(&["inspect", s(&dir), "--json"]).stdout).unwrap();
    for pe in 0..2u64 {
        let runs = report["per_pe"][pe as usize]["memory"]["q"]
            .as_array()
            .unwrap();
        let words: u64 = runs
            .iter()
            .map(|r| r[1].as_u64().unwrap() - r[0].as_u64().unwrap() + 1)
            .sum();
        assert_eq!(words, q_on(&m, pe) + pe, "PE {pe}: {runs:?}");
        let has = runs
            .iter()
            .any(|r| r[0].as_u64().unwrap() <= word && word <= r[1].as_u64().unwrap());
        assert_eq!(has, pe == 1, "PE {pe}: {runs:?}");
    }
    ok(&["run", s(&dir)]);
    let o = attnc(&["verify", s(&dir)]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(!o.status.success() && out.contains("unused-input"), "{out}");
}

/// An exp that is off by up to `ulps` units in the last place, pseudo-randomly per call, as a
/// hardware exp within the documented error bound may be.
struct PerturbedExp {
    state: u64,
    ulps: i64,
    calls: u64,
}

impl PerturbedExp {
    fn next(&mut self) -> u64 {
        // splitmix64: deterministic, so a failure reproduces.
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl isa::Domain for PerturbedExp {
    type Value = f32;
    fn op(&mut self, kind: isa::OpKind, a: &f32, b: Option<&f32>, imm: f32) -> f32 {
        let e = isa::F32Domain.op(kind, a, b, imm);
        if !matches!(kind, isa::OpKind::Exp | isa::OpKind::Expd) {
            return e;
        }
        self.calls += 1;
        if !e.is_finite() || e == 0.0 {
            return e;
        }
        let off = (self.next() % (2 * self.ulps as u64 + 1)) as i64 - self.ulps;
        // exp is positive, so stepping the bit pattern steps the value by whole ulps.
        f32::from_bits((i64::from(e.to_bits()) + off) as u32)
    }
    fn add(&mut self, a: &f32, b: &f32) -> f32 {
        a + b
    }
}

/// Max |y − reference| over a grid of layers with exp perturbed by up to `ulps`.
fn worst_error_with_perturbed_exp(ulps: i64) -> f64 {
    let mut worst: f64 = 0.0;
    let layers = [
        (16, 16, 2, true, true, 4),
        (12, 8, 3, false, true, 6),
        (32, 16, 1, false, false, 8),
        (24, 32, 2, true, false, 5),
        (8, 64, 1, false, false, 3),
    ];
    for (i, (n, d, h, shared, causal, pes)) in layers.into_iter().enumerate() {
        let c = common::compile_src(
            &common::layer_src(n, d, h, shared, causal),
            pes,
            Default::default(),
        );
        for seed in 0..3 {
            let inputs = compiler::exec::random_inputs(&c.manifest, seed);
            let dom = PerturbedExp {
                state: seed * 1000 + i as u64,
                ulps,
                calls: 0,
            };
            let out = compiler::exec::execute(
                dom,
                c.programs.clone(),
                &c.manifest,
                &inputs,
                &mut isa::NoObserver,
            )
            .unwrap();
            let want = compiler::exec::reference_output(&c.manifest, &inputs).unwrap();
            worst = worst.max(compiler::exec::max_abs_err(&out.outputs["y"], &want));
        }
    }
    worst
}

#[test]
fn outputs_stay_within_tolerance_for_an_exp_within_the_documented_bound() {
    // docs/isa.md: an exp within 16 ulp of e^x keeps max_abs_err under the default 1e-4 for
    // standard-normal inputs.
    let within = worst_error_with_perturbed_exp(16);
    assert!(within <= 1e-4, "max_abs_err {within:e} with a 16-ulp exp");
    // The perturbation is real: far beyond the bound the same check fails, so the test above
    // measures something.
    let beyond = worst_error_with_perturbed_exp(1 << 17);
    assert!(beyond > 1e-4, "a 2^17-ulp exp still gave {beyond:e}");
    let exact = worst_error_with_perturbed_exp(0);
    assert!(
        within > exact,
        "16-ulp perturbation changed nothing ({within:e})"
    );
}

#[test]
fn text_grammar_is_as_documented() {
    let prog = |line: &str| isa::parse(&format!(".format 1\n.pe 0\n.pes 1\n.mem 4\n{line}\n"));
    let scale = |s: &str| match prog(&format!("exp m0, {s}")) {
        Ok(p) => match p.bundles[0].op {
            isa::Op::Arith(x) => Ok(x.imm),
            isa::Op::Nop => Err("parsed as nop".to_string()),
        },
        Err(e) => Err(e.to_string()),
    };
    assert_eq!(scale(".5"), Ok(0.5));
    assert_eq!(scale("5."), Ok(5.0));
    assert_eq!(scale("+2"), Ok(2.0));
    assert_eq!(scale("1E-3"), Ok(1e-3));
    assert_eq!(scale("-0"), Ok(-0.0));
    assert_eq!(scale("0.1"), Ok(0.1f32)); // rounded to nearest
    assert!(scale("0.577_35026").is_err());
    assert!(scale("inf").unwrap_err().contains("not a finite f32"));
    assert!(scale("NaN").unwrap_err().contains("not a finite f32"));
    assert!(scale("1e39").unwrap_err().contains("not a finite f32"));
    assert!(scale("0x1p-2").is_err());
    // Punctuation separates tokens on its own; words need whitespace between them.
    assert!(prog("mul m3,m1->m2|add m2->m2|send acc->m0").is_ok());
    assert!(prog("mulm0, m1").is_err());
    assert!(prog("mul m 0, m1").is_err());
    assert!(isa::parse(".format 1\n.pe0\n.pes 1\n.mem 4\n").is_err());
    assert!(prog("MUL m0, m1").is_err());
    assert!(prog("mul m0, m1 -> m2 ; comment").is_ok());
}

#[test]
fn canonical_scales_switch_to_exponent_form_as_documented() {
    let print = |scale: f32| {
        isa::Op::exp(0, scale, None)
            .to_string()
            .trim_start_matches("exp m0, ")
            .to_string()
    };
    assert_eq!(print(0.25), "0.25");
    assert_eq!(print(1.0), "1.0");
    assert_eq!(print(-0.0), "-0.0");
    assert_eq!(print(0.0001), "0.0001");
    assert_eq!(print(0.00009999), "9.999e-5");
    assert_eq!(print(1e-7), "1e-7");
    assert_eq!(print(1e15), "1000000000000000.0");
    assert_eq!(print(1e16), "1e16");
    assert_eq!(print(1.5e20), "1.5e20");
    assert_eq!(print(0.17677669), "0.17677669");
}

/// The bitwise CRC-32 oracle of the `isa` crate's tests (one copy for the workspace).
#[path = "../isa/tests/common/mod.rs"]
mod isa_common;
use isa_common::crc32_bitwise as crc32_iso_hdlc;

#[test]
fn binary_checksum_is_crc32_iso_hdlc_of_everything_before_it() {
    assert_eq!(crc32_iso_hdlc(b"123456789"), 0xCBF4_3926);
    let c = common::compile_src(
        &common::layer_src(4, 4, 1, false, true),
        3,
        Default::default(),
    );
    for p in &c.programs {
        let bytes = isa::encode(p).unwrap();
        let (body, tail) = bytes.split_at(bytes.len() - 4);
        assert_eq!(tail, crc32_iso_hdlc(body).to_le_bytes());
    }
}

/// The slices of one (process, thread): (ts, dur, event).
type Track<'a> = Vec<(u64, u64, &'a Value)>;

/// Checks the trace's structure and returns, per PE and slot, the slot-cycles per class key.
fn check_trace(
    trace: &Value,
    pes: u64,
    cycles: u64,
) -> Vec<[std::collections::BTreeMap<String, u64>; 3]> {
    let events = trace["traceEvents"].as_array().expect("traceEvents array");
    let mut names = std::collections::BTreeSet::new();
    let mut tracks: std::collections::BTreeMap<(u64, u64), Track> = Default::default();
    for e in events {
        let ph = e["ph"].as_str().expect("ph");
        let pid = e["pid"].as_u64().expect("integer pid");
        match ph {
            "M" => {
                if e["name"] == "process_name" {
                    names.insert(e["args"]["name"].as_str().unwrap().to_string());
                }
            }
            "X" => {
                let tid = e["tid"].as_u64().expect("tid");
                assert!(tid < 3, "{e}");
                assert!(e["name"].is_string() && e["cat"].is_string(), "{e}");
                let ts = e["ts"].as_u64().expect("integer ts");
                let dur = e["dur"].as_u64().expect("integer dur");
                assert!(dur > 0, "{e}");
                tracks.entry((pid, tid)).or_default().push((ts, dur, e));
            }
            "C" => {
                assert!(e["ts"].is_u64() && e["args"]["sent"].is_number(), "{e}");
            }
            other => panic!("unexpected event phase {other}: {e}"),
        }
    }
    for p in 0..pes {
        assert!(
            names.contains(&format!("PE {p}")),
            "PE {p} missing from {names:?}"
        );
    }
    let mut out = vec![<[std::collections::BTreeMap<String, u64>; 3]>::default(); pes as usize];
    for ((pid, tid), mut slices) in tracks {
        slices.sort_by_key(|s| s.0);
        // Slices tile the run: no gap, no overlap, durations sum to the cycle count.
        let mut t = 0;
        for (ts, dur, e) in &slices {
            assert_eq!(*ts, t, "gap or overlap on PE {pid} slot {tid}");
            t += dur;
            let counts = &mut out[pid as usize][tid as usize];
            match e.get("args").and_then(|a| a.as_object()) {
                Some(args) => {
                    let n: u64 = args.values().map(|v| v.as_u64().unwrap()).sum();
                    assert_eq!(n, *dur, "aggregated counts cover the slice: {e}");
                    for (k, v) in args {
                        *counts.entry(k.clone()).or_default() += v.as_u64().unwrap();
                    }
                }
                None => {
                    *counts
                        .entry(e["cat"].as_str().unwrap().to_string())
                        .or_default() += dur
                }
            }
        }
        assert_eq!(t, cycles, "PE {pid} slot {tid} does not cover the run");
    }
    out
}

#[test]
fn readme_example_trace_opens_as_chrome_trace_events() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    ok(&[
        s(&repo("examples/gpt_head.attn")),
        "--pes",
        "4",
        "-o",
        s(&out),
    ]);
    let manifest = read_json(&out.join("manifest.json"));
    let cycles = manifest["cycles"].as_u64().unwrap();
    let ops = &manifest["ops"];
    let work = program_counts(&out, 4);
    for (bin, exact) in [(None, true), (Some("64"), false)] {
        let trace_path = tmp.path().join("t.json");
        let mut args = vec!["run", s(&out), "--trace", s(&trace_path)];
        if let Some(b) = bin {
            args.extend(["--trace-bin", b]);
        }
        ok(&args);
        let trace = read_json(&trace_path);
        assert_eq!(
            trace["otherData"]["cycles_per_bin"].as_u64().unwrap() == 1,
            exact
        );
        let counts = check_trace(&trace, 4, cycles);
        let busy = |m: &std::collections::BTreeMap<String, u64>| {
            m.iter()
                .filter(|(k, _)| *k != "idle")
                .map(|(_, v)| v)
                .sum::<u64>()
        };
        let mut by_phase = std::collections::BTreeMap::<String, u64>::new();
        for (p, slots) in counts.iter().enumerate() {
            // The busy part of each track is exactly the work in the program file.
            assert_eq!(busy(&slots[0]), work[p].0, "PE {p} op slot");
            assert_eq!(busy(&slots[1]), work[p].1, "PE {p} acc slot");
            assert_eq!(busy(&slots[2]), work[p].2, "PE {p} link slot");
            for (k, v) in &slots[0] {
                *by_phase.entry(k.clone()).or_default() += v;
            }
        }
        // Phases found by lineage agree with the compiler's own operation counts.
        assert_eq!(
            by_phase.get("qk").copied().unwrap_or(0),
            ops["phase1_mac"].as_u64().unwrap()
        );
        assert_eq!(
            by_phase.get("softmax").copied().unwrap_or(0),
            ops["phase2_exp"].as_u64().unwrap()
                + ops["phase2_div"].as_u64().unwrap()
                // Absent for a plain softmax.
                + ops.get("phase2_max").and_then(|v| v.as_u64()).unwrap_or(0)
        );
        assert_eq!(
            by_phase.get("av").copied().unwrap_or(0),
            ops["phase3_mac"].as_u64().unwrap()
        );
        assert!(!by_phase.contains_key("other"), "{by_phase:?}");
    }
}

#[test]
fn inspect_trace_and_show_work_on_every_grid_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let v = schema();
    for (i, (n, d, h, shared, causal, pes)) in GRID.into_iter().enumerate() {
        let dir = compile_dir(
            tmp.path(),
            i,
            &common::layer_src(n, d, h, shared, causal),
            pes,
        );
        let manifest = read_json(&dir.join("manifest.json"));
        assert_valid(&v, &manifest, &format!("grid {i}"));
        let typed = compiler::manifest::Manifest::from_json(
            &std::fs::read_to_string(dir.join("manifest.json")).unwrap(),
        )
        .unwrap();
        let cycles = manifest["cycles"].as_u64().unwrap();
        let work = program_counts(&dir, pes as usize);

        let o = ok(&["inspect", s(&dir), "--json"]);
        let report: Value = serde_json::from_slice(&o.stdout).unwrap();
        let rows = report["per_pe"].as_array().unwrap();
        assert_eq!(rows.len(), pes as usize);
        let mut qk = 0;
        for (p, r) in rows.iter().enumerate() {
            assert_eq!(r["bundles"].as_u64().unwrap(), cycles);
            assert_eq!(r["binary_file_bytes"], r["binary_bytes"]);
            let busy: u64 = ["qk", "softmax", "av", "other"]
                .iter()
                .map(|k| r["ops"][k].as_u64().unwrap())
                .sum();
            assert_eq!(busy, work[p].0, "grid {i} PE {p}");
            assert_eq!(busy + r["idle_cycles"].as_u64().unwrap(), cycles);
            assert_eq!(r["link_sent"].as_u64().unwrap(), work[p].2);
            let prev = (p + pes as usize - 1) % pes as usize;
            assert_eq!(r["link_received"].as_u64().unwrap(), work[prev].2);
            assert_eq!(r["ops"]["other"], 0);
            qk += r["ops"]["qk"].as_u64().unwrap();
            // Every input word the manifest places on this PE is in the memory map.
            for name in manifest["inputs"].as_object().unwrap().keys() {
                // Per-element arrays, or an affine layout (a stream compile): count either way.
                let place = &typed.inputs[name];
                // Preload copies are listed under their input too.
                let here = common::preload_pes(place, pes)
                    .filter(|&at| at == p as u32)
                    .count();
                let listed: u64 = r["memory"][name]
                    .as_array()
                    .map(|rs| {
                        rs.iter()
                            .map(|r| r[1].as_u64().unwrap() - r[0].as_u64().unwrap() + 1)
                            .sum()
                    })
                    .unwrap_or(0);
                assert_eq!(listed, here as u64, "grid {i} PE {p} {name}");
            }
        }
        assert_eq!(qk, manifest["ops"]["phase1_mac"].as_u64().unwrap());
        let text = ok(&["inspect", s(&dir)]);
        assert!(String::from_utf8_lossy(&text.stdout).contains("memory map"));

        let trace_path = tmp.path().join(format!("t{i}.json"));
        ok(&["run", s(&dir), "--trace", s(&trace_path)]);
        check_trace(&read_json(&trace_path), u64::from(pes), cycles);

        let svg_path = tmp.path().join(format!("u{i}.svg"));
        ok(&["show", s(&dir), "-o", s(&svg_path)]);
        let svg = std::fs::read_to_string(&svg_path).unwrap();
        let mut texts = Vec::new();
        for event in svg::read(&svg).expect("the SVG parses") {
            if let svg::parser::Event::Text(t) = event {
                texts.push(t.to_string());
            }
        }
        let all = texts.join("\n");
        assert!(
            all.contains(&format!("{cycles} cycles on {pes} PEs")),
            "{all}"
        );
        assert!(
            all.contains("cycles/LB") && all.contains("time (cycles)") && all.contains("idle"),
            "{all}"
        );
    }
}

#[test]
fn a_large_layer_trace_is_aggregated_and_small() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = compile_dir(
        tmp.path(),
        0,
        &common::layer_src(64, 32, 2, false, false),
        64,
    );
    let manifest = read_json(&dir.join("manifest.json"));
    let cycles = manifest["cycles"].as_u64().unwrap();
    let trace_path = tmp.path().join("t.json");
    ok(&["run", s(&dir), "--trace", s(&trace_path)]);
    let bytes = std::fs::metadata(&trace_path).unwrap().len();
    assert!(bytes < 50_000_000, "{bytes} bytes");
    let trace = read_json(&trace_path);
    assert!(trace["otherData"]["cycles_per_bin"].as_u64().unwrap() > 1);
    let counts = check_trace(&trace, 64, cycles);
    let work = program_counts(&dir, 64);
    for (p, slots) in counts.iter().enumerate() {
        let busy: u64 = slots[0]
            .iter()
            .filter(|(k, _)| *k != "idle")
            .map(|(_, v)| v)
            .sum();
        assert_eq!(busy, work[p].0, "aggregation lost work on PE {p}");
    }
    let svg_path = tmp.path().join("u.svg");
    ok(&["show", s(&dir), "-o", s(&svg_path)]);
    assert!(std::fs::metadata(&svg_path).unwrap().len() < 5_000_000);
}

#[test]
fn piped_runs_print_no_progress() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = compile_dir(tmp.path(), 0, &common::layer_src(8, 8, 1, false, false), 2);
    let o = ok(&["run", s(&dir), "--json"]);
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let _: Value = serde_json::from_slice(&o.stdout).expect("stdout is one JSON object");
}

/// Runs of a memory map entry as inclusive `(first, last)` pairs.
fn runs(v: &Value) -> Vec<(u64, u64)> {
    v.as_array()
        .map(|rs| {
            rs.iter()
                .map(|r| (r[0].as_u64().unwrap(), r[1].as_u64().unwrap()))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn inspect_from_the_loop_structure_agrees_with_the_flattened_walk() {
    // The loop summary counts from trip counts and predicates, the default summary walks the
    // flattened programs: per PE they must give the same work, traffic and placements, and
    // every word the walk saw written must lie in a hull the loop summary lists.
    let tmp = tempfile::tempdir().unwrap();
    let stream = [
        (8, 4, 2, false, false, 4),
        (12, 3, 1, false, true, 3),
        (16, 8, 3, false, true, 4),
        (9, 4, 2, false, false, 4),
        (8, 8, 1, true, false, 4),
        (16, 4, 1, true, false, 4),
    ];
    let dirs = GRID
        .into_iter()
        .map(|l| (l, false))
        .chain(stream.into_iter().map(|l| (l, true)));
    let mut compared = 0;
    for (i, ((n, d, h, shared, causal, pes), forced)) in dirs.enumerate() {
        let src = common::layer_src(n, d, h, shared, causal);
        let file = tmp.path().join(format!("l{i}.attn"));
        std::fs::write(&file, &src).unwrap();
        let dir = tmp.path().join(format!("out{i}"));
        let pes_s = pes.to_string();
        let mut args = vec![s(&file), "--pes", &pes_s, "-o", s(&dir)];
        if forced {
            args.extend_from_slice(&["--schedule", "stream"]);
        }
        ok(&args);
        let manifest = read_json(&dir.join("manifest.json"));
        if manifest["programs"] != "loops" {
            // Flat files: `--loops` says it needs loop programs.
            let o = attnc(&["inspect", s(&dir), "--loops"]);
            assert!(!o.status.success());
            continue;
        }
        let walk: Value =
            serde_json::from_slice(&ok(&["inspect", s(&dir), "--json"]).stdout).unwrap();
        let loops: Value =
            serde_json::from_slice(&ok(&["inspect", s(&dir), "--json", "--loops"]).stdout).unwrap();
        let (w, l) = (
            walk["per_pe"].as_array().unwrap(),
            loops["per_pe"].as_array().unwrap(),
        );
        assert_eq!(w.len(), l.len());
        compared += 1;
        for (p, (a, b)) in w.iter().zip(l).enumerate() {
            let what = format!("{src} on {pes} PEs, PE {p}");
            for key in [
                "busy_cycles",
                "idle_cycles",
                "acc_adds",
                "link_sent",
                "link_received",
                "mem_words",
                "binary_file_bytes",
                "text_file_bytes",
            ] {
                assert_eq!(a[key], b[key], "{what}: {key}");
            }
            assert_eq!(b["cycles"], manifest["cycles"], "{what}");
            let (wm, lm) = (
                a["memory"].as_object().unwrap(),
                b["memory"].as_object().unwrap(),
            );
            let hulls: Vec<(u64, u64)> = lm
                .iter()
                .filter(|(k, _)| k.starts_with("written:") || *k == "received")
                .flat_map(|(_, v)| runs(v))
                .collect();
            for (name, v) in wm {
                if ["q", "k", "v", "x", "y"].contains(&name.as_str()) {
                    // Placements from the manifest, listed alike by both.
                    assert_eq!(runs(v), runs(&lm[name]), "{what}: {name}");
                    continue;
                }
                for (lo, hi) in runs(v) {
                    for addr in lo..=hi {
                        assert!(
                            hulls.iter().any(|&(a, b)| a <= addr && addr <= b),
                            "{what}: {name} word {addr} outside every written hull {hulls:?}"
                        );
                    }
                }
            }
        }
    }
    // The grid's rerolled directories and every stream one.
    assert!(
        compared >= 10,
        "only {compared} directories held loop programs"
    );
}

#[test]
fn inspect_summarises_a_real_layer_without_flattening() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = compile_dir(
        tmp.path(),
        0,
        "layer gpt2 { tokens = 1024; dim = 64; heads = 12; mask = causal; }",
        16,
    );
    let o = ok(&["inspect", s(&dir), "--json"]);
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    let manifest = read_json(&dir.join("manifest.json"));
    assert!(report["loop_summary"]
        .as_str()
        .unwrap()
        .contains("flattens"));
    let rows = report["per_pe"].as_array().unwrap();
    assert_eq!(rows.len(), 16);
    let (mut sent, mut received) = (0, 0);
    for (p, r) in rows.iter().enumerate() {
        assert_eq!(r["cycles"], manifest["cycles"]);
        let busy: u64 = r["ops"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum();
        assert_eq!(busy, r["busy_cycles"].as_u64().unwrap());
        assert_eq!(
            busy + r["idle_cycles"].as_u64().unwrap(),
            manifest["cycles"].as_u64().unwrap()
        );
        sent += r["link_sent"].as_u64().unwrap();
        received += r["link_received"].as_u64().unwrap();
        // Every listed run lies inside the PE's memory.
        let words = manifest["mem_words"][p].as_u64().unwrap();
        for (name, v) in r["memory"].as_object().unwrap() {
            for (_, hi) in runs(v) {
                assert!(hi < words, "PE {p} {name} reaches {hi} of {words}");
            }
        }
        // Its share of q, k, v and y: 12 heads × 64 rows × 64 columns each.
        for name in ["q", "k", "v", "y"] {
            let listed: u64 = runs(&r["memory"][name])
                .iter()
                .map(|(a, b)| b - a + 1)
                .sum();
            assert_eq!(listed, 12 * 64 * 64, "PE {p} {name}");
        }
    }
    assert_eq!(sent, received);
    assert!(sent > 0);
}
