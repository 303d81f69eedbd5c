//! The `lang` crate's integration tests, one module per file of this directory, built as one
//! test binary (one link, one harness across the files). One file's tests: `cargo test -p lang
//! --test suite FILE::`.

mod diagnostics;
mod parse;
mod robustness;
