//! The parts of the `attnc` command that are pure functions of bytes: reading `.npy` tensors,
//! loading an emitted directory from its files' contents, checking a run's result, and the
//! limits every size read from a file is held to. The binary (`src/main.rs`, `src/cli/`) does
//! the IO around them; keeping them here lets the fuzz targets drive the same code.

pub mod alloc;
pub mod limits;
pub mod npy;
pub mod rundir;
