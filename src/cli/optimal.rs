//! `attnc optimal`: search for a provably optimal schedule with a SAT solver and write it like
//! `attnc compile` does.

use super::outdir::{self, Files};
use super::source::{self, Source};
use compiler::exact::{self, Outcome, Strategy};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct OptimalArgs {
    /// The layer description (.attn)
    pub file: PathBuf,
    /// Number of PEs in the ring
    #[arg(long, value_name = "M")]
    pub pes: Option<u32>,
    /// Output directory (replaced atomically; written only when everything succeeded)
    #[arg(short = 'o', long = "out", value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Schedule only the layer with this name (required when the file holds several)
    #[arg(long, value_name = "NAME")]
    pub layer: Option<String>,
    /// Largest cycle budget to try
    #[arg(long, value_name = "T")]
    pub max_cycles: Option<u64>,
    /// Stop searching after this many seconds and keep the best schedule found
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    pub time_limit: Option<Duration>,
    /// Give up on each cycle budget after this many SAT conflicts, and end the neighbourhood
    /// search after as many; unlike --time-limit, the result is the same on any machine
    #[arg(long, value_name = "N")]
    pub conflict_limit: Option<u64>,
    /// Order of budgets: down (from the best schedule known), up (from the lower bound), bisect
    #[arg(long, default_value = "down", value_parser = parse_strategy)]
    pub search: Strategy,
    /// Keep schedules that differ only by a symmetry (slower; for checking the encoding)
    #[arg(long)]
    pub no_symmetry_breaking: bool,
    /// Keep schedules that a local change improves (slower; for checking the encoding)
    #[arg(long)]
    pub no_dominance: bool,
    /// Skip the large-neighbourhood search that shortens the heuristic schedule first
    #[arg(long)]
    pub no_improve: bool,
    /// Solve with SAT even where the heuristic schedule already meets the lower bound, and write
    /// the SAT schedule
    #[arg(long)]
    pub sat_only: bool,
    /// Print one JSON object instead of text
    #[arg(long)]
    pub json: bool,
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("expected a number of seconds, got `{s}`"))?;
    if !(0.0..=attnc::limits::MAX_TIME_LIMIT_SECS).contains(&secs) {
        return Err(format!(
            "expected a non-negative number of seconds, at most {}, got `{s}`",
            attnc::limits::MAX_TIME_LIMIT_SECS
        ));
    }
    Duration::try_from_secs_f64(secs)
        .map_err(|_| format!("expected a non-negative number of seconds, got `{s}`"))
}

fn parse_strategy(s: &str) -> Result<Strategy, String> {
    Strategy::parse(s).ok_or_else(|| format!("expected one of: {}", Strategy::NAMES.join(", ")))
}

/// Time kept back from the search for verifying and writing the result, so that the whole
/// command stays within `--time-limit`: a tenth of the limit, at most a second.
fn reserve(limit: Duration) -> Duration {
    (limit / 10).min(Duration::from_secs(1))
}

pub fn run(args: &OptimalArgs) -> Result<(), String> {
    let started = std::time::Instant::now();
    let Source {
        name, layers, text, ..
    } = source::read_layers(&args.file, args.layer.as_deref())?;
    let layer = match layers.as_slice() {
        [one] => one,
        [] => return Err(format!("{name}: the file holds no layer")),
        _ => {
            let names: Vec<&str> = layers.iter().map(|l| l.name.as_str()).collect();
            return Err(format!(
                "{name}: holds several layers ({}); pick one with --layer NAME",
                names.join(", ")
            ));
        }
    };
    let pes = source::ring_size(args.pes)?;
    let Some(out) = &args.out else {
        return Err("missing -o DIR (where to write the microcode)".into());
    };
    outdir::check_target(out)?;
    source::check_exact_ring(layer, pes)?;

    let opts = exact::Options {
        max_cycles: args.max_cycles,
        // The limit covers the whole command: what parsing took and the reserve for
        // verification and writing come off the search's share.
        time_limit: args
            .time_limit
            .map(|l| l.saturating_sub(started.elapsed() + reserve(l))),
        conflict_limit: args.conflict_limit,
        strategy: args.search,
        symmetry_breaking: !args.no_symmetry_breaking,
        sat_only: args.sat_only,
        dominance: !args.no_dominance,
        improve: !args.no_improve,
    };
    if !args.json {
        eprintln!(
            "{}: searching on {pes} PEs (lower bound {})",
            layer.name,
            exact::problem_of(layer)
                .map(|p| p.lower_bound(pes))
                .map_err(|e| e.to_string())?
        );
    }
    let outcome = {
        let bar = super::progress::Progress::spinner("searching", args.json);
        let mut report = |p: exact::search::Progress| {
            let stage = p
                .budget
                .map_or("shortening the heuristic schedule".to_string(), |t| {
                    format!("trying T = {t}")
                });
            bar.set_message(format!(
                "{stage}; best {} cycles, none below {}",
                p.best, p.proven
            ));
        };
        exact::search::optimal_with_progress(layer, pes, &opts, &mut report).map_err(|e| {
            match e {
                // A refusal names a field of the layer: show it there, as `compile` does.
                exact::ExactError::Compile(c @ compiler::CompileError::Refused(_)) => {
                    super::compile::explain(c, layer, &name, &text)
                }
                e => format!("{name}: {e}"),
            }
        })?
    };

    // The solver is not trusted: what it found is proved like every compiled program.
    // The exact model places exactly the necessary operations; a heuristic schedule kept
    // instead may recompute the phase-1 products its manifest declares (the wide dataflow).
    let exact_ops = outcome.source == exact::search::Source::Sat;
    source::verify(&outcome.programs, &outcome.manifest, &layer.name, exact_ops)?;
    let mut files: Files = Vec::new();
    source::push_program_files(
        &mut files,
        Path::new(""),
        &outcome.programs,
        &outcome.manifest,
    )?;
    outdir::write_atomically(out, &files)?;

    if args.json {
        println!("{}", to_json(&outcome, &layer.name, pes, out));
    } else {
        for s in &outcome.improvements {
            eprintln!(
                "  improved to {} cycles after {:.3} s (neighbourhood search)",
                s.cycles, s.seconds
            );
        }
        for a in &outcome.attempts {
            eprintln!(
                "  T = {:>5}: {:7} {:9.3} s  ({} variables, {} clauses)",
                a.t,
                a.verdict.name(),
                a.seconds,
                a.variables,
                a.clauses
            );
        }
        if let Some(msg) = &outcome.too_large {
            eprintln!("  note: {msg}");
        }
        let proof = if outcome.proved_optimal {
            if outcome.cycles == outcome.lower_bound {
                "optimal: equals the lower bound".to_string()
            } else {
                format!("optimal: {} cycles is unsatisfiable", outcome.cycles - 1)
            }
        } else {
            format!(
                "not proved optimal: no schedule has fewer than {} cycles{}",
                outcome.proven_bound,
                if outcome.timed_out {
                    "; the time limit stopped the search"
                } else {
                    ""
                }
            )
        };
        println!(
            "{}: {} cycles on {pes} PEs, lower bound {}, heuristic {}, schedule from {} — {}",
            layer.name,
            outcome.cycles,
            outcome.lower_bound,
            outcome
                .heuristic_cycles
                .map_or("none".to_string(), |c| c.to_string()),
            outcome.source.name(),
            proof
        );
        eprintln!("wrote {} (verified)", out.display());
    }
    Ok(())
}

fn to_json(o: &Outcome, layer: &str, pes: u32, out: &std::path::Path) -> serde_json::Value {
    let attempts: Vec<serde_json::Value> = o
        .attempts
        .iter()
        .map(|a| {
            serde_json::json!({
                "t": a.t,
                "result": a.verdict.name(),
                "seconds": a.seconds,
                "variables": a.variables,
                "clauses": a.clauses,
            })
        })
        .collect();
    serde_json::json!({
        "layer": layer,
        "pes": pes,
        "cycles": o.cycles,
        "proved_optimal": o.proved_optimal,
        "lower_bound": o.lower_bound,
        "proven_bound": o.proven_bound,
        "heuristic_cycles": o.heuristic_cycles,
        "source": o.source.name(),
        "timed_out": o.timed_out,
        "too_large": o.too_large,
        "attempts": attempts,
        "improvements": o.improvements.iter().map(|s| serde_json::json!({
            "cycles": s.cycles,
            "seconds": s.seconds,
        })).collect::<Vec<_>>(),
        "out": out.display().to_string(),
    })
}
