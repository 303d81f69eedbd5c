//! The stream schedule's loop programs, flattened, are proved by the verifier under the online
//! formulation (deferred normalisation; running maxima and rescaling when safe), and corrupting
//! one bundle of them is caught.

use crate::verifier_common::stream;

use compiler::passes::schedule_stream::{
    self, Lag, MirroredTiming, Stream, WholePass, WholeTiming,
};
use compiler::problem::Problem;
use isa::{Op, OpKind, Program};
use runtime::layer::{Normalisation, Softmax};
use runtime::manifest::Manifest;
use std::collections::BTreeMap;
use stream::stream_manifest;
use verifier::{Invariant, Options, Report};

fn problem(n: u32, d: u32, h: u32, shared: bool, causal: bool, safe: bool) -> Problem {
    Problem::attention(
        n,
        d,
        h,
        shared,
        causal,
        if safe { Softmax::Safe } else { Softmax::Plain },
    )
}

/// The flattened programs and manifest, or `None` where the schedule does not apply.
#[allow(clippy::too_many_arguments)] // a layer's shape, spelled out at each call
fn build(
    n: u32,
    d: u32,
    h: u32,
    m: u32,
    shared: bool,
    causal: bool,
    safe: bool,
    lag: Lag,
) -> Option<(Vec<Program>, Manifest)> {
    build_checked(n, d, h, m, shared, causal, safe, lag, true)
}

/// [`build`], with the checks and proof without unrolling only if `compact`.
#[allow(clippy::too_many_arguments)] // a layer's shape, spelled out at each call
fn build_checked(
    n: u32,
    d: u32,
    h: u32,
    m: u32,
    shared: bool,
    causal: bool,
    safe: bool,
    lag: Lag,
    compact: bool,
) -> Option<(Vec<Program>, Manifest)> {
    let p = problem(n, d, h, shared, causal, safe);
    if schedule_stream::unsupported(&p, m).is_some() {
        return None;
    }
    let st = schedule_stream::run_with(&p, m, safe, lag).unwrap_or_else(|e| panic!("{e}"));
    let man = stream_manifest(&p, m, &st);
    if compact {
        assert_compact_clean(
            &st.programs,
            &man,
            &format!("n={n} d={d} h={h} m={m} shared={shared} causal={causal} safe={safe} {lag:?}"),
        );
    }
    let flat = flattened(&st.programs);
    Some((flat, man))
}

fn verify(programs: &[Program], m: &Manifest) -> Report {
    verifier::verify_with(
        programs,
        m,
        &Options {
            exact_ops: false,
            ..Options::default()
        },
    )
}

/// The checks without unrolling find nothing wrong with programs the flattened proof proves,
/// and conclude every check they make (no address extent left undecided), except that they
/// leave placements listed element by element (the uneven deal's) to the flattened proof.
/// Every layer built here is also proved flattened, so this is the cross-check of the two.
fn assert_compact_clean(loops: &[isa::LoopProgram], man: &Manifest, what: &str) {
    let c = verifier::compact::check_loops(loops, man, &Options::default());
    assert_eq!(c.counts, BTreeMap::new(), "{what}: compact:\n{c}");
    let listed = man
        .inputs
        .values()
        .chain(man.outputs.values())
        .any(|p| p.layout.is_none());
    let undecided: Vec<&String> = c
        .undecided
        .iter()
        .filter(|u| !(listed && u.starts_with("placement:")))
        .collect();
    assert_eq!(undecided, Vec::<&String>::new(), "{what}: compact:\n{c}");
    assert!(!c.proved());
    // The proof without unrolling, where it applies, proves what the flattened proof proves
    // (every caller proves these programs flattened too).
    let p = verifier::compact::prove_loops(loops, man, &Options::default());
    let applies = verifier::compact::prove::applies(loops, man).is_ok();
    let per_pe = verifier::compact::ring::applies(loops, man).is_ok();
    // A proof that does not apply proves nothing.
    assert!(
        applies || per_pe || !p.proved(),
        "{what}: proved outside its scope"
    );
    let causal = man.layer.mask == "causal";
    // Every causal layer it covers (separate q, k, v) is proved, as it is flattened.
    assert!(
        !(causal && per_pe) || p.proved(),
        "{what}: not proved without unrolling: {:?}",
        p.outcome
    );
    COMPACT.with(|c| {
        let mut c = c.borrow_mut();
        c.0 += usize::from(applies);
        c.1 += usize::from(p.proved());
        if applies && !p.proved() && c.2.len() < 5 {
            c.2.push(format!("{what}: {:?}", p.outcome));
        }
        c.3 += usize::from(causal);
        c.4 += usize::from(causal && p.proved());
    });
}

thread_local! {
    /// Per test thread: layers the proof without unrolling applies to, proves, and why some
    /// it applies to are not proved; causal layers seen, and proved without unrolling (each
    /// of them proved flattened by the caller too).
    static COMPACT: std::cell::RefCell<(usize, usize, Vec<String>, usize, usize)> = Default::default();
}

/// Every PE's loop program unrolled (the flattened programs the proofs below check).
fn flattened(loops: &[isa::LoopProgram]) -> Vec<Program> {
    loops
        .iter()
        .map(|lp| lp.flatten(1 << 24).expect("flattens"))
        .collect()
}
/// The stream's manifest and flattened programs, proved as built (the original a mutation test
/// then changes).
fn proved_original(p: &Problem, m: u32, st: &Stream) -> (Manifest, Vec<Program>) {
    let man = stream_manifest(p, m, st);
    let flat = flattened(&st.programs);
    assert_proved(&flat, &man, "original");
    (man, flat)
}

/// Proves `programs` against `man`: no violation of any invariant, and the online work the
/// verifier counted is exactly what the manifest declares.
fn assert_proved(programs: &[Program], man: &Manifest, what: &str) {
    let r = verify(programs, man);
    assert_eq!(r.counts, BTreeMap::new(), "{what}:\n{r}");
    assert_eq!(r.stats.ops.rescale, man.ops.online_rescale, "{what}");
}

#[test]
fn stream_programs_are_proved_for_many_sizes() {
    let mut proved = 0;
    for n in [4, 8, 12, 16] {
        for d in [1, 2, 3, 4, 8] {
            for m in [2, 3, 4] {
                for h in [1, 2, 3] {
                    // Heads repeat the same code; two sizes are enough for the large layers.
                    if h == 2 && n > 8 {
                        continue;
                    }
                    for shared in [false, true] {
                        for causal in [false, true] {
                            for safe in [false, true] {
                                let Some((programs, man)) =
                                    build(n, d, h, m, shared, causal, safe, Lag::Off)
                                else {
                                    continue;
                                };
                                assert_proved(&programs, &man, &format!("n={n} d={d} h={h} m={m} shared={shared} causal={causal} safe={safe}"));
                                proved += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    eprintln!("{proved} stream layers proved");
    COMPACT.with(|c| {
        let c = c.borrow();
        eprintln!(
            "without unrolling: one program on every PE {}, proved in all {}; e.g. not proved: {:#?}; causal layers {}, proved without unrolling {}",
            c.0, c.1, c.2, c.3, c.4
        );
        // The separate causal layers (half of them; shared ones are outside the proof).
        assert!(c.4 >= 180, "only {} causal layers proved without unrolling", c.4);
    });
    assert!(proved >= 600, "only {proved} layers applied");
}

/// Causal layers whose step-0 triangle is long enough to become stepped loops (a PE owning 8
/// or more rows), trimmed and untrimmed hops alike, proved exactly.
#[test]
fn triangular_step_zero_is_proved() {
    let mut stepped = 0;
    for (n, m) in [(16, 2), (24, 2), (32, 2), (32, 4), (48, 3), (64, 4)] {
        for d in [1, 2, 3, 8] {
            for shared in [false, true] {
                for safe in [false, true] {
                    let Some((programs, man)) = build(n, d, 1, m, shared, true, safe, Lag::Off)
                    else {
                        panic!("n={n} m={m} does not apply");
                    };
                    let r = verify(&programs, &man);
                    assert_eq!(
                        r.counts,
                        BTreeMap::new(),
                        "n={n} d={d} m={m} shared={shared} safe={safe}:\n{r}"
                    );
                    let p = problem(n, d, 1, shared, true, safe);
                    let loops = schedule_stream::run_with(&p, m, safe, Lag::Off).unwrap();
                    stepped += usize::from(loops.programs.iter().all(|q| {
                        q.to_text()
                            .lines()
                            .any(|l| l.trim_start().starts_with("loop") && l.contains(" + i"))
                    }));
                }
            }
        }
    }
    assert!(
        stepped >= 60,
        "only {stepped} layers had stepped loops on every PE"
    );
}

/// Causal layers whose values trail their keys by every lag the ring allows (and by the lag
/// chosen within the default allowance), proved exactly, the online work included; on every
/// PE the program is as long.
#[test]
fn lagged_values_are_proved() {
    let mut proved = 0;
    for (n, m) in [
        (8, 2),
        (16, 2),
        (16, 4),
        (24, 4),
        (32, 4),
        (24, 6),
        (32, 8),
        (48, 8),
    ] {
        for d in [1, 2, 3, 5] {
            // Three heads and more keep the first head's odd blocks in the last outputs.
            for h in [1, 2, 3] {
                let lags = (2..=m).filter(|g| g % 2 == 0 && m % g == 0);
                for lag in lags.map(Lag::Steps).chain([Lag::Fit(None)]) {
                    let Some((programs, man)) = build(n, d, h, m, false, true, true, lag) else {
                        panic!("n={n} m={m} does not apply");
                    };
                    assert_proved(&programs, &man, &format!("n={n} d={d} h={h} m={m} {lag:?}"));
                    let lens: Vec<usize> = programs.iter().map(|p| p.bundles.len()).collect();
                    assert!(lens.iter().all(|&l| l == lens[0]), "{lens:?}");
                    proved += 1;
                }
            }
        }
    }
    eprintln!("{proved} lagged layers proved");
    assert!(proved >= 250, "only {proved}");
}

/// Layers without a mask whose values trail their keys: every row against every key in every
/// step (step 0 a square), by every lag the ring allows, proved exactly with the online work
/// counted; where the stream applies without a lag, every lag takes fewer rescalings.
#[test]
fn lagged_values_without_a_mask_are_proved() {
    let mut proved = 0;
    for (n, m) in [
        (4, 2),
        (8, 2),
        (8, 4),
        (12, 4),
        (16, 4),
        (12, 6),
        (16, 8),
        (24, 8),
    ] {
        for d in [1, 2, 3, 5] {
            for h in [1, 2, 3] {
                let p = problem(n, d, h, false, false, true);
                let plain = schedule_stream::run_with(&p, m, true, Lag::Off).unwrap();
                let lags = (2..=m).filter(|g| g % 2 == 0 && m % g == 0);
                for lag in lags.map(Lag::Steps).chain([Lag::Fit(None)]) {
                    let what = format!("n={n} d={d} h={h} m={m} {lag:?}");
                    let Some((programs, man)) = build(n, d, h, m, false, false, true, lag) else {
                        panic!("{what}: does not apply");
                    };
                    assert_proved(&programs, &man, &what);
                    let lens: Vec<usize> = programs.iter().map(|p| p.bundles.len()).collect();
                    assert!(lens.iter().all(|&l| l == lens[0]), "{what}: {lens:?}");
                    let st = schedule_stream::run_with(&p, m, true, lag).unwrap();
                    if st.lag > 0 {
                        assert!(st.total_ops < plain.total_ops, "{what}");
                        proved += 1;
                    }
                }
            }
        }
    }
    eprintln!("{proved} lagged layers without a mask proved");
    assert!(proved >= 150, "only {proved}");
}

/// Layers whose tokens the ring cannot deal evenly: dealt as if it could, the rows and keys
/// past the end masked (a causal mask hides those keys; without one the padded block's keys
/// are masked where it is computed on); proved exactly (their outputs, the work counts, no read
/// of a word nothing wrote, no word forwarded and not read), with and without lagged values,
/// shared or not, safe or plain.
#[test]
fn ragged_layers_are_proved() {
    let mut proved = 0;
    for m in [1, 2, 3, 4] {
        for n in 2 * m..=8 * m {
            for d in [1, 3] {
                for shared in [false, true] {
                    for causal in [true, false] {
                        for safe in [false, true] {
                            let p = problem(n, d, 2, shared, causal, safe);
                            let per = if causal { 2 * m } else { m };
                            if schedule_stream::unsupported(&p, m).is_some() {
                                assert!(n % per != 0 || n < 2 * per, "n={n} m={m} refused");
                                continue;
                            }
                            let mut lags = vec![Lag::Off, Lag::Fit(None)];
                            if causal && !shared && safe && m % 2 == 0 {
                                lags.push(Lag::Steps(2));
                            }
                            for lag in lags {
                                let (programs, man) =
                                    build(n, d, 2, m, shared, causal, safe, lag).expect("applies");
                                assert_proved(&programs, &man, &format!("n={n} d={d} m={m} shared={shared} causal={causal} safe={safe} {lag:?}"));
                                proved += usize::from(n % per != 0);
                            }
                        }
                    }
                }
            }
        }
    }
    eprintln!("{proved} ragged layers proved");
    assert!(proved >= 300, "only {proved}");
}

/// Builds the layer (it must apply), proves it exactly and checks that every PE's flattened
/// program is as long (the PEs keep in step).
#[allow(clippy::too_many_arguments)] // a layer's shape, spelled out at each call
fn assert_builds_proved(
    n: u32,
    d: u32,
    h: u32,
    m: u32,
    shared: bool,
    causal: bool,
    safe: bool,
    lag: Lag,
    compact: bool,
) {
    let what =
        format!("n={n} d={d} h={h} m={m} shared={shared} causal={causal} safe={safe} {lag:?}");
    let Some((programs, man)) = build_checked(n, d, h, m, shared, causal, safe, lag, compact)
    else {
        panic!("{what}: does not apply");
    };
    assert_proved(&programs, &man, &what);
    let lens: Vec<usize> = programs.iter().map(|p| p.bundles.len()).collect();
    assert!(lens.iter().all(|&l| l == lens[0]), "{what}: {lens:?}");
}

/// Causal layers whose padding takes more than part of the last chunk (some PEs' second chunks
/// short or empty): no hop carries a padded word or a word no PE further on reads, with and
/// without lagged values (every lag the ring allows), shared or not, safe or plain; proved
/// exactly.
#[test]
fn causal_padding_beyond_the_last_chunk_is_proved() {
    let (mut proved, mut empty_chunks) = (0, 0);
    for m in [2u32, 3, 4, 5, 6, 8] {
        for n in 2 * m + 1..=6 * m {
            let chunk = n.div_ceil(2 * m);
            let missing = 2 * m * chunk - n;
            if chunk < 2 || missing < chunk {
                continue;
            }
            empty_chunks += usize::from(missing >= 2 * chunk);
            for d in [1, 3] {
                for h in [1, 2, 3] {
                    for (shared, safe) in [(false, true), (false, false), (true, true)] {
                        let mut lags = vec![Lag::Off, Lag::Fit(None)];
                        if !shared && safe {
                            lags.extend(
                                (2..=m).filter(|g| g % 2 == 0 && m % g == 0).map(Lag::Steps),
                            );
                        }
                        for lag in lags {
                            // The proof without unrolling on every third layer: on all of them
                            // it tripled this test's time (the main grid and the lagged layers
                            // keep it on every layer).
                            let compact = proved % 3 == 0;
                            assert_builds_proved(n, d, h, m, shared, true, safe, lag, compact);
                            proved += 1;
                        }
                    }
                }
            }
        }
    }
    eprintln!("{proved} layers padded beyond the last chunk proved ({empty_chunks} shapes with an empty chunk)");
    assert!(proved >= 500, "only {proved}");
    assert!(empty_chunks >= 5, "only {empty_chunks}");
}

/// Layers without a mask whose padding takes more than part of the last block: the last PEs
/// own no token and only pass blocks on, no block is forwarded past the last PE that computes
/// with it, and a block of padding only leaves the running maximum as it was; proved exactly,
/// shared or not, safe or plain.
#[test]
fn padding_beyond_the_last_block_is_proved() {
    let (mut proved, mut two_empty) = (0, 0);
    for m in [3u32, 5, 6, 8, 10] {
        for n in 1..=4 * m {
            let rows = n.div_ceil(m);
            let empty = (m * rows - n) / rows;
            if empty == 0 {
                continue;
            }
            two_empty += usize::from(empty >= 2);
            for d in [1, 3] {
                for h in [1, 2] {
                    for shared in [false, true] {
                        for safe in [false, true] {
                            for lag in [Lag::Off, Lag::Fit(None)] {
                                assert_builds_proved(n, d, h, m, shared, false, safe, lag, true);
                                proved += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    eprintln!("{proved} layers padded beyond the last block proved ({two_empty} shapes with two empty PEs or more)");
    assert!(proved >= 300, "only {proved}");
    assert!(two_empty >= 3, "only {two_empty}");
}

/// `(pe, index)` of every bundle whose op satisfies `f`.
fn find(programs: &[Program], f: impl Fn(&isa::Arith) -> bool) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for (pe, p) in programs.iter().enumerate() {
        for (i, b) in p.bundles.iter().enumerate() {
            if let Op::Arith(x) = b.op {
                if f(&x) {
                    out.push((pe, i));
                }
            }
        }
    }
    out
}

fn arith(programs: &[Program], at: (usize, usize)) -> isa::Arith {
    match programs[at.0].bundles[at.1].op {
        Op::Arith(x) => x,
        Op::Nop => panic!("not an op"),
    }
}

/// Applies `edit` to the op of each chosen bundle in turn (up to `limit`, spread over the
/// program) and requires every mutant to be rejected.
fn each_rejected(
    programs: &[Program],
    man: &Manifest,
    base: &Report,
    what: &str,
    sites: Vec<(usize, usize)>,
    edit: impl Fn(isa::Arith) -> Op,
) -> usize {
    assert!(!sites.is_empty(), "no site for {what}");
    let step = sites.len().div_ceil(12).max(1);
    let mut n = 0;
    for &at in sites.iter().step_by(step) {
        let mut p = programs.to_vec();
        let new = edit(arith(programs, at));
        if new == programs[at.0].bundles[at.1].op {
            continue;
        }
        p[at.0].bundles[at.1].op = new;
        let r = verify(&p, man);
        assert!(
            r.counts != base.counts,
            "{what} at PE {}, bundle {} `{}` was accepted",
            at.0,
            at.1,
            p[at.0].bundles[at.1]
        );
        n += 1;
    }
    n
}

#[test]
fn corrupted_stream_bundles_are_rejected() {
    let cases = [
        (8, 2, 1, 2, false, false),
        (8, 3, 2, 2, false, true),
        (12, 2, 1, 3, true, false),
        (16, 2, 1, 2, true, true),
        (16, 4, 1, 4, false, true),
    ];
    for (n, d, h, m, shared, causal) in cases {
        for safe in [false, true] {
            let (programs, man) =
                build(n, d, h, m, shared, causal, safe, Lag::Off).expect("applies");
            let base = verify(&programs, &man);
            assert_eq!(base.counts, BTreeMap::new(), "{base}");
            let base = &base;
            let mem = programs[0].mem_words;
            // Phase-1 and phase-3 products (no destination): a wrong operand address.
            let products = find(&programs, |x| x.kind == OpKind::Mul && x.dst.is_none());
            each_rejected(
                &programs,
                &man,
                base,
                "a product on a wrong operand",
                products.clone(),
                |x| Op::mul(x.a, (x.b + 1) % mem, x.dst),
            );
            each_rejected(
                &programs,
                &man,
                base,
                "a product on a swapped-in operand",
                products,
                |x| Op::mul(x.b, x.b, x.dst),
            );
            // The final divisions: a wrong denominator.
            let divs = find(&programs, |x| x.kind == OpKind::Div);
            each_rejected(
                &programs,
                &man,
                base,
                "a division by the wrong sum",
                divs,
                |x| Op::div(x.a, x.a, x.dst),
            );
            if !safe {
                continue;
            }
            // A running maximum that misses a score.
            let maxes = find(&programs, |x| x.kind == OpKind::Max && x.a != x.b);
            each_rejected(
                &programs,
                &man,
                base,
                "a max missing a score",
                maxes.clone(),
                |x| Op::max(x.a, x.a, x.dst),
            );
            each_rejected(&programs, &man, base, "a dropped max", maxes, |_| Op::Nop);
            // Exponentials (`expd x, M -> x`): a bias that is not the running maximum, or none.
            let exps = find(&programs, |x| x.kind == OpKind::Expd && x.dst == Some(x.a));
            each_rejected(
                &programs,
                &man,
                base,
                "an expd biased by its own score",
                exps.clone(),
                |x| Op::expd(x.a, x.a, x.imm, x.dst),
            );
            each_rejected(&programs, &man, base, "a dropped bias", exps, |x| {
                Op::exp(x.a, x.imm, x.dst)
            });
            // Rescale factors (`expd M_old, M_new -> f`): swapped, or the scale changed.
            let factors = find(&programs, |x| x.kind == OpKind::Expd && x.dst != Some(x.a));
            each_rejected(
                &programs,
                &man,
                base,
                "a swapped rescale factor",
                factors.clone(),
                |x| Op::expd(x.b, x.a, x.imm, x.dst),
            );
            each_rejected(
                &programs,
                &man,
                base,
                "a rescale factor of another scale",
                factors,
                |x| Op::expd(x.a, x.b, x.imm * 2.0, x.dst),
            );
            // Rescaled partial sums (`mul l, f -> l`, `mul y, f -> y`): dropped, or squared.
            let rescales = find(&programs, |x| x.kind == OpKind::Mul && x.dst == Some(x.a));
            each_rejected(
                &programs,
                &man,
                base,
                "a dropped rescale",
                rescales.clone(),
                |_| Op::Nop,
            );
            each_rejected(
                &programs,
                &man,
                base,
                "a rescale by the partial sum",
                rescales,
                |x| Op::mul(x.a, x.a, x.dst),
            );
        }
    }
}

#[test]
fn the_manifest_must_declare_the_online_work_exactly() {
    let (programs, man) = build(8, 2, 1, 2, false, false, true, Lag::Off).expect("applies");
    assert!(verify(&programs, &man).is_ok());
    assert!(man.ops.online_rescale > 0);
    for delta in [-1i64, 1] {
        let mut bad = man.clone();
        bad.ops.online_rescale = (bad.ops.online_rescale as i64 + delta) as u64;
        let r = verify(&programs, &bad);
        assert!(r.counts.contains_key(&Invariant::OpCount), "{r}");
    }
    // Deferred normalisation is only accepted from a manifest that declares it (with the
    // per-weight counts it then must claim, the programs are too short for that formulation).
    let mut classic = man.clone();
    classic.normalisation = runtime::layer::Normalisation::PerWeight;
    let r = verify(&programs, &classic);
    assert!(!r.is_ok(), "{r}");
    let shape = runtime::layer::Shape {
        heads: 1,
        tokens: 8,
        dim: 2,
        shared: false,
        causal: false,
        softmax: runtime::layer::Softmax::Safe,
    };
    classic.necessary_ops = shape.necessary().unwrap().total();
    classic.lower_bound = shape.lower_bound(2).unwrap();
    classic.bound = shape.bound(2, runtime::layer::Normalisation::PerWeight);
    let r = verify(&programs, &classic);
    assert!(r.counts.contains_key(&Invariant::OpCount), "{r}");
    // A wrong mask or sharing is a different layer.
    let mut unmasked = man.clone();
    unmasked.layer.mask = "none".into();
    unmasked.necessary_ops = 0;
    assert!(!verify(&programs, &unmasked).is_ok());
}

#[test]
fn a_stream_run_against_the_wrong_mask_is_masked_or_wrong() {
    // The unmasked program checked as if the layer were causal computes masked work: products
    // of masked keys (separate), or weighted values of a masked key (shared: the exponential
    // itself is another row's).
    for (shared, safe) in [(false, true), (false, false), (true, false), (true, true)] {
        let p = problem(8, 2, 1, shared, false, safe);
        let st = schedule_stream::run(&p, 2, safe).expect("applies");
        let programs: Vec<Program> = flattened(&st.programs);
        let mut man = stream_manifest(&p, 2, &st);
        let causal = problem(8, 2, 1, shared, true, safe);
        let cst = schedule_stream::run(&causal, 2, safe).expect("applies");
        let cman = stream_manifest(&causal, 2, &cst);
        man.layer.mask = "causal".into();
        man.necessary_ops = cman.necessary_ops;
        man.lower_bound = cman.lower_bound;
        man.bound = cman.bound;
        let r = verify(&programs, &man);
        assert!(!r.is_ok());
        if !(shared && safe) {
            assert!(r.counts.contains_key(&Invariant::Masked), "{r}");
        }
    }
}

#[test]
fn affine_layouts_that_do_not_cover_the_layer_are_refused_without_panicking() {
    let (programs, man) = build(8, 2, 1, 2, false, true, true, Lag::Off).expect("applies");
    let edits: [fn(&mut runtime::manifest::Layout); 4] = [
        |l| l.rows_per_pe = 0,
        |l| l.rows_per_pe = 3,
        |l| l.rows_per_pe += 2,
        |l| l.base = u32::MAX - 1,
    ];
    for edit in edits {
        let mut bad = man.clone();
        for p in bad.inputs.values_mut() {
            if let Some(l) = p.layout.as_mut() {
                edit(l);
            }
        }
        let r = verify(&programs, &bad);
        assert!(r.counts.contains_key(&Invariant::Manifest), "{r}");
    }
    // A layout and explicit entries at once is ambiguous.
    let mut both = man.clone();
    if let Some(p) = both.outputs.get_mut("y") {
        p.pe = vec![0];
        p.addr = vec![0];
    }
    let r = verify(&programs, &both);
    assert!(r.counts.contains_key(&Invariant::Manifest), "{r}");
}

#[test]
fn the_statement_names_the_online_formulation() {
    let (programs, man) = build(8, 2, 2, 2, true, false, true, Lag::Off).expect("applies");
    let r = verify(&programs, &man);
    let proved = r.proved.clone().unwrap_or_default();
    eprintln!("{r}");
    assert!(proved.contains("online"), "{r}");
    assert!(
        proved.contains(&format!("{} running-maximum", man.ops.online_rescale)),
        "{r}"
    );
    assert_eq!(
        r.to_json()["stats"]["ops"]["rescale"],
        man.ops.online_rescale
    );
}

/// The paired programs of `h` heads of width `d` on `m` PEs, blocks of `b` tokens, `pad` short of
/// dealing evenly: the products the manifest declares, the PEs in lockstep, the checks without
/// unrolling clean and the flattened programs proved. Returns them and the layer.
fn assert_paired_proved(
    m: u32,
    b: u32,
    d: u32,
    h: u32,
    pad: u32,
) -> (schedule_stream::Stream, Problem) {
    use schedule_stream::Pairing;
    let (f, g) = (b / 2, b - b / 2);
    // `pad` tokens short of dealing evenly: the last PE's block is padded.
    let n = b * m - pad;
    let what = format!("n={n} d={d} h={h} m={m}");
    let p = problem(n, d, h, true, false, true);
    let st = schedule_stream::run_pairing(&p, m, true, Lag::Fit(None), Pairing::On)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let distinct = u64::from(n) * u64::from(n + 1) / 2 * u64::from(d * h);
    let twice = |k: u32| k * k.saturating_sub(1) / 2;
    // Every PE does its two diagonal quarters (`f` and `g` rows) in full; the last PE's padded
    // block keeps the part laid out first whole (the `g` rows where it keeps them and two more)
    // and the live rest of the other.
    let (first, second) = if b - pad >= g + 2 { (g, f) } else { (f, g) };
    let own =
        u64::from(((m - 1) * (twice(f) + twice(g)) + twice(first) + twice(second - pad)) * d * h);
    assert_eq!(st.ops.phase1_mac, distinct + own, "{what}");
    let cycles: Vec<u64> = st.programs.iter().map(|q| q.cycles()).collect();
    assert!(
        cycles.iter().all(|&c| c == cycles[0]),
        "{what}: PEs out of lockstep {cycles:?}"
    );
    let flat: Vec<Program> = flattened(&st.programs);
    let man = stream_manifest(&p, m, &st);
    assert_compact_clean(&st.programs, &man, &what);
    assert_proved(&flat, &man, &what);
    (st, p)
}

/// Shared layers without a mask whose score blocks are computed once for both rows they serve
/// (the travelling state merged at home), on odd and even rings, proved exactly; the counts
/// declare the own blocks' products twice and nothing else beyond the distinct ones.
#[test]
fn paired_shared_scores_are_proved() {
    use schedule_stream::Pairing;
    let mut proved = 0;
    for m in [3, 4, 5, 6, 8] {
        for b in [4, 5, 6, 7, 8] {
            // The halves of a block: the second is the larger when `b` is odd.
            let g = b - b / 2;
            for d in [1, 2, 3, 4] {
                for (h, pad) in [(1, 0), (2, 0), (1, 1), (1, g - 2)] {
                    // The last block keeps two tokens of its second half.
                    if h == 2 && (b > 4 || m > 4) || pad > 0 && (d > 3 || pad > g - 2) {
                        continue;
                    }
                    let (st, p) = assert_paired_proved(m, b, d, h, pad);
                    let n = p.tokens;
                    let plain =
                        schedule_stream::run_pairing(&p, m, true, Lag::Fit(None), Pairing::Off)
                            .unwrap();
                    if b >= 8 && d >= 3 {
                        assert!(
                            st.cycles < plain.cycles,
                            "n={n} m={m} d={d}: paired {} not below {}",
                            st.cycles,
                            plain.cycles
                        );
                    }
                    proved += 1;
                }
            }
        }
    }
    eprintln!("{proved} paired layers proved");
    assert!(proved >= 100, "only {proved} paired layers");
}

/// Paired shared layers on rings of 10 and 12 PEs (long runs of low and high steps, the padded
/// block's step inside them), dealt evenly and padded, with the `G` part of each block first
/// and not, proved exactly with the own blocks' products counted as above.
#[test]
fn paired_scores_on_long_rings_are_proved() {
    let mut proved = 0;
    for (m, b, d, h, pad) in [
        (12u32, 4u32, 1u32, 1u32, 0u32),
        (12, 6, 2, 1, 1),
        (12, 7, 1, 2, 1),
        (12, 8, 1, 1, 2),
        (12, 5, 2, 1, 1),
        (12, 9, 1, 1, 2),
        (10, 6, 2, 1, 1),
        (10, 8, 1, 1, 0),
        (10, 7, 1, 1, 2),
    ] {
        assert_paired_proved(m, b, d, h, pad);
        proved += 1;
    }
    assert_eq!(proved, 9);
}

/// Paired shared layers of three heads or more under a memory limit that only the reuse of
/// idle heads' regions meets (the visiting block and the travelling rows live there), proved,
/// dealt evenly and padded; every head runs in one head loop (the regions are affine in the
/// head), so the program is not much larger than with buffers of its own.
#[test]
fn paired_scores_in_idle_heads_regions_are_proved() {
    use schedule_stream::Pairing;
    let mut proved = 0;
    for (m, b, d, h, pad) in [
        (3, 4, 2, 3, 0),
        (4, 6, 3, 3, 0),
        (5, 4, 1, 4, 0),
        (4, 8, 2, 4, 0),
        (6, 4, 3, 3, 0),
        (4, 4, 2, 5, 0),
        (8, 4, 1, 3, 0),
        (3, 6, 2, 4, 1),
        (4, 7, 2, 3, 1),
        (6, 5, 1, 4, 1),
        (4, 8, 1, 3, 2),
        (5, 6, 2, 3, 1),
    ] {
        let n = b * m - pad;
        let p = problem(n, d, h, true, false, true);
        let own = schedule_stream::run_pairing(&p, m, true, Lag::Fit(None), Pairing::On).unwrap();
        let words = own.programs[0].mem_words;
        let limit = words - 2 * b * d;
        let st = schedule_stream::run_pairing(&p, m, true, Lag::Fit(Some(limit)), Pairing::On)
            .unwrap_or_else(|e| panic!("n={n} m={m}: {e}"));
        assert!(st.programs.iter().all(|q| q.mem_words == limit));
        assert_eq!(st.cycles, own.cycles, "n={n} m={m} d={d} h={h}");
        for (q, o) in st.programs.iter().zip(&own.programs) {
            assert_eq!(q.body.len(), 1, "n={n} m={m} d={d} h={h}: one head loop");
            // The moving regions add a head term to some addresses, not a copy of the loop.
            let (reused, owned) = (
                isa::looped_binary::encoded_len(q),
                isa::looped_binary::encoded_len(o),
            );
            assert!(
                2 * reused < 3 * owned,
                "n={n} m={m} d={d} h={h}: PE {} {reused} bytes against {owned} with its own buffers",
                q.pe
            );
        }
        let flat: Vec<Program> = flattened(&st.programs);
        let man = stream_manifest(&p, m, &st);
        assert_compact_clean(&st.programs, &man, &format!("n={n} d={d} h={h} m={m}"));
        let r = verify(&flat, &man);
        assert_eq!(r.counts, BTreeMap::new(), "n={n} d={d} h={h} m={m}:\n{r}");
        // One word less is refused.
        assert!(
            schedule_stream::run_pairing(&p, m, true, Lag::Fit(Some(limit - 1)), Pairing::On)
                .is_err()
        );
        proved += 1;
    }
    assert_eq!(proved, 12);
}

/// Separate layers without a mask on rings that do not divide the tokens, dealt unevenly (rows
/// cut where the even share ends, the two parts of a cut row merged over the link, or the first
/// part's scores passed on to the second): proved exactly, the merges declared as the online
/// work; every PE's program as long as the layer's cycles; and below the padded deal's cycles.
#[test]
fn uneven_deals_are_proved() {
    let mut proved = 0;
    let mut merged = 0;
    let mut passed = 0;
    for (n, m) in [
        (9, 2),
        (13, 3),
        (14, 3),
        (17, 4),
        (18, 4),
        (19, 4),
        (22, 5),
        (26, 6),
        (29, 6),
        (30, 7),
        (35, 8),
        (45, 8),
        (52, 12),
    ] {
        for d in [1, 2, 3, 8] {
            for h in [1, 2, 3] {
                if h > 1 && d > 3 {
                    continue;
                }
                let what = format!("n={n} d={d} h={h} m={m}");
                let p = problem(n, d, h, false, false, true);
                let st =
                    schedule_stream::run_uneven(&p, m).unwrap_or_else(|e| panic!("{what}: {e}"));
                for lp in &st.programs {
                    assert_eq!(lp.cycles(), st.cycles, "{what}: PE {}", lp.pe);
                }
                let man = stream_manifest(&p, m, &st);
                assert!(
                    man.inputs["q"].layout.is_none()
                        && man.inputs["q"].pe.len() == (n * d * h) as usize,
                    "{what}: placements listed per element"
                );
                let padded = schedule_stream::run_with(&p, m, true, Lag::Off).unwrap();
                assert!(
                    st.cycles < padded.cycles,
                    "{what}: {} against {}",
                    st.cycles,
                    padded.cycles
                );
                // What `compile --schedule stream --mem …` takes where the words allow.
                let chosen = schedule_stream::run_with(&p, m, true, Lag::Fit(Some(u32::MAX)));
                assert_eq!(chosen.unwrap().cycles, st.cycles, "{what}");
                // Each merged cut row's merge: 1 exponential, d + 1 products; a passed one has
                // none.
                let cuts = (1..m).filter(|&p| p * n % m != 0).count() as u64;
                let rescale = u64::from(h * (d + 2));
                assert!(man.ops.online_rescale.is_multiple_of(rescale), "{what}");
                assert!(man.ops.online_rescale <= cuts * rescale, "{what}");
                merged += usize::from(man.ops.online_rescale > 0);
                passed += usize::from(man.ops.online_rescale < cuts * rescale);
                let flat: Vec<Program> = flattened(&st.programs);
                assert_proved(&flat, &man, &what);
                proved += 1;
            }
        }
    }
    // 64 tokens, `d = 64` on 6 PEs: every cut row passed, rows handed where a first part
    // would hold more than half a row (each moves a token's y to the next PE, as a cut row
    // does), first parts leaving maxima loose.
    let p = problem(64, 64, 1, false, false, true);
    let st = schedule_stream::run_uneven(&p, 6).unwrap();
    let man = stream_manifest(&p, 6, &st);
    assert_eq!(man.ops.online_rescale, 0, "every cut row passed");
    let (q, y) = (&man.inputs["q"].pe, &man.outputs["y"].pe);
    let moved = q.iter().zip(y).filter(|(a, b)| a != b).count();
    assert_eq!(moved, 6 * 64, "4 cut rows and 2 handed rows");
    let flat: Vec<Program> = flattened(&st.programs);
    assert_proved(&flat, &man, "n=64 d=64 m=6");
    // 64 tokens, `d = 128`: every row divides its 64 weights instead of its 128 outputs, which
    // needs every cut passed.
    let p = problem(64, 128, 1, false, false, true);
    let st = schedule_stream::run_uneven(&p, 6).unwrap();
    let man = stream_manifest(&p, 6, &st);
    assert_eq!(man.normalisation, Normalisation::PerWeight);
    assert_eq!((man.ops.online_rescale, man.ops.phase2_div), (0, 64 * 64));
    let flat: Vec<Program> = flattened(&st.programs);
    assert_proved(&flat, &man, "n=64 d=128 m=6");
    // 64 tokens on 12 PEs (blocks of 5 and 6 tokens): a PE with a passed first part or a
    // handed row would run ahead of the next one in the ring pass and leave it waiting for
    // blocks; with score nests deferred past the pass and first parts taking two keys of step
    // 0, every cut row is passed and the layer comes within a cycle of its bound with `d = 64`
    // and 23 cycles of the per-weight bound with `d = 128`.
    for (d, norm, over) in [
        (64, Normalisation::Deferred, 1),
        (128, Normalisation::PerWeight, 23),
    ] {
        let what = format!("n=64 d={d} m=12");
        let p = problem(64, d, 1, false, false, true);
        let st = schedule_stream::run_uneven(&p, 12).unwrap();
        let man = stream_manifest(&p, 12, &st);
        assert_eq!(man.normalisation, norm, "{what}");
        assert_eq!(man.ops.online_rescale, 0, "{what}: every cut row passed");
        let lb = p.shape().lower_bound_as(12, norm).unwrap();
        assert!(st.cycles <= lb + over, "{what}: {} against {lb}", st.cycles);
        let flat: Vec<Program> = flattened(&st.programs);
        assert_proved(&flat, &man, &what);
    }
    eprintln!("{proved} uneven layers proved, {merged} merging and {passed} passing cut rows");
    assert_eq!(proved, 13 * (3 * 3 + 1), "layers proved");
    assert!(merged > 0 && passed > 0, "both kinds of cut row proved");
}

/// Taking a cut row's merge out of the programs (its first part's `y` left out) is caught.
#[test]
fn uneven_deal_without_a_merge_is_rejected() {
    let p = problem(26, 3, 2, false, false, true);
    let st = schedule_stream::run_uneven(&p, 6).unwrap();
    let (man, mut flat) = proved_original(&p, 6, &st);
    // PE 1 holds the second part of the row cut at 26/6: its merge's rescaled `y` sums,
    // `mul rcv, f1 | add y -> y`, are its last acc-carrying bundles before its divisions.
    let pe = 1;
    let at = flat[pe]
        .bundles
        .iter()
        .rposition(|b| b.acc != isa::Acc::Nop && b.op.kind() == Some(OpKind::Mul))
        .unwrap();
    flat[pe].bundles[at] = isa::Bundle::NOP;
    let r = verify(&flat, &man);
    assert!(!r.is_ok(), "a merge taken out was proved");
}

#[test]
fn one_division_per_weight_is_proved() {
    // The whole ring's lag dividing each weight by its row's sum: proved flattened against
    // the per-weight formulation the manifest declares, with exactly its operations; the
    // checks without unrolling find nothing wrong.
    let mut proved = 0;
    for (n, d, h, m, causal) in [
        (4, 8, 1, 2, false),
        (8, 12, 2, 4, false),
        (12, 16, 1, 2, false),
        (6, 7, 2, 2, false),
        (8, 40, 2, 4, false),
        (16, 20, 1, 8, false),
        (20, 24, 3, 4, false),
    ] {
        let what = format!("n={n} d={d} h={h} m={m} causal={causal}");
        let (programs, man) = build_checked(n, d, h, m, false, causal, true, Lag::PerWeight, false)
            .unwrap_or_else(|| panic!("{what}: does not apply"));
        assert_eq!(man.normalisation, runtime::layer::Normalisation::PerWeight);
        assert_proved(&programs, &man, &what);
        let st = schedule_stream::run_with(
            &problem(n, d, h, false, causal, true),
            m,
            true,
            Lag::PerWeight,
        )
        .unwrap();
        let c = verifier::compact::check_loops(&st.programs, &man, &Options::default());
        assert_eq!(c.counts, BTreeMap::new(), "{what}: compact:\n{c}");
        // The proofs without unrolling cover the deferred formulation: here they decline
        // (said, not guessed), so such a layer past the flattening limit is reported not
        // proved.
        let p = verifier::compact::prove_loops(&st.programs, &man, &Options::default());
        assert!(
            !p.proved(),
            "{what}: proved without unrolling: {:?}",
            p.outcome
        );
        proved += 1;
    }
    assert_eq!(proved, 7);
}

/// The `d` of the carried schedule's test layers for blocks of `b` tokens on `m` PEs: the
/// smallest with `d` a multiple of `b/2` and `d ≥ 2d/b + m` (the forwarding's room on the
/// score chains).
fn carried_dims(b: u32, m: u32) -> impl Iterator<Item = u32> {
    (1..).filter(move |&d| (2 * d) % b == 0 && d >= 2 * d / b + m)
}

#[test]
fn carried_scores_are_proved() {
    use runtime::layer::Normalisation;
    let mut proved = 0;
    let mut heads = [1, 2, 3, 4].into_iter().cycle();
    for m in [4, 6, 8] {
        for b in [4, 6, 8] {
            // Deferred with the two smallest dims; one division per weight past the tokens.
            let n = m * b;
            let mut dims: Vec<(u32, bool)> =
                carried_dims(b, m).take(2).map(|d| (d, false)).collect();
            if m == 4 {
                dims.extend(carried_dims(b, m).find(|&d| d > n).map(|d| (d, true)));
            }
            for (d, per_weight) in dims {
                let h = heads.next().unwrap();
                let what = format!("n={n} d={d} h={h} m={m} per_weight={per_weight}");
                let p = problem(n, d, h, true, false, true);
                let st = schedule_stream::run_carried(&p, m, per_weight)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                let norm = if per_weight {
                    Normalisation::PerWeight
                } else {
                    Normalisation::Deferred
                };
                assert_eq!(st.normalisation, norm, "{what}");
                // Every distinct score once.
                let distinct = u64::from(n) * u64::from(n + 1) / 2 * u64::from(d * h);
                assert_eq!(st.ops.phase1_mac, distinct, "{what}");
                let cycles: Vec<u64> = st.programs.iter().map(|q| q.cycles()).collect();
                assert!(
                    cycles.iter().all(|&c| c == cycles[0]),
                    "{what}: PEs out of lockstep {cycles:?}"
                );
                // At the formulation's lower bound: nothing rescaled, nothing merged, no PE idle.
                assert_eq!(Some(st.cycles), p.shape().lower_bound_as(m, norm), "{what}");
                let man = stream_manifest(&p, m, &st);
                assert_eq!(man.ops.online_rescale, 0, "{what}");
                let flat: Vec<Program> = flattened(&st.programs);
                assert_compact_clean(&st.programs, &man, &what);
                assert_proved(&flat, &man, &what);
                proved += 1;
            }
        }
    }
    eprintln!("{proved} carried layers proved");
    assert!(proved >= 20, "only {proved} carried layers");
}

#[test]
fn carried_scores_are_chosen_where_they_apply_and_others_proved_where_not() {
    // With room to spare the stream builder keeps the carried programs (each distinct score
    // once, no online work); odd token counts and blocks that do not deal evenly are refused
    // by them and left to the other streams, which are proved as before.
    let p = problem(32, 8, 2, true, false, true);
    let st = schedule_stream::run_with(&p, 4, true, Lag::Fit(Some(u32::MAX))).unwrap();
    assert_eq!(st.ops.phase1_mac, 32 * 33 / 2 * 8 * 2);
    assert_eq!(stream_manifest(&p, 4, &st).ops.online_rescale, 0);
    for (n, d, h, m) in [(15, 8, 1, 4), (21, 9, 2, 4), (17, 8, 1, 4), (30, 10, 1, 4)] {
        let what = format!("n={n} d={d} h={h} m={m}");
        let p = problem(n, d, h, true, false, true);
        assert!(
            schedule_stream::run_carried(&p, m, false).is_err(),
            "{what}: carried"
        );
        let st = schedule_stream::run_with(&p, m, true, Lag::Fit(Some(u32::MAX))).unwrap();
        let man = stream_manifest(&p, m, &st);
        // These rings do not divide the tokens: the mirrored deal (placements listed per
        // element, nothing rescaled) where it takes fewer cycles, else a stream with online work.
        let mirrored = man.inputs["x"].layout.is_none();
        if mirrored {
            let m_st = schedule_stream::run_mirrored(&p, m).unwrap();
            assert_eq!(m_st.cycles, st.cycles, "{what}: the mirrored deal");
            assert_eq!(man.ops.online_rescale, 0, "{what}: online work");
        } else {
            assert!(man.ops.online_rescale > 0, "{what}: no online work");
        }
        let flat: Vec<Program> = flattened(&st.programs);
        assert_proved(&flat, &man, &what);
    }
}

#[test]
fn one_division_per_weight_under_a_causal_mask_is_proved() {
    // Each PE's first row sees one score in step 0; its maximum starts from that score in the
    // first step that brings it more keys (PE 0's never does: the score is its own maximum),
    // so the programs execute exactly the per-weight formulation's operations and declare no
    // online work. Proved flattened over even and padded deals on five ring sizes (one group
    // holds the whole ring, so an odd one serves too), one to four heads; dealt evenly they run
    // at the lower bound.
    let mut proved = 0;
    let mut at_bound = 0;
    let mut case = 0u32;
    for m in [2u32, 3, 4, 6, 8] {
        for n in [4 * m, 4 * m + 1, 4 * m + 3, 6 * m - 1, 6 * m] {
            for d in [2u32, 5] {
                case += 1;
                let h = 1 + case % 4;
                let what = format!("n={n} d={d} h={h} m={m}");
                let (programs, man) =
                    build_checked(n, d, h, m, false, true, true, Lag::PerWeight, false)
                        .unwrap_or_else(|| panic!("{what}: does not apply"));
                assert_eq!(
                    man.normalisation,
                    runtime::layer::Normalisation::PerWeight,
                    "{what}"
                );
                assert_eq!(man.ops.online_rescale, 0, "{what}");
                assert_proved(&programs, &man, &what);
                let maxes = find(&programs, |x| x.kind == OpKind::Max).len() as u64;
                let weights = u64::from(h) * u64::from(n) * u64::from(n + 1) / 2;
                assert_eq!(maxes, weights - u64::from(h * n), "{what}");
                if n % (2 * m) == 0 {
                    let total = weights * (2 * u64::from(d) + 3) - u64::from(h * n);
                    assert_eq!(man.cycles, total.div_ceil(u64::from(m)), "{what}");
                    at_bound += 1;
                }
                proved += 1;
            }
        }
    }
    assert_eq!((proved, at_bound), (50, 20));
}

#[test]
fn a_causal_per_weight_maximum_started_wrongly_is_rejected() {
    // The maxima that start a row (their first operand is not their destination): starting
    // from the running maximum's word instead, which nothing wrote, or from one score only,
    // must each be caught.
    for (n, d, h, m) in [(16, 3, 1, 2), (17, 2, 2, 4), (24, 2, 1, 6)] {
        let what = format!("n={n} d={d} h={h} m={m}");
        let (programs, man) = build_checked(n, d, h, m, false, true, true, Lag::PerWeight, false)
            .unwrap_or_else(|| panic!("{what}: does not apply"));
        let base = verify(&programs, &man);
        assert_eq!(base.counts, BTreeMap::new(), "{what}: {base}");
        let starts = find(&programs, |x| x.kind == OpKind::Max && x.dst != Some(x.a));
        // Every PE starts its rows: the triangle's rows 1.. on all, row 0 from step 1 on all
        // but PE 0.
        let pes: std::collections::BTreeSet<usize> = starts.iter().map(|s| s.0).collect();
        assert_eq!(pes.len(), m as usize, "{what}");
        let n1 = each_rejected(
            &programs,
            &man,
            &base,
            &format!("{what}: a maximum started from its unwritten word"),
            starts.clone(),
            |x| Op::max(x.dst.unwrap_or(x.a), x.b, x.dst),
        );
        let n2 = each_rejected(
            &programs,
            &man,
            &base,
            &format!("{what}: a maximum started from one score"),
            starts,
            |x| Op::max(x.b, x.b, x.dst),
        );
        assert!(n1 >= 6 && n2 >= 6, "{what}: {n1} {n2}");
        // The starts from a row's step-0 score (not the first two scores of the row, which
        // lie side by side): one per head on every PE but PE 0, each mutant caught.
        let peeled = find(&programs, |x| {
            x.kind == OpKind::Max && x.dst != Some(x.a) && x.b != x.a + 1
        });
        assert_eq!(peeled.len(), (h * (m - 1)) as usize, "{what}");
        assert!(peeled.iter().all(|s| s.0 != 0), "{what}");
        for edit in [
            |x: isa::Arith| Op::max(x.dst.unwrap_or(x.a), x.b, x.dst),
            |x: isa::Arith| Op::max(x.b, x.b, x.dst),
            |x: isa::Arith| Op::max(x.a, x.a, x.dst),
        ] {
            let k = each_rejected(&programs, &man, &base, &what, peeled.clone(), edit);
            assert_eq!(k, peeled.len(), "{what}");
        }
    }
}

/// Causal layers on rings that do not deal the tokens in `2m` equal chunks, dealt whole rows
/// (zigzag over periods from the last token, the first rows to the least loaded PE, every k/v
/// row of a head kept): proved exactly, with one operation beyond the formulation's per head
/// (token 0's maximum, a copy of its only score); every PE's program as long as the layer.
#[test]
fn whole_rows_under_a_causal_mask_are_proved() {
    let mut proved = 0;
    for (n, m) in [
        (13, 3),
        (16, 3),
        (20, 3),
        (17, 4),
        (19, 4),
        (30, 4),
        (22, 5),
        (27, 5),
        (26, 6),
        (29, 6),
        (30, 7),
        (35, 8),
        (37, 8),
        (41, 9),
        (44, 10),
        (50, 12),
        (53, 12),
    ] {
        for d in [1, 2, 5, 8] {
            for h in [1, 2, 3] {
                if h > 1 && d > 2 {
                    continue;
                }
                let what = format!("n={n} d={d} h={h} m={m}");
                let p = problem(n, d, h, false, true, true);
                let st = schedule_stream::run_whole_as(&p, m, Normalisation::Deferred)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                for lp in &st.programs {
                    assert_eq!(lp.cycles(), st.cycles, "{what}: PE {}", lp.pe);
                }
                let man = stream_manifest(&p, m, &st);
                assert!(
                    man.inputs["q"].layout.is_none()
                        && man.inputs["q"].pe.len() == (n * d * h) as usize,
                    "{what}: placements listed per element"
                );
                assert_eq!(man.ops.online_rescale, u64::from(h), "{what}");
                let flat: Vec<Program> = flattened(&st.programs);
                assert_proved(&flat, &man, &what);
                proved += 1;
            }
        }
    }
    eprintln!("{proved} whole-row layers proved");
    assert_eq!(proved, 17 * (2 * 3 + 2), "layers proved");
}

/// Whole rows dividing each weight by its row's sum (one division per key, before the values)
/// instead of each output element: proved exactly, with no operation beyond the per-weight
/// formulation's (token 0's exponential takes its only score as its maximum), over rings of 3 to
/// 12 PEs and `d` on both sides of where it takes fewer divisions.
#[test]
fn whole_rows_dividing_each_weight_are_proved() {
    let mut proved = 0;
    for (n, m) in [
        (13, 3),
        (19, 4),
        (27, 5),
        (29, 6),
        (26, 6),
        (37, 8),
        (50, 12),
        (53, 12),
    ] {
        for d in [1, 4, 16, 40] {
            for h in [1, 2, 4] {
                if h > 1 && d > 4 && (h == 2 || m != 6 && m != 12) {
                    continue;
                }
                let what = format!("n={n} d={d} h={h} m={m}");
                let p = problem(n, d, h, false, true, true);
                let st = schedule_stream::run_whole_as(&p, m, Normalisation::PerWeight)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(st.normalisation, Normalisation::PerWeight, "{what}");
                for lp in &st.programs {
                    assert_eq!(lp.cycles(), st.cycles, "{what}: PE {}", lp.pe);
                }
                let man = stream_manifest(&p, m, &st);
                assert_eq!(man.ops.online_rescale, 0, "{what}");
                let weights = u64::from(n * (n + 1) / 2 * h);
                assert_eq!(man.ops.phase2_div, weights, "{what}");
                let flat: Vec<Program> = flattened(&st.programs);
                assert_proved(&flat, &man, &what);
                proved += 1;
            }
        }
    }
    eprintln!("{proved} whole-row layers dividing each weight proved");
    assert_eq!(proved, 8 * (6 + 2) + 4 * 2, "layers proved");
}

/// Whole rows dividing each weight, with one weight's division taken out or a row's
/// exponential reading another word as its maximum, are caught.
#[test]
fn whole_rows_per_weight_with_a_division_or_a_maximum_wrong_are_rejected() {
    let (n, m) = (29, 6);
    let p = problem(n, 4, 2, false, true, true);
    let st = schedule_stream::run_whole_as(&p, m, Normalisation::PerWeight).unwrap();
    let (man, flat) = proved_original(&p, m, &st);
    for pe in 0..m as usize {
        let divs: Vec<usize> = (0..flat[pe].bundles.len())
            .filter(|&i| flat[pe].bundles[i].op.kind() == Some(OpKind::Div))
            .collect();
        let mut cut = flat.clone();
        cut[pe].bundles[divs[divs.len() / 2]].op = Op::Nop;
        assert!(
            !verify(&cut, &man).is_ok(),
            "PE {pe}: a division taken out was proved"
        );
    }
    // Every PE's maxima feed its exponentials: token 0's row (PE 0's first local row) takes
    // its score as its own maximum; a maximum taken out of any row leaves a wrong one.
    let mut cut = flat;
    let at = cut[3]
        .bundles
        .iter()
        .rposition(|b| b.op.kind() == Some(OpKind::Max))
        .unwrap();
    cut[3].bundles[at].op = Op::Nop;
    assert!(
        !verify(&cut, &man).is_ok(),
        "a maximum taken out was proved"
    );
}

/// Whole rows normalising per row (each weight divided where the row has fewer keys than `d`,
/// each output element in the others): proved exactly, with the one copy per head (token 0's
/// maximum) as online work, over rings of 3 to 12 PEs, with `d` below, inside and above the
/// rows' key counts.
#[test]
fn whole_rows_normalising_per_row_are_proved() {
    let mut proved = 0;
    for (n, m) in [
        (13, 3),
        (19, 4),
        (27, 5),
        (29, 6),
        (26, 6),
        (37, 8),
        (50, 12),
        (53, 12),
    ] {
        for d in [1, 3, 8, 20, 60] {
            for h in [1, 4] {
                if h > 1 && d > 8 && m != 6 && m != 12 {
                    continue;
                }
                let what = format!("n={n} d={d} h={h} m={m}");
                let p = problem(n, d, h, false, true, true);
                let st = schedule_stream::run_whole_as(&p, m, Normalisation::PerRow)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                for lp in &st.programs {
                    assert_eq!(lp.cycles(), st.cycles, "{what}: PE {}", lp.pe);
                }
                let man = stream_manifest(&p, m, &st);
                assert_eq!(man.normalisation, Normalisation::PerRow, "{what}");
                assert_eq!(man.ops.online_rescale, u64::from(h), "{what}");
                let divs: u32 = (1..=n).map(|keys| keys.min(d)).sum();
                assert_eq!(man.ops.phase2_div, u64::from(divs * h), "{what}");
                let flat: Vec<Program> = flattened(&st.programs);
                assert_proved(&flat, &man, &what);
                // The same programs declared under either whole-layer formulation are refused:
                // their division counts and specifications differ row by row.
                for other in [Normalisation::Deferred, Normalisation::PerWeight] {
                    if d == 1 || d > n {
                        continue;
                    }
                    let mut wrong = man.clone();
                    wrong.normalisation = other;
                    assert!(
                        !verify(&flat, &wrong).is_ok(),
                        "{what}: proved as {other:?}"
                    );
                }
                proved += 1;
            }
        }
    }
    eprintln!("{proved} whole-row layers normalising per row proved");
    assert_eq!(proved, 4 * 10 + 4 * 8, "layers proved");
}

/// Whole rows with rows passed on to the next PE (the scores and a first part's maximum sent
/// after the ring pass, the rest of the row's softmax and values on the next PE, its `y` row
/// placed there): proved flattened under each normalisation, on 6 and 12 PEs, with one and four
/// heads, with no operation beyond those of the whole rows under the same normalisation. The
/// two largest layers (128 tokens on 12 PEs) take one head: four of theirs took over half the
/// test's time, and four heads are proved on 12 PEs (100 tokens) and on every layer of 6 PEs.
/// `cargo test --release --test suite verify_stream::whole_rows_passed_on_every_head --
/// --ignored` proves four heads on those two too.
fn whole_rows_passed_on(every_head: bool) -> usize {
    let mut proved = Vec::new();
    for (n, d, m) in [
        (64, 32, 6),
        (40, 16, 6),
        (52, 20, 6),
        (64, 64, 6),
        (100, 24, 12),
        (128, 32, 12),
        (128, 64, 12),
    ] {
        for h in [1, 4] {
            if h > 1 && n > 100 && !every_head {
                continue;
            }
            for norm in [
                Normalisation::Deferred,
                Normalisation::PerWeight,
                Normalisation::PerRow,
            ] {
                let what = format!("n={n} d={d} h={h} m={m} {norm:?}");
                let p = problem(n, d, h, false, true, true);
                let Ok(st) = schedule_stream::run_whole_passed_as(&p, m, norm) else {
                    continue;
                };
                for lp in &st.programs {
                    assert_eq!(lp.cycles(), st.cycles, "{what}: PE {}", lp.pe);
                }
                let man = stream_manifest(&p, m, &st);
                assert_eq!(man.normalisation, norm, "{what}");
                let copy = u64::from(norm != Normalisation::PerWeight);
                assert_eq!(man.ops.online_rescale, copy * u64::from(h), "{what}");
                let flat: Vec<Program> = flattened(&st.programs);
                assert_proved(&flat, &man, &what);
                proved.push(what);
            }
        }
    }
    eprintln!(
        "{} layers with rows passed on proved: {proved:#?}",
        proved.len()
    );
    proved.len()
}

#[test]
fn whole_rows_passed_on_are_proved() {
    assert_eq!(whole_rows_passed_on(false), 36, "layers proved");
}

#[test]
#[ignore = "four heads of 128 tokens take minutes; the test above proves the rest"]
fn whole_rows_passed_on_every_head() {
    assert_eq!(whole_rows_passed_on(true), 42, "layers proved");
}

/// Rows passed on whose words do not all reach the next PE (one sent word taken out), or
/// whose second part misses a maximum, are caught.
#[test]
fn whole_rows_passed_on_with_a_word_or_a_maximum_taken_out_are_rejected() {
    let (n, d, m) = (64, 32, 6);
    let p = problem(n, d, 1, false, true, true);
    let st = schedule_stream::run_whole_passed_as(&p, m, Normalisation::PerRow).unwrap();
    let (man, flat) = proved_original(&p, m, &st);
    // A PE's last send is a word of a row it passes on (the ring pass's sends come first).
    for pe in 0..m as usize {
        let Some(at) = flat[pe]
            .bundles
            .iter()
            .rposition(|b| b.xfer != isa::Xfer::Nop)
        else {
            continue;
        };
        let mut cut = flat.clone();
        cut[pe].bundles[at].xfer = isa::Xfer::Nop;
        assert!(
            !verify(&cut, &man).is_ok(),
            "PE {pe}: a word taken out was proved"
        );
    }
    // Every PE's last maximum is a second part's (those come last).
    for pe in 0..m as usize {
        let mut cut = flat.clone();
        let at = cut[pe]
            .bundles
            .iter()
            .rposition(|b| b.op.kind() == Some(OpKind::Max))
            .unwrap();
        cut[pe].bundles[at].op = Op::Nop;
        assert!(
            !verify(&cut, &man).is_ok(),
            "PE {pe}: a maximum taken out was proved"
        );
    }
}

/// Per-row programs with a division moved to the other kind of row are caught: a deferred
/// row's output element divided once more or less, or a per-weight row's weight left whole.
#[test]
fn whole_rows_per_row_with_a_division_wrong_are_rejected() {
    let (n, d, m) = (29, 8, 6);
    let p = problem(n, d, 2, false, true, true);
    let st = schedule_stream::run_whole_as(&p, m, Normalisation::PerRow).unwrap();
    let (man, flat) = proved_original(&p, m, &st);
    // The statement says which rows are held to which formula.
    let proved = verify(&flat, &man).proved.unwrap_or_default();
    assert!(
        proved.contains("per row: y = Σ (exp") && proved.contains("per-row normalisation"),
        "{proved}"
    );
    let mut caught = 0;
    for pe in 0..m as usize {
        let divs: Vec<usize> = (0..flat[pe].bundles.len())
            .filter(|&i| flat[pe].bundles[i].op.kind() == Some(OpKind::Div))
            .collect();
        // The first division of the head and its last: a per-weight row's (the PE's first
        // rows are its lowest tokens) and a deferred one's.
        for at in [divs[0], divs[divs.len() / 2 - 1]] {
            let mut cut = flat.clone();
            cut[pe].bundles[at].op = Op::Nop;
            assert!(
                !verify(&cut, &man).is_ok(),
                "PE {pe}: division at bundle {at} taken out was proved"
            );
            caught += 1;
        }
    }
    assert_eq!(caught, 2 * m as usize);
}

/// The proofs without unrolling cover the deferred formulation only: a deferred causal stream
/// they prove is not proved by them once its manifest declares per-row normalisation (whose
/// rows of fewer keys than `d` divide each weight), and the flattened proof rejects it.
#[test]
fn per_row_declared_on_deferred_programs_is_not_proved() {
    let p = problem(32, 4, 1, false, true, true);
    let st = schedule_stream::run_with(&p, 4, true, Lag::Fit(None)).unwrap();
    let man = stream_manifest(&p, 4, &st);
    assert_eq!(man.normalisation, Normalisation::Deferred);
    let proof = verifier::compact::prove_loops(&st.programs, &man, &Options::default());
    assert!(proof.proved(), "deferred: {:?}", proof.outcome);
    let mut wrong = man.clone();
    wrong.normalisation = Normalisation::PerRow;
    assert!(verifier::compact::prove::applies(&st.programs, &wrong).is_err());
    assert!(verifier::compact::ring::applies(&st.programs, &wrong).is_err());
    let proof = verifier::compact::prove_loops(&st.programs, &wrong, &Options::default());
    assert!(!proof.proved(), "per row: {:?}", proof.outcome);
    let flat: Vec<Program> = flattened(&st.programs);
    assert_proved(&flat, &man, "deferred");
    assert!(!verify(&flat, &wrong).is_ok(), "per row proved flattened");
}

/// Whole rows whose own block does not come home (the v rows of the last ring step's hop
/// left out), or whose top row's maximum misses a score, are caught.
#[test]
fn whole_rows_with_a_hop_or_a_maximum_taken_out_are_rejected() {
    let (n, m) = (29, 6);
    let p = problem(n, 2, 2, false, true, true);
    let st = schedule_stream::run_whole_as(&p, m, Normalisation::Deferred).unwrap();
    let (man, flat) = proved_original(&p, m, &st);
    // The last send of PE 0 in the first head is a v word of the block it brings home.
    let mut cut = flat.clone();
    let half = cut[0].bundles.len() / 2;
    let at = cut[0].bundles[..half]
        .iter()
        .rposition(|b| b.xfer != isa::Xfer::Nop)
        .unwrap();
    cut[0].bundles[at].xfer = isa::Xfer::Nop;
    assert!(!verify(&cut, &man).is_ok(), "a hop taken out was proved");
    // PE 1's last maximum of the first head.
    let mut cut = flat;
    let at = cut[1].bundles[..half]
        .iter()
        .rposition(|b| b.op.kind() == Some(OpKind::Max))
        .unwrap();
    cut[1].bundles[at].op = Op::Nop;
    assert!(
        !verify(&cut, &man).is_ok(),
        "a maximum taken out was proved"
    );
}

/// Shared layers without a mask on rings that do not divide the tokens, rows dealt whole and
/// each score computed once with its mirror carried home: proved flattened, with no online
/// work, every PE's program as long as the layer.
#[test]
fn mirrored_scores_are_proved() {
    let mut proved = 0;
    for (n, m) in [
        (9u32, 2u32),
        (13, 3),
        (14, 4),
        (22, 5),
        (26, 6),
        (29, 6),
        (40, 12),
    ] {
        for d in [2u32, 3, 8] {
            for (h, timing) in [
                (1u32, MirroredTiming::OnStep),
                (1, MirroredTiming::Relayed),
                (2, MirroredTiming::OnStep),
                (2, MirroredTiming::Relayed),
            ] {
                let what = format!("n={n} d={d} h={h} m={m} {timing:?}");
                let p = problem(n, d, h, true, false, true);
                let st = match schedule_stream::run_mirrored_timed(&p, m, timing) {
                    Ok(st) => st,
                    // Blocks of 3 and 4 rows on 12 PEs: the steps are too short for any relay
                    // to keep ahead of them.
                    Err(e) if m == 12 && e.contains("relayed timing does not apply") => {
                        continue;
                    }
                    Err(e) => panic!("{what}: {e}"),
                };
                for lp in &st.programs {
                    assert_eq!(lp.cycles(), st.cycles, "{what}: PE {}", lp.pe);
                }
                let man = stream_manifest(&p, m, &st);
                let flat: Vec<Program> = flattened(&st.programs);
                assert_proved(&flat, &man, &what);
                proved += 1;
            }
        }
    }
    assert_eq!(proved, 7 * 3 * 4 - 3 * 2);
}

/// Mirrored scores with one mirror's send taken out, or one maximum taken out, are rejected.
#[test]
fn mirrored_scores_with_a_mirror_or_maximum_taken_out_are_rejected() {
    for timing in [MirroredTiming::OnStep, MirroredTiming::Relayed] {
        mirror_or_maximum_taken_out(timing);
    }
}

fn mirror_or_maximum_taken_out(timing: MirroredTiming) {
    let p = problem(26, 3, 2, true, false, true);
    let st = schedule_stream::run_mirrored_timed(&p, 6, timing).unwrap();
    let (man, flat) = proved_original(&p, 6, &st);
    for pe in [0usize, 2, 5] {
        // A score's mirror leaves from the acc of its chain's last product.
        let mut cut = flat.clone();
        let at = cut[pe]
            .bundles
            .iter()
            .position(|b| {
                matches!(
                    b.xfer,
                    isa::Xfer::Send {
                        src: isa::XferSrc::Acc,
                        ..
                    }
                )
            })
            .unwrap();
        cut[pe].bundles[at].xfer = isa::Xfer::Nop;
        assert!(
            !verify(&cut, &man).is_ok(),
            "{timing:?} PE {pe}: a mirror left out was proved"
        );
        // A forwarded word (x row or payload) leaves from memory; the last one of the first
        // head is one whose absence no later word can hide.
        let mut cut = flat.clone();
        let half = cut[pe].bundles.len() / 2;
        let at = cut[pe].bundles[..half]
            .iter()
            .rposition(|b| {
                matches!(
                    b.xfer,
                    isa::Xfer::Send {
                        src: isa::XferSrc::Mem(_),
                        ..
                    }
                )
            })
            .unwrap();
        cut[pe].bundles[at].xfer = isa::Xfer::Nop;
        assert!(
            !verify(&cut, &man).is_ok(),
            "{timing:?} PE {pe}: a forwarded word left out was proved"
        );
        let mut cut = flat.clone();
        let at = cut[pe]
            .bundles
            .iter()
            .rposition(|b| b.op.kind() == Some(OpKind::Max))
            .unwrap();
        cut[pe].bundles[at] = isa::Bundle::NOP;
        assert!(
            !verify(&cut, &man).is_ok(),
            "{timing:?} PE {pe}: a maximum left out was proved"
        );
    }
}

/// Relayed mirrored scores whose words left over after a PE's ring pass ride on the transfer
/// slots of its rows' softmax and values (6 and 12 PEs, one to four heads): proved flattened,
/// some of those sends are there, and taking one out (a word the next PE reads) is rejected.
#[test]
fn mirrored_words_laid_on_the_rows_are_proved() {
    let mut laid = 0;
    for (n, d, h, m) in [
        (26u32, 3u32, 1u32, 6u32),
        (26, 3, 4, 6),
        (34, 6, 4, 6),
        (50, 8, 1, 12),
        (64, 8, 1, 12),
        (61, 8, 2, 12),
        (64, 8, 4, 12),
    ] {
        let what = format!("n={n} d={d} h={h} m={m}");
        let p = problem(n, d, h, true, false, true);
        let st = schedule_stream::run_mirrored_timed(&p, m, MirroredTiming::Relayed)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        for lp in &st.programs {
            assert_eq!(lp.cycles(), st.cycles, "{what}: PE {}", lp.pe);
        }
        let man = stream_manifest(&p, m, &st);
        let flat: Vec<Program> = flattened(&st.programs);
        assert_proved(&flat, &man, &what);
        // Only the rows take maxima and exponentials, and nothing of theirs is sent.
        let on_rows = |b: &isa::Bundle| {
            matches!(b.op.kind(), Some(OpKind::Max | OpKind::Expd))
                && matches!(b.xfer, isa::Xfer::Send { .. })
        };
        let pes: Vec<usize> = (0..flat.len())
            .filter(|&pe| flat[pe].bundles.iter().any(on_rows))
            .collect();
        assert!(!pes.is_empty(), "{what}: no word laid on the rows");
        laid += 1;
        let pe = pes[0];
        // The last such send of the first head.
        let head = flat[pe].bundles.len() / h as usize;
        let at = flat[pe].bundles[..head].iter().rposition(on_rows).unwrap();
        let mut cut = flat.clone();
        cut[pe].bundles[at].xfer = isa::Xfer::Nop;
        assert!(
            !verify(&cut, &man).is_ok(),
            "{what}: PE {pe}: a word laid on the rows left out was proved"
        );
    }
    assert_eq!(laid, 7);
}

/// Whether a loop's count moves with an enclosing index somewhere in `nodes`.
fn has_stepped(nodes: &[isa::Node]) -> bool {
    nodes.iter().any(|n| match n {
        isa::Node::Loop(l) => l.step.is_some() || has_stepped(&l.body),
        isa::Node::Bundle(_) => false,
    })
}

/// Mirrored rows that follow one another and whose code moves on alike run as one loop over
/// the rows (key counts of the own triangle stepped by the row): proved flattened both ways,
/// on 6 and 12 PEs with one to four heads.
#[test]
fn mirrored_rows_in_loops_are_proved() {
    for (n, d, h, m, timing) in [
        (64u32, 4u32, 1u32, 6u32, MirroredTiming::OnStep),
        (64, 4, 1, 6, MirroredTiming::Relayed),
        (64, 4, 4, 6, MirroredTiming::OnStep),
        (64, 8, 2, 6, MirroredTiming::Relayed),
        (128, 4, 1, 6, MirroredTiming::OnStep),
        (61, 8, 2, 12, MirroredTiming::Relayed),
        (64, 8, 4, 12, MirroredTiming::Relayed),
    ] {
        let what = format!("n={n} d={d} h={h} m={m} {timing:?}");
        let p = problem(n, d, h, true, false, true);
        let st = schedule_stream::run_mirrored_timed(&p, m, timing)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            st.programs.iter().any(|lp| has_stepped(&lp.body)),
            "{what}: no rows in a loop"
        );
        for lp in &st.programs {
            assert_eq!(lp.cycles(), st.cycles, "{what}: PE {}", lp.pe);
        }
        let man = stream_manifest(&p, m, &st);
        let flat: Vec<Program> = flattened(&st.programs);
        assert_proved(&flat, &man, &what);
    }
}

/// Relayed mirrored scores with each pair's scores kept whole at the homes of the blocks
/// (row- or column-major segments of the payload, the home's own scores beside the mirrors):
/// proved flattened on 3, 6 and 12 PEs with one to four heads, deferred and per weight, every
/// PE's rows but the first few in one loop, and a kept score's product or a mirror's send taken
/// out rejected.
#[test]
fn mirrored_scores_kept_whole_are_proved() {
    for (n, d, h, m) in [
        (13u32, 8u32, 1u32, 3u32),
        (26, 3, 2, 6),
        (29, 8, 1, 6),
        (50, 8, 1, 12),
        (61, 8, 2, 12),
        (64, 16, 4, 12),
        (50, 64, 1, 12),
    ] {
        let what = format!("n={n} d={d} h={h} m={m}");
        let p = problem(n, d, h, true, false, true);
        let st = schedule_stream::run_mirrored_timed(&p, m, MirroredTiming::Whole)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            st.programs.iter().all(|lp| has_stepped(&lp.body)),
            "{what}: a PE without its rows in a loop"
        );
        for lp in &st.programs {
            assert_eq!(lp.cycles(), st.cycles, "{what}: PE {}", lp.pe);
        }
        let man = stream_manifest(&p, m, &st);
        let flat: Vec<Program> = flattened(&st.programs);
        assert_proved(&flat, &man, &what);
        // The last product of a chain whose score the PE keeps (no send), and a mirror's send.
        let pe = 1usize;
        let kept = flat[pe]
            .bundles
            .iter()
            .rposition(|b| {
                b.op.kind() == Some(OpKind::Mul)
                    && matches!(b.acc, isa::Acc::Add { dst: Some(_), .. })
                    && b.xfer == isa::Xfer::Nop
            })
            .unwrap();
        let mut cut = flat.clone();
        cut[pe].bundles[kept].op = Op::Nop;
        assert!(
            !verify(&cut, &man).is_ok(),
            "{what}: a kept score's product left out was proved"
        );
        let mirror = flat[pe]
            .bundles
            .iter()
            .position(|b| {
                matches!(
                    b.xfer,
                    isa::Xfer::Send {
                        src: isa::XferSrc::Acc,
                        ..
                    }
                )
            })
            .unwrap();
        let mut cut = flat.clone();
        cut[pe].bundles[mirror].xfer = isa::Xfer::Nop;
        assert!(
            !verify(&cut, &man).is_ok(),
            "{what}: a mirror's send left out was proved"
        );
    }
}

/// Mirrored scores with fewer keys than columns divide each weight by its row's sum (`n`
/// divisions a row instead of `d`): proved under that formulation, both timings, on 3, 6 and
/// 12 PEs with one and four heads.
#[test]
fn mirrored_scores_per_weight_are_proved() {
    for (n, d, h, m, timing) in [
        (13u32, 16u32, 1u32, 3u32, MirroredTiming::OnStep),
        (13, 16, 2, 3, MirroredTiming::Relayed),
        (26, 32, 1, 6, MirroredTiming::Relayed),
        (26, 32, 4, 6, MirroredTiming::OnStep),
        (50, 64, 1, 12, MirroredTiming::Relayed),
        (50, 64, 4, 12, MirroredTiming::Relayed),
    ] {
        let what = format!("n={n} d={d} h={h} m={m} {timing:?}");
        let p = problem(n, d, h, true, false, true);
        let st = schedule_stream::run_mirrored_timed(&p, m, timing)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(
            st.normalisation,
            runtime::layer::Normalisation::PerWeight,
            "{what}"
        );
        let man = stream_manifest(&p, m, &st);
        let flat: Vec<Program> = flattened(&st.programs);
        assert_proved(&flat, &man, &what);
        // One weight's division taken out.
        let mut cut = flat.clone();
        let at = cut[1]
            .bundles
            .iter()
            .position(|b| b.op.kind() == Some(OpKind::Div))
            .unwrap();
        cut[1].bundles[at].op = Op::Nop;
        assert!(
            !verify(&cut, &man).is_ok(),
            "{what}: a division left out was proved"
        );
    }
}

/// The mirrored programs skip the relayed timing where forwarding on the step takes no more
/// cycles than its busiest PE's operations; the layers below check that what is kept is still
/// the faster of the two built apart (a tie keeps the step), including layers where the rule
/// skips the relay.
#[test]
fn mirrored_timing_kept_is_the_faster_of_both() {
    let mut skipped = 0;
    for (n, d, h, m) in [
        (26u32, 3u32, 1u32, 6u32),
        (29, 8, 1, 6),
        (40, 16, 1, 6),
        (64, 8, 1, 6),
        (64, 16, 2, 6),
        (26, 32, 1, 6),
        (50, 8, 1, 12),
        (64, 16, 1, 12),
        // Shapes of the shapes table: the relay wins on the first, is skipped on the others.
        (64, 32, 1, 6),
        (64, 64, 1, 6),
        (128, 32, 2, 6),
    ] {
        let what = format!("n={n} d={d} h={h} m={m}");
        let p = problem(n, d, h, true, false, true);
        let on = schedule_stream::run_mirrored_timed(&p, m, MirroredTiming::OnStep)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let relayed = schedule_stream::run_mirrored_timed(&p, m, MirroredTiming::Relayed);
        let kept = schedule_stream::run_mirrored_timed(&p, m, MirroredTiming::Fastest)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let want = match &relayed {
            Ok(r) if r.cycles < on.cycles => r.cycles,
            _ => on.cycles,
        };
        assert_eq!(kept.cycles, want, "{what}");
        let floor = on
            .programs
            .iter()
            .map(|lp| lp.op_counts().iter().sum::<u64>())
            .max()
            .unwrap();
        if on.cycles <= floor {
            skipped += 1;
        }
    }
    assert!(
        skipped >= 2,
        "the rule skipped the relay on {skipped} layers"
    );
}

/// Whole rows whose ring steps start once each word they read has arrived rather than the
/// whole block (the same steps, shorter waits): proved flattened on 6 and 12 PEs, one and four
/// heads, each normalisation, with no row passed on, rows passed on after their first maxima,
/// and rows split by their output columns as well; with none passed on never longer than the
/// steps waiting for the whole block, and shorter on the 64-token layers of 12 PEs, where the
/// blocks of six tokens take longer to forward than the steps of five. Two tests of two layers
/// each (18 proofs a layer), so that the two test threads share the work.
fn word_timed_layers_are_proved(layers: [(u32, u32, u32); 2]) {
    let mut proved = Vec::new();
    let mut shorter = 0;
    for (n, d, m) in layers {
        for h in [1, 4] {
            for norm in [
                Normalisation::Deferred,
                Normalisation::PerWeight,
                Normalisation::PerRow,
            ] {
                for pass in [WholePass::Off, WholePass::Rows, WholePass::Split] {
                    let what = format!("n={n} d={d} h={h} m={m} {norm:?} pass={pass:?}");
                    let p = problem(n, d, h, false, true, true);
                    let Ok(st) =
                        schedule_stream::run_whole_timed(&p, m, norm, pass, WholeTiming::Word)
                    else {
                        assert!(pass != WholePass::Off, "{what}: not built");
                        continue;
                    };
                    if pass == WholePass::Off {
                        let block = schedule_stream::run_whole_as(&p, m, norm).unwrap();
                        assert!(st.cycles <= block.cycles, "{what}");
                        shorter += usize::from(st.cycles < block.cycles && n == 64);
                    }
                    for lp in &st.programs {
                        assert_eq!(lp.cycles(), st.cycles, "{what}: PE {}", lp.pe);
                    }
                    let man = stream_manifest(&p, m, &st);
                    assert_eq!(man.normalisation, norm, "{what}");
                    let flat: Vec<Program> = flattened(&st.programs);
                    assert_proved(&flat, &man, &what);
                    proved.push(what);
                }
            }
        }
    }
    eprintln!("{} word-timed layers proved: {proved:#?}", proved.len());
    assert_eq!(proved.len(), 36, "layers proved");
    assert_eq!(shorter, 6, "64-token layers shorter by word");
}

#[test]
fn whole_rows_timed_by_word_are_proved() {
    word_timed_layers_are_proved([(40, 16, 6), (64, 64, 12)]);
}

#[test]
fn whole_rows_timed_by_word_are_proved_on_longer_rows() {
    word_timed_layers_are_proved([(64, 32, 12), (100, 24, 12)]);
}

/// Word-timed steps start without waiting for the whole block, so the proof must see each
/// word arrive before it is read: a PE whose head starts late by all the idle cycles it ends
/// with (moved from its end to its start) sends words the next PE reads before they arrive,
/// and is rejected. PEs 3 to 11 end early enough for that; PEs 1 and 2 do not (their idle
/// cycles are within the slack the next PE leaves, so moved they are still proved).
#[test]
fn whole_rows_timed_by_word_with_a_pe_late_are_rejected() {
    let (n, d, m) = (64, 32, 12);
    let p = problem(n, d, 1, false, true, true);
    let st = schedule_stream::run_whole_timed(
        &p,
        m,
        Normalisation::PerRow,
        WholePass::Off,
        WholeTiming::Word,
    )
    .unwrap();
    let block = schedule_stream::run_whole_as(&p, m, Normalisation::PerRow).unwrap();
    assert!(st.cycles < block.cycles);
    let (man, flat) = proved_original(&p, m, &st);
    let idle = |b: &isa::Bundle| *b == isa::Bundle::default();
    let mut late = Vec::new();
    let mut tried = 0;
    for pe in 0..m as usize {
        let b = &flat[pe].bundles;
        let spare = b.iter().rev().take_while(|x| idle(x)).count();
        if spare < 64 {
            continue;
        }
        tried += 1;
        let mut cut = flat.clone();
        cut[pe].bundles.truncate(b.len() - spare);
        cut[pe]
            .bundles
            .splice(0..0, std::iter::repeat_n(isa::Bundle::default(), spare));
        if !verify(&cut, &man).is_ok() {
            late.push(pe);
        }
    }
    eprintln!("PEs caught late: {late:?} of {tried}");
    assert_eq!(tried, 11);
    assert_eq!(late, (3..12).collect::<Vec<_>>());
}

/// Rows split by their output columns whose words do not all reach the next PE (a PE's last
/// send, the sum or an exponential of such a row, taken out) are caught.
#[test]
fn whole_rows_split_by_columns_with_a_word_taken_out_are_rejected() {
    let (n, d, m) = (64, 32, 12);
    let p = problem(n, d, 1, false, true, true);
    let st = schedule_stream::run_whole_timed(
        &p,
        m,
        Normalisation::PerRow,
        WholePass::Split,
        WholeTiming::Word,
    )
    .unwrap();
    let (man, flat) = proved_original(&p, m, &st);
    for pe in 0..m as usize {
        let Some(at) = flat[pe]
            .bundles
            .iter()
            .rposition(|b| b.xfer != isa::Xfer::Nop)
        else {
            continue;
        };
        let mut cut = flat.clone();
        cut[pe].bundles[at].xfer = isa::Xfer::Nop;
        assert!(
            !verify(&cut, &man).is_ok(),
            "PE {pe}: a word taken out was proved"
        );
    }
}

/// The proofs without unrolling know input words from the layouts' closed forms only: with a
/// preload copy added (in a word of its own, read by nobody) they decline rather than prove,
/// and the checks leave the placement undecided, for uniform and causal rings alike.
#[test]
fn preload_copies_are_left_to_the_flattened_proof() {
    for causal in [false, true] {
        let p = problem(8, 2, 1, false, causal, true);
        let st = schedule_stream::run_with(&p, 2, true, Lag::Off).unwrap();
        let man = stream_manifest(&p, 2, &st);
        let opts = Options::default();
        assert!(
            verifier::compact::prove_loops(&st.programs, &man, &opts).proved(),
            "causal={causal}: not proved without the copy"
        );
        // One more word on every PE, so that every PE still runs one program.
        let (mut loops, mut with) = (st.programs.clone(), man.clone());
        let word = loops[1].mem_words;
        for (l, w) in loops.iter_mut().zip(&mut with.mem_words) {
            l.mem_words += 1;
            *w += 1;
        }
        with.format_version = runtime::manifest::COPIES_FORMAT_VERSION;
        with.inputs.get_mut("k").unwrap().copies = vec![runtime::manifest::PreloadCopy {
            index: 3,
            pe: 1,
            addr: word,
        }];
        Manifest::from_json(&with.to_json().unwrap()).unwrap();
        let c = verifier::compact::check_loops(&loops, &with, &opts);
        assert!(
            c.undecided.iter().any(|u| u.contains("preload copies")),
            "causal={causal}: {c}"
        );
        assert!(!verifier::compact::prove_loops(&loops, &with, &opts).proved());
        assert!(verifier::compact::prove::applies(&loops, &with).is_err());
        assert!(verifier::compact::ring::applies(&loops, &with).is_err());
    }
}
