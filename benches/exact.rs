//! Exact-schedule table (placeholder until the encoder lands).
fn main() {}
