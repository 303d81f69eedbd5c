//! The command line: the only place that touches files and process exit codes.

pub mod compile;
pub mod inspect;
pub mod inspect_loops;
pub mod load;
pub mod optimal;
pub mod outdir;
pub mod progress;
pub mod run;
pub mod show;
pub mod source;
pub mod trace;
pub mod verify;

pub use attnc::npy;
