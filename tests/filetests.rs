//! File-driven tests of the `attnc` binary, in the manner of cranelift's filetests: every
//! `tests/filetests/NAME.attn` starts with `//` directives saying how to compile it and what to
//! print, and `tests/filetests/NAME.expect` beside it holds exactly what the binary printed.
//! `UPDATE_EXPECT=1 cargo test --test suite filetests::` rewrites the `.expect` files after a deliberate
//! change (review the diff before committing it). The directive format is in `docs/testing.md`.
//!
//! The binary, not the library, is driven so that these tests pin what a user sees and survive
//! any reshuffling of the crates behind it.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

const EMIT_KINDS: [&str; 5] = ["ir", "facts", "schedule", "asm", "manifest"];

/// One `attnc compile` invocation's printing flag: `--emit KIND` or `--dump-after PASS`.
#[derive(Clone, Debug)]
enum Print {
    Emit(String),
    DumpAfter(String),
}

/// A test file's header.
#[derive(Debug, Default)]
struct Directives {
    pes: Option<String>,
    schedule: Option<String>,
    layer: Option<String>,
    mem: Option<String>,
    prints: Vec<Print>,
    expect_error: bool,
}

fn directives(src: &str) -> Result<Directives, String> {
    let mut d = Directives::default();
    // The header is the leading run of `//` lines; directives elsewhere would be easy to miss.
    for (i, line) in src.lines().enumerate() {
        let Some(comment) = line.trim_start().strip_prefix("//") else {
            break;
        };
        let Some((key, value)) = comment.split_once(':') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        let values = || value.split(',').map(|v| v.trim().to_string());
        let once = |slot: &mut Option<String>| {
            if slot.replace(value.to_string()).is_some() {
                Err(format!("line {}: `{key}` given twice", i + 1))
            } else {
                Ok(())
            }
        };
        match key {
            "pes" => once(&mut d.pes)?,
            "schedule" => once(&mut d.schedule)?,
            "layer" => once(&mut d.layer)?,
            "mem" => once(&mut d.mem)?,
            "emit" => d.prints.extend(values().map(Print::Emit)),
            "dump-after" => d.prints.extend(values().map(Print::DumpAfter)),
            "expect" => match value {
                "error" => d.expect_error = true,
                other => return Err(format!("line {}: unknown expectation `{other}`", i + 1)),
            },
            // A header comment that happens to contain a colon.
            k if k.contains(' ') => {}
            other => return Err(format!("line {}: unknown directive `{other}`", i + 1)),
        }
    }
    if d.pes.is_none() {
        return Err("no `// pes: N` directive".into());
    }
    if d.prints.is_empty() {
        return Err("no `// emit:` or `// dump-after:` directive".into());
    }
    Ok(d)
}

fn attnc(dir: &Path, args: &[String]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_attnc"))
        .current_dir(dir)
        .args(args)
        .output()
        .expect("attnc runs")
}

/// Runs every invocation a file asks for and renders what happened, as the `.expect` file
/// should hold it. `Err` is a broken test file or an unexpected exit status.
fn actual(dir: &Path, file: &str, d: &Directives) -> Result<String, String> {
    let mut out = String::new();
    for print in &d.prints {
        let mut args: Vec<String> = vec!["compile".into(), file.into()];
        for (flag, value) in [
            ("--pes", &d.pes),
            ("--schedule", &d.schedule),
            ("--layer", &d.layer),
            ("--mem", &d.mem),
        ] {
            if let Some(v) = value {
                args.extend([flag.to_string(), v.clone()]);
            }
        }
        match print {
            Print::Emit(k) => args.extend(["--emit".into(), k.clone()]),
            Print::DumpAfter(p) => args.extend(["--dump-after".into(), p.clone()]),
        }
        let o = attnc(dir, &args);
        let stdout = String::from_utf8_lossy(&o.stdout);
        let stderr = String::from_utf8_lossy(&o.stderr);
        if stderr.contains("panicked") {
            return Err(format!("attnc {} panicked:\n{stderr}", args.join(" ")));
        }
        let code = o.status.code();
        match (d.expect_error, code) {
            (false, Some(0)) | (true, Some(1)) => {}
            _ => {
                return Err(format!(
                    "attnc {} exited with {code:?}, expected {}\n--- stdout\n{stdout}--- stderr\n{stderr}",
                    args.join(" "),
                    if d.expect_error { "1 (// expect: error)" } else { "0" }
                ))
            }
        }
        let _ = writeln!(out, "==> attnc {}", args.join(" "));
        out.push_str(&stdout);
        if !stderr.is_empty() {
            let _ = writeln!(out, "--- stderr");
            out.push_str(&stderr);
        }
    }
    Ok(out)
}

/// A line diff of `want` against `got` (`-` only in the expectation, `+` only in the output),
/// with two lines of context around each change.
fn diff(want: &str, got: &str) -> String {
    let a: Vec<&str> = want.lines().collect();
    let b: Vec<&str> = got.lines().collect();
    // Longest common subsequence by dynamic programming; expectation files are small.
    let mut lcs = vec![vec![0u32; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    let mut ops: Vec<(char, usize, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', i + 1, a[i]));
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            ops.push(('-', i + 1, a[i]));
            i += 1;
        } else {
            ops.push(('+', j + 1, b[j]));
            j += 1;
        }
    }
    let near_change = |k: usize| {
        ops[k.saturating_sub(2)..(k + 3).min(ops.len())]
            .iter()
            .any(|o| o.0 != ' ')
    };
    let mut s = String::new();
    let mut skipped = false;
    for (k, &(tag, line, text)) in ops.iter().enumerate() {
        if near_change(k) {
            if skipped {
                s.push_str("    ...\n");
                skipped = false;
            }
            let _ = writeln!(s, "  {tag}{line:5} | {text}");
        } else {
            skipped = true;
        }
    }
    if want.ends_with('\n') != got.ends_with('\n') {
        s.push_str("  (the files differ in the final newline)\n");
    }
    s
}

/// Every pass name `attnc passes` lists, plus the `schedule` alias for the chosen one.
fn pass_names(dir: &Path) -> BTreeSet<String> {
    let o = attnc(dir, &["passes".to_string()]);
    assert!(o.status.success(), "attnc passes failed");
    let mut names: BTreeSet<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect();
    names.insert("schedule".into());
    names
}

#[test]
fn filetests() {
    let update = std::env::var_os("UPDATE_EXPECT").is_some_and(|v| v == "1");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/filetests");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/filetests exists")
        .map(|e| e.expect("directory entry").path())
        .collect();
    files.sort();

    let mut failures = String::new();
    let mut dumped: BTreeSet<String> = BTreeSet::new();
    let mut emitted: BTreeSet<String> = BTreeSet::new();
    let mut errors = 0;
    let mut ran = 0;
    for path in &files {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if path.extension().is_some_and(|e| e == "expect") {
            if !path.with_extension("attn").is_file() {
                let _ = writeln!(failures, "{name}: no .attn file beside it");
            }
            continue;
        }
        if path.extension().is_none_or(|e| e != "attn") {
            let _ = writeln!(failures, "{name}: neither .attn nor .expect");
            continue;
        }
        ran += 1;
        let src = std::fs::read_to_string(path).expect("readable test file");
        let d = match directives(&src) {
            Ok(d) => d,
            Err(e) => {
                let _ = writeln!(failures, "{name}: {e}");
                continue;
            }
        };
        for p in &d.prints {
            match p {
                Print::Emit(k) => emitted.insert(k.clone()),
                Print::DumpAfter(p) => dumped.insert(p.clone()),
            };
        }
        errors += usize::from(d.expect_error);
        let got = match actual(&dir, &name, &d) {
            Ok(g) => g,
            Err(e) => {
                let _ = writeln!(failures, "{name}: {e}");
                continue;
            }
        };
        let expect_path = path.with_extension("expect");
        let want = std::fs::read_to_string(&expect_path).ok();
        if want.as_deref() == Some(got.as_str()) {
            continue;
        }
        if update {
            std::fs::write(&expect_path, &got).expect("write the expectation");
            eprintln!("updated {}", expect_path.display());
            continue;
        }
        let expect_name = expect_path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy();
        match want {
            None => {
                let _ = writeln!(
                    failures,
                    "{name}: no {expect_name} (run with UPDATE_EXPECT=1 to create it)"
                );
            }
            Some(want) => {
                let _ = writeln!(
                    failures,
                    "{name}: output differs from {expect_name} (- expected, + actual):\n{}",
                    diff(&want, &got)
                );
            }
        }
    }

    // Coverage: a pass or an --emit kind nobody pins would silently escape these tests.
    for pass in pass_names(&dir) {
        if !dumped.contains(&pass) {
            let _ = writeln!(failures, "no file has `// dump-after: {pass}`");
        }
    }
    for kind in EMIT_KINDS {
        if !emitted.contains(kind) {
            let _ = writeln!(failures, "no file has `// emit: {kind}`");
        }
    }
    if errors == 0 {
        let _ = writeln!(failures, "no file has `// expect: error`");
    }
    assert!(ran > 0, "no .attn files in {}", dir.display());
    assert!(
        failures.is_empty(),
        "{} in {}:\n{failures}",
        if update {
            "filetests that could not be updated"
        } else {
            "failing filetests (UPDATE_EXPECT=1 rewrites .expect files after a deliberate change)"
        },
        dir.display()
    );
}
