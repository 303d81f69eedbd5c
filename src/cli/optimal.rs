//! `attnc optimal`: exact schedules by SAT (placeholder until the encoder lands).

use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct OptimalArgs {
    /// The layer description (.attn)
    pub file: PathBuf,
}

pub fn run(_args: &OptimalArgs) -> Result<(), String> {
    Err("the exact scheduler is not built yet".into())
}
