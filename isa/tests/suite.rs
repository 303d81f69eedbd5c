//! The `isa` crate's integration tests, one module per file of this directory, built as one
//! test binary (one link, one harness across the files). One file's tests: `cargo test -p isa
//! --test suite FILE::`.

mod common;

mod faultfiles;
mod formats;
mod loop_binary;
mod looped;
mod machine;
