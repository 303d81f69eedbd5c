//! The command line: the only place that touches files and process exit codes.

pub mod compile;
pub mod load;
pub mod optimal;
pub mod outdir;
pub mod run;
pub mod source;
pub mod verify;

pub use attnc::npy;
