//! The cols dataflow's lanes for causal layers with `d = 8` on large rings: the lanes of a
//! q/k PE and a softmax PE per row laid from the last row (`Apart::rows_from_last`), and the
//! one-lane layouts with their rows dealt from the last softmax PE (`Apart::soft_from_last`).
//! Each layer is compiled with `cols` forced and with `auto`; the programs are proved with the
//! necessary operations alone and run against the f64 reference, in the cycles the manifest
//! predicts and no fewer than the layer's bound, and they take fewer cycles than the cols
//! dataflow took before these lanes (measured with `attnc compile`).

use crate::common;

use common::{compile_src, run_within};
use compiler::passes::select::Choice;
use compiler::Compiled;

/// The end-to-end tolerance every grid uses (inputs in [-1, 1], f32 arithmetic).
const TOL: f64 = 1e-4;

/// A causal layer of `n` tokens, `d = 8`, `heads` heads, safe or plain softmax.
fn src(n: u32, heads: u32, safe: bool) -> String {
    let s = common::layer_src(n, 8, heads, false, true);
    if safe {
        s.replace(" softmax = plain;", "")
    } else {
        s
    }
}

/// Compiles the layer with `cols` forced and with `auto`, proves and runs both, and returns
/// `(cols cycles, auto cycles, the cols compile)`.
fn check(n: u32, m: u32, heads: u32, safe: bool) -> (u64, u64, Compiled) {
    let text = src(n, heads, safe);
    let what = format!("{text} on {m} PEs");
    let cols = compile_src(&text, m, Choice::Named("cols"));
    assert_eq!(cols.manifest.schedule, "schedule-cols", "{what}");
    let auto = compile_src(&text, m, Choice::Auto);
    for (c, which) in [(&cols, "cols"), (&auto, "auto")] {
        // `run_emitted` proves the programs with `exact_ops` (no operation beyond the
        // necessary ones).
        run_within(
            c,
            u64::from(n * 1000 + m + heads),
            TOL,
            &format!("{what} ({which})"),
        );
    }
    assert!(
        auto.manifest.cycles <= cols.manifest.cycles,
        "{what}: auto {} against cols {}",
        auto.manifest.cycles,
        cols.manifest.cycles
    );
    (cols.manifest.cycles, auto.manifest.cycles, cols)
}

/// 32 tokens on 64 PEs: the lanes of two PEs per row took 556 cycles laid from the first row
/// (safe softmax; 555 plain), every link carrying every k and v row to the last row's lane.
/// Laid from the last row they take fewer, and the last row's q row is then preloaded on PE 0,
/// the first lane's q/k PE (laid from the first row it was on PE 62).
#[test]
fn pair_lanes_laid_from_the_last_row() {
    for (safe, before) in [(true, 556), (false, 555)] {
        let (cols, auto, _) = check(32, 64, 1, safe);
        assert!(
            cols < before && auto < before,
            "32 tokens, d = 8, causal (safe: {safe}) on 64 PEs: cols {cols}, auto {auto} against {before}"
        );
        // The lanes' layout with one placement per element (with preload copies a faster
        // schedule may win and every PE holds the rows it reads).
        let single = common::compile_single(&src(32, 1, safe), 64, Choice::Named("cols"));
        assert!(
            single.manifest.cycles < before,
            "single placement: {}",
            single.manifest.cycles
        );
        let q = &single.manifest.inputs["q"];
        assert_eq!(
            q.locate(64, 31 * 8).0,
            0,
            "the last row's lane comes first on the ring"
        );
    }
}

/// 16 tokens on 64 PEs, and with four heads on 256 PEs (64 PEs a head): one lane of 8 q/k
/// PEs, 3 softmax PEs and 8 v PEs took 199 cycles with the rows dealt from the first softmax
/// PE, the first row's weights waiting behind later rows' scores on the links to the other
/// softmax PEs; dealt from the last they take fewer.
#[test]
fn rows_dealt_from_the_last_softmax_pe() {
    for (m, heads) in [(64, 1), (256, 4)] {
        let (cols, auto, _) = check(16, m, heads, true);
        assert!(
            cols < 199 && auto < 199,
            "16 tokens, d = 8, causal, {heads} heads on {m} PEs: cols {cols}, auto {auto} against 199"
        );
    }
}
