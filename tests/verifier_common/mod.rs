//! Compiling layers for the verifier's tests.

#![allow(dead_code)]

pub mod stream;

use compiler::passes::select::Choice;
use compiler::{compile, CompileError, Compiled, Options};

/// The `.attn` source of one layer, in the paper's formulation (every schedule implements it).
pub fn source(tokens: u32, dim: u32, heads: u32, shared: bool, causal: bool) -> String {
    format!(
        "layer t {{ tokens = {tokens}; dim = {dim}; heads = {heads}; qkv = {}; mask = {}; softmax = plain; }}",
        if shared { "shared" } else { "separate" },
        if causal { "causal" } else { "none" }
    )
}

/// The same layer with the default, safe softmax.
pub fn safe_source(tokens: u32, dim: u32, heads: u32, shared: bool, causal: bool) -> String {
    source(tokens, dim, heads, shared, causal).replace(" softmax = plain;", "")
}

/// Compiles the single layer in `src`; `None` when the scheduler refuses the combination.
pub fn build(src: &str, pes: u32, schedule: Choice) -> Option<Compiled> {
    try_build(src, pes, schedule)
        .unwrap_or_else(|e| panic!("{src} on {pes} PEs with {schedule:?}: {e}"))
}

/// Like [`build`], but an internal compiler error is returned rather than a panic.
pub fn try_build(src: &str, pes: u32, schedule: Choice) -> Result<Option<Compiled>, CompileError> {
    let parsed = lang::parse(0, src);
    assert!(
        parsed.diagnostics.is_empty(),
        "{src}: {:?}",
        parsed.diagnostics
    );
    let layer = &parsed.layers[0];
    let opts = Options {
        pes,
        schedule,
        dump_after: None,
        mem_limit: None,
        reroll: false,
        single_placement: false,
    };
    match compile(layer, &opts) {
        Ok(c) => Ok(Some(c)),
        Err(CompileError::Refused(_)) => Ok(None),
        Err(e) => Err(e),
    }
}
