//! Preload copies: layers on rings larger than their work compiled with copies allowed (the
//! default) and with `single_placement`. Every program is proved by the verifier and run against
//! the f64 reference (reading its copies as a loader would write them), takes at least the bound
//! its manifest states, and the manifest says what the programs need: copies listed only at
//! format version 3, a bound for programs with copies, memory that counts every copy.

use crate::common;

use common::{parse_one, run_within};
use compiler::passes::select::Choice;

/// The end-to-end tolerance every grid uses (inputs in [-1, 1], f32 arithmetic).
const TOL: f64 = 1e-4;

fn compile(text: &str, pes: u32, single_placement: bool) -> compiler::Compiled {
    if single_placement {
        common::compile_single(text, pes, Choice::Auto)
    } else {
        common::compile_src(text, pes, Choice::Auto)
    }
}

/// Input words each PE holds before cycle 0: one per placement and one per copy.
fn preloaded_words(c: &compiler::Compiled) -> Vec<u64> {
    let mut words = vec![0u64; c.manifest.pes as usize];
    for p in c.manifest.inputs.values() {
        for pe in common::preload_pes(p, c.manifest.pes) {
            words[pe as usize] += 1;
        }
    }
    words
}

/// Compiles `(n, d, m, heads, scheme)` both ways and checks both; returns the cycles with copies
/// allowed, with a single placement, and the copies the first preloads.
fn both(n: u32, d: u32, m: u32, heads: u32, scheme: &str) -> (u64, u64, usize) {
    let (copied, single, copies) = both_compiled(n, d, m, heads, scheme);
    (copied.manifest.cycles, single, copies)
}

/// [`both`], returning the program compiled with copies allowed itself.
fn both_compiled(
    n: u32,
    d: u32,
    m: u32,
    heads: u32,
    scheme: &str,
) -> (compiler::Compiled, u64, usize) {
    let text = common::scheme_src(n, d, heads, scheme);
    let what = format!("{text} on {m} PEs");
    let single = compile(&text, m, true);
    let copied = compile(&text, m, false);
    let seed = u64::from(n * 1000 + d * 10 + m);
    run_within(&single, seed, TOL, &format!("{what}, single placement"));
    run_within(&copied, seed, TOL, &format!("{what}, copies allowed"));

    let (sb, cb) = (
        single.manifest.bound.expect("a bound"),
        copied.manifest.bound.expect("a bound"),
    );
    assert!(!sb.copies && cb.copies, "{what}: bounds {sb:?}, {cb:?}");
    assert!(
        cb.value <= sb.value,
        "{what}: the bound with copies {cb:?} above the one without {sb:?}"
    );
    let copies: usize = copied
        .manifest
        .inputs
        .values()
        .map(|p| p.copies.len())
        .sum();
    assert!(
        single.manifest.inputs.values().all(|p| p.copies.is_empty()),
        "{what}: copies in a single-placement manifest"
    );
    assert!(single.manifest.format_version < compiler::manifest::COPIES_FORMAT_VERSION);
    assert_eq!(
        copied.manifest.format_version >= compiler::manifest::COPIES_FORMAT_VERSION,
        copies > 0,
        "{what}: format version {} with {copies} copies",
        copied.manifest.format_version
    );
    for (pe, (&words, &mem)) in preloaded_words(&copied)
        .iter()
        .zip(&copied.manifest.mem_words)
        .enumerate()
    {
        assert!(
            words <= u64::from(mem),
            "{what}: PE {pe} preloads {words} words but its memory is {mem}"
        );
    }
    // Copies are only a choice: a schedule without them is always among the candidates.
    assert!(
        copied.manifest.cycles <= single.manifest.cycles,
        "{what}: {} cycles with copies allowed, {} without",
        copied.manifest.cycles,
        single.manifest.cycles
    );
    let single_cycles = single.manifest.cycles;
    (copied, single_cycles, copies)
}

/// PEs that preload both a k word and a v word (a placement or a copy).
fn pes_with_keys_and_values(c: &compiler::Compiled) -> usize {
    let m = c.manifest.pes;
    let holders = |name: &str| -> Vec<bool> {
        let mut on = vec![false; m as usize];
        for pe in c
            .manifest
            .inputs
            .get(name)
            .into_iter()
            .flat_map(|p| common::preload_pes(p, m))
        {
            on[pe as usize] = true;
        }
        on
    };
    let (k, v) = (holders("k"), holders("v"));
    k.iter().zip(&v).filter(|(a, b)| **a && **b).count()
}

/// Causal layers of 32 tokens on 256 PEs, where lanes with their parts on PEs apart left each
/// PE one phase and took 2.28 (`d = 64`) and 2.32 (`d = 8`, four heads) times the bound: on
/// arcs holding their own copies each PE computes scores of its own rows and outputs of the
/// arc before it, so most PEs read both k and v words and the layer takes under twice its
/// bound.
#[test]
fn arcs_with_copies_give_each_pe_both_phases() {
    for (n, d, m, heads) in [(32, 64, 256, 1), (32, 8, 256, 4)] {
        let what = format!("{n} tokens, d = {d}, {heads} heads, causal on {m} PEs");
        let (copied, single, copies) = both_compiled(n, d, m, heads, "causal");
        let bound = copied.manifest.bound.expect("a bound").value;
        let cycles = copied.manifest.cycles;
        assert!(
            cycles < 2 * bound && cycles < single && copies > 0,
            "{what}: {cycles} cycles (bound {bound}), {single} with a single placement"
        );
        let both_phases = pes_with_keys_and_values(&copied);
        assert!(
            2 * both_phases >= m as usize,
            "{what}: {both_phases} PEs hold both k and v words"
        );
    }
}

/// 32 tokens, `d = 8`, q = k = v on 64 PEs: two PEs per row. On arcs whose softmax PEs did
/// nothing but the softmax, the other PE of an arc took all of a row's outputs after its own
/// scores (448 cycles; `auto` kept another dataflow at 423, bound 242); with the softmax PEs
/// taking a share of the outputs and fewer of their own arc's scores the layer takes at most
/// one and a half times its bound.
#[test]
fn arcs_softmax_pes_take_outputs_too() {
    let (n, d, m) = (32, 8, 64);
    let (copied, single, copies) = both_compiled(n, d, m, 1, "shared");
    let bound = copied.manifest.bound.expect("a bound").value;
    let cycles = copied.manifest.cycles;
    assert!(
        2 * cycles <= 3 * bound && copies > 0,
        "{n} tokens, d = {d}, q = k = v on {m} PEs: {cycles} cycles (bound {bound}), {single} \
         with a single placement"
    );
}

/// Layers of 8 to 32 tokens with `d = 8` on 64 PEs and more, where a single placement streams
/// the k and v rows (or the x rows) through one link: with a copy on every PE that reads a word
/// each row group's lane starts at once.
#[test]
fn copies_shorten_short_layers_on_large_rings() {
    for (n, d, m, heads, scheme) in [
        (16, 8, 64, 1, "separate"),
        (16, 8, 64, 1, "shared"),
        (12, 8, 64, 1, "causal"),
        (8, 8, 64, 4, "separate"),
        (16, 8, 128, 1, "causal"),
    ] {
        let (copied, single, copies) = both(n, d, m, heads, scheme);
        assert!(
            copied < single && copies > 0,
            "{n} tokens, d = {d}, {heads} heads, {scheme} on {m} PEs: {copied} cycles with \
             {copies} copies, {single} without"
        );
    }
}

/// With `d = 64` on 256 PEs: q = k = v, whose x words otherwise cross from the q/k PEs to the
/// v PEs.
#[test]
fn copies_shorten_shared_layers_with_long_heads() {
    let (copied, single, copies) = both(4, 64, 256, 1, "shared");
    assert!(
        copied < single && copies > 0,
        "{copied} cycles with {copies} copies, {single} without"
    );
}

/// Small rings and layers with enough work: copies may or may not win, and every program is
/// checked either way.
#[test]
fn copies_where_the_ring_is_not_larger_than_the_work() {
    for (n, d, m, heads, scheme) in [
        (2, 8, 16, 1, "separate"),
        (4, 8, 16, 1, "shared"),
        (8, 8, 16, 2, "causal"),
        (16, 8, 8, 1, "shared"),
        (3, 4, 4, 1, "separate"),
    ] {
        both(n, d, m, heads, scheme);
    }
}

/// Copies cost memory: under a `--mem` limit that the fastest schedule with copies exceeds but
/// the single-placement one meets, the compile still succeeds within the limit (a schedule
/// that fits, with copies or, when none with them does, without).
#[test]
fn a_memory_limit_copies_exceed_falls_back_to_single_placements() {
    let text = common::scheme_src(16, 8, 1, "separate");
    let single = compile(&text, 256, true);
    let copied = compile(&text, 256, false);
    let words = |c: &compiler::Compiled| c.manifest.mem_words.iter().copied().max().unwrap_or(0);
    assert!(
        words(&copied) > words(&single),
        "copies {} words, single {}",
        words(&copied),
        words(&single)
    );
    let opts = compiler::Options {
        pes: 256,
        schedule: Choice::Auto,
        dump_after: None,
        mem_limit: Some(words(&single)),
        reroll: false,
        single_placement: false,
    };
    let limited = compiler::compile(&parse_one(&text), &opts).expect("fits single placements");
    assert!(words(&limited) <= words(&single));
    run_within(
        &limited,
        7,
        TOL,
        "16 tokens on 256 PEs under a memory limit",
    );
}
