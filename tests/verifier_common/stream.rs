//! The manifest of a stream schedule's programs, as `compile` is to write it: format 2, loop
//! programs, affine placements, and the operations beyond the necessary ones declared as
//! `ops.online_rescale`.

#![allow(dead_code)]

use compiler::passes::schedule_stream::Stream;
use compiler::problem::Problem;
use runtime::manifest::Manifest;

/// The manifest describing `st`, built by `schedule_stream::run(p, pes, _)`: the one `compile`
/// writes for it.
pub fn stream_manifest(p: &Problem, pes: u32, st: &Stream) -> Manifest {
    compiler::stream::manifest("stream", p, pes, st, "forced".into())
        .unwrap_or_else(|e| panic!("{e}"))
}
