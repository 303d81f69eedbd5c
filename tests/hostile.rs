//! Hostile input and faults against the `attnc` binary: each case must end in a clean error (or,
//! for correct results, a pass), never a panic, and must leave every file outside the output
//! directory exactly as it was.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn attnc_in(cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attnc"))
        .args(args)
        .current_dir(cwd)
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

fn assert_clean_failure(o: &Output, needle: &str) {
    let t = text(o);
    assert!(!o.status.success(), "expected failure, got success:\n{t}");
    assert!(
        matches!(o.status.code(), Some(1) | Some(2)),
        "exit code {:?}:\n{t}",
        o.status.code()
    );
    assert!(!t.contains("panicked"), "panic:\n{t}");
    assert!(
        t.contains(needle),
        "expected `{needle}` in:\n{}",
        &t[..t.len().min(4000)]
    );
}

fn assert_success(o: &Output) {
    assert!(o.status.success(), "{}", text(o));
}

/// Every file and directory under `root` (symbolic links not followed) with its contents,
/// leaving out `skip` and everything under it.
fn snapshot(root: &Path, skip: Option<&Path>) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            if skip.is_some_and(|s| path.starts_with(s)) {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                out.insert(rel, Some(target.to_string_lossy().as_bytes().to_vec()));
            } else if meta.is_dir() {
                out.insert(rel, None);
                stack.push(path);
            } else {
                out.insert(rel, Some(std::fs::read(&path).unwrap()));
            }
        }
    }
    out
}

/// Runs `args` in `cwd` and checks that nothing under `cwd` outside `out` changed.
fn run_untouched(cwd: &Path, out: Option<&Path>, args: &[&str]) -> Output {
    let skip = out.map(|o| cwd.join(o));
    let before = snapshot(cwd, skip.as_deref());
    let o = attnc_in(cwd, args);
    let after = snapshot(cwd, skip.as_deref());
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>(),
        "entries outside the output directory changed:\n{}",
        text(&o)
    );
    assert!(
        before == after,
        "file contents outside the output directory changed"
    );
    o
}

const SMALL: &str = "layer a { tokens = 4; dim = 4; }\n";

fn setup(src: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.attn"), src).unwrap();
    dir
}

fn staging_entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".attnc-"))
        .collect()
}

// ---- output directories -------------------------------------------------------------------

#[test]
fn foreign_directory_with_a_manifest_is_not_replaced() {
    let dir = setup(SMALL);
    let web = dir.path().join("webext");
    std::fs::create_dir_all(web.join("src")).unwrap();
    std::fs::write(web.join("manifest.json"), r#"{"manifest_version":3}"#).unwrap();
    std::fs::write(web.join("notes.txt"), "precious").unwrap();
    let o = run_untouched(dir.path(), None, &["a.attn", "--pes", "2", "-o", "webext"]);
    assert_clean_failure(&o, "webext exists and is not an attnc output directory");
    assert_clean_failure(&o, "not an attnc manifest");
    assert!(staging_entries(dir.path()).is_empty());
}

#[test]
fn own_output_with_a_foreign_file_is_not_replaced() {
    let dir = setup(SMALL);
    assert_success(&attnc_in(
        dir.path(),
        &["a.attn", "--pes", "2", "-o", "out"],
    ));
    std::fs::write(dir.path().join("out/notes.txt"), "mine").unwrap();
    let o = run_untouched(dir.path(), None, &["a.attn", "--pes", "2", "-o", "out"]);
    assert_clean_failure(&o, "notes.txt`, which attnc did not write");
    // A directory of subdirectories is attnc's only if each one is.
    std::fs::remove_file(dir.path().join("out/notes.txt")).unwrap();
    std::fs::create_dir(dir.path().join("multi")).unwrap();
    std::fs::rename(dir.path().join("out"), dir.path().join("multi/a")).unwrap();
    std::fs::create_dir(dir.path().join("multi/b")).unwrap();
    std::fs::write(dir.path().join("multi/b/pe0.s"), "mine").unwrap();
    let o = run_untouched(dir.path(), None, &["a.attn", "--pes", "2", "-o", "multi"]);
    assert_clean_failure(&o, "has no manifest.json");
}

#[test]
fn own_output_is_replaced() {
    let two = "layer a { tokens = 4; dim = 4; }\nlayer b { tokens = 2; dim = 2; }\n";
    let dir = setup(two);
    for _ in 0..2 {
        let o = run_untouched(
            dir.path(),
            Some(Path::new("out")),
            &["a.attn", "--pes", "2", "-o", "out"],
        );
        assert_success(&o);
    }
    assert!(dir.path().join("out/b/pe1.bin").is_file());
    // A single-layer output may replace the multi-layer one and back again.
    std::fs::write(dir.path().join("one.attn"), SMALL).unwrap();
    assert_success(&attnc_in(
        dir.path(),
        &["one.attn", "--pes", "2", "-o", "out"],
    ));
    assert!(dir.path().join("out/pe1.s").is_file());
    assert_success(&attnc_in(
        dir.path(),
        &["a.attn", "--pes", "2", "-o", "out"],
    ));
    assert!(staging_entries(dir.path()).is_empty());
}

#[test]
fn output_into_the_current_directory_is_refused_cleanly() {
    let dir = setup(SMALL);
    std::fs::write(dir.path().join("manifest.json"), "{}").unwrap();
    for out in [".", "..", "./", "sub/.."] {
        let o = run_untouched(dir.path(), None, &["a.attn", "--pes", "2", "-o", out]);
        assert_clean_failure(&o, "not `.`, `..` or `/`");
        assert!(staging_entries(dir.path()).is_empty());
    }
}

#[test]
fn symlink_and_file_targets_are_refused() {
    let dir = setup(SMALL);
    std::fs::write(dir.path().join("file"), "x").unwrap();
    let o = run_untouched(dir.path(), None, &["a.attn", "--pes", "2", "-o", "file"]);
    assert_clean_failure(&o, "is not a directory");
    #[cfg(unix)]
    {
        std::fs::create_dir(dir.path().join("real")).unwrap();
        std::os::unix::fs::symlink("real", dir.path().join("link")).unwrap();
        let o = run_untouched(dir.path(), None, &["a.attn", "--pes", "2", "-o", "link"]);
        assert_clean_failure(&o, "symbolic link");
    }
}

/// A pid that no longer runs: a child that has exited and been reaped.
fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

#[test]
fn stale_staging_from_a_killed_run_is_removed_and_only_that() {
    let dir = setup(SMALL);
    let p = dir.path();
    let dead = dead_pid();
    let stale = p.join(format!(".attnc-out-{dead}-abc123"));
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(stale.join("pe0.s"), "; attnc ring micro").unwrap();
    let old = p.join(format!(".attnc-old-{dead}-17f"));
    std::fs::create_dir_all(old.join("layer_b")).unwrap();
    std::fs::write(old.join("layer_b/manifest.json"), "{").unwrap();
    // Not attnc's: a foreign file inside, a running process's pid, a name off the pattern.
    let foreign = p.join(format!(".attnc-out-{dead}-def"));
    std::fs::create_dir(&foreign).unwrap();
    std::fs::write(foreign.join("notes.txt"), "mine").unwrap();
    let live = p.join(format!(".attnc-out-{}-x", std::process::id()));
    std::fs::create_dir(&live).unwrap();
    std::fs::write(live.join("pe0.bin"), "partial").unwrap();
    let odd = p.join(".attnc-out-notapid");
    std::fs::create_dir(&odd).unwrap();

    assert_success(&attnc_in(p, &["a.attn", "--pes", "2", "-o", "out"]));
    let mut left = staging_entries(p);
    left.sort();
    let mut want = vec![
        foreign.file_name().unwrap().to_string_lossy().into_owned(),
        live.file_name().unwrap().to_string_lossy().into_owned(),
        ".attnc-out-notapid".to_string(),
    ];
    want.sort();
    assert_eq!(left, want);
    assert_eq!(std::fs::read(foreign.join("notes.txt")).unwrap(), b"mine");
}

#[cfg(unix)]
#[test]
fn killed_compile_leaves_nothing_after_the_next_compile() {
    // A layer that takes a moment to compile, so the kill lands somewhere inside the run.
    let dir = setup("layer a { tokens = 48; dim = 48; heads = 2; }\n");
    let p = dir.path();
    for delay_ms in [5u64, 60, 200] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_attnc"))
            .args(["a.attn", "--pes", "4", "-o", "out"])
            .current_dir(p)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_success(&attnc_in(p, &["a.attn", "--pes", "4", "-o", "out"]));
        assert!(staging_entries(p).is_empty(), "{:?}", staging_entries(p));
    }
}

// ---- panics and overflow ------------------------------------------------------------------

#[test]
fn optimal_time_limits_out_of_range() {
    let dir = setup("layer a { tokens = 2; dim = 2; }\n");
    for t in ["1e19", "nan", "-1", "inf"] {
        let flag = format!("--time-limit={t}");
        let args = ["optimal", "a.attn", "--pes", "2", "-o", "o", &flag];
        let o = run_untouched(dir.path(), None, &args);
        assert_clean_failure(&o, "--time-limit");
        assert_clean_failure(
            &o,
            "expected a non-negative number of seconds, at most 1000000",
        );
    }
}

fn compiled_dir(src: &str, pes: &str) -> tempfile::TempDir {
    let dir = setup(src);
    assert_success(&attnc_in(
        dir.path(),
        &["a.attn", "--pes", pes, "-o", "out"],
    ));
    dir
}

fn edit_manifest(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("out/manifest.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
}

#[test]
fn manifest_sizes_that_overflow_are_refused() {
    let dir = compiled_dir(SMALL, "2");
    edit_manifest(dir.path(), |v| {
        v["layer"]["heads"] = 4294967295u32.into();
        v["layer"]["tokens"] = 4294967295u32.into();
        v["layer"]["dim"] = 4294967295u32.into();
        for t in ["inputs", "outputs"] {
            for (_, p) in v[t].as_object_mut().unwrap() {
                p["shape"] = serde_json::json!([4294967295u32, 4294967295u32, 4294967295u32]);
                p["pe"] = serde_json::json!([]);
                p["addr"] = serde_json::json!([]);
            }
        }
    });
    let o = run_untouched(dir.path(), None, &["run", "out"]);
    assert_clean_failure(&o, "too large to count");
}

#[test]
fn manifest_placement_that_disagrees_with_the_layer_is_refused() {
    let dir = compiled_dir(SMALL, "2");
    edit_manifest(dir.path(), |v| {
        v["layer"]["heads"] = 2.into();
    });
    assert_clean_failure(
        &run_untouched(dir.path(), None, &["run", "out"]),
        "does not match the layer",
    );
}

// ---- resource limits ----------------------------------------------------------------------

#[test]
fn diagnostics_are_capped_and_long_lines_cut() {
    // 100 KB of stray characters on one line, then the same spread over many lines.
    let one_line = "@ ".repeat(50_000);
    let many_lines = "@ @ @ @\n".repeat(12_500);
    for src in [one_line, many_lines] {
        let dir = setup(&src);
        let o = run_untouched(dir.path(), None, &["a.attn", "--pes", "2", "-o", "out"]);
        assert_clean_failure(
            &o,
            "more diagnostics not shown (only the first 50 are rendered)",
        );
        // 50 diagnostics of a few lines each, every line cut to a few hundred bytes.
        assert!(
            o.stderr.len() < 100_000,
            "{} bytes of diagnostics",
            o.stderr.len()
        );
    }
}

#[test]
fn long_line_diagnostic_points_at_the_real_column() {
    let src = format!(
        "layer a {{ tokens = 4; dim = 4; {} mask = maybe; }}\n",
        " ".repeat(5000)
    );
    let dir = setup(&src);
    let o = attnc_in(dir.path(), &["a.attn", "--pes", "2", "-o", "out"]);
    let col = src.find("maybe").unwrap() + 1;
    assert_clean_failure(&o, &format!("a.attn:1:{col}"));
    assert_clean_failure(&o, "…");
    assert!(o.stderr.len() < 4000, "{}", text(&o));
}

#[test]
fn ring_size_above_the_maximum_is_refused() {
    let dir = setup(SMALL);
    let o = run_untouched(
        dir.path(),
        None,
        &["a.attn", "--pes", "4294967295", "-o", "out"],
    );
    assert_clean_failure(&o, "--pes 4294967295 exceeds the maximum ring size, 65536");
    let o = run_untouched(
        dir.path(),
        None,
        &["optimal", "a.attn", "--pes", "65537", "-o", "out"],
    );
    assert_clean_failure(&o, "exceeds the maximum ring size");
}

/// Gives the compiled one-head layer in `out` a consistent manifest for `tokens` tokens of
/// dimension 1, every element placed at word 0 of PE 0.
fn claim_tokens(dir: &Path, tokens: usize) {
    edit_manifest(dir, |v| {
        v["layer"]["tokens"] = tokens.into();
        v["layer"]["dim"] = 1.into();
        for t in ["inputs", "outputs"] {
            for (_, p) in v[t].as_object_mut().unwrap() {
                p["shape"] = serde_json::json!([1, tokens, 1]);
                p["pe"] = serde_json::json!(vec![0; tokens]);
                p["addr"] = serde_json::json!(vec![0; tokens]);
            }
        }
    });
}

#[test]
fn manifest_claiming_a_huge_layer_is_refused_before_the_reference() {
    let dir = compiled_dir(SMALL, "2");
    claim_tokens(dir.path(), 100_000);
    let o = run_untouched(dir.path(), None, &["run", "out"]);
    assert_clean_failure(&o, "tokens = 100000 is outside 1..=65536");
    // Within the language's limits, but far more work than the programs can hold.
    claim_tokens(dir.path(), 60_000);
    let o = run_untouched(dir.path(), None, &["run", "out"]);
    assert_clean_failure(&o, "the manifest does not describe these programs");
}

fn npy_bytes(shape: &[u64], data: &[f32]) -> Vec<u8> {
    attnc::npy::write_f32(shape, data).expect("a test tensor encodes")
}

#[test]
fn npy_header_length_is_checked_before_allocating() {
    let dir = compiled_dir(SMALL, "2");
    let mut b = b"\x93NUMPY\x02\x00".to_vec();
    b.extend_from_slice(&u32::MAX.to_le_bytes());
    b.extend_from_slice(b"{'descr': '<f4', 'fortran_order': False, 'shape': (4, 4), }");
    for t in ["q", "k", "v"] {
        let data: Vec<f32> = (0..16).map(|i| i as f32 / 16.0).collect();
        std::fs::write(
            dir.path().join(format!("{t}.npy")),
            npy_bytes(&[4, 4], &data),
        )
        .unwrap();
    }
    std::fs::write(dir.path().join("q.npy"), &b).unwrap();
    let o = run_untouched(
        dir.path(),
        None,
        &[
            "run", "out", "--input", "q=q.npy", "--input", "k=k.npy", "--input", "v=v.npy",
        ],
    );
    assert_clean_failure(&o, "q.npy: the .npy header claims 4294967295 bytes");
}

// ---- refused where first nameable ---------------------------------------------------------

#[test]
fn scale_that_is_not_a_finite_f32_is_a_diagnostic() {
    for (scale, msg) in [
        ("1e39", "`scale` is not a finite 32-bit float, found `1e39`"),
        ("1e-50", "`scale` rounds to zero as a 32-bit float"),
        ("100", "`scale` 100 makes exp overflow for typical scores"),
    ] {
        let dir = setup(&format!(
            "layer a {{ tokens = 4; dim = 4; scale = {scale}; }}\n"
        ));
        let o = run_untouched(dir.path(), None, &["a.attn", "--pes", "2", "-o", "out"]);
        assert_clean_failure(&o, msg);
        assert_clean_failure(&o, "E0012");
        assert!(!dir.path().join("out").exists());
    }
    // The largest scale allowed compiles.
    let dir = setup("layer a { tokens = 4; dim = 4; scale = 44; }\n");
    assert_success(&attnc_in(
        dir.path(),
        &["a.attn", "--pes", "2", "-o", "out"],
    ));
}

#[test]
fn tolerances_must_be_finite_and_non_negative() {
    let dir = compiled_dir(SMALL, "2");
    for t in ["nan", "inf", "-1e-4", "-inf"] {
        for flag in ["--tolerance", "--rtol"] {
            let arg = format!("{flag}={t}");
            let o = run_untouched(dir.path(), None, &["run", "out", &arg]);
            assert_clean_failure(&o, "expected a finite, non-negative number");
        }
    }
}

#[test]
fn manifest_mask_and_qkv_strings_are_validated() {
    let dir = compiled_dir(SMALL, "2");
    edit_manifest(dir.path(), |v| v["layer"]["mask"] = "bogus".into());
    let o = run_untouched(dir.path(), None, &["run", "out"]);
    assert_clean_failure(&o, r#"layer mask is "bogus", expected "causal" or "none""#);
    edit_manifest(dir.path(), |v| {
        v["layer"]["mask"] = "none".into();
        v["layer"]["qkv"] = "bogus".into();
    });
    let o = run_untouched(dir.path(), None, &["run", "out"]);
    assert_clean_failure(&o, r#"layer qkv is "bogus""#);
    edit_manifest(dir.path(), |v| {
        v["layer"]["qkv"] = "shared".into();
    });
    let o = run_untouched(dir.path(), None, &["run", "out"]);
    assert_clean_failure(&o, "a layer with qkv = shared takes inputs [\"x\"]");
}

#[test]
fn non_finite_inputs_are_named() {
    let dir = compiled_dir(SMALL, "2");
    let mut data: Vec<f32> = (0..16).map(|i| i as f32 / 16.0).collect();
    for t in ["q", "k"] {
        std::fs::write(
            dir.path().join(format!("{t}.npy")),
            npy_bytes(&[4, 4], &data),
        )
        .unwrap();
    }
    data[6] = f32::INFINITY;
    std::fs::write(dir.path().join("v.npy"), npy_bytes(&[1, 4, 4], &data)).unwrap();
    let args = [
        "run", "out", "--input", "q=q.npy", "--input", "k=k.npy", "--input", "v=v.npy",
    ];
    let o = run_untouched(dir.path(), None, &args);
    assert_clean_failure(&o, "v.npy: input `v` element [0, 1, 2] is inf");
    data[6] = f32::NAN;
    std::fs::write(dir.path().join("v.npy"), npy_bytes(&[1, 4, 4], &data)).unwrap();
    let o = run_untouched(dir.path(), None, &args);
    assert_clean_failure(&o, "input `v` element [0, 1, 2] is NaN");
}

#[test]
fn json_tells_an_infinite_error_apart_from_a_number() {
    // Finite but huge inputs: the schedule's exp without max subtraction overflows, the
    // max-subtracted reference does not, so the error is infinite (NaN outputs).
    let dir = compiled_dir(
        "layer a { tokens = 4; dim = 4; qkv = shared; softmax = plain; }\n",
        "2",
    );
    let data: Vec<f32> = (0..16).map(|i| 1000.0 + i as f32).collect();
    std::fs::write(dir.path().join("x.npy"), npy_bytes(&[4, 4], &data)).unwrap();
    let o = run_untouched(
        dir.path(),
        None,
        &["run", "out", "--input", "x=x.npy", "--json"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["max_abs_err"], "inf");
    assert_eq!(v["pass"], false);
    assert_eq!(v["non_finite"], 16);
    // Named as an overflow, not as a mere mismatch.
    assert_clean_failure(&o, "OVERFLOW: 16 of 16 outputs are NaN or infinite");
    // A normal run gives a number.
    let o = attnc_in(dir.path(), &["run", "out", "--json"]);
    assert_success(&o);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["max_abs_err"].as_f64().unwrap() < 1e-4);
    assert_eq!(v["pass"], true);
}

// ---- tolerance ----------------------------------------------------------------------------

/// Deterministic values in [-2, 2) without a random number crate.
fn values(seed: u32, len: usize, scale: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2654435761).wrapping_add(12345);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x as f32 / u32::MAX as f32 * 4.0 - 2.0) * scale
        })
        .collect()
}

#[test]
fn large_values_pass_under_the_relative_tolerance() {
    let src = "layer a { tokens = 16; dim = 16; heads = 2; }\n";
    let dir = compiled_dir(src, "4");
    let len = 2 * 16 * 16;
    for (t, scale) in [("q", 1.0), ("k", 1.0), ("v", 1000.0)] {
        std::fs::write(
            dir.path().join(format!("{t}.npy")),
            npy_bytes(&[2, 16, 16], &values(t.as_bytes()[0].into(), len, scale)),
        )
        .unwrap();
    }
    let args = [
        "run", "out", "--input", "q=q.npy", "--input", "k=k.npy", "--input", "v=v.npy",
    ];
    let o = run_untouched(dir.path(), None, &args);
    assert_success(&o);
    // The absolute error alone exceeds the default 1e-4 here: without the relative part the
    // same run is a mismatch.
    let mut strict = args.to_vec();
    strict.extend(["--rtol", "0"]);
    let o = attnc_in(dir.path(), &strict);
    assert_clean_failure(&o, "MISMATCH");
}

#[test]
fn run_output_never_overwrites_an_existing_file() {
    let dir = compiled_dir(SMALL, "2");
    std::fs::write(dir.path().join("y.npy"), "precious").unwrap();
    let o = run_untouched(dir.path(), None, &["run", "out", "--output", "y.npy"]);
    assert_clean_failure(
        &o,
        "--output y.npy already exists; refusing to overwrite it",
    );
    let o = attnc_in(dir.path(), &["run", "out", "--output", "fresh.npy"]);
    assert_success(&o);
    let (shape, _) =
        attnc::npy::read_f32(&std::fs::read(dir.path().join("fresh.npy")).unwrap(), 16).unwrap();
    assert_eq!(shape, [1, 4, 4]);
}

#[test]
fn layer_near_the_old_operation_limit_is_not_unrolled() {
    // 14 heads of 128 tokens, dim 64, the plain softmax of the original report: 29.8M operations,
    // which used to take 5 GB and minutes. Now it is never unrolled: its tokens deal evenly to
    // 8 PEs, so `auto` writes the stream schedule's loop programs (the test's whole run is
    // seconds in a debug build); forced onto an unrolled schedule it is refused before
    // scheduling, naming the memory unrolling would take and the way out.
    let dir = setup("layer big { tokens = 128; dim = 64; heads = 14; softmax = plain; }\n");
    let o = run_untouched(
        dir.path(),
        Some(Path::new("out")),
        &["a.attn", "--pes", "8", "-o", "out"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let m = std::fs::read_to_string(dir.path().join("out/manifest.json")).unwrap();
    assert!(m.contains("\"programs\": \"loops\""), "{m}");
    let o = run_untouched(
        dir.path(),
        None,
        &["a.attn", "--pes", "8", "--schedule", "rows", "-o", "out2"],
    );
    assert_clean_failure(
        &o,
        "this layer needs 29818880 operations; compiling it would take about 9.5 GB of memory",
    );
    assert_clean_failure(&o, "attnc unrolls layers of up to 6000000 operations");
    // 127 tokens deal to 8 PEs with the last block one short: loop programs too.
    let dir = setup("layer big { tokens = 127; dim = 64; heads = 14; softmax = plain; }\n");
    let o = run_untouched(
        dir.path(),
        Some(Path::new("out")),
        &["a.attn", "--pes", "8", "-o", "out"],
    );
    assert!(o.status.success(), "{}", text(&o));
    // 24 causal tokens on 16 PEs would be chunks of 1: refused at once.
    let dir = setup(
        "layer big { tokens = 24; dim = 512; heads = 64; softmax = plain; mask = causal; }\n",
    );
    let o = run_untouched(dir.path(), None, &["a.attn", "--pes", "16", "-o", "out"]);
    assert_clean_failure(&o, "more than the 6000000 attnc unrolls");
    assert_clean_failure(&o, "chunks of at least 2 tokens");
}
