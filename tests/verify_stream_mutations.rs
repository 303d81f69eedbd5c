//! Loop programs are proved like the flat ones: compile with the stream schedule, write the
//! files, load them as `attnc verify` does (loop programs flattened, layouts expanded) and prove
//! them. Then the fields only loop programs have — loop counts and their steps, address strides and base
//! addresses — are mutated one at a time and every mutant must be rejected: refused on loading,
//! or not proved.

use crate::common;

use attnc::rundir;
use common::{layer_src, parse_one};
use compiler::passes::schedule_stream::{self, Lag};
use compiler::passes::select::Choice;
use isa::looped::{field, set_field, Field};
use isa::{LoopProgram, Node};
use rand::{RngExt, SeedableRng};
use runtime::layer::Normalisation;
use std::collections::BTreeMap;

fn stream(src: &str, pes: u32, mem_limit: Option<u32>) -> compiler::Compiled {
    let opts = compiler::Options {
        pes,
        schedule: Choice::Stream,
        dump_after: None,
        mem_limit,
        reroll: false,
        single_placement: false,
    };
    compiler::compile(&parse_one(src), &opts).unwrap_or_else(|e| panic!("{e}"))
}

/// The safe causal stream of `n` tokens, dim `d`, `h` heads on `m` PEs with values lagging
/// as `lag` says, and its manifest.
fn causal_stream(
    n: u32,
    d: u32,
    h: u32,
    m: u32,
    lag: Lag,
) -> (schedule_stream::Stream, runtime::manifest::Manifest) {
    let p =
        compiler::problem::Problem::attention(n, d, h, false, true, runtime::layer::Softmax::Safe);
    let st = schedule_stream::run_with(&p, m, true, lag).unwrap();
    let man = compiler::stream::manifest("stream", &p, m, &st, "forced".into()).unwrap();
    (st, man)
}

fn files(
    loops: &[LoopProgram],
    manifest: &compiler::manifest::Manifest,
) -> BTreeMap<String, Vec<u8>> {
    let mut f = BTreeMap::new();
    for p in loops {
        f.insert(format!("pe{}.bin", p.pe), isa::encode_looped(p).unwrap());
    }
    f.insert(
        "manifest.json".into(),
        manifest.to_json().unwrap().into_bytes(),
    );
    f
}

/// `Ok(())` when proved; otherwise what stopped it (loading or the proof).
fn prove(f: &BTreeMap<String, Vec<u8>>) -> Result<(), String> {
    let loaded = rundir::load(f)?;
    let (programs, manifest) = loaded.flat()?;
    let report = verifier::verify(&programs, &manifest);
    if report.is_ok() {
        Ok(())
    } else {
        Err(report.to_string())
    }
}

/// Number of loops, in pre-order.
fn count_loops(nodes: &[Node]) -> usize {
    nodes
        .iter()
        .map(|n| match n {
            Node::Loop(l) => 1 + count_loops(&l.body),
            Node::Bundle(_) => 0,
        })
        .sum()
}

/// The `k`-th loop in pre-order (`k` counts down as loops are passed).
fn nth_loop<'a>(nodes: &'a mut [Node], k: &mut usize) -> Option<&'a mut isa::Loop> {
    for n in nodes {
        if let Node::Loop(l) = n {
            if *k == 0 {
                return Some(l);
            }
            *k -= 1;
            if let Some(found) = nth_loop(&mut l.body, k) {
                return Some(found);
            }
        }
    }
    None
}

/// Every bundle with the counts of the loops enclosing it (outermost first).
fn bundles_mut<'a>(
    nodes: &'a mut [Node],
    counts: &mut Vec<u32>,
    out: &mut Vec<(&'a mut isa::LBundle, Vec<u32>)>,
) {
    for n in nodes {
        match n {
            Node::Bundle(b) => out.push((b, counts.clone())),
            Node::Loop(l) => {
                counts.push(l.count);
                bundles_mut(&mut l.body, counts, out);
                counts.pop();
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mutation {
    LoopCount,
    Stride,
    Base,
    /// The step of a triangular loop's count.
    Step,
}

/// Every stepped loop, in pre-order.
fn stepped_loops<'a>(nodes: &'a mut [Node], out: &mut Vec<&'a mut isa::Loop>) {
    for n in nodes {
        if let Node::Loop(l) = n {
            if l.step.is_some() {
                out.push(l);
            } else {
                stepped_loops(&mut l.body, out);
            }
        }
    }
}

/// Applies one mutation of `kind` at a random place that matters; `None` when the program has
/// no such place.
fn mutate(p: &mut LoopProgram, kind: Mutation, rng: &mut impl RngExt) -> Option<String> {
    match kind {
        Mutation::Step => {
            let mut all = Vec::new();
            stepped_loops(&mut p.body, &mut all);
            if all.is_empty() {
                return None;
            }
            let i = rng.random_range(0..all.len());
            let l = &mut all[i];
            let old = l.step?;
            let per = old.per + if rng.random_bool(0.5) { 1 } else { -1 };
            l.step = (per != 0).then_some(isa::CountStep { per, ..old });
            Some(format!("count step {} -> {per}", old.per))
        }
        Mutation::LoopCount => {
            let total = count_loops(&p.body);
            let mut k = rng.random_range(0..total);
            let l = nth_loop(&mut p.body, &mut k)?;
            let old = l.count;
            l.count = if old > 1 && rng.random_bool(0.5) {
                old - 1
            } else {
                old + 1
            };
            Some(format!("loop count {old} -> {}", l.count))
        }
        Mutation::Stride => {
            let mut all = Vec::new();
            bundles_mut(&mut p.body, &mut Vec::new(), &mut all);
            // A term of a loop that iterates more than once, so the stride is ever used.
            let mut places: Vec<(usize, usize)> = Vec::new();
            for (i, (b, counts)) in all.iter().enumerate() {
                for (j, t) in b.terms.iter().enumerate() {
                    // ...and whose slot is not predicated to one iteration of that loop.
                    let slot = match t.field {
                        Field::OpA | Field::OpB | Field::OpDst => isa::Slot::Op,
                        Field::AccSrc | Field::AccDst => isa::Slot::Acc,
                        Field::XferSrc | Field::XferDst => isa::Slot::Xfer,
                    };
                    let pinned = b.preds.iter().any(|p| {
                        p.slot == slot
                            && p.level == t.level
                            && match p.cmp {
                                isa::Cmp::Eq => true,
                                isa::Cmp::Lt => p.value <= 1,
                                _ => false,
                            }
                    });
                    if counts[usize::from(t.level)] > 1 && !pinned {
                        places.push((i, j));
                    }
                }
            }
            if places.is_empty() {
                return None;
            }
            let (i, j) = places[rng.random_range(0..places.len())];
            let t = &mut all[i].0.terms[j];
            let old = t.stride;
            t.stride += if rng.random_bool(0.5) { 1 } else { -1 };
            if t.stride == 0 {
                t.stride = old * 2;
            }
            Some(format!("stride {old} -> {} of {:?}", t.stride, t.field))
        }
        Mutation::Base => {
            let mut all = Vec::new();
            bundles_mut(&mut p.body, &mut Vec::new(), &mut all);
            let mut places: Vec<(usize, Field)> = Vec::new();
            for (i, (b, _)) in all.iter().enumerate() {
                for f in Field::ALL {
                    if field(&b.bundle, f).is_some() {
                        places.push((i, f));
                    }
                }
            }
            let (i, f) = places[rng.random_range(0..places.len())];
            let b = &mut all[i].0.bundle;
            let old = field(b, f)?;
            let new = if old > 0 && rng.random_bool(0.5) {
                old - 1
            } else {
                old + 1
            };
            set_field(b, f, new);
            Some(format!("base of {f:?} m{old} -> m{new}"))
        }
    }
}

#[test]
fn stream_programs_are_proved_and_every_mutant_of_a_loop_field_is_rejected() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut rejected = [0u32; 4];
    // Per kind, mutants the compact checks reject with the original manifest and with one
    // whose cycle count follows the mutant.
    let mut caught = [[0u32; 2]; 4];
    let (mut idle_mutants, mut unseen_idle) = (0u32, 0u32);
    let layers = [
        (8, 2, 1, false, false, 2),
        (8, 3, 2, true, false, 4),
        (8, 2, 1, false, true, 2),
        (16, 2, 2, false, true, 2),
        (12, 4, 1, true, true, 3),
        // Step-0 triangles long enough for stepped loops.
        (32, 2, 1, false, true, 2),
        (32, 3, 1, true, true, 2),
    ];
    // A lag of 2 in 4 groups on 8 PEs, as `--mem` selects it: the limit is what that lag
    // needs, so the larger ones do not fit.
    let grouped = {
        let p = compiler::problem::Problem {
            tokens: 48,
            dim: 2,
            heads: 1,
            scale: 1.0 / 2f64.sqrt(),
            symmetric: false,
            shared_values: false,
            causal: true,
            softmax: runtime::layer::Softmax::Safe,
            copies: false,
        };
        let st = schedule_stream::run_with(&p, 8, true, Lag::Steps(2)).unwrap();
        st.programs[0].mem_words
    };
    // The layers above in the paper's formulation; with a safe softmax, values trailing keys
    // on 4 and 8 PEs (the allowance takes the largest lag, the whole ring) and in groups.
    let mut cases: Vec<_> = layers.iter().map(|&l| (l, false, None)).collect();
    cases.push(((16, 2, 1, false, true, 4), true, None));
    cases.push(((48, 2, 1, false, true, 8), true, None));
    cases.push(((48, 2, 1, false, true, 8), true, Some(grouped)));
    // Shared scores paired across the two meetings of their blocks, on an even and an odd ring.
    cases.push(((32, 3, 1, true, false, 4), true, None));
    cases.push(((40, 4, 2, true, false, 5), true, None));
    cases.push(((38, 2, 1, true, false, 4), true, None));
    cases.push(((28, 4, 1, true, false, 4), true, None));
    // And with three heads under a limit that only the idle heads' regions meet.
    let reused = {
        let p = compiler::problem::Problem {
            tokens: 32,
            dim: 3,
            heads: 3,
            scale: 1.0 / 3f64.sqrt(),
            symmetric: true,
            shared_values: true,
            causal: false,
            softmax: runtime::layer::Softmax::Safe,
            copies: false,
        };
        let own =
            schedule_stream::run_pairing(&p, 4, true, Lag::Fit(None), schedule_stream::Pairing::On)
                .unwrap();
        own.programs[0].mem_words - 2 * 8 * 3
    };
    cases.push(((32, 3, 3, true, false, 4), true, Some(reused)));
    for ((n, d, h, shared, causal, m), safe, limit) in cases {
        let what = format!("n={n} d={d} h={h} shared={shared} causal={causal} m={m} safe={safe}");
        let mut src = layer_src(n, d, h, shared, causal);
        if safe {
            src = src.replace("softmax = plain", "softmax = safe");
        }
        let c = stream(&src, m, limit);
        if let Some(limit) = limit {
            assert_eq!(c.manifest.mem_words.iter().max(), Some(&limit), "{what}");
        }
        if shared && !causal && safe {
            // Paired: fewer products than one per score.
            assert!(
                c.manifest.ops.phase1_mac < u64::from(n * n * d * h),
                "{what}: scores not paired"
            );
        }
        prove(&files(&c.loops, &c.manifest)).unwrap_or_else(|e| panic!("{what}: {e}"));
        for (k, kind) in [
            Mutation::LoopCount,
            Mutation::Stride,
            Mutation::Base,
            Mutation::Step,
        ]
        .into_iter()
        .enumerate()
        {
            for _ in 0..6 {
                let mut loops = c.loops.clone();
                let pe = rng.random_range(0..loops.len());
                let Some(how) = mutate(&mut loops[pe], kind, &mut rng) else {
                    continue;
                };
                // A count lowered on a loop of sends or no-ops only (a tail of forwarded words)
                // leaves the work as it was and the PE shorter than the longest, which is all
                // the closed-form length sees: only the flattened proof can reject it.
                let idle = kind == Mutation::LoopCount
                    && loops[pe].cycles() < c.loops[pe].cycles()
                    && loops[pe].op_counts() == c.loops[pe].op_counts();
                // Also the manifest a careless tool would write for the mutant: its cycle
                // count follows the loops, so the mutant is not refused just for the length.
                let mut manifest = c.manifest.clone();
                manifest.cycles = loops.iter().map(LoopProgram::cycles).max().unwrap_or(0);
                for (careless, m) in [(false, &c.manifest), (true, &manifest)] {
                    let r = prove(&files(&loops, m));
                    assert!(r.is_err(), "{what}: PE {pe}, {how}: the mutant was proved");
                    // The checks without unrolling never prove; a violation they report is
                    // always one the flattened proof agrees is wrong (asserted just above).
                    let compact =
                        verifier::compact::check_loops(&loops, m, &verifier::Options::default());
                    assert!(!compact.proved());
                    if compact.total_violations() > 0 {
                        caught[k][usize::from(careless)] += 1;
                    } else if idle && !careless {
                        unseen_idle += 1;
                    }
                }
                if idle {
                    idle_mutants += 1;
                }
                rejected[k] += 1;
            }
        }
    }
    eprintln!("mutants rejected by the flattened proof {rejected:?}; by the compact checks (original manifest, careless manifest) {caught:?}");
    // A loop count or count step changes the length, which the compact checks derive in closed
    // form; with a manifest that follows the length, usually the work too. Strides and base
    // addresses are caught only where they leave memory: the rest needs the flattened proof.
    eprintln!("{idle_mutants} loop-count mutants shorten a PE without changing its work, {unseen_idle} of them unseen by the compact checks");
    assert_eq!(
        caught[0][0] + unseen_idle,
        rejected[0],
        "{caught:?} of {rejected:?}"
    );
    assert_eq!(caught[3][0], rejected[3], "{caught:?} of {rejected:?}");
    assert!(rejected[..3].iter().all(|&r| r >= 20), "{rejected:?}");
    // Three layers have stepped loops.
    assert!(rejected[3] >= 18, "{rejected:?}");
}

/// The same loop-field mutation on every PE keeps the programs uniform, so the proof without
/// unrolling applies to the mutant too: it must never prove one the flattened proof rejects.
#[test]
fn uniform_mutants_are_proved_without_unrolling_only_if_proved_flattened() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    let opts = verifier::Options::default();
    let mut proved_layers = 0;
    // Per kind: mutants, rejected flattened, rejected without unrolling.
    let mut seen = [[0u32; 3]; 3];
    for (n, d, h, m, safe) in [
        (16, 4, 2, 4, true),
        (12, 3, 1, 3, false),
        (16, 8, 1, 2, true),
        // Shapes proved only since written-out terms meet ranges: two-key blocks, one column.
        (8, 2, 2, 4, false),
        (16, 2, 2, 8, true),
        (16, 1, 1, 4, false),
    ] {
        let p = compiler::problem::Problem::attention(
            n,
            d,
            h,
            false,
            false,
            if safe {
                runtime::layer::Softmax::Safe
            } else {
                runtime::layer::Softmax::Plain
            },
        );
        let st = schedule_stream::run_with(&p, m, safe, Lag::Off).unwrap();
        let man = compiler::stream::manifest("stream", &p, m, &st, "forced".into()).unwrap();
        let what = format!("n={n} d={d} h={h} m={m} safe={safe}");
        let proof = verifier::compact::prove_loops(&st.programs, &man, &opts);
        assert!(proof.proved(), "{what}: {proof}");
        proved_layers += 1;
        for (k, kind) in [Mutation::LoopCount, Mutation::Stride, Mutation::Base]
            .into_iter()
            .enumerate()
        {
            for _ in 0..8 {
                let mut first = st.programs[0].clone();
                let Some(how) = mutate(&mut first, kind, &mut rng) else {
                    continue;
                };
                let loops: Vec<LoopProgram> = st
                    .programs
                    .iter()
                    .map(|q| LoopProgram {
                        body: first.body.clone(),
                        ..q.clone()
                    })
                    .collect();
                let mut manifest = man.clone();
                manifest.cycles = loops.iter().map(LoopProgram::cycles).max().unwrap_or(0);
                let flat = prove(&files(&loops, &manifest)).is_ok();
                let compact = verifier::compact::prove_loops(&loops, &manifest, &opts);
                assert!(
                    flat || !compact.proved(),
                    "{what}: {how}: proved without unrolling, rejected flattened:\n{compact}"
                );
                seen[k][0] += 1;
                seen[k][1] += u32::from(!flat);
                seen[k][2] += u32::from(!compact.proved());
            }
        }
    }
    eprintln!("uniform mutants (count, stride, base): [mutants, rejected flattened, not proved without unrolling] {seen:?}");
    assert_eq!(proved_layers, 6);
}

/// Causal (lagged) stream programs differ per PE; the proof without unrolling evaluates every
/// PE in phases and proves them. Every loop-count, count-step, stride or base mutant of one PE
/// is rejected by the flattened proof, and must never be proved without unrolling.
#[test]
fn causal_mutants_are_rejected_without_unrolling() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let opts = verifier::Options::default();
    // Per kind: mutants, rejected flattened, not proved without unrolling.
    let mut seen = [[0u32; 3]; 4];
    for (n, d, h, m, lag) in [
        (16, 2, 1, 4, Lag::Steps(2)),
        (32, 3, 2, 4, Lag::Steps(4)),
        (48, 2, 1, 8, Lag::Steps(2)),
    ] {
        let (st, man) = causal_stream(n, d, h, m, lag);
        let what = format!("n={n} d={d} h={h} m={m} {lag:?}");
        prove(&files(&st.programs, &man)).unwrap_or_else(|e| panic!("{what}: {e}"));
        let original = verifier::compact::prove_loops(&st.programs, &man, &opts);
        assert!(original.proved(), "{what}: {original}");
        for (k, kind) in [
            Mutation::LoopCount,
            Mutation::Stride,
            Mutation::Base,
            Mutation::Step,
        ]
        .into_iter()
        .enumerate()
        {
            for _ in 0..6 {
                let mut loops = st.programs.clone();
                let pe = rng.random_range(0..loops.len());
                let Some(how) = mutate(&mut loops[pe], kind, &mut rng) else {
                    continue;
                };
                let mut manifest = man.clone();
                manifest.cycles = loops.iter().map(LoopProgram::cycles).max().unwrap_or(0);
                let flat = prove(&files(&loops, &manifest)).is_ok();
                let compact = verifier::compact::prove_loops(&loops, &manifest, &opts);
                assert!(!flat, "{what}: PE {pe}, {how}: proved flattened");
                assert!(
                    !compact.proved(),
                    "{what}: PE {pe}, {how}: proved without unrolling:\n{compact}"
                );
                seen[k][0] += 1;
                seen[k][1] += u32::from(!flat);
                seen[k][2] += u32::from(!compact.proved());
            }
        }
    }
    eprintln!("causal mutants (count, stride, base, step): [mutants, rejected flattened, not proved without unrolling] {seen:?}");
    assert!(seen[..3].iter().all(|s| s[0] >= 12), "{seen:?}");
}

/// The per-PE proof decides when a word sent over the ring lands relative to the receiver's
/// reads, so the sends are where a wrong acceptance would hide. Every send template of every PE
/// of two causal lagged layers, mutated one at a time — its destination base moved by one word
/// or by one row, its source base by one word, or the row bound of its predicate moved by one
/// (a row more or less forwarded) — is never proved without unrolling unless the flattened
/// proof finds nothing wrong beyond the invariants the proof without unrolling does not cover
/// (a redundant send is only an `unread-transfer`).
#[test]
fn causal_send_mutants_are_rejected_without_unrolling() {
    use verifier::Invariant;
    let opts = verifier::Options::default();
    let uncovered = [
        Invariant::LostValue,
        Invariant::UnreadTransfer,
        Invariant::UnusedInput,
    ];
    let (mut mutants, mut rejected_compact, mut rejected_flat) = (0u32, 0u32, 0u32);
    // Per kind: mutants, not proved without unrolling.
    let mut kinds: BTreeMap<&str, [u32; 2]> = BTreeMap::new();
    for (n, d, h, m, lag) in [(16, 2, 1, 2, Lag::Steps(2)), (32, 3, 2, 4, Lag::Steps(2))] {
        let (st, man) = causal_stream(n, d, h, m, lag);
        let what = format!("n={n} d={d} h={h} m={m} {lag:?}");
        assert!(
            verifier::compact::prove_loops(&st.programs, &man, &opts).proved(),
            "{what}"
        );
        for pe in 0..st.programs.len() {
            let sends = {
                let mut loops = st.programs.clone();
                let mut all = Vec::new();
                bundles_mut(&mut loops[pe].body, &mut Vec::new(), &mut all);
                all.iter()
                    .filter(|(b, _)| b.bundle.xfer != isa::Xfer::Nop)
                    .count()
            };
            for s in 0..sends {
                for how in 0..6 {
                    let mut loops = st.programs.clone();
                    let mut all = Vec::new();
                    bundles_mut(&mut loops[pe].body, &mut Vec::new(), &mut all);
                    let mut with_send = all
                        .into_iter()
                        .filter(|(b, _)| b.bundle.xfer != isa::Xfer::Nop);
                    let Some((b, _)) = with_send.nth(s) else {
                        continue;
                    };
                    let shift = |b: &mut isa::LBundle, f: Field, by: i64| {
                        let old = i64::from(field(&b.bundle, f).unwrap_or(0));
                        set_field(&mut b.bundle, f, u32::try_from(old + by).unwrap_or(0));
                    };
                    let desc = match how {
                        0 => {
                            shift(b, Field::XferDst, 1);
                            "destination + 1"
                        }
                        1 => {
                            shift(b, Field::XferDst, -1);
                            "destination − 1"
                        }
                        2 => {
                            shift(b, Field::XferDst, i64::from(d));
                            "destination + one row"
                        }
                        3 => {
                            shift(b, Field::XferSrc, 1);
                            "source + 1"
                        }
                        _ => {
                            let Some(pr) = b
                                .preds
                                .iter_mut()
                                .find(|p| p.slot == isa::Slot::Xfer && p.cmp == isa::Cmp::Lt)
                            else {
                                continue;
                            };
                            if how == 4 {
                                pr.value += 1;
                                "one row more forwarded"
                            } else if pr.value > 1 {
                                pr.value -= 1;
                                "one row fewer forwarded"
                            } else {
                                continue;
                            }
                        }
                    };
                    if loops[pe].validate().is_err() {
                        continue;
                    }
                    mutants += 1;
                    let compact = verifier::compact::prove_loops(&loops, &man, &opts);
                    let flat: Vec<isa::Program> = loops
                        .iter()
                        .map(|lp| lp.flatten(1 << 24).expect("flattens"))
                        .collect();
                    let r = verifier::verify(&flat, &man);
                    rejected_flat += u32::from(!r.is_ok());
                    rejected_compact += u32::from(!compact.proved());
                    let k = kinds.entry(desc).or_default();
                    k[0] += 1;
                    k[1] += u32::from(!compact.proved());
                    if compact.proved() {
                        let beyond: Vec<_> =
                            r.counts.keys().filter(|k| !uncovered.contains(k)).collect();
                        assert!(
                            beyond.is_empty(),
                            "{what}: PE {pe}, send {s}: {desc}: proved without unrolling, flattened:\n{r}"
                        );
                    }
                }
            }
        }
    }
    eprintln!(
        "causal send mutants: {mutants}, rejected flattened {rejected_flat}, not proved without unrolling {rejected_compact}; per kind [mutants, not proved without unrolling]: {kinds:?}"
    );
    assert!(mutants >= 100, "only {mutants}");
}

/// Every loop-field kind of mutation.
const ALL_KINDS: [Mutation; 4] = [
    Mutation::LoopCount,
    Mutation::Stride,
    Mutation::Base,
    Mutation::Step,
];

/// Proves `c`'s programs, then 8 random mutants of one PE per kind in `kinds`, each of which
/// must not be proved; counts them per kind in `rejected` (mutations that find nothing to
/// change are skipped).
fn reject_mutants(
    c: &compiler::Compiled,
    what: &str,
    kinds: &[Mutation],
    rng: &mut rand::rngs::StdRng,
    rejected: &mut [u32],
) {
    prove(&files(&c.loops, &c.manifest)).unwrap_or_else(|e| panic!("{what}: {e}"));
    for (k, &kind) in kinds.iter().enumerate() {
        for _ in 0..8 {
            let mut loops = c.loops.clone();
            let pe = rng.random_range(0..loops.len());
            let Some(how) = mutate(&mut loops[pe], kind, rng) else {
                continue;
            };
            let r = prove(&files(&loops, &c.manifest));
            assert!(r.is_err(), "{what}: PE {pe}, {how}: the mutant was proved");
            rejected[k] += 1;
        }
    }
}

/// The uneven deal's programs (rows cut between PEs, steps of different lengths, placements
/// listed element by element; on 12 PEs blocks of 4 and 5 tokens, where the variants with
/// score nests after the ring pass are built too): proved, and every mutant of a loop count, a
/// stride or a base address rejected.
#[test]
fn uneven_deal_mutants_are_rejected() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let mut rejected = [0u32; 3];
    for (n, d, h, m) in [(26, 3, 1, 6), (19, 2, 2, 4), (13, 4, 1, 3), (52, 3, 1, 12)] {
        let what = format!("n={n} d={d} h={h} m={m}");
        let src = layer_src(n, d, h, false, false).replace("softmax = plain", "softmax = safe");
        // The uneven deal keeps a head's every k/v row: more than the default allowance.
        let c = stream(&src, m, Some(u32::MAX));
        assert!(
            c.manifest.inputs["q"].layout.is_none(),
            "{what}: not the uneven deal"
        );
        reject_mutants(
            &c,
            &what,
            &[Mutation::LoopCount, Mutation::Stride, Mutation::Base],
            &mut rng,
            &mut rejected,
        );
    }
    assert!(rejected.iter().all(|&r| r >= 20), "{rejected:?}");
}

/// Whole rows under a causal mask (steps of different lengths joined into loops where they
/// continue one another, stepped nests, placements listed element by element), with deferred
/// normalisation, dividing each weight, and per row, and with rows passed on to the next PE:
/// proved, and every mutant of a loop count, a stride, a base address or a count's step
/// rejected.
#[test]
fn whole_row_mutants_are_rejected() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(19);
    let mut rejected = [0u32; 4];
    // Under each normalisation the builder keeps: the fewest cycles.
    // Whether rows are passed on to the next PE, too (since rows may be split by their output
    // columns, every one of these layers passes some on).
    for (n, d, h, m, norm, passed) in [
        (29, 3, 1, 6, Normalisation::PerRow, true),
        (19, 2, 2, 4, Normalisation::Deferred, true),
        (20, 4, 1, 3, Normalisation::PerRow, true),
        (19, 24, 1, 4, Normalisation::PerWeight, true),
        (29, 20, 2, 6, Normalisation::PerRow, true),
        (40, 16, 2, 6, Normalisation::PerRow, true),
    ] {
        let what = format!("n={n} d={d} h={h} m={m}");
        let src = layer_src(n, d, h, false, true).replace("softmax = plain", "softmax = safe");
        // Whole rows keep a head's every k/v row: more than the default allowance.
        let c = stream(&src, m, Some(u32::MAX));
        assert!(
            c.manifest.inputs["q"].layout.is_none(),
            "{what}: not whole rows"
        );
        assert_eq!(c.manifest.normalisation, norm, "{what}: normalisation");
        assert_eq!(
            c.manifest.outputs["y"].pe != c.manifest.inputs["q"].pe,
            passed,
            "{what}: rows passed on"
        );
        // Steps wait for their blocks and PEs for the longest one: a loop of no-ops (a wait)
        // may have slack, and one run shorter is still a correct program. Loop counts are
        // mutated on loops that do work.
        reject_mutants(
            &c,
            &what,
            &[Mutation::Stride, Mutation::Base, Mutation::Step],
            &mut rng,
            &mut rejected[1..],
        );
        for _ in 0..8 {
            let mut loops = c.loops.clone();
            let pe = rng.random_range(0..loops.len());
            let total = count_loops(&loops[pe].body);
            let mut k = rng.random_range(0..total);
            let Some(l) = nth_loop(&mut loops[pe].body, &mut k) else {
                continue;
            };
            if !does_work(&l.body) {
                continue;
            }
            let old = l.count;
            let new = if old > 1 && rng.random_bool(0.5) {
                old - 1
            } else {
                old + 1
            };
            l.count = new;
            let r = prove(&files(&loops, &c.manifest));
            assert!(
                r.is_err(),
                "{what}: PE {pe}, loop count {old} -> {new}: the mutant was proved"
            );
            rejected[0] += 1;
        }
    }
    assert!(rejected.iter().all(|&r| r >= 12), "{rejected:?}");
}

/// Whether a loop body holds an operation, an accumulation or a send.
fn does_work(nodes: &[Node]) -> bool {
    nodes.iter().any(|n| match n {
        Node::Loop(l) => does_work(&l.body),
        Node::Bundle(b) => b.bundle != isa::Bundle::NOP,
    })
}

#[test]
fn carried_score_mutants_are_rejected() {
    // The shared stream whose mirrored scores travel home with their blocks (with room to
    // spare the stream builder keeps it): every distinct score once, no online work. Its
    // forwarding counts move with the ring step (stepped loops), so every kind of mutant applies.
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let mut rejected = [0u32; 4];
    for (n, d, h, m) in [(16, 8, 1, 4), (24, 9, 2, 4), (32, 16, 1, 8)] {
        let what = format!("n={n} d={d} h={h} m={m}");
        let src = layer_src(n, d, h, true, false).replace("softmax = plain", "softmax = safe");
        let c = stream(&src, m, Some(u32::MAX));
        assert_eq!(
            c.manifest.ops.phase1_mac,
            u64::from(n * (n + 1) / 2 * d * h),
            "{what}: not every score once"
        );
        assert_eq!(c.manifest.ops.online_rescale, 0, "{what}: online work");
        reject_mutants(&c, &what, &ALL_KINDS, &mut rng, &mut rejected);
    }
    assert!(rejected.iter().all(|&r| r >= 20), "{rejected:?}");
}

#[test]
fn causal_per_weight_mutants_are_rejected() {
    // Forced stream on causal layers whose weights are fewer than their output elements: the
    // whole ring's lag dividing each weight. Every mutant of a loop field is rejected. The
    // layers deal evenly: a padded one has loops of masked rows whose every slot is off, and
    // dropping an iteration of those changes nothing the proof could object to.
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let mut rejected = [0u32; 4];
    for (n, d, h, m) in [(16, 12, 1, 4), (12, 12, 2, 2), (24, 16, 1, 6)] {
        let what = format!("n={n} d={d} h={h} m={m}");
        let src = layer_src(n, d, h, false, true).replace("softmax = plain", "softmax = safe");
        let c = stream(&src, m, Some(u32::MAX));
        assert_eq!(
            c.manifest.normalisation,
            runtime::layer::Normalisation::PerWeight,
            "{what}"
        );
        reject_mutants(&c, &what, &ALL_KINDS, &mut rng, &mut rejected);
    }
    assert!(rejected.iter().all(|&r| r >= 20), "{rejected:?}");
}

/// Causal streams that the induction over ring steps proves (each PE alone, its receive
/// buffers stated by the ring's contracts): one PE's loop count, count step, stride or base
/// address mutated, or one of its sends moved (destination by a word either way or by a row,
/// source by a word), is rejected by the flattened proof and never proved by the induction.
#[test]
fn induction_mutants_are_rejected() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let opts = verifier::Options::default();
    // Per kind: mutants (all rejected both ways, asserted).
    let mut seen = [0u32; 5];
    // (layer, mutants per loop-field kind, send mutants): the larger ring's mutants take
    // seconds each to prove flattened.
    for ((n, d, h, m), per_kind, per_send) in [((64, 4, 2, 4), 3, 8), ((128, 4, 2, 8), 1, 3)] {
        let src = format!("layer l {{ tokens = {n}; dim = {d}; heads = {h}; mask = causal; }}");
        let c = stream(&src, m, None);
        let what = format!("{src} on {m} PEs");
        prove(&files(&c.loops, &c.manifest)).unwrap_or_else(|e| panic!("{what}: {e}"));
        let original = verifier::compact::prove_loops_by_induction(&c.loops, &c.manifest, &opts);
        assert!(original.proved(), "{what}: {original}");
        let check = |loops: &[LoopProgram], how: &str, pe: usize| {
            let mut manifest = c.manifest.clone();
            manifest.cycles = loops.iter().map(LoopProgram::cycles).max().unwrap_or(0);
            assert!(
                prove(&files(loops, &manifest)).is_err(),
                "{what}: PE {pe}, {how}: proved flattened"
            );
            let by_induction = verifier::compact::prove_loops_by_induction(loops, &manifest, &opts);
            assert!(
                !by_induction.proved(),
                "{what}: PE {pe}, {how}: proved by induction:\n{by_induction}"
            );
        };
        for (k, &kind) in ALL_KINDS.iter().enumerate() {
            for _ in 0..per_kind {
                let mut loops = c.loops.clone();
                let pe = rng.random_range(0..loops.len());
                let Some(how) = mutate(&mut loops[pe], kind, &mut rng) else {
                    continue;
                };
                check(&loops, &how, pe);
                seen[k] += 1;
            }
        }
        for _ in 0..per_send {
            let mut loops = c.loops.clone();
            let pe = rng.random_range(0..loops.len());
            let mut all = Vec::new();
            bundles_mut(&mut loops[pe].body, &mut Vec::new(), &mut all);
            let mut sends: Vec<_> = all
                .into_iter()
                .filter(|(b, _)| b.bundle.xfer != isa::Xfer::Nop)
                .collect();
            if sends.is_empty() {
                continue;
            }
            let s = rng.random_range(0..sends.len());
            let b = &mut sends[s].0;
            let (f, by, how) = match rng.random_range(0..4) {
                0 => (Field::XferDst, 1, "destination + 1"),
                1 => (Field::XferDst, -1, "destination − 1"),
                2 => (Field::XferDst, i64::from(d), "destination + one row"),
                _ => (Field::XferSrc, 1, "source + 1"),
            };
            let old = i64::from(field(&b.bundle, f).unwrap_or(0));
            set_field(&mut b.bundle, f, u32::try_from(old + by).unwrap_or(0));
            drop(sends);
            if loops[pe].validate().is_err() {
                continue;
            }
            check(&loops, &format!("send {s}: {how}"), pe);
            seen[4] += 1;
        }
    }
    eprintln!("induction mutants (count, stride, base, step, send): {seen:?}");
    assert!(
        seen[..3].iter().all(|&k| k >= 4) && seen[4] >= 8,
        "{seen:?}"
    );
}

/// Relayed mirrored scores (placements listed element by element, the words left after a PE's
/// ring pass laid on the transfer slots of its rows, rows alike in loops whose key counts step
/// with the row): proved, and every mutant of a loop count, a count's step, a stride or a base
/// address rejected, on 6 and 12 PEs with one, two and four heads; and the same with each
/// pair's scores kept whole at the homes.
#[test]
fn relayed_mirrored_mutants_are_rejected() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let mut rejected = [0u32; 4];
    let timings = [
        schedule_stream::MirroredTiming::Relayed,
        schedule_stream::MirroredTiming::Whole,
    ];
    for (timing, (n, d, h, m)) in timings.into_iter().flat_map(|t| {
        [
            (26, 3, 1, 6),
            (34, 6, 4, 6),
            (64, 8, 2, 6),
            (50, 8, 1, 12),
            (61, 8, 2, 12),
            // Fewer keys than columns: each weight divided by its row's sum.
            (26, 32, 1, 6),
        ]
        .map(move |c| (t, c))
    }) {
        let what = format!("n={n} d={d} h={h} m={m} {timing:?}");
        let p = compiler::problem::Problem::attention(
            n,
            d,
            h,
            true,
            false,
            runtime::layer::Softmax::Safe,
        );
        let st = schedule_stream::run_mirrored_timed(&p, m, timing)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let man = compiler::stream::manifest("stream", &p, m, &st, "forced".into()).unwrap();
        prove(&files(&st.programs, &man)).unwrap_or_else(|e| panic!("{what}: {e}"));
        for (k, &kind) in ALL_KINDS.iter().enumerate() {
            for _ in 0..6 {
                let mut loops = st.programs.clone();
                let pe = rng.random_range(0..loops.len());
                // Waits may have slack (a run one shorter is still correct): loop counts are
                // mutated on loops that do work.
                let how = if kind == Mutation::LoopCount {
                    let mut at = rng.random_range(0..count_loops(&loops[pe].body));
                    let Some(l) = nth_loop(&mut loops[pe].body, &mut at) else {
                        continue;
                    };
                    if !does_work(&l.body) {
                        continue;
                    }
                    let old = l.count;
                    l.count = if old > 1 && rng.random_bool(0.5) {
                        old - 1
                    } else {
                        old + 1
                    };
                    format!("loop count {old} -> {}", l.count)
                } else {
                    let Some(how) = mutate(&mut loops[pe], kind, &mut rng) else {
                        continue;
                    };
                    how
                };
                let r = prove(&files(&loops, &man));
                assert!(r.is_err(), "{what}: PE {pe}, {how}: the mutant was proved");
                rejected[k] += 1;
            }
        }
    }
    eprintln!("relayed mirrored mutants rejected per kind: {rejected:?}");
    assert!(rejected.iter().all(|&r| r >= 24), "{rejected:?}");
}
