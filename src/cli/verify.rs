//! `attnc verify`: prove an emitted directory correct (placeholder until the verifier lands).

use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    /// Directory written by `attnc compile`
    pub dir: PathBuf,
}

pub fn run(args: &VerifyArgs) -> Result<(), String> {
    let _ = super::load::load_dir(&args.dir)?;
    Err("the symbolic verifier is not built yet".into())
}
