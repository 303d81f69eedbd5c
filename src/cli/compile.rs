//! `attnc compile`: read a layer file, compile it, write the output directory.

use super::outdir::{self, Files};
use super::source::{self, Source};
use codespan_reporting::diagnostic::{Diagnostic, Label};
use compiler::passes::select::{Choice, Culprit};
use compiler::{CompileError, Options};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct CompileArgs {
    /// The layer description (.attn)
    pub file: PathBuf,
    /// Number of PEs in the ring: at most 65536, and at most one per necessary operation of the
    /// layer (the split dataflow gives a PE work without an attention weight of its own)
    #[arg(long, value_name = "M")]
    pub pes: Option<u32>,
    /// Output directory (replaced atomically; written only when everything succeeded)
    #[arg(short = 'o', long = "out", value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Scheduling algorithm: auto (fewest cycles among those that apply), baseline, symmetric,
    /// causal, rows, split, wide, cols, dag, or stream (loop programs); `attnc passes` describes each
    #[arg(long, default_value = "auto", value_parser = parse_choice)]
    pub schedule: Choice,
    /// Print an intermediate form to stdout instead of writing files: ir, facts, schedule, asm, manifest
    #[arg(long, value_name = "KIND")]
    pub emit: Option<Emit>,
    /// Print the result of a pass to stdout (see `attnc passes`)
    #[arg(long, value_name = "PASS")]
    pub dump_after: Option<String>,
    /// Compile only the layer with this name (a file may hold several)
    #[arg(long, value_name = "NAME")]
    pub layer: Option<String>,
    /// Prove the emitted programs with the symbolic verifier before writing them (default: on for
    /// layers of up to 1M operations, where it takes well under a second)
    #[arg(long, overrides_with = "no_verify")]
    pub verify: bool,
    /// Skip the symbolic verification before writing
    #[arg(long, overrides_with = "verify")]
    pub no_verify: bool,
    /// Print how long each pass took (to stderr)
    #[arg(long)]
    pub time_passes: bool,
    /// Largest memory per PE, in words: choose a schedule that fits or fail
    #[arg(long = "mem", value_name = "WORDS")]
    pub mem: Option<u32>,
    /// Write flat programs (one bundle per cycle, ISA formats 1–2) with memory packed as tightly
    /// as possible, even where rerolled loop programs (format 3, values packed by kind for some
    /// more words) would be smaller; for reading a schedule cycle by cycle
    #[arg(long)]
    pub flat: bool,
    /// Preload every input element on exactly one PE. By default a schedule may preload copies
    /// of an element on several PEs where that is faster (small layers on large rings); the
    /// manifest then lists them as `copies` (format version 3), and a loader must write each
    /// copy
    #[arg(long)]
    pub single_placement: bool,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Emit {
    Ir,
    Facts,
    Schedule,
    Asm,
    Manifest,
}

/// Up to this many operations `compile` runs the verifier unless told not to.
const VERIFY_BY_DEFAULT_OPS: u64 = 1_000_000;

fn parse_choice(s: &str) -> Result<Choice, String> {
    Choice::parse(s).ok_or_else(|| format!("expected one of: {}", Choice::names().join(", ")))
}

pub fn run(args: &CompileArgs) -> Result<(), String> {
    let Source {
        name,
        text: source,
        layers,
    } = source::read_layers(&args.file, args.layer.as_deref())?;

    let dump_after = match args.emit {
        Some(Emit::Ir) => Some("lower".to_string()),
        Some(Emit::Facts) => Some("analyze".to_string()),
        Some(Emit::Schedule) => Some(compiler::CHOSEN_SCHEDULE.to_string()),
        Some(Emit::Asm) => Some("codegen".to_string()),
        Some(Emit::Manifest) | None => args.dump_after.clone(),
    };
    let printing = args.emit.is_some() || args.dump_after.is_some();
    let pes = source::ring_size(args.pes)?;
    if args.out.is_none() && !printing {
        return Err("missing -o DIR (where to write the microcode)".into());
    }
    // Refuse a target attnc may not replace before spending time on compiling (checked again
    // when writing).
    if let Some(out) = &args.out {
        outdir::check_target(out)?;
    }

    for layer in &layers {
        source::check_ring(layer, pes)?;
    }
    let several = layers.len() > 1;
    let mut files: Files = Vec::new();
    for layer in &layers {
        let opts = Options {
            pes,
            schedule: args.schedule,
            dump_after: dump_after.clone(),
            mem_limit: args.mem,
            reroll: !args.flat,
            single_placement: args.single_placement,
        };
        let compiled = {
            let _spinner =
                super::progress::Progress::spinner(&format!("compiling {}", layer.name), printing);
            compiler::compile(layer, &opts)
        }
        .map_err(|e| explain(e, layer, &name, &source))?;
        if args.time_passes {
            for (pass, secs) in &compiled.timings {
                eprintln!("time: {secs:9.4}s  {pass}");
            }
        }
        if let Some(d) = &compiled.dump {
            println!("{d}");
        }
        let m = &compiled.manifest;
        let verify = args.verify || (!args.no_verify && m.necessary_ops <= VERIFY_BY_DEFAULT_OPS);
        if verify {
            let t = std::time::Instant::now();
            let flat;
            let programs = if compiled.loops.is_empty() {
                &compiled.programs
            } else {
                flat = source::flatten_for_proof(&compiled.loops).map_err(|e| {
                    format!(
                        "{}: cannot verify before writing: {e} (pass --no-verify)",
                        layer.name
                    )
                })?;
                &flat
            };
            source::verify(
                programs,
                m,
                &layer.name,
                compiled.scheduler.is_some_and(|s| s.necessary_only()),
            )?;
            if args.time_passes {
                eprintln!("time: {:9.4}s  verify", t.elapsed().as_secs_f64());
            }
        }
        if args.emit == Some(Emit::Manifest) {
            println!(
                "{}",
                compiled.manifest.to_json().map_err(|e| e.to_string())?
            );
        }
        let sub = source::layer_subdir(several, &layer.name);
        if compiled.loops.is_empty() {
            source::push_program_files(&mut files, &sub, &compiled.programs, m)?;
        } else {
            source::push_loop_files(&mut files, &sub, &compiled.loops, m)?;
        }
        if !printing {
            let copies: usize = m.inputs.values().map(|p| p.copies.len()).sum();
            eprintln!(
                "{}: {} on {} PEs: {} cycles (lower bound {}, ratio {:.3}{}), {} words/PE max{} ({}){}",
                layer.name,
                compiled
                    .scheduler
                    .map_or(compiler::passes::schedule_stream::DESCRIPTION, |s| s
                        .title()),
                pes,
                m.cycles,
                m.lower_bound,
                m.cycles as f64 / m.lower_bound.max(1) as f64,
                m.bound.map_or(String::new(), |b| format!(
                    "; bound {}, ratio {:.3}",
                    b.value,
                    m.cycles as f64 / b.value.max(1) as f64
                )),
                m.mem_words.iter().max().unwrap_or(&0),
                if copies > 0 {
                    format!(", {copies} preload copies")
                } else {
                    String::new()
                },
                m.selection.reason,
                if verify { "; verified" } else { "" }
            );
        }
    }
    if let Some(out) = &args.out {
        outdir::write_atomically(out, &files)?;
        if !printing {
            eprintln!("wrote {}", out.display());
        }
    }
    Ok(())
}

/// Turns a compile error into a rendered diagnostic pointing at the field to blame.
pub(crate) fn explain(e: CompileError, layer: &lang::Layer, name: &str, source: &str) -> String {
    let CompileError::Refused(r) = &e else {
        return e.to_string();
    };
    let field = match r.culprit {
        Culprit::Tokens => Some(lang::Field::Tokens),
        Culprit::Dim => Some(lang::Field::Dim),
        Culprit::Qkv => Some(lang::Field::Qkv),
        Culprit::Mask => Some(lang::Field::Mask),
        Culprit::Softmax => Some(lang::Field::Softmax),
        Culprit::Pes | Culprit::Memory => None,
    };
    let Some(field) = field else {
        return format!("{}\n  = note: {}", r.message, r.note);
    };
    let diag = Diagnostic::error()
        .with_message(format!("cannot schedule layer `{}`", layer.name))
        .with_labels(vec![
            Label::primary(0, layer.field_span(field)).with_message(r.message.clone())
        ])
        .with_notes(vec![r.note.clone()]);
    eprint!("{}", lang::render(name, source, &[diag]));
    format!("{name}: could not compile due to the error above")
}
