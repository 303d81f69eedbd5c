//! The cols dataflow (per head: q/k columns, softmax PEs and v columns on separate runs of PEs)
//! forced over rings of one to more than four PEs per token, one to four heads, every scheme and
//! both softmax formulations. Every program is proved by the symbolic verifier with the
//! necessary operations alone (it recomputes nothing), run against the f64 reference, its run
//! takes the cycles the manifest predicts and no fewer than the layer's bound, and `auto`, which
//! weighs it among the other candidates, is never slower.

use crate::common;

use common::{compile_src, run_emitted, run_within};
use compiler::passes::select::Choice;

/// The end-to-end tolerance every grid uses (inputs in [-1, 1], f32 arithmetic).
const TOL: f64 = 1e-4;

#[derive(Clone, Copy, Debug)]
enum Scheme {
    Separate,
    Shared,
    Causal,
}

fn src(n: u32, d: u32, heads: u32, scheme: Scheme, safe: bool) -> String {
    let (shared, causal) = match scheme {
        Scheme::Separate => (false, false),
        Scheme::Shared => (true, false),
        Scheme::Causal => (false, true),
    };
    let s = common::layer_src(n, d, heads, shared, causal);
    if safe {
        s.replace(" softmax = plain;", "")
    } else {
        s
    }
}

/// Each `(n, d, m, heads, before)`: the q = k = v layer (safe softmax) through [`check`], in
/// fewer cycles than `before`.
fn shared_cols_below(cases: &[(u32, u32, u32, u32, u64)]) {
    let cases: Vec<_> = cases
        .iter()
        .map(|&(n, d, m, heads, before)| (n, d, m, heads, Scheme::Shared, before))
        .collect();
    cols_below(&cases);
}

/// Each `(n, d, m, heads, scheme, before)`: the layer (safe softmax) through [`check`], in
/// fewer cycles than `before`.
fn cols_below(cases: &[(u32, u32, u32, u32, Scheme, u64)]) {
    for &(n, d, m, heads, scheme, before) in cases {
        let cols = check(n, d, m, heads, scheme, true);
        assert!(
            cols < before,
            "{n} tokens, d = {d}, {heads} heads, {scheme:?} on {m} PEs: cols {cols}, before {before}"
        );
    }
}

/// Compiles the layer with `cols` forced and checks it; returns its cycles.
fn check(n: u32, d: u32, m: u32, heads: u32, scheme: Scheme, safe: bool) -> u64 {
    let text = src(n, d, heads, scheme, safe);
    let what = format!("{text} on {m} PEs");
    let cols = compile_src(&text, m, Choice::Named("cols"));
    assert_eq!(cols.manifest.schedule, "schedule-cols", "{what}");
    assert!(
        cols.scheduler.is_some_and(|s| s.necessary_only()),
        "{what}: the cols dataflow must be proved with the necessary operations alone"
    );
    // `run_emitted` proves the programs with `exact_ops` (no operation beyond the necessary).
    let r = run_within(&cols, u64::from(n * 1000 + d * 10 + m), TOL, &what);
    assert!(r.cycles >= cols.manifest.lower_bound, "{what}");
    let auto = compile_src(&text, m, Choice::Auto);
    assert!(
        auto.manifest.cycles <= cols.manifest.cycles,
        "{what}: auto {} against cols {}",
        auto.manifest.cycles,
        cols.manifest.cycles
    );
    r.cycles
}

#[test]
fn rings_of_one_to_five_pes_per_token() {
    let mut combos = 0;
    for n in [1u32, 2, 3, 5, 8] {
        for d in [3u32, 8, 16] {
            for m in [3 * n.max(1), 4 * n + 1, (5 * n).max(8)] {
                // Cycle the heads (as many as 3 PEs per head allow), the scheme and the
                // formulation so every size meets each of them.
                let heads = (1 + (n + d + m) % 4).min(m / 3);
                let scheme = [Scheme::Separate, Scheme::Shared, Scheme::Causal]
                    [((n + 2 * d + m) % 3) as usize];
                let safe = (n + m + d).is_multiple_of(2);
                check(n, d, m, heads, scheme, safe);
                combos += 1;
            }
        }
    }
    assert_eq!(combos, 45);
}

#[test]
fn large_rings_every_scheme() {
    for (n, d, m, heads) in [
        (4u32, 16u32, 64u32, 1u32),
        (6, 8, 48, 3),
        (8, 16, 64, 4),
        (3, 32, 40, 2),
    ] {
        for scheme in [Scheme::Separate, Scheme::Shared, Scheme::Causal] {
            let cols = check(n, d, m, heads, scheme, true);
            if (n, d, m, heads) == (8, 16, 64, 4) && matches!(scheme, Scheme::Causal) {
                // The arcs' gain on this layer ([`heads_on_arcs_with_phase_3_on_the_next_arc`]),
                // checked here so that the layer is compiled once.
                assert!(
                    cols < 145,
                    "8 tokens, d = 16, 4 heads, causal on 64 PEs: {cols}"
                );
            }
        }
    }
}

/// The dataflow exists for layers whose rows are too few for the ring: on 16 tokens, d = 32
/// on 128 PEs it must beat the row-group lanes of the split dataflow, whose every lane needs
/// every k and v row (measured: 387 cycles for cols, 564 for split when this was written).
#[test]
fn beats_split_where_rows_are_few() {
    let text = src(16, 32, 1, Scheme::Separate, true);
    let cols = check(16, 32, 128, 1, Scheme::Separate, true);
    // With one placement per element, as when this was written: with preload copies the split
    // dataflow's lanes no longer need the k and v rows streamed to them.
    let split = common::compile_single(&text, 128, Choice::Named("split"));
    assert!(
        cols < split.manifest.cycles,
        "cols {cols} against split {}",
        split.manifest.cycles
    );
}

/// With separate q, k, v, no mask and `2·n·d ≤ n²`, one lane per row, whose k and v rows
/// stream round the ring from every lane, forwards fewer words per link than the lanes that
/// gather a head's scores into their softmax PEs: on 16 tokens, d = 8 on 64 PEs it must beat
/// the row dataflow (measured when it was added: 306 cycles against 318; the cols lanes
/// before it took 339).
#[test]
fn row_lanes_beat_the_row_dataflow_where_keys_stream_cheaper_than_scores_gather() {
    let cols = check(16, 8, 64, 1, Scheme::Separate, true);
    let text = src(16, 8, 1, Scheme::Separate, true);
    let rows = compile_src(&text, 64, Choice::Named("rows"));
    assert!(
        cols < rows.manifest.cycles,
        "{text} on 64 PEs: cols {cols} against rows {}",
        rows.manifest.cycles
    );
}

/// A lane per row of two PEs (scores on one, softmax and half the outputs on the other), the
/// k and v rows streamed one way through a head's lanes, k rows first: with 32 tokens, d = 8
/// (two PEs per row and head) `auto` kept the row dataflow before it, 966 cycles with 4 heads
/// on 256 PEs (cols 1171) and 713 with one head on 64 PEs, and causal with one head on 256
/// PEs the split dataflow's 581; the lanes took 670, 669 and 556 when they were added. Proved
/// and run by `check`, which also holds `auto` to no more than the cols dataflow.
#[test]
fn pair_lanes_stream_keys_first_where_heads_have_two_pes_per_row() {
    for (m, heads, scheme, before) in [
        (256, 4, Scheme::Separate, 966),
        (64, 1, Scheme::Separate, 713),
        (256, 1, Scheme::Causal, 581),
    ] {
        let cols = check(32, 8, m, heads, scheme, true);
        assert!(
            cols < before,
            "32 tokens, d = 8, {heads} heads, {scheme:?} on {m} PEs: cols {cols} against {before}"
        );
    }
}

/// On large rings the softmax PEs are also tried at more than the estimate's count: with
/// q = k = v, 8 tokens, d = 64 on 256 PEs the lane whose weights go round the ring to the q/k
/// PEs took 426 cycles with the estimate's counts (two softmax PEs and fewer), 419 with eight.
#[test]
fn more_softmax_pes_on_large_rings() {
    let cols = check(8, 64, 256, 1, Scheme::Shared, true);
    assert!(
        cols < 426,
        "8 tokens, d = 64, shared on 256 PEs: cols {cols}"
    );
}

/// Phase 3 cut by outputs over any number of v PEs: with `d = 8` on 16 PEs, 8 q/k PEs leave
/// 8 PEs, which whole v columns can only share out as 8 v PEs (no softmax PE) or fewer v PEs
/// holding two columns each. Cut by outputs, 2 softmax PEs (rows dealt by weight) and 6 v PEs
/// doing a sixth of phase 3 each: 16 tokens causal took 278 cycles before (cols, outputs on
/// the softmax PEs; split 279), 257 with the cut; 12 tokens causal 163 (split) before; 4
/// tokens separate 51 (split) before. Each layer checked with `auto` too, which must keep no
/// more than the cols dataflow. The two causal layers (safe softmax) are checked by
/// [`shortest_rows_outputs_on_the_qk_pes`], with the same [`check`] and below fewer cycles
/// (257 and 159), so they are compiled there only.
#[test]
fn phase_3_cut_by_outputs_on_mid_rings() {
    let cols = check(4, 8, 16, 1, Scheme::Separate, true);
    assert!(
        cols < 51,
        "4 tokens, d = 8, separate on 16 PEs: cols {cols} against 51"
    );
}

/// Under a causal mask the lanes cut by outputs also put the shortest rows' outputs on the q/k
/// PEs, which otherwise idle once phase 1 is done (`Apart::qk_rows`): 16 tokens, `d = 8` on 16
/// PEs took 257 cycles (safe) and 228 (plain) before, with 8 q/k, 2 softmax and 6 v PEs; 12
/// tokens 159; 16 tokens, `d = 16` on 32 PEs 246. Every program is proved and run by
/// [`check`], which also makes `auto` keep no more.
#[test]
fn shortest_rows_outputs_on_the_qk_pes() {
    for (n, d, m, safe, before) in [
        (16, 8, 16, true, 257),
        (16, 8, 16, false, 228),
        (12, 8, 16, true, 159),
        (16, 16, 32, true, 246),
    ] {
        let cols = check(n, d, m, 1, Scheme::Causal, safe);
        assert!(
            cols < before,
            "{n} tokens, d = {d}, causal (safe {safe}) on {m} PEs: cols {cols} against {before}"
        );
    }
}

/// Every softmax count up to 8 is tried, not only the estimate's ladder of halves and doubles:
/// 8 tokens, d = 8 on 64 PEs took 115 cycles with the ladder's counts and 106 with three
/// softmax PEs.
#[test]
fn every_small_softmax_count_is_tried() {
    let cols = check(8, 8, 64, 1, Scheme::Separate, true);
    assert!(
        cols < 115,
        "8 tokens, d = 8, separate on 64 PEs: cols {cols}"
    );
}

/// With q = k = v and `d ≤ 2n` on large rings, rows that keep their outputs on their own
/// softmax PEs receive the x rows once and move no weight: 8 tokens, d = 8 on 256 PEs must
/// beat the row dataflow (measured when it was added: 124 cycles against 173; the cols lanes
/// before it took 174).
#[test]
fn outputs_on_the_softmax_pes_beat_the_row_dataflow_with_shared_rows() {
    let cols = check(8, 8, 256, 1, Scheme::Shared, true);
    let text = src(8, 8, 1, Scheme::Shared, true);
    let rows = compile_src(&text, 256, Choice::Named("rows"));
    assert!(
        cols < rows.manifest.cycles,
        "{text} on 256 PEs: cols {cols} against rows {}",
        rows.manifest.cycles
    );
    // The helper PEs' gain on this layer ([`helper_pes_split_the_outputs_kept_on_the_softmax_pes`]),
    // checked here so that the layer is compiled once.
    assert!(cols < 124, "{text} on 256 PEs: cols {cols} against 124");
}

/// On those lanes a row's softmax PE does all `n·d` products of its row after its softmax;
/// with a helper PE after each softmax PE taking half of its rows' output columns the last
/// rows finish sooner. Cycles of the cols dataflow (which `auto` kept) before the helpers:
/// 319 for 16 tokens, `d = 8`, 4 heads, q = k = v on 256 PEs, 125 for 8 tokens with 4 heads,
/// 124 with one (that layer is checked by
/// [`outputs_on_the_softmax_pes_beat_the_row_dataflow_with_shared_rows`], which compiles it).
#[test]
fn helper_pes_split_the_outputs_kept_on_the_softmax_pes() {
    shared_cols_below(&[(16, 8, 256, 4, 319), (8, 8, 256, 4, 125)]);
}

/// On layers of 2 to 4 tokens the last row's softmax and outputs are the critical path; the
/// tucked lanes (`Apart::tuck`: the softmax part starting on the last q/k PE, a softmax PE per
/// row, the v part overlapping the softmax PEs) shorten it. Each `(n, d, m, heads, scheme,
/// before)` is proved, run and checked through [`check`], and must take fewer cycles than
/// `before`: `auto`'s cycles before these lanes (the cols dataflow's, the split one's for 3 tokens
/// on 64 PEs), measured with
/// `cargo bench --bench small -- --only n=2/3/4,m=16/64 --no-paper` (safe softmax).
#[test]
fn tucked_lanes_shorten_layers_of_few_tokens() {
    cols_below(&[
        (2, 8, 16, 1, Scheme::Separate, 26),
        (3, 8, 16, 1, Scheme::Shared, 39),
        (4, 8, 16, 1, Scheme::Causal, 37),
        (3, 8, 64, 1, Scheme::Shared, 44),
    ]);
}

/// Where one lane per row is tried (separate q, k, v, no mask, `2d ≤ n`, 3 PEs per row and
/// head or more): rings of 3 to 5 PEs per row, one or two heads, both formulations.
#[test]
fn row_lanes_on_rings_of_three_to_five_pes_per_row() {
    let mut combos = 0;
    for (n, d) in [(4u32, 2u32), (6, 3), (8, 2), (8, 4)] {
        for per in [3u32, 5] {
            let heads = 1 + (n + per) % 2;
            let m = per * n * heads;
            check(
                n,
                d,
                m,
                heads,
                Scheme::Separate,
                (n + per).is_multiple_of(2),
            );
            combos += 1;
        }
    }
    assert_eq!(combos, 8);
}

/// With q = k = v the x words the v columns read are inputs, ready in cycle 0, so they can
/// cross the softmax PEs while phase 1 runs: the lane chosen for that must be tried. Shared
/// layers of few tokens (each count of `ns`) on rings of 4 to more than 10 PEs per token, one
/// to four heads; the number of layers checked.
fn shared_rows_on_large_rings(ns: &[u32]) -> u32 {
    let mut combos = 0;
    for &n in ns {
        for d in [8u32, 24, 64] {
            for m in [(4 * n).max(6), 64] {
                let heads = (1 + (n + d / 8 + m) % 4).min(m / 3);
                check(n, d, m, heads, Scheme::Shared, (n + m).is_multiple_of(2));
                combos += 1;
            }
        }
    }
    combos
}

// The 30 layers in three tests (CPU time about 3 : 2.5 : 4.5), so the harness spreads them over
// the cores: as one test, the longest of the binary, it ran alone at the end.
#[test]
fn shared_rows_on_large_rings_1_to_3_tokens() {
    assert_eq!(shared_rows_on_large_rings(&[1, 2, 3]), 18);
}

#[test]
fn shared_rows_on_large_rings_4_tokens() {
    assert_eq!(shared_rows_on_large_rings(&[4]), 6);
}

#[test]
fn shared_rows_on_large_rings_6_tokens() {
    assert_eq!(shared_rows_on_large_rings(&[6]), 6);
}

/// One token, d = 64 on 64 PEs: a separate layer's cols lane takes 82 cycles (bound 76).
/// The shared layer has the same weights and half the phase-1 work; its 64 x words must reach
/// the v columns, which they can do during the 64 cycles of the score's chain, so it must be
/// no slower (it took 130, in the row dataflow, while its lanes were estimated as if those
/// words crossed after phase 1).
#[test]
fn one_shared_token_is_no_slower_than_a_separate_one() {
    let separate = check(1, 64, 64, 1, Scheme::Separate, true);
    let shared = check(1, 64, 64, 1, Scheme::Shared, true);
    assert!(
        shared <= separate,
        "shared {shared} against separate {separate}"
    );
}

/// With q = k = v the columns can split between the two ways to phase 3: the first ones keep
/// it on their q/k PEs (the weights come round the ring to them), the others' x words cross
/// the softmax PEs to PEs of their own. 2 tokens, d = 64 on 64 PEs took 139 cycles with the
/// lanes that send all of them one way or the other.
#[test]
fn shared_columns_split_between_both_ways_to_phase_3() {
    let cols = check(2, 64, 64, 1, Scheme::Shared, true);
    assert!(
        cols < 139,
        "2 tokens, d = 64, shared on 64 PEs: cols {cols}"
    );
}

/// With q = k = v each pair's score is computed once; with its larger row, row 0's last score
/// is computed in the last row's turn, so no row's softmax starts before phase 1 ends. Computed
/// with its smaller row, the rows complete one after another. `auto` took 713 cycles for
/// 16 tokens, d = 64 on 256 PEs (the cols lane whose weights go on round the ring) and 596
/// for 8 tokens, d = 64, 4 heads on 64 PEs (the split dataflow) with every pair on its larger
/// row; both programs are proved with the necessary operations alone and run.
#[test]
fn shared_pairs_computed_with_their_smaller_row() {
    let cols = check(16, 64, 256, 1, Scheme::Shared, true);
    assert!(
        cols < 713,
        "16 tokens, d = 64, shared on 256 PEs: cols {cols}"
    );
    let text = src(8, 64, 4, Scheme::Shared, true);
    let auto = compile_src(&text, 64, Choice::Auto);
    let r = run_emitted(&auto, 8064);
    assert!(r.proved.is_some(), "{text}: not proved");
    assert_eq!(r.redundant_ops, 0, "{text}");
    assert!(
        r.max_abs_err <= TOL,
        "{text}: max_abs_err {}",
        r.max_abs_err
    );
    assert_eq!(r.cycles, auto.manifest.cycles, "{text}");
    assert!(
        r.cycles < 596,
        "8 tokens, d = 64, 4 heads, shared on 64 PEs: auto {} ({})",
        r.cycles,
        auto.manifest.schedule
    );
}

/// With q = k = v and the v columns apart, every x word crosses the links into and out of the
/// softmax PE; a few columns held whole by that PE, both phases, cross nothing. Cycles with the
/// cols dataflow (which `auto` kept) before those columns were tried: 289 for 4 tokens,
/// `d = 64` on 256 PEs, 138 for 2 tokens, 213 for 3 tokens with 4 heads.
#[test]
fn shared_columns_held_by_the_softmax_pe() {
    shared_cols_below(&[
        (4, 64, 256, 1, 289),
        (2, 64, 256, 1, 138),
        (3, 64, 256, 4, 213),
    ]);
}

/// Layers where those lanes are tried (their estimate beats all x words crossing), one and
/// two heads, rings of 16 to 64 PEs, both formulations: on most of them a split lane was the
/// fastest cols lane when this was written.
#[test]
fn split_columns_grid() {
    let mut combos = 0;
    for (n, d, m, heads) in [
        (3u32, 24u32, 32u32, 1u32),
        (2, 48, 64, 1),
        (3, 48, 48, 2),
        (4, 48, 64, 2),
        (2, 32, 16, 1),
    ] {
        for safe in [true, false] {
            check(n, d, m, heads, Scheme::Shared, safe);
            combos += 1;
        }
    }
    assert_eq!(combos, 10);
}

/// Fractional columns: where neither column part can have a PE count that suits `d` (here
/// 64 PEs per head for two parts of 32 columns and a softmax), each part's products are cut
/// evenly over its PEs, a column's rows split between neighbours. With whole columns the best
/// cols lanes took 543 cycles (16 tokens, d = 32, 1 head on 64 PEs), 858 (2 heads) and 303
/// (causal).
#[test]
fn fractional_columns_where_no_part_length_suits_d() {
    for (heads, scheme, before) in [
        (1, Scheme::Separate, 543),
        (2, Scheme::Separate, 858),
        (1, Scheme::Causal, 303),
    ] {
        let cols = check(16, 32, 64, heads, scheme, true);
        assert!(
            cols < before,
            "16 tokens, d = 32, {heads} heads, {scheme:?} on 64 PEs: cols {cols}"
        );
    }
}

/// Arcs: with four heads on 256 PEs each head's q and k columns hold an arc of 64 PEs, one
/// column a PE, and its softmax and outputs go on the next head's arc, so every PE does phase 1
/// of its head and phase 3 of the one before. The cols lanes with parts apart took 257 cycles
/// (8 tokens, d = 64), 349 (8 tokens, d = 128, causal) and 299 (12 tokens, d = 64, causal).
/// Smaller rings too, arcs of several columns a PE: 2 heads, 4 tokens, d = 8 on 16 PEs took 64
/// (the split dataflow; the cols lanes 70), 4 heads, 8 tokens, d = 16, causal on 64 PEs 145
/// (that layer is checked by [`large_rings_every_scheme`], which compiles it).
#[test]
fn heads_on_arcs_with_phase_3_on_the_next_arc() {
    cols_below(&[
        (8, 64, 256, 4, Scheme::Separate, 257),
        (8, 128, 256, 4, Scheme::Causal, 349),
        (12, 64, 256, 4, Scheme::Causal, 299),
        (4, 8, 16, 2, Scheme::Separate, 64),
    ]);
}

/// With q = k = v and several heads on a large ring, arcs whose softmax PEs come first and
/// whose q/k PEs take both phases of their head: the scores go round the ring to the softmax
/// PEs, where the lanes before sent every head's weights round it. `before` is the cycle count
/// `auto` had without these arcs (the cols lanes with the weights round the ring).
#[test]
fn shared_heads_send_their_scores_round_the_ring() {
    shared_cols_below(&[
        (8, 64, 256, 4, 622),
        (4, 128, 256, 4, 445),
        (3, 128, 256, 4, 420),
    ]);
}

#[test]
fn refuses_rings_without_three_pes_per_head() {
    let layer = common::parse_one(&src(4, 4, 2, Scheme::Separate, true));
    let opts = compiler::Options {
        pes: 5,
        schedule: Choice::Named("cols"),
        ..Default::default()
    };
    let err = compiler::compile(&layer, &opts)
        .err()
        .map(|e| e.to_string());
    assert!(
        err.as_deref().is_some_and(|e| e.contains("3 PEs per head")),
        "{err:?}"
    );
}

/// A division's quotient leaves in the cycle it is made, through the division's idle acc slot
/// (`div … | add 0 | send acc`): one token with d = 8 on 16 PEs took 15 cycles when the weight
/// could only leave from memory a cycle later, and takes 14 (the bound is 13), with a division
/// in the programs that sends its own result.
#[test]
fn quotients_leave_in_the_cycle_they_are_made() {
    use isa::{Acc, AccSrc, OpKind, Xfer, XferSrc};
    for scheme in [Scheme::Separate, Scheme::Shared, Scheme::Causal] {
        let cols = check(1, 8, 16, 1, scheme, true);
        assert!(
            cols < 15,
            "one token, d = 8, {scheme:?} on 16 PEs: cols {cols}"
        );
    }
    let c = compile_src(
        &src(1, 8, 1, Scheme::Separate, true),
        16,
        Choice::Named("cols"),
    );
    let riding = c
        .programs
        .iter()
        .flat_map(|p| p.bundles.iter())
        .filter(|b| {
            b.op.kind() == Some(OpKind::Div)
                && b.acc
                    == Acc::Add {
                        src: AccSrc::Zero,
                        dst: None,
                    }
                && matches!(
                    b.xfer,
                    Xfer::Send {
                        src: XferSrc::Acc,
                        ..
                    }
                )
        })
        .count();
    assert_eq!(riding, 1, "the one division sends its quotient itself");
}
