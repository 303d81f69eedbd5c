//! The `compiler` crate's integration tests, one module per file of this directory, built as one
//! test binary (one link, one harness across the files). One file's tests: `cargo test -p compiler
//! --test suite FILE::`.

#[cfg(feature = "exact")]
mod exact;
mod reroll;
mod rows_floor;
mod stream;
