//! File-driven tests of the ISA: every `.s` file under `tests/faults/` is a ring of one or more
//! programs in text assembly plus `;` annotations that say what must happen when it is
//! assembled, encoded, loaded and run. The format is described in `docs/testing.md`; in short:
//!
//! ```text
//! ; preload: PE mADDR=VALUE ...   words put into PE's memory before cycle 0
//! ; bytes: EDIT                   edit the (single) program's binary encoding, then decode it
//! ; check: PE mADDR=VALUE         a word after the run (or at the start of the faulting cycle)
//! ; ---                           ends one PE's program and starts the next
//! ; OUTCOME: TEXT                 exactly one, OUTCOME one of: expect, fault, parse-error,
//!                                 decode-error, load-error
//! ```
//!
//! The outcome line is compared exactly with what happened; `UPDATE_EXPECT=1 cargo test`
//! rewrites it in place instead. `check:` lines are hand-written and never rewritten.
//!
//! Besides each file's own outcome, the run as a whole must cover every [`FaultKind`],
//! [`DecodeError`] and [`LoadError`] variant: the exhaustive matches below stop compiling when a
//! variant is added, and the coverage check then fails until a file produces it.

use isa::{DecodeError, F32Domain, FaultKind, LoadError, Machine, NoObserver, Program};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::common;
use common::crc32_bitwise;

/// The outcome keys, in the order a program meets them.
const OUTCOMES: [&str; 5] = [
    "parse-error",
    "decode-error",
    "load-error",
    "fault",
    "expect",
];

/// File name prefix → the outcome such a file must end in.
const PREFIXES: [(&str, &str); 5] = [
    ("parse_", "parse-error"),
    ("decode_", "decode-error"),
    ("load_", "load-error"),
    ("fault_", "fault"),
    ("ok_", "expect"),
];

fn fault_name(k: &FaultKind) -> &'static str {
    match k {
        FaultKind::ReadUninitialized { .. } => "read-uninitialized",
        FaultKind::AddrOutOfRange { .. } => "addr-out-of-range",
        FaultKind::WriteConflict { .. } => "write-conflict",
        FaultKind::AccWithoutOp => "acc-without-op",
        FaultKind::SendAccWithoutAcc => "send-acc-without-acc",
    }
}
const FAULT_NAMES: [&str; 5] = [
    "read-uninitialized",
    "addr-out-of-range",
    "write-conflict",
    "acc-without-op",
    "send-acc-without-acc",
];

fn decode_name(e: &DecodeError) -> &'static str {
    match e {
        DecodeError::BadMagic => "bad-magic",
        DecodeError::UnsupportedVersion(_) => "unsupported-version",
        DecodeError::Truncated => "truncated",
        DecodeError::ChecksumMismatch => "checksum-mismatch",
        DecodeError::TrailingBytes => "trailing-bytes",
        DecodeError::InvalidHeader { .. } => "invalid-header",
        DecodeError::InvalidBundle { .. } => "invalid-bundle",
    }
}
const DECODE_NAMES: [&str; 7] = [
    "bad-magic",
    "unsupported-version",
    "truncated",
    "checksum-mismatch",
    "trailing-bytes",
    "invalid-header",
    "invalid-bundle",
];

fn load_name(e: &LoadError) -> &'static str {
    match e {
        LoadError::NoPrograms => "no-programs",
        LoadError::PesMismatch { .. } => "pes-mismatch",
        LoadError::PeOutOfRange { .. } => "pe-out-of-range",
        LoadError::DuplicatePe { .. } => "duplicate-pe",
        LoadError::MissingPe { .. } => "missing-pe",
        LoadError::MemoryTooLarge { .. } => "memory-too-large",
        LoadError::NoSuchPe { .. } => "no-such-pe",
        LoadError::AddrOutOfRange { .. } => "addr-out-of-range",
        LoadError::AlreadyStarted => "already-started",
    }
}
/// Load errors a file can produce. Left out: `memory-too-large` (whether a huge allocation fails
/// depends on the host's memory and overcommit policy, so no file can pin it) and
/// `already-started` (preloading once cycles have run is an API misuse the file format has no
/// way to express; `isa/tests/machine.rs` covers it).
const LOAD_NAMES: [&str; 7] = [
    "no-programs",
    "pes-mismatch",
    "pe-out-of-range",
    "duplicate-pe",
    "missing-pe",
    "no-such-pe",
    "addr-out-of-range",
];

/// One test file, read.
struct Case {
    path: PathBuf,
    text: String,
    /// Line index and text of the outcome annotation, if there is one.
    outcome: Option<(usize, String)>,
    preloads: Vec<(u32, u32, f32)>,
    bytes: Vec<String>,
    checks: Vec<(u32, u32, f32)>,
    /// Each program's source with every other program's lines blanked, so that parse errors
    /// carry the line numbers of the file.
    programs: Vec<String>,
}

fn word(spec: &str, what: &str) -> Result<(u32, f32), String> {
    let (addr, value) = spec
        .split_once('=')
        .ok_or_else(|| format!("{what}: expected mADDR=VALUE, got `{spec}`"))?;
    let addr = addr
        .trim()
        .strip_prefix('m')
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| format!("{what}: bad address in `{spec}`"))?;
    let value = value
        .trim()
        .parse()
        .map_err(|_| format!("{what}: bad value in `{spec}`"))?;
    Ok((addr, value))
}

/// `PE mA=V mB=W ...` as `(pe, addr, value)` triples.
fn words(rest: &str, what: &str) -> Result<Vec<(u32, u32, f32)>, String> {
    let mut it = rest.split_whitespace();
    let pe: u32 = it
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| format!("{what}: expected a PE number first, got `{rest}`"))?;
    it.map(|w| word(w, what).map(|(a, v)| (pe, a, v))).collect()
}

fn read_case(path: &Path) -> Result<Case, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let lines: Vec<&str> = text.lines().collect();
    let mut case = Case {
        path: path.to_path_buf(),
        text: text.clone(),
        outcome: None,
        preloads: Vec::new(),
        bytes: Vec::new(),
        checks: Vec::new(),
        programs: Vec::new(),
    };
    let mut starts = vec![0];
    for (i, line) in lines.iter().enumerate() {
        let Some(comment) = line.trim_start().strip_prefix(';') else {
            continue;
        };
        let comment = comment.trim();
        if comment == "---" {
            starts.push(i + 1);
            continue;
        }
        let Some((key, rest)) = comment.split_once(':') else {
            continue;
        };
        let rest = rest.trim();
        match key {
            "preload" => case.preloads.extend(words(rest, "preload")?),
            "check" => case.checks.extend(words(rest, "check")?),
            "bytes" => case.bytes.push(rest.to_string()),
            k if OUTCOMES.contains(&k) => {
                if case.outcome.is_some() {
                    return Err(format!("line {}: a second outcome annotation", i + 1));
                }
                case.outcome = Some((i, format!("{k}: {rest}")));
            }
            _ => {}
        }
    }
    starts.push(lines.len());
    for w in starts.windows(2) {
        let (from, to) = (w[0], w[1]);
        let has_code = lines[from..to].iter().any(|l| {
            let t = l.trim();
            !t.is_empty() && !t.starts_with(';')
        });
        if !has_code {
            continue;
        }
        let src: String = lines
            .iter()
            .enumerate()
            .map(|(i, l)| if (from..to).contains(&i) { *l } else { "" })
            .fold(String::new(), |mut s, l| {
                s.push_str(l);
                s.push('\n');
                s
            });
        case.programs.push(src);
    }
    Ok(case)
}

/// Applies one `bytes:` edit to an encoded program.
fn edit(bytes: &mut Vec<u8>, spec: &str) -> Result<(), String> {
    let parts: Vec<&str> = spec.split_whitespace().collect();
    let num = |s: &str| -> Result<usize, String> {
        let v = match s.strip_prefix("0x") {
            Some(h) => usize::from_str_radix(h, 16),
            None => s.parse(),
        };
        v.map_err(|_| format!("bytes: bad number `{s}` in `{spec}`"))
    };
    let at = |i: usize, len: usize| -> Result<usize, String> {
        if i < len {
            Ok(i)
        } else {
            Err(format!("bytes: offset {i} beyond {len} bytes in `{spec}`"))
        }
    };
    match parts.as_slice() {
        ["set", off, val] => {
            let i = at(num(off)?, bytes.len())?;
            bytes[i] = num(val)? as u8;
        }
        ["xor", off, val] => {
            let i = at(num(off)?, bytes.len())?;
            bytes[i] ^= num(val)? as u8;
        }
        ["drop", n] => {
            let n = num(n)?.min(bytes.len());
            bytes.truncate(bytes.len() - n);
        }
        ["keep", n] => bytes.truncate(num(n)?),
        ["append", rest @ ..] => {
            for b in rest {
                bytes.push(num(b)? as u8);
            }
        }
        // Recomputes the trailing checksum, so that an edit reaches the checks behind it.
        ["crc"] => {
            let body = bytes.len().saturating_sub(isa::binary::CHECKSUM_BYTES);
            let crc = crc32_bitwise(&bytes[..body]);
            bytes.truncate(body);
            bytes.extend_from_slice(&crc.to_le_bytes());
        }
        _ => return Err(format!("bytes: unknown edit `{spec}`")),
    }
    Ok(())
}

/// What happened to a case: its outcome line (without the `; `), and the variant it produced.
struct Happened {
    line: String,
    /// `(family, name)`, e.g. `("fault", "write-conflict")`.
    kind: Option<(&'static str, &'static str)>,
    /// Hand-written `check:` lines that did not hold.
    failed_checks: Vec<String>,
}

fn run_case(case: &Case) -> Result<Happened, String> {
    let mut programs: Vec<Program> = Vec::new();
    for src in &case.programs {
        match isa::parse(src) {
            Ok(p) => programs.push(p),
            Err(e) => {
                return Ok(Happened {
                    line: format!("parse-error: {e}"),
                    kind: None,
                    failed_checks: Vec::new(),
                })
            }
        }
    }
    // Every program that assembles round-trips through both encodings unchanged.
    for p in &programs {
        let again = isa::parse(&p.to_text()).map_err(|e| format!("reprinted text: {e}"))?;
        if &again != p {
            return Err("text round trip changed the program".into());
        }
        let back = isa::decode(&isa::encode(p).map_err(|e| e.to_string())?)
            .map_err(|e| format!("own encoding: {e}"))?;
        if &back != p {
            return Err("binary round trip changed the program".into());
        }
    }
    if !case.bytes.is_empty() {
        let [one] = programs.as_slice() else {
            return Err("`bytes:` edits need exactly one program".into());
        };
        let mut bytes = isa::encode(one).unwrap();
        for spec in &case.bytes {
            edit(&mut bytes, spec)?;
        }
        match isa::decode(&bytes) {
            Ok(p) => programs = vec![p],
            Err(e) => {
                return Ok(Happened {
                    line: format!("decode-error: {}: {e}", decode_name(&e)),
                    kind: Some(("decode", decode_name(&e))),
                    failed_checks: Vec::new(),
                })
            }
        }
    }
    let load_error = |e: LoadError| Happened {
        line: format!("load-error: {}: {e}", load_name(&e)),
        kind: Some(("load", load_name(&e))),
        failed_checks: Vec::new(),
    };
    let mut m = match Machine::new(F32Domain, programs) {
        Ok(m) => m,
        Err(e) => return Ok(load_error(e)),
    };
    for &(pe, addr, v) in &case.preloads {
        if let Err(e) = m.preload(pe, addr, v) {
            return Ok(load_error(e));
        }
    }
    let mut happened = match m.run(&mut NoObserver) {
        Ok(stats) => Happened {
            line: format!("expect: ok after {} cycles", stats.cycles),
            kind: None,
            failed_checks: Vec::new(),
        },
        Err(f) => Happened {
            line: format!("fault: {}: {f}", fault_name(&f.kind)),
            kind: Some(("fault", fault_name(&f.kind))),
            failed_checks: Vec::new(),
        },
    };
    for &(pe, addr, want) in &case.checks {
        let got = m.read(pe, addr).copied();
        if got != Some(want) {
            happened
                .failed_checks
                .push(format!("check: PE {pe} m{addr}: want {want}, got {got:?}"));
        }
    }
    Ok(happened)
}

/// Puts `line` into the file as its outcome annotation: in place of the old one, or after the
/// leading comment block.
fn rewrite(case: &Case, line: &str) -> std::io::Result<()> {
    let mut lines: Vec<String> = case.text.lines().map(String::from).collect();
    let annotation = format!("; {line}");
    match case.outcome {
        Some((i, _)) => lines[i] = annotation,
        None => {
            let at = lines
                .iter()
                .position(|l| !l.trim_start().starts_with(';'))
                .unwrap_or(lines.len());
            lines.insert(at, annotation);
        }
    }
    std::fs::write(&case.path, lines.join("\n") + "\n")
}

#[test]
fn fault_files() {
    let update = std::env::var_os("UPDATE_EXPECT").is_some_and(|v| v == "1");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/faults");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/faults exists")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "s"))
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no .s files in {}", dir.display());

    let mut failures = String::new();
    let mut seen: BTreeSet<(&str, &str)> = BTreeSet::new();
    for path in &paths {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let case = match read_case(path) {
            Ok(c) => c,
            Err(e) => {
                let _ = writeln!(failures, "{name}: bad test file: {e}");
                continue;
            }
        };
        let happened = match run_case(&case) {
            Ok(h) => h,
            Err(e) => {
                let _ = writeln!(failures, "{name}: {e}");
                continue;
            }
        };
        seen.extend(happened.kind);
        // The name says what the file is for, so that a file meant to fault cannot quietly turn
        // into one that stops earlier (say, at the assembler) and still pass after an update.
        let family = happened.line.split(':').next().unwrap_or_default();
        let intended = PREFIXES
            .iter()
            .find(|(prefix, _)| name.starts_with(prefix))
            .map(|&(_, f)| f);
        if intended != Some(family) {
            let _ = writeln!(
                failures,
                "{name}: ends in `{family}`, but its name asks for {}",
                intended.map_or(
                    "nothing known (start it with one of: parse_, decode_, load_, fault_, ok_)"
                        .to_string(),
                    |f| format!("`{f}`")
                )
            );
        }
        for c in &happened.failed_checks {
            let _ = writeln!(failures, "{name}: {c}");
        }
        let expected = case.outcome.as_ref().map(|(_, l)| l.as_str());
        if expected == Some(happened.line.as_str()) {
            continue;
        }
        if update {
            rewrite(&case, &happened.line).expect("rewrite the test file");
            eprintln!("updated {name}");
            if case.outcome.is_none() {
                // The inserted line moved the code down, and parse errors name lines: run the
                // file once more so that one update is enough.
                let again = read_case(path).and_then(|c| run_case(&c).map(|h| (c, h)));
                if let Ok((c, h)) = again {
                    if c.outcome.as_ref().map(|(_, l)| l) != Some(&h.line) {
                        rewrite(&c, &h.line).expect("rewrite the test file");
                    }
                }
            }
            continue;
        }
        match expected {
            None => {
                let _ = writeln!(
                    failures,
                    "{name}: no outcome annotation; it would be\n    + ; {}\n  (run with UPDATE_EXPECT=1 to add it)",
                    happened.line
                );
            }
            Some(want) => {
                let _ = writeln!(
                    failures,
                    "{name}: outcome differs\n    - ; {want}\n    + ; {}",
                    happened.line
                );
            }
        }
    }
    for (family, all) in [
        ("fault", &FAULT_NAMES[..]),
        ("decode", &DECODE_NAMES[..]),
        ("load", &LOAD_NAMES[..]),
    ] {
        for name in all {
            if !seen.contains(&(family, *name)) {
                let _ = writeln!(failures, "no file produces the {family} error `{name}`");
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} fault file(s) in {}:\n{failures}",
        if update {
            "could not update"
        } else {
            "failing"
        },
        dir.display()
    );
}
