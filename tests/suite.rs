//! The workspace's end-to-end tests, one module per file of this directory, built as one test
//! binary: one compile and link instead of one per file, and one harness that keeps every core
//! busy across the files (separate binaries run one after the other, each ending on its slowest
//! test). Run one file's tests with `cargo test --test suite FILE::`, e.g. `e2e_shapes::`.

// The binary's allocator: the suite's proofs are most of its time (src/alloc.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod common;
mod verifier_common;

mod cli;
mod cols_causal;
mod cols_grid;
mod copies_grid;
mod dag_grid;
mod e2e_grid;
mod e2e_shapes;
mod filetests;
mod fuzz_regressions;
mod hostile;
mod softmax;
mod split_grid;
mod stream_dir;
mod verify_contract;
mod verify_grid;
mod verify_hostile;
mod verify_induct;
mod verify_mutations;
mod verify_steps;
mod verify_stream;
mod verify_stream_mutations;
mod visual;
mod wide_grid;
