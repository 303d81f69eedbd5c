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
}

pub fn run(args: &VerifyArgs) -> Result<(), String> {
    let loaded = super::load::load_dir(&args.dir)?;
    let opts = verifier::Options {
        max_per_invariant: args.max_violations,
        max_listed: args.max_violations.saturating_mul(5),
        ..Default::default()
    };
    let (programs, manifest) = loaded
        .flat()
        .map_err(|e| format!("{}: cannot prove: {e}", args.dir.display()))?;
    let report = verifier::verify_with(&programs, &manifest, &opts);
    if args.json {
        let mut obj = report.to_json();
        obj["dir"] = args.dir.display().to_string().into();
        obj["program_source"] = loaded.source.into();
        println!("{obj}");
    } else {
        println!(
            "{}: {} ({} PEs, schedule {})",
            args.dir.display(),
            loaded.manifest.layer.name,
            loaded.manifest.pes,
            loaded.manifest.schedule
        );
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
