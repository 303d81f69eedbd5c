//! `attnc run`: execute an emitted directory in the cycle-level interpreter.

use super::{load, npy};
use attnc::rundir;
use compiler::exec;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Directory written by `attnc compile`
    pub dir: PathBuf,
    /// An input tensor, NAME=FILE.npy (float32, C order, [heads, tokens, dim]); repeatable
    #[arg(long = "input", value_name = "NAME=FILE")]
    pub inputs: Vec<String>,
    /// Write the output tensor y here (.npy, float32, [heads, tokens, dim]); must not exist yet
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Seed for the random standard-normal inputs drawn when no --input is given
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Absolute tolerance: an element passes when |y - ref| <= TOLERANCE + RTOL·max|ref|
    #[arg(long, default_value = "1e-4", value_parser = rundir::parse_tolerance)]
    pub tolerance: f64,
    /// Relative tolerance, a fraction of the largest |reference| element (see --tolerance)
    #[arg(long, value_name = "RTOL", default_value = "1e-5", value_parser = rundir::parse_tolerance)]
    pub rtol: f64,
    /// Print one JSON object instead of text
    #[arg(long)]
    pub json: bool,
    /// Also write the run's timeline as Chrome trace-event JSON (Perfetto, chrome://tracing)
    #[arg(long, value_name = "FILE.json")]
    pub trace: Option<PathBuf>,
    /// Aggregate the trace into bins of at least this many cycles (default: exact when small)
    #[arg(long, value_name = "CYCLES", requires = "trace")]
    pub trace_bin: Option<u64>,
    /// Refuse to run more than this many PE-cycles (PEs × cycles): loop programs can stand for
    /// far more work than their size suggests
    #[arg(long, value_name = "N", default_value_t = attnc::limits::DEFAULT_MAX_PE_CYCLES)]
    pub max_pe_cycles: u64,
}

pub fn run(args: &RunArgs) -> Result<(), String> {
    let loaded = load::load_dir(&args.dir)?;
    let m = &loaded.manifest;
    let pe_cycles = m.cycles.saturating_mul(u64::from(m.pes));
    if pe_cycles > args.max_pe_cycles {
        return Err(format!(
            "{}: {} PEs × {} cycles = {pe_cycles} PE-cycles, more than --max-pe-cycles {} (raise it to run this directory)",
            args.dir.display(),
            m.pes,
            m.cycles,
            args.max_pe_cycles
        ));
    }
    let inputs = if args.inputs.is_empty() {
        exec::random_inputs(m, args.seed)
    } else {
        read_inputs(&args.inputs, m)?
    };
    if let Some(path) = &args.trace {
        let (programs, flat_m) = loaded
            .flat()
            .map_err(|e| format!("{}: cannot trace: {e}", args.dir.display()))?;
        let t = super::trace::write(path, &programs, &flat_m, args.trace_bin, args.json)
            .map_err(|e| format!("{}: {e}", args.dir.display()))?;
        if !args.json {
            eprintln!(
                "trace: {} ({} events, {:.1} MB, {} cycle(s) per slice bin, {} PE(s) per process)",
                path.display(),
                t.events,
                t.bytes as f64 / 1e6,
                t.cycles_per_bin,
                t.pes_per_process
            );
        }
    }
    // Only a long run gets a bar: a short one would just flicker.
    let long = m.cycles.saturating_mul(u64::from(m.pes)) > 5_000_000;
    let bar = super::progress::Progress::bar(m.cycles, "cycles", args.json || !long);
    let clock = std::time::Instant::now();
    let mut bulk = None;
    let outcome = if !loaded.loops.is_empty() {
        // Natively, loops and all: no per-cycle observer, so no progress bar.
        exec::execute_loops(loaded.loops, m, &inputs).map(|(outcome, b)| {
            bulk = Some(b);
            outcome
        })
    } else if bar.is_active() {
        let mut obs = super::progress::CycleObserver {
            progress: &bar,
            last: 0,
        };
        exec::execute(isa::F32Domain, loaded.programs, m, &inputs, &mut obs)
    } else {
        exec::execute(
            isa::F32Domain,
            loaded.programs,
            m,
            &inputs,
            &mut isa::NoObserver,
        )
    }
    .map_err(|e| format!("{}: {e}", args.dir.display()))?;
    drop(bar);
    report(
        args,
        m,
        loaded.source,
        &inputs,
        outcome,
        clock.elapsed(),
        bulk,
    )
}

/// Compares a finished run with the reference and prints the summary.
fn report(
    args: &RunArgs,
    m: &runtime::manifest::Manifest,
    source: &str,
    inputs: &std::collections::BTreeMap<String, Vec<f32>>,
    outcome: exec::Outcome<f32>,
    elapsed: std::time::Duration,
    bulk: Option<u64>,
) -> Result<(), String> {
    let y = &outcome.outputs["y"];
    // `load` checked that the inputs are the ones the layer's qkv implies, so there always is a
    // reference; its absence would be a bug, not a pass.
    let reference = exec::reference_output(m, inputs).ok_or_else(|| {
        format!(
            "{}: no reference for this layer's inputs",
            args.dir.display()
        )
    })?;
    let cmp = rundir::compare(y, &reference, args.tolerance, args.rtol);
    let err = cmp.max_abs_err;
    let overflow = non_finite(y);
    if let Some(path) = &args.output {
        let (h, n, d) = (
            m.layer.heads as u64,
            m.layer.tokens as u64,
            m.layer.dim as u64,
        );
        write_new(path, &npy::write_f32(&[h, n, d], y)?)?;
    }
    let stats = &outcome.stats;
    let total = |f: &dyn Fn(&isa::PeStats) -> u64| stats.per_pe.iter().map(f).sum::<u64>();
    // Every op kind of the table; kinds newer than format 1 only once a program used them, so
    // the summary of a format-1 program reads as it always has.
    let by_kind: Vec<(&str, u64)> = isa::OPS
        .iter()
        .map(|o| (o.mnemonic, total(&|p| p.count(o.kind)), o.since))
        .filter(|&(_, n, since)| since == 1 || n > 0)
        .map(|(m, n, _)| (m, n))
        .collect();
    let ratio = stats.cycles as f64 / m.lower_bound.max(1) as f64;
    let pe_ops: u64 = by_kind.iter().map(|&(_, n)| n).sum();
    if args.json {
        let mut ops_json: serde_json::Map<String, serde_json::Value> = by_kind
            .iter()
            .map(|&(m, n)| (m.to_string(), n.into()))
            .collect();
        ops_json.insert("add".into(), total(&|p| p.add).into());
        ops_json.insert("send".into(), total(&|p| p.send).into());
        let obj = serde_json::json!({
            "cycles": stats.cycles,
            "lower_bound": m.lower_bound,
            "ratio": ratio,
            "bound": m.bound,
            "utilization": stats.utilization(),
            "schedule": m.schedule,
            "pes": m.pes,
            "ops": ops_json,
            "mem_words": m.mem_words,
            "program_source": source,
            "run_seconds": elapsed.as_secs_f64(),
            "pe_ops_per_second": pe_ops as f64 / elapsed.as_secs_f64().max(1e-9),
            "bulk_cycles": bulk,
            "inputs": if args.inputs.is_empty() { "random" } else { "files" },
            "seed": args.seed,
            // JSON has no infinity or NaN; a non-finite error is the string "inf" (NaN outputs
            // count as infinite error), never null.
            "max_abs_err": if err.is_finite() { serde_json::json!(err) } else { serde_json::json!("inf") },
            "tolerance": args.tolerance,
            "non_finite": overflow.map_or(0, |(count, _)| count),
            "first_non_finite": overflow.map(|(_, first)| first),
            "rtol": args.rtol,
            "pass": cmp.pass(),
        });
        println!("{obj}");
    } else {
        println!(
            "layer: {} ({} PEs, schedule {})",
            m.layer.name, m.pes, m.schedule
        );
        println!("cycles: {}", stats.cycles);
        println!("lower_bound: {} (cycles/LB {:.4})", m.lower_bound, ratio);
        if let Some(b) = &m.bound {
            if b.copies {
                let words: usize = m.inputs.values().map(|p| p.copies.len()).sum();
                println!(
                    "bound: {} (cycles/bound {:.4}; critical path {}; for programs with preload copies, {words} here)",
                    b.value,
                    stats.cycles as f64 / b.value.max(1) as f64,
                    b.critical_path,
                );
            } else {
                println!(
                    "bound: {} (cycles/bound {:.4}; critical path {}, link {})",
                    b.value,
                    stats.cycles as f64 / b.value.max(1) as f64,
                    b.critical_path,
                    b.link
                );
            }
        }
        let kinds: Vec<String> = by_kind.iter().map(|(m, n)| format!("{m} {n}")).collect();
        println!(
            "ops: {} add {} send {}",
            kinds.join(" "),
            total(&|p| p.add),
            total(&|p| p.send)
        );
        println!("utilization: {:.4}", stats.utilization());
        println!(
            "run: {:.3} s, {:.3e} PE-ops/s{}",
            elapsed.as_secs_f64(),
            pe_ops as f64 / elapsed.as_secs_f64().max(1e-9),
            bulk.map_or(String::new(), |b| format!(
                ", loop programs, {:.0}% of cycles in bulk",
                100.0 * b as f64 / stats.cycles.max(1) as f64
            ))
        );
        println!(
            "mem_words: max {} per PE",
            m.mem_words.iter().max().unwrap_or(&0)
        );
        println!(
            "max_abs_err: {err:.3e} (tolerance {:.0e} + {:.0e}·max|ref|)",
            args.tolerance, args.rtol
        );
    }
    if let Some((count, first)) = overflow {
        return Err(overflow_message(m, y, count, first));
    }
    match cmp.worst {
        None => Ok(()),
        Some((i, got, want)) => {
            let (n, d) = (m.layer.tokens as usize, m.layer.dim as usize);
            Err(format!(
                "MISMATCH: y[{}, {}, {}] is {got:e}, the reference {want:e}: |error| {:.3e} exceeds {:.0e} + {:.0e}·max|ref| (max_abs_err {err:.3e})",
                i / (n * d),
                i % (n * d) / d,
                i % d,
                (f64::from(got) - want).abs(),
                args.tolerance,
                args.rtol
            ))
        }
    }
}

/// Creates `path` with `bytes`, refusing to overwrite anything already there: attnc cannot prove
/// an existing file is one it wrote. A failed write removes the file it created.
fn write_new(path: &std::path::Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                format!(
                    "--output {} already exists; refusing to overwrite it (remove it or choose another name)",
                    path.display()
                )
            } else {
                format!("cannot create {}: {e}", path.display())
            }
        })?;
    if let Err(e) = f.write_all(bytes).and_then(|()| f.sync_all()) {
        drop(f);
        std::fs::remove_file(path).ok();
        return Err(format!("cannot write {}: {e}", path.display()));
    }
    Ok(())
}

/// How many outputs are NaN or infinite, and the flat index of the first.
fn non_finite(y: &[f32]) -> Option<(usize, usize)> {
    let first = y.iter().position(|v| !v.is_finite())?;
    Some((y[first..].iter().filter(|v| !v.is_finite()).count(), first))
}

/// A non-finite output is an overflow, not a rounding difference: say so, where, and what to do.
fn overflow_message(
    m: &compiler::manifest::Manifest,
    y: &[f32],
    count: usize,
    first: usize,
) -> String {
    let (n, d) = (m.layer.tokens as usize, m.layer.dim as usize);
    let at = if n > 0 && d > 0 {
        format!("y[{}][{}][{}]", first / (n * d), first / d % n, first % d)
    } else {
        format!("y[{first}]")
    };
    let hint = if m.layer.softmax() == Some(runtime::layer::Softmax::Plain) {
        "; this layer uses `softmax = plain`, whose exp(scale·score) overflows f32 once a scaled score passes about 88.7 (compile with `softmax = safe`, the default, to subtract each row's maximum)"
    } else {
        ""
    };
    format!(
        "OVERFLOW: {count} of {} outputs are NaN or infinite, the first {at} = {}{hint}",
        y.len(),
        y[first]
    )
}

fn read_inputs(
    specs: &[String],
    m: &compiler::manifest::Manifest,
) -> Result<BTreeMap<String, Vec<f32>>, String> {
    let mut inputs = BTreeMap::new();
    for spec in specs {
        let (name, file) = spec
            .split_once('=')
            .ok_or_else(|| format!("--input expects NAME=FILE.npy, got `{spec}`"))?;
        if !m.inputs.contains_key(name) {
            let names: Vec<&str> = m.inputs.keys().map(String::as_str).collect();
            return Err(format!(
                "layer `{}` takes no input named `{name}` (it takes: {})",
                m.layer.name,
                names.join(", ")
            ));
        }
        // Per-element arrays or an affine layout: the shape counts the elements either way.
        let elems = m.inputs[name].len() as u64;
        // Header plus data: anything larger is refused before it is read.
        let max_bytes = 12 + attnc::limits::MAX_NPY_HEADER_BYTES + 4 * elems;
        let size = std::fs::metadata(file)
            .map_err(|e| format!("cannot read {file}: {e}"))?
            .len();
        if size > max_bytes {
            return Err(format!(
                "{file}: {size} bytes, more than a .npy of the {elems} float32 elements of `{name}` can take"
            ));
        }
        let bytes = std::fs::read(file).map_err(|e| format!("cannot read {file}: {e}"))?;
        let (shape, data) = npy::read_f32(&bytes, elems).map_err(|e| format!("{file}: {e}"))?;
        npy::check_shape(name, &shape, m.layer.heads, m.layer.tokens, m.layer.dim)
            .map_err(|e| format!("{file}: {e}"))?;
        npy::check_finite(name, &data, m.layer.tokens, m.layer.dim)
            .map_err(|e| format!("{file}: {e}"))?;
        if inputs.insert(name.to_string(), data).is_some() {
            return Err(format!("input `{name}` given twice"));
        }
    }
    for name in m.inputs.keys() {
        if !inputs.contains_key(name) {
            return Err(format!(
                "missing --input {name}=FILE.npy (give all inputs, or none for random ones)"
            ));
        }
    }
    Ok(inputs)
}
