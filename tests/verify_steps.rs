//! The timing of ring steps, pair of neighbours by pair (`verifier::compact::steps`): the
//! causal stream's arrivals are proved apart from each receiver's reads and writes in windows
//! of many ring steps at once, and a send moved into the buffer its receiver reads is refused.

use crate::common;

use compiler::passes::select::Choice;
use isa::looped::LBundle;
use isa::looped::{field, set_field, Field, Term};
use isa::{Acc, AccSrc, LoopProgram, Node, Op, Xfer, XferSrc};
use std::time::{Duration, Instant};
use verifier::compact::steps::Timing;

fn compile(n: u32, d: u32, h: u32, m: u32) -> Vec<LoopProgram> {
    compile_layer(
        &format!("layer l {{ tokens = {n}; dim = {d}; heads = {h}; mask = causal; }}"),
        m,
    )
}

fn compile_layer(src: &str, m: u32) -> Vec<LoopProgram> {
    let c = common::compile_src(src, m, Choice::Stream);
    assert_eq!(c.loops.len(), m as usize, "loop programs, one per PE");
    c.loops
}

const BOUND: Duration = Duration::from_secs(60);

#[test]
fn causal_rings_are_timed_in_windows_of_many_steps() {
    for (n, d, h, m) in [(64, 4, 2, 8), (128, 8, 2, 16), (256, 4, 3, 32)] {
        let programs = compile(n, d, h, m);
        let t = verifier::compact::steps::timing(&programs, BOUND)
            .unwrap_or_else(|why| panic!("{n} tokens on {m} PEs: {why}"));
        assert_eq!(t.pairs, m as usize);
        // Some pairs run many ring steps through one window, so the windows stand for more
        // iterations than there are windows.
        assert!(t.windows > 0, "{n} tokens on {m} PEs: no window ({t:?})");
        assert!(
            t.aligned >= 2 * t.windows,
            "{n} tokens on {m} PEs: windows of two iterations or more ({t:?})"
        );
    }
}

/// Per cycle of a flattened program: the words it reads, the words it writes, and the word its
/// send lands on in the next PE.
struct Trace {
    reads: Vec<Vec<u32>>,
    writes: Vec<Vec<u32>>,
    sends: Vec<Option<u32>>,
}

fn trace(p: &LoopProgram) -> Trace {
    let flat = p.flatten(1 << 22).expect("a small program flattens");
    let mut t = Trace {
        reads: Vec::new(),
        writes: Vec::new(),
        sends: Vec::new(),
    };
    for b in &flat.bundles {
        let (mut r, mut w) = (Vec::new(), Vec::new());
        if let Op::Arith(x) = b.op {
            r.extend(x.reads());
            w.extend(x.dst);
        }
        if let Acc::Add { src, dst } = b.acc {
            if let AccSrc::Mem(a) = src {
                r.push(a);
            }
            w.extend(dst);
        }
        let send = match b.xfer {
            Xfer::Send { src, dst } => {
                if let XferSrc::Mem(a) = src {
                    r.push(a);
                }
                Some(dst)
            }
            Xfer::Nop => None,
        };
        t.reads.push(r);
        t.writes.push(w);
        t.sends.push(send);
    }
    t
}

/// Whether, in some cycle, a word PE `p − 1` sends lands on one PE `p` writes in that cycle
/// (which no commit order can make right).
fn collides(traces: &[Trace]) -> bool {
    let m = traces.len();
    (0..m).any(|p| {
        let (tx, rx) = (&traces[(p + m - 1) % m], &traces[p]);
        (0..tx.sends.len().min(rx.writes.len()))
            .any(|c| tx.sends[c].is_some_and(|x| rx.writes[c].contains(&x)))
    })
}

/// The timing's claims against the traces: the stretches tile each pair's common cycles from
/// 0, and in each no arrival lands on a word the receiver writes in it, nor reads in it when
/// it lasts more than a cycle.
fn check_claims(t: &Timing, traces: &[Trace], what: &str) {
    let m = traces.len();
    assert_eq!(t.stretches.len(), m, "{what}");
    for p in 0..m {
        let (tx, rx) = (&traces[(p + m - 1) % m], &traces[p]);
        let common = tx.sends.len().min(rx.reads.len()) as u64;
        let mut spans = Vec::new();
        let (heads, per) = t.heads.unwrap_or((1, 0));
        for h in 0..heads {
            let mut at = h * per;
            for s in &t.stretches[p] {
                assert_eq!(
                    s.start + h * per,
                    at,
                    "{what}: PE {p}'s stretches tile its cycles"
                );
                for k in 0..s.count {
                    spans.push((at + k * s.len, s.len));
                }
                at += s.len * s.count;
            }
        }
        let covered = spans.last().map_or(0, |&(a, l)| a + l);
        assert!(
            covered >= common,
            "{what}: PE {p}: {covered} of {common} cycles covered"
        );
        for (a, len) in spans {
            let cycles = a as usize..((a + len) as usize).min(common as usize);
            let arrivals: Vec<u32> = cycles.clone().filter_map(|c| tx.sends[c]).collect();
            for c in cycles {
                for x in &rx.writes[c] {
                    assert!(
                        !arrivals.contains(x),
                        "{what}: PE {p} writes m{x} in cycle {c}, in a stretch of {len} from {a} where it arrives"
                    );
                }
                if len > 1 {
                    for x in &rx.reads[c] {
                        assert!(
                            !arrivals.contains(x),
                            "{what}: PE {p} reads m{x} in cycle {c}, in a stretch of {len} from {a} where it arrives"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn the_stretches_hold_on_the_flattened_programs() {
    for (n, d, h, m) in [(64, 4, 2, 8), (96, 2, 1, 8), (128, 4, 1, 16)] {
        let programs = compile(n, d, h, m);
        let what = format!("{n} tokens on {m} PEs");
        let t = verifier::compact::steps::timing(&programs, BOUND).expect("timed");
        let traces: Vec<Trace> = programs.iter().map(trace).collect();
        check_claims(&t, &traces, &what);
    }
    // Other streams: without a mask, and tokens that do not divide the ring.
    for (src, m) in [
        ("layer l { tokens = 64; dim = 4; heads = 2; }", 8),
        (
            "layer l { tokens = 60; dim = 4; heads = 1; mask = causal; }",
            8,
        ),
        ("layer l { tokens = 50; dim = 3; heads = 2; }", 4),
    ] {
        let programs = compile_layer(src, m);
        let traces: Vec<Trace> = programs.iter().map(trace).collect();
        let t = verifier::compact::steps::timing(&programs, BOUND)
            .unwrap_or_else(|why| panic!("{src} on {m} PEs: {why}"));
        check_claims(&t, &traces, src);
    }
}

/// The number of send templates in `nodes`.
fn sends(nodes: &[Node]) -> usize {
    nodes
        .iter()
        .map(|n| match n {
            Node::Loop(l) => sends(&l.body),
            Node::Bundle(b) => usize::from(matches!(b.bundle.xfer, Xfer::Send { .. })),
        })
        .sum()
}

/// Applies `f` to the `k`-th send template of `nodes` (counting down `k`).
fn kth_send(nodes: &mut [Node], k: &mut usize, f: &mut dyn FnMut(&mut LBundle) -> bool) -> bool {
    for n in nodes {
        match n {
            Node::Loop(l) => {
                if kth_send(&mut l.body, k, f) {
                    return true;
                }
                if *k == usize::MAX {
                    return false;
                }
            }
            Node::Bundle(b) => {
                if matches!(b.bundle.xfer, Xfer::Send { .. }) {
                    if *k == 0 {
                        let done = f(b);
                        *k = usize::MAX;
                        return done;
                    }
                    *k -= 1;
                }
            }
        }
    }
    false
}

/// A send template's destination moved: by `by` words, or onto the template's own acc
/// destination (the word the receiver, laid out alike, accumulates into about then).
fn mutate(b: &mut LBundle, by: Option<i64>) -> bool {
    let Xfer::Send { dst, .. } = b.bundle.xfer else {
        return false;
    };
    match by {
        Some(k) => {
            let Ok(to) = u32::try_from(i64::from(dst) + k) else {
                return false;
            };
            set_field(&mut b.bundle, Field::XferDst, to);
        }
        None => {
            let Some(acc) = field(&b.bundle, Field::AccDst) else {
                return false;
            };
            set_field(&mut b.bundle, Field::XferDst, acc);
            b.terms.retain(|t| t.field != Field::XferDst);
            let moved: Vec<Term> = b
                .terms
                .iter()
                .filter(|t| t.field == Field::AccDst)
                .map(|t| Term {
                    field: Field::XferDst,
                    ..*t
                })
                .collect();
            b.terms.extend(moved);
        }
    }
    true
}

#[test]
fn moved_sends_are_refused_or_timed_truly() {
    let (n, d, h, m) = (64, 4, 2, 8);
    let programs = compile(n, d, h, m);
    let (mut refused, mut colliding, mut tried) = (0, 0, 0);
    for p in 0..m as usize {
        for k in 0..sends(&programs[p].body) {
            for by in [Some(1), Some(-1), Some(4), None] {
                let mut bad = programs.clone();
                let mut at = k;
                if !kth_send(&mut bad[p].body, &mut at, &mut |b| mutate(b, by))
                    || bad[p].validate().is_err()
                {
                    continue;
                }
                tried += 1;
                let what = format!("PE {p}, send template {k} moved by {by:?}");
                let traces: Vec<Trace> = bad.iter().map(trace).collect();
                let collision = collides(&traces);
                colliding += usize::from(collision);
                match verifier::compact::steps::timing(&bad, BOUND) {
                    Ok(t) => {
                        assert!(
                            !collision,
                            "{what}: timed, yet an arrival meets a write in one cycle"
                        );
                        check_claims(&t, &traces, &what);
                    }
                    Err(_) => refused += 1,
                }
            }
        }
    }
    assert!(tried > 100, "{tried} mutants");
    // Every mutant with a one-cycle collision is refused (asserted above); there are some.
    assert!(
        colliding > 0 && refused >= colliding,
        "{refused} refused, {colliding} colliding of {tried}"
    );
    println!("{tried} mutants: {colliding} collide in one cycle, {refused} refused");
}

/// The loops of `nodes`, then their bundles, in order, as mutable references.
fn parts<'a>(
    nodes: &'a mut [Node],
    loops: &mut Vec<&'a mut u32>,
    bundles: &mut Vec<&'a mut LBundle>,
) {
    for n in nodes {
        match n {
            Node::Loop(l) => {
                loops.push(&mut l.count);
                parts(&mut l.body, loops, bundles);
            }
            Node::Bundle(b) => bundles.push(b),
        }
    }
}

#[test]
fn loop_field_mutants_are_refused_or_timed_truly() {
    let (n, d, h, m) = (64, 4, 2, 8);
    let programs = compile(n, d, h, m);
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = |k: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % k as u64) as usize
    };
    let (mut tried, mut refused, mut timed) = (0, 0, 0);
    while tried < 60 {
        let mut bad = programs.clone();
        let p = next(m as usize);
        let what;
        {
            let (mut loops, mut bundles) = (Vec::new(), Vec::new());
            parts(&mut bad[p].body, &mut loops, &mut bundles);
            match next(3) {
                0 => {
                    let i = next(loops.len());
                    let by = if next(2) == 0 { 1 } else { u32::MAX };
                    *loops[i] = loops[i].wrapping_add(by);
                    what = format!("PE {p}: loop {i}'s count {by:+}");
                }
                1 => {
                    let b = next(bundles.len());
                    let Some(t) = bundles[b].terms.first_mut() else {
                        continue;
                    };
                    t.stride += 1;
                    what = format!("PE {p}: template {b}'s first stride + 1");
                }
                _ => {
                    let b = next(bundles.len());
                    let f = [
                        Field::OpA,
                        Field::OpDst,
                        Field::AccDst,
                        Field::XferSrc,
                        Field::XferDst,
                    ][next(5)];
                    let Some(a) = field(&bundles[b].bundle, f) else {
                        continue;
                    };
                    set_field(&mut bundles[b].bundle, f, a + 1);
                    what = format!("PE {p}: template {b}'s {f:?} base + 1");
                }
            }
        }
        if bad[p].validate().is_err() {
            continue;
        }
        tried += 1;
        let traces: Vec<Trace> = bad.iter().map(trace).collect();
        match verifier::compact::steps::timing(&bad, BOUND) {
            Ok(t) => {
                timed += 1;
                assert!(
                    !collides(&traces),
                    "{what}: timed, yet an arrival meets a write in one cycle"
                );
                check_claims(&t, &traces, &what);
            }
            Err(_) => refused += 1,
        }
    }
    println!("{tried} loop-field mutants: {timed} timed (claims checked), {refused} refused");
}

/// The model-size causal layers: `cargo test --release --test suite verify_steps:: -- --ignored
/// --nocapture` prints each one's time.
#[test]
#[ignore]
fn model_layers_are_timed() {
    for (name, n, d, h, m) in [
        ("GPT-2 small", 1024, 64, 12, 16),
        ("GPT-2 small", 1024, 64, 12, 64),
        ("Llama-2-7B", 4096, 128, 32, 64),
        ("Llama-2-7B", 4096, 128, 32, 256),
        ("8k context", 8192, 128, 32, 1024),
    ] {
        let programs = compile(n, d, h, m);
        let t0 = Instant::now();
        let t = verifier::compact::steps::timing(&programs, BOUND)
            .unwrap_or_else(|why| panic!("{name} on {m} PEs: {why}"));
        println!(
            "{name} on {m} PEs: {:.3} s, {} phases, {} windows standing for {} aligned loop iterations",
            t0.elapsed().as_secs_f64(),
            t.phases,
            t.windows,
            t.aligned
        );
    }
}
