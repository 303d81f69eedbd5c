//! `attnc verify`: prove an emitted directory correct for all inputs by symbolic execution.

use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    /// Directory written by `attnc compile`
    pub dir: PathBuf,
    /// Print one JSON object instead of text
    #[arg(long)]
    pub json: bool,
    /// Violations listed per invariant (all are counted)
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub max_violations: usize,
    /// Worker threads for proofs that evaluate PEs apart (0: one per available core); the
    /// verdict and the report are the same for any number
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub threads: usize,
}

pub fn run(args: &VerifyArgs) -> Result<(), String> {
    let loaded = super::load::load_dir(&args.dir)?;
    let opts = verifier::Options {
        max_per_invariant: args.max_violations,
        max_listed: args.max_violations.saturating_mul(5),
        threads: args.threads,
        ..Default::default()
    };
    let bundles: u64 = loaded.loops.iter().map(|p| p.cycles()).sum();
    if !loaded.loops.is_empty() && bundles > attnc::rundir::MAX_FLATTENED_BUNDLES {
        return compact(args, &loaded, bundles, &opts);
    }
    let (programs, manifest) = loaded
        .flat()
        .map_err(|e| format!("{}: cannot prove: {e}", args.dir.display()))?;
    let report = verifier::verify_with(&programs, &manifest, &opts);
    if args.json {
        println!("{}", decorated(report.to_json(), args, &loaded));
    } else {
        println!("{}", heading(args, &loaded));
        println!("{report}");
    }
    if report.is_ok() {
        Ok(())
    } else {
        Err(format!(
            "{}: verification failed with {} violation(s)",
            args.dir.display(),
            report.total_violations()
        ))
    }
}

/// The first line of the text report: directory, layer, ring and schedule.
fn heading(args: &VerifyArgs, loaded: &super::load::Loaded) -> String {
    format!(
        "{}: {} ({} PEs, schedule {})",
        args.dir.display(),
        loaded.manifest.layer.name,
        loaded.manifest.pes,
        loaded.manifest.schedule
    )
}

/// A JSON report with the directory and where its programs were read from.
fn decorated(
    mut obj: serde_json::Value,
    args: &VerifyArgs,
    loaded: &super::load::Loaded,
) -> serde_json::Value {
    obj["dir"] = args.dir.display().to_string().into();
    obj["program_source"] = loaded.source.into();
    obj
}

/// Loop programs too large to flatten: proved without unrolling where that proof covers them,
/// otherwise what can be checked without unrolling, reported as not proved (exit status 1).
fn compact(
    args: &VerifyArgs,
    loaded: &super::load::Loaded,
    bundles: u64,
    opts: &verifier::Options,
) -> Result<(), String> {
    let found = verifier::compact::prove_loops(&loaded.loops, &loaded.manifest, opts);
    let why = format!(
        "the loop programs stand for {bundles} bundles, more than the {} the symbolic proof flattens",
        attnc::rundir::MAX_FLATTENED_BUNDLES
    );
    if args.json {
        let mut obj = decorated(found.to_json(), args, loaded);
        obj["not_flattened_because"] = why.clone().into();
        println!("{obj}");
    } else {
        println!("{}", heading(args, loaded));
        println!("{why}");
        println!("{found}");
    }
    if found.proved() {
        return Ok(());
    }
    Err(format!(
        "{}: cannot prove: {why}; the checks without unrolling found {} violation(s)",
        args.dir.display(),
        found.checks.total_violations()
    ))
}
