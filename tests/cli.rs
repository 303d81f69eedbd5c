//! The `attnc` binary on good and bad input: every bad input gets a clear message, a non-zero
//! exit, no panic, and nothing half-written.

use npyz::WriterBuilder;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn attnc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attnc"))
        .args(args)
        .output()
        .expect("attnc runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Fails unless the command failed cleanly: exit code 1 or 2, a message, no panic.
fn assert_clean_failure(o: &Output, needle: &str) {
    let t = text(o);
    assert!(!o.status.success(), "expected failure, got success:\n{t}");
    assert!(
        matches!(o.status.code(), Some(1) | Some(2)),
        "exit code {:?}:\n{t}",
        o.status.code()
    );
    assert!(!t.contains("panicked"), "panic:\n{t}");
    assert!(t.contains(needle), "expected `{needle}` in:\n{t}");
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

const LAYER: &str = "layer t { tokens = 4; dim = 4; heads = 2; }";

fn compiled(dir: &Path, src: &str, pes: &str) -> PathBuf {
    compiled_with(dir, src, pes, &[])
}

fn compiled_with(dir: &Path, src: &str, pes: &str, extra: &[&str]) -> PathBuf {
    let file = dir.join("layer.attn");
    std::fs::write(&file, src).unwrap();
    let out = dir.join("out");
    let mut args = vec![s(&file), "--pes", pes, "-o", s(&out)];
    args.extend_from_slice(extra);
    let o = attnc(&args);
    assert!(o.status.success(), "{}", text(&o));
    out
}

/// The two forms `compile` writes: rerolled loop programs (the default, for a layer this size)
/// and flat ones.
const FORMS: [&[&str]; 2] = [&[], &["--flat"]];

fn npy(shape: &[u64], data: &[f32]) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut w = npyz::WriteOptions::new()
        .default_dtype()
        .shape(shape)
        .writer(&mut buf)
        .begin_nd()
        .unwrap();
    w.extend(data.iter().copied()).unwrap();
    w.finish().unwrap();
    buf
}

#[test]
fn compile_then_run_the_bundled_example() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = attnc(&["examples/gpt_head.attn", "--pes", "4", "-o", s(&out)]);
    assert!(o.status.success(), "{}", text(&o));
    for pe in 0..4 {
        assert!(out.join(format!("pe{pe}.s")).is_file());
        assert!(out.join(format!("pe{pe}.bin")).is_file());
    }
    let o = attnc(&["run", s(&out), "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["max_abs_err"].as_f64().unwrap() <= 1e-4);
    assert!(v["cycles"].as_u64().unwrap() >= v["lower_bound"].as_u64().unwrap());
    assert!(v["utilization"].as_f64().unwrap() > 0.5);
    // Same result from the text files when the binary ones are absent.
    for pe in 0..4 {
        std::fs::remove_file(out.join(format!("pe{pe}.bin"))).unwrap();
    }
    let o2 = attnc(&["run", s(&out), "--json"]);
    assert!(o2.status.success(), "{}", text(&o2));
    let v2: serde_json::Value = serde_json::from_slice(&o2.stdout).unwrap();
    assert_eq!(v2["program_source"], "text");
    assert_eq!(v["cycles"], v2["cycles"]);
    assert_eq!(v["max_abs_err"], v2["max_abs_err"]);
}

#[test]
fn compile_subcommand_and_emit_ir() {
    let o = attnc(&[
        "compile",
        "examples/encoder.attn",
        "--pes",
        "2",
        "--emit",
        "ir",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(t.contains("n3 = scores n0, n1"), "{t}");
    assert!(t.contains("softmax"), "{t}");
}

/// Both kinds of output directory take `.npy` inputs: per-element placements (`--flat`) and the
/// stream's affine layouts (which once counted as holding no element).
#[test]
fn run_with_npy_inputs_and_output() {
    for extra in [&["--flat"][..], &["--schedule", "stream"][..]] {
        run_with_npy_inputs(extra);
    }
}

fn run_with_npy_inputs(extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let out = compiled_with(dir.path(), LAYER, "2", extra);
    let data: Vec<f32> = (0..32).map(|i| (i as f32 * 0.37).sin()).collect();
    let mut args = vec!["run".to_string(), s(&out).to_string()];
    for name in ["q", "k", "v"] {
        let f = dir.path().join(format!("{name}.npy"));
        std::fs::write(&f, npy(&[2, 4, 4], &data)).unwrap();
        args.push("--input".into());
        args.push(format!("{name}={}", s(&f)));
    }
    let y = dir.path().join("y.npy");
    args.extend(["--output".into(), s(&y).into()]);
    let o = attnc(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("cycles: "));
    let bytes = std::fs::read(&y).unwrap();
    let f = npyz::NpyFile::new(&bytes[..]).unwrap();
    assert_eq!(f.shape(), &[2, 4, 4]);
}

#[test]
fn malformed_layer_file_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.attn");
    std::fs::write(&file, "layer t { tokens = ; dim = 4 }").unwrap();
    let out = dir.path().join("out");
    let o = attnc(&[s(&file), "--pes", "2", "-o", s(&out)]);
    assert_clean_failure(&o, "error");
    assert!(
        !out.exists(),
        "a failed compile must not create the output directory"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no staging leftovers"
    );
}

#[test]
fn binary_layer_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bin.attn");
    std::fs::write(&file, [0u8, 159, 146, 150, 255, 0, 1, 2]).unwrap();
    let o = attnc(&[s(&file), "--pes", "2", "-o", s(&dir.path().join("out"))]);
    assert_clean_failure(&o, "UTF-8");
}

/// The help text names every schedule `--schedule` accepts (a scheduler added to the registry
/// must be added to the text).
#[test]
fn compile_help_names_every_schedule() {
    let o = attnc(&["compile", "--help"]);
    assert!(o.status.success(), "{}", text(&o));
    let help = text(&o);
    for name in compiler::passes::select::Choice::names() {
        assert!(
            help.contains(&format!(" {name}")),
            "`{name}` missing from:\n{help}"
        );
    }
}

#[test]
fn unknown_flag() {
    let o = attnc(&["examples/encoder.attn", "--pes", "2", "--frobnicate"]);
    assert_clean_failure(&o, "--frobnicate");
}

#[test]
fn zero_pes() {
    let dir = tempfile::tempdir().unwrap();
    let o = attnc(&[
        "examples/encoder.attn",
        "--pes",
        "0",
        "-o",
        s(&dir.path().join("o")),
    ]);
    assert_clean_failure(&o, "--pes");
    assert!(!dir.path().join("o").exists());
}

#[test]
fn forced_baseline_on_pes_not_dividing_tokens_points_at_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("l.attn");
    std::fs::write(&file, "layer t {\n  tokens = 6;\n  dim = 6;\n}\n").unwrap();
    let o = attnc(&[
        s(&file),
        "--pes",
        "4",
        "--schedule",
        "baseline",
        "-o",
        s(&dir.path().join("o")),
    ]);
    assert_clean_failure(&o, "l.attn:2:");
    assert!(text(&o).contains("tokens"));
    // Under `auto` the row dataflow takes the same layer.
    let o = attnc(&[s(&file), "--pes", "4", "-o", s(&dir.path().join("o"))]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn missing_files() {
    let o = attnc(&["/nonexistent/layer.attn", "--pes", "2", "-o", "/tmp/x"]);
    assert_clean_failure(&o, "cannot read");
    let o = attnc(&["run", "/nonexistent/dir"]);
    assert_clean_failure(&o, "not a directory");
}

#[test]
fn npy_of_wrong_dtype_shape_order_or_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let out = compiled(
        dir.path(),
        "layer t { tokens = 4; dim = 4; qkv = shared; }",
        "2",
    );
    let good = npy(&[4, 4], &[0.5; 16]);
    let run_with = |bytes: &[u8], needle: &str| {
        let f = dir.path().join("x.npy");
        std::fs::write(&f, bytes).unwrap();
        let o = attnc(&["run", s(&out), "--input", &format!("x={}", s(&f))]);
        assert_clean_failure(&o, needle);
    };
    // f64 instead of f32.
    let mut f64buf = Vec::new();
    {
        let mut w = npyz::WriteOptions::<f64>::new()
            .default_dtype()
            .shape(&[4, 4])
            .writer(&mut f64buf)
            .begin_nd()
            .unwrap();
        w.extend(std::iter::repeat_n(0.5f64, 16)).unwrap();
        w.finish().unwrap();
    }
    run_with(&f64buf, "float32");
    run_with(&npy(&[4, 3], &[0.5; 12]), "shape");
    let (from, to) = (b"'fortran_order': False", b"'fortran_order': True ");
    let at = good.windows(from.len()).position(|w| w == from).unwrap();
    let mut fortran = good.clone();
    fortran[at..at + to.len()].copy_from_slice(to);
    run_with(&fortran, "Fortran");
    run_with(&good[..good.len() - 7], "truncated");
    run_with(b"not an npy file at all", "npy");
}

#[test]
fn input_name_the_layer_does_not_take() {
    let dir = tempfile::tempdir().unwrap();
    let out = compiled(dir.path(), LAYER, "2");
    let f = dir.path().join("x.npy");
    std::fs::write(&f, npy(&[2, 4, 4], &[0.0; 32])).unwrap();
    let o = attnc(&["run", s(&out), "--input", &format!("x={}", s(&f))]);
    assert_clean_failure(&o, "takes no input named `x`");
}

#[test]
fn damaged_manifest() {
    for form in FORMS {
        let dir = tempfile::tempdir().unwrap();
        let out = compiled_with(dir.path(), LAYER, "2", form);
        let path = out.join("manifest.json");
        let good = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, &good[..good.len() / 2]).unwrap();
        assert_clean_failure(&attnc(&["run", s(&out)]), "manifest.json");
        let future = good
            .replace("\"format_version\": 1", "\"format_version\": 4")
            .replace("\"format_version\": 2", "\"format_version\": 4");
        std::fs::write(&path, future).unwrap();
        assert_clean_failure(&attnc(&["run", s(&out)]), "version 4 is not supported");
        std::fs::write(&path, good.replace("\"cycles\": ", "\"cycles\": 1")).unwrap();
        assert_clean_failure(&attnc(&["run", s(&out)]), "cycles");
        std::fs::write(&path, "\u{0}\u{1}garbage").unwrap();
        assert_clean_failure(&attnc(&["run", s(&out)]), "JSON");
    }
}

#[test]
fn damaged_microcode() {
    for form in FORMS {
        damaged_microcode_in(form);
    }
}

fn damaged_microcode_in(form: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let out = compiled_with(dir.path(), LAYER, "2", form);
    let bin = out.join("pe1.bin");
    let good = std::fs::read(&bin).unwrap();
    std::fs::write(&bin, &good[..good.len() - 10]).unwrap();
    assert_clean_failure(&attnc(&["run", s(&out)]), "pe1.bin");
    let mut flipped = good.clone();
    flipped[40] ^= 0x10;
    std::fs::write(&bin, &flipped).unwrap();
    assert_clean_failure(&attnc(&["run", s(&out)]), "pe1.bin");
    let mut version = good.clone();
    version[8] = 9;
    std::fs::write(&bin, &version).unwrap();
    assert_clean_failure(&attnc(&["run", s(&out)]), "version");
    // Text form: from another format version, then truncated mid-line.
    for pe in 0..2 {
        std::fs::remove_file(out.join(format!("pe{pe}.bin"))).unwrap();
    }
    let asm = out.join("pe0.s");
    let good = std::fs::read_to_string(&asm).unwrap();
    // A safe layer's flat programs are format 2, a plain one's format 1; loop programs format 3.
    let other = good
        .replace(".format 1", ".format 7")
        .replace(".format 2", ".format 7")
        .replace(".format 3", ".format 7");
    std::fs::write(&asm, other).unwrap();
    assert_clean_failure(&attnc(&["run", s(&out)]), "pe0.s");
    std::fs::write(&asm, &good[..good.len() / 2]).unwrap();
    assert_clean_failure(&attnc(&["run", s(&out)]), "pe0.s");
}

#[test]
fn refuses_to_overwrite_a_foreign_directory() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("precious");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    let o = attnc(&["examples/encoder.attn", "--pes", "2", "-o", s(&out)]);
    assert_clean_failure(&o, "refusing to overwrite");
    assert_eq!(
        std::fs::read_to_string(out.join("notes.txt")).unwrap(),
        "mine"
    );
}

#[test]
fn forced_schedule_that_does_not_apply() {
    let o = attnc(&[
        "examples/encoder.attn",
        "--pes",
        "2",
        "--schedule",
        "causal",
        "-o",
        "/tmp/never",
    ]);
    assert_clean_failure(&o, "mask = causal");
}

#[test]
fn memory_limit_too_small() {
    let dir = tempfile::tempdir().unwrap();
    let o = attnc(&[
        "examples/encoder.attn",
        "--pes",
        "2",
        "--mem",
        "10",
        "-o",
        s(&dir.path().join("o")),
    ]);
    assert_clean_failure(&o, "no schedule fits in 10 words");
    assert!(!dir.path().join("o").exists());
}

#[test]
fn layer_too_large_to_unroll() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big.attn");
    // Too large to unroll, and 20 causal tokens would make chunks of 1 on 16 PEs: refused on
    // `tokens`, saying both.
    std::fs::write(
        &file,
        "layer odd {\n  tokens = 20;\n  dim = 512;\n  heads = 96;\n  mask = causal;\n}\n",
    )
    .unwrap();
    let o = attnc(&[s(&file), "--pes", "16", "-o", s(&dir.path().join("o"))]);
    assert_clean_failure(&o, "big.attn:2:");
    assert!(text(&o).contains("attnc unrolls"), "{}", text(&o));
    assert!(text(&o).contains("at least 2 tokens"), "{}", text(&o));
    assert!(!dir.path().join("o").exists());
    // Without a mask they deal in blocks of 2, the last 6 PEs owning none: loop programs.
    std::fs::write(
        &file,
        "layer odd {\n  tokens = 20;\n  dim = 512;\n  heads = 96;\n}\n",
    )
    .unwrap();
    let sparse = dir.path().join("sparse");
    let o = attnc(&[s(&file), "--pes", "16", "-o", s(&sparse)]);
    assert!(o.status.success(), "{}", text(&o));
    // 1001 tokens deal to 8 PEs with the last block 7 short: loop programs.
    std::fs::write(
        &file,
        "layer odd {\n  tokens = 1001;\n  dim = 64;\n  heads = 12;\n}\n",
    )
    .unwrap();
    let odd = dir.path().join("odd");
    let o = attnc(&[s(&file), "--pes", "8", "-o", s(&odd)]);
    assert!(o.status.success(), "{}", text(&o));
    // GPT-2 small's size with a dealable token count: loop programs.
    std::fs::write(
        &file,
        "layer gpt2 {\n  tokens = 1024;\n  dim = 64;\n  heads = 12;\n}\n",
    )
    .unwrap();
    let out = dir.path().join("o");
    let o = attnc(&[s(&file), "--pes", "8", "-o", s(&out)]);
    assert!(o.status.success(), "{}", text(&o));
    let m = std::fs::read_to_string(out.join("manifest.json")).unwrap();
    assert!(m.contains("\"programs\": \"loops\""), "{m}");
    // Far more work than `run` takes by default is refused up front, naming the flag.
    let o = attnc(&["run", s(&out), "--max-pe-cycles", "1000000"]);
    assert_clean_failure(&o, "--max-pe-cycles");
}

#[test]
fn verify_proves_emitted_code_and_rejects_a_tampered_program() {
    let dir = tempfile::tempdir().unwrap();
    let out = compiled(
        dir.path(),
        "layer t { tokens = 4; dim = 4; mask = causal; }",
        "2",
    );
    let o = attnc(&["verify", s(&out)]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("proved: for all inputs"), "{}", text(&o));
    // Swap two multiplications' operands for a different column: still runs, wrong result.
    for pe in 0..2 {
        std::fs::remove_file(out.join(format!("pe{pe}.bin"))).unwrap();
    }
    let asm = out.join("pe0.s");
    let good = std::fs::read_to_string(&asm).unwrap();
    let line = good.lines().position(|l| l.starts_with("mul ")).unwrap();
    let mut lines: Vec<String> = good.lines().map(String::from).collect();
    let (first, rest) = lines[line].split_once(',').unwrap();
    let a: &str = first.trim_start_matches("mul ");
    lines[line] = format!(
        "mul {a},{}",
        rest.replacen(rest.split('|').next().unwrap(), &format!(" {a} "), 1)
    );
    std::fs::write(&asm, lines.join("\n") + "\n").unwrap();
    let o = attnc(&["verify", s(&out)]);
    assert_clean_failure(&o, "verification failed");
}

/// Compiles `src` on `pes` PEs into loop programs too large to flatten and runs `verify` on
/// them: it must succeed past the flatten limit. Returns the output directory and what it
/// printed.
fn verified_past_the_flatten_limit(dir: &Path, src: &str, pes: &str) -> (PathBuf, String) {
    let out = compiled(dir, src, pes);
    let o = attnc(&["verify", s(&out)]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("more than the 8000000 the symbolic proof flattens"),
        "{t}"
    );
    (out, t)
}

/// Rewrites `pe{pe}.s` in `out` with `from` replaced by `to` once (it must occur), after
/// removing the binaries so that the text programs are the ones loaded.
fn mutate_asm(out: &Path, pe: u32, from: &str, to: &str) {
    for entry in std::fs::read_dir(out).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "bin") {
            std::fs::remove_file(path).unwrap();
        }
    }
    let asm = out.join(format!("pe{pe}.s"));
    let good = std::fs::read_to_string(&asm).unwrap();
    let bad = good.replacen(from, to, 1);
    assert_ne!(bad, good, "`{from}` not in {}", asm.display());
    std::fs::write(&asm, bad).unwrap();
}

/// Loop programs too large to flatten: `verify` proves a uniform unmasked ring without
/// unrolling; a program moved out of uniformity is not proved, and an address that leaves
/// memory is located.
#[test]
fn verify_proves_loop_programs_too_large_to_flatten_without_unrolling() {
    let dir = tempfile::tempdir().unwrap();
    let (out, t) = verified_past_the_flatten_limit(
        dir.path(),
        "layer mid { tokens = 256; dim = 64; heads = 2; mask = none; }",
        "4",
    );
    assert!(
        t.contains("proved without unrolling: for all inputs"),
        "{t}"
    );
    let o = attnc(&["verify", "--json", s(&out)]);
    let json: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    assert_eq!(json["ok"], true);
    assert_eq!(json["compact"], true);
    assert_eq!(json["coverage"]["manifest"], "full");
    // A base address moved on one PE so that the last key's score lands past the end of
    // memory: the PEs no longer run one program, and the checks locate the address.
    mutate_asm(
        &out,
        3,
        "add 0 -> m[32768 + 1*i2]",
        "add 0 -> m[32968 + 1*i2]",
    );
    let o = attnc(&["verify", s(&out)]);
    assert_clean_failure(&o, "found 1 violation(s)");
    let t = text(&o);
    assert!(t.contains("NOT proved"), "{t}");
    assert!(t.contains("[fault] PE 3"), "{t}");
}

#[test]
fn compile_reports_verification() {
    let dir = tempfile::tempdir().unwrap();
    let o = attnc(&[
        "examples/encoder.attn",
        "--pes",
        "2",
        "-o",
        s(&dir.path().join("o")),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("verified"), "{}", text(&o));
    let o = attnc(&[
        "examples/encoder.attn",
        "--pes",
        "2",
        "--no-verify",
        "-o",
        s(&dir.path().join("o")),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!text(&o).contains("verified"), "{}", text(&o));
}

/// The acceptance runs of `attnc optimal`: causal and shared n = m = 3 proved optimal (both at
/// the lower bound, which the paper's own search does not reach for the causal one), written
/// like `compile` writes, and the programs pass `run` and `verify`.
#[test]
fn optimal_proves_small_layers_and_writes_runnable_verified_programs() {
    for (src, cycles) in [
        (
            "layer c { tokens = 3; dim = 3; scale = 1; mask = causal; softmax = plain; }",
            16,
        ),
        (
            "layer s { tokens = 3; dim = 3; scale = 1; qkv = shared; softmax = plain; }",
            21,
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("layer.attn");
        std::fs::write(&file, src).unwrap();
        let out = dir.path().join("out");
        let o = attnc(&[
            "optimal",
            s(&file),
            "--pes",
            "3",
            "-o",
            s(&out),
            "--sat-only",
            // A bound on work, not seconds, so that a slow machine cannot fail the test; both
            // layers need a few thousand conflicts at most.
            "--conflict-limit",
            "2000000",
            "--json",
        ]);
        assert!(o.status.success(), "{}", text(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["proved_optimal"], true, "{v}");
        assert_eq!(v["cycles"].as_u64(), Some(cycles), "{v}");
        assert!(
            v["attempts"].as_array().is_some_and(|a| !a.is_empty()),
            "{v}"
        );
        let o = attnc(&["run", s(&out), "--json"]);
        assert!(o.status.success(), "{}", text(&o));
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(r["cycles"].as_u64(), Some(cycles));
        assert!(r["max_abs_err"].as_f64().unwrap() <= 1e-4);
        let o = attnc(&["verify", s(&out)]);
        assert!(o.status.success(), "{}", text(&o));
    }
}

/// Where the search finds nothing shorter, `optimal` keeps the heuristic schedule; on a shared
/// layer on a large ring that is the wide dataflow, which recomputes phase-1 products its
/// manifest declares. It is proved as `compile` proves it, not as an exact-model schedule.
#[test]
fn optimal_keeps_a_heuristic_schedule_that_recomputes_products(
) -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("layer.attn");
    std::fs::write(
        &file,
        "layer t { tokens = 4; dim = 4; scale = 0.5; softmax = plain; qkv = shared; }",
    )?;
    let out = dir.path().join("out");
    let o = attnc(&[
        "optimal",
        s(&file),
        "--pes",
        "16",
        "-o",
        s(&out),
        "--no-improve",
        // One conflict per budget: the solver gives up at once and the heuristic stays.
        "--conflict-limit",
        "1",
        "--json",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(v["source"], "heuristic", "{v}");
    let o = attnc(&["verify", s(&out)]);
    assert!(o.status.success(), "{}", text(&o));
    let o = attnc(&["run", s(&out), "--json"]);
    assert!(o.status.success(), "{}", text(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    assert!(r["max_abs_err"].as_f64().is_some_and(|e| e <= 1e-4), "{r}");
    Ok(())
}

#[test]
fn optimal_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("layer.attn");
    std::fs::write(&file, "layer c { tokens = 3; dim = 3; mask = causal; }").unwrap();
    let out = dir.path().join("out");
    let o = attnc(&["optimal", s(&file), "-o", s(&out)]);
    assert_clean_failure(&o, "--pes");
    let o = attnc(&[
        "optimal",
        s(&file),
        "--pes",
        "3",
        "-o",
        s(&out),
        "--search",
        "sideways",
    ]);
    assert_clean_failure(&o, "up, down, bisect");
    let o = attnc(&[
        "optimal",
        s(&file),
        "--pes",
        "3",
        "-o",
        s(&out),
        "--time-limit=-1",
    ]);
    assert_clean_failure(&o, "non-negative");
    assert!(!out.exists());
}

#[test]
fn closed_stdout_is_not_a_panic() {
    // `attnc verify DIR | head -1`: the reader goes away before attnc is done printing.
    let dir = tempfile::tempdir().unwrap();
    let out = compiled(dir.path(), LAYER, "2");
    let mut child = Command::new(env!("CARGO_BIN_EXE_attnc"))
        .args(["verify", s(&out)])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
}

/// A causal layer too large to flatten: its PEs run different programs, and `verify` proves it
/// without unrolling by evaluating every PE in phases; a send moved by one word on one PE (the
/// next PE then reads a word of its block that never arrived) is not proved.
#[test]
fn verify_proves_causal_loop_programs_without_unrolling() {
    let dir = tempfile::tempdir().unwrap();
    let (out, t) = verified_past_the_flatten_limit(
        dir.path(),
        "layer c { tokens = 512; dim = 64; heads = 1; mask = causal; }",
        "4",
    );
    assert!(
        t.contains(
            "proved without unrolling: for all inputs, y = attention(q, k, v, mask = causal"
        ),
        "{t}"
    );
    assert!(t.contains("every PE evaluated"), "{t}");
    mutate_asm(
        &out,
        2,
        "-> m[32768 + 192*i1 + 64*i2] if i2 < 3",
        "-> m[32769 + 192*i1 + 64*i2] if i2 < 3",
    );
    let o = attnc(&["verify", s(&out)]);
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("NOT proved"), "{t}");
    assert!(t.contains("not proved without unrolling"), "{t}");
}

/// A causal layer of a real model's heads and head size (12 heads of 64, 512 tokens, values
/// trailing keys on 8 PEs: 2.1·10^8 bundles) is proved without unrolling, its heads evaluated
/// as one symbolic head. Mutants of one PE are not: a head stride that is right for head 0
/// only (of a query read, and of a lagged send's destination), a key row moved by its base, an
/// inner loop one iteration short.
#[test]
fn verify_proves_a_model_size_causal_layer_and_not_its_mutants() {
    let dir = tempfile::tempdir().unwrap();
    let src = "layer c { tokens = 512; dim = 64; heads = 12; mask = causal; }";
    let (_, t) = verified_past_the_flatten_limit(dir.path(), src, "8");
    assert!(
        t.contains(
            "proved without unrolling: for all inputs, y = attention(q, k, v, mask = causal"
        ),
        "{t}"
    );
    assert!(t.contains("12 head(s) × 512 tokens × dim 64"), "{t}");
    let mutants = [
        ("mul m[0 + 4096*i0 + 64*i1]", "mul m[0 + 2048*i0 + 64*i1]"),
        (
            "-> m[90112 + 8192*i0 + 8192*(i2 % 2) + 64*i4] if i3 < 1",
            "-> m[90112 + 4096*i0 + 8192*(i2 % 2) + 64*i4] if i3 < 1",
        ),
        (
            "m[98304 + 8192*i0 + 64*i2] | add 0",
            "m[98368 + 8192*i0 + 64*i2] | add 0",
        ),
        ("loop 63 {", "loop 62 {"),
    ];
    for (k, (from, to)) in mutants.iter().enumerate() {
        let sub = dir.path().join(format!("m{k}"));
        std::fs::create_dir(&sub).unwrap();
        let bad = compiled(&sub, src, "8");
        mutate_asm(&bad, 2, from, to);
        let o = attnc(&["verify", s(&bad)]);
        let t = text(&o);
        assert!(!o.status.success(), "`{from}` -> `{to}`: {t}");
        assert!(t.contains("NOT proved"), "`{from}` -> `{to}`: {t}");
    }
}

/// A ring far larger than a layer's work compiles (up to 1024 PEs), proved and run against
/// the reference; above 1024 PEs a ring may have one PE per necessary operation at most, and
/// the exact search keeps that rule on any ring.
#[test]
fn rings_larger_than_the_work_compile_up_to_1024_pes() -> Result<(), std::io::Error> {
    let dir = tempfile::tempdir()?;
    // One token, d = 8: 18 necessary operations.
    let file = dir.path().join("one.attn");
    std::fs::write(&file, "layer t { tokens = 1; dim = 8; heads = 1; }")?;
    let out = dir.path().join("out");
    let o = attnc(&[s(&file), "--pes", "256", "-o", s(&out)]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("on 256 PEs"), "{}", text(&o));
    assert!(text(&o).contains("verified"), "{}", text(&o));
    let o = attnc(&["run", s(&out)]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("max_abs_err"), "{}", text(&o));

    let big = dir.path().join("big");
    let o = attnc(&[s(&file), "--pes", "1025", "-o", s(&big)]);
    assert_clean_failure(&o, "at most one PE per necessary operation");
    assert!(!big.exists());
    let o = attnc(&["optimal", s(&file), "--pes", "19", "-o", s(&big)]);
    assert_clean_failure(&o, "at most 18 PEs");
    assert!(!big.exists());
    Ok(())
}
