//! Seeded random mutations of compiled programs and manifests: the verifier must reject every
//! mutant whose numeric run differs from the reference (or faults), and so never accept a wrong one.

use crate::verifier_common as common;

use common::{build, safe_source, source};
use compiler::exec;
use compiler::manifest::Manifest;
use compiler::passes::select::Choice;
use isa::{Acc, AccSrc, Addr, Bundle, Op, OpKind, Program, Xfer, XferSrc};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

const TOLERANCE: f64 = 1e-4;

/// Whether the numeric interpreter reproduces the reference on two random input sets.
fn numerically_correct(programs: &[Program], m: &Manifest) -> bool {
    (0..2).all(|seed| {
        let inputs = exec::random_inputs(m, seed);
        let Some(want) = exec::reference_output(m, &inputs) else {
            return false;
        };
        match exec::execute(
            isa::F32Domain,
            programs.to_vec(),
            m,
            &inputs,
            &mut isa::NoObserver,
        ) {
            Ok(out) => out
                .outputs
                .get("y")
                .is_some_and(|y| y.len() == want.len() && exec::max_abs_err(y, &want) <= TOLERANCE),
            Err(_) => false,
        }
    })
}

fn addr(rng: &mut StdRng, mem: u32) -> Addr {
    match rng.random_range(0..10) {
        // Mostly in range, so that mutants run rather than fault at once.
        0 => mem + rng.random_range(0..3),
        _ => rng.random_range(0..mem.max(1)),
    }
}

fn some_addr(rng: &mut StdRng, mem: u32) -> Option<Addr> {
    if rng.random_range(0..4) == 0 {
        None
    } else {
        Some(addr(rng, mem))
    }
}

/// Changes one field of one slot of `b`.
fn mutate_bundle(rng: &mut StdRng, b: &mut Bundle, mem: u32, scale: f32) -> &'static str {
    match rng.random_range(0..9) {
        0 => {
            b.op = match b.op {
                Op::Nop => Op::mul(addr(rng, mem), addr(rng, mem), some_addr(rng, mem)),
                Op::Arith(x) => {
                    // Any other kind of the table on the same operands (the second operand is
                    // the first for a kind that had only one), or no op at all.
                    let b2 = if x.kind.info().reads == 2 { x.b } else { x.a };
                    let others: Vec<OpKind> =
                        OpKind::ALL.into_iter().filter(|&k| k != x.kind).collect();
                    if rng.random_range(0..4) == 0 {
                        Op::Nop
                    } else {
                        match others[rng.random_range(0..others.len())] {
                            OpKind::Mul => Op::mul(x.a, b2, x.dst),
                            OpKind::Div => Op::div(b2, x.a, x.dst),
                            OpKind::Max => Op::max(x.a, b2, x.dst),
                            OpKind::Exp => Op::exp(x.a, scale, x.dst),
                            OpKind::Expd => Op::expd(x.a, b2, scale, x.dst),
                        }
                    }
                }
            };
            "opcode"
        }
        1 | 2 => {
            let new = addr(rng, mem);
            match &mut b.op {
                Op::Arith(x) => {
                    if x.kind.info().reads == 2 && rng.random_bool(0.5) {
                        x.b = new;
                    } else {
                        x.a = new;
                    }
                }
                Op::Nop => return mutate_bundle(rng, b, mem, scale),
            }
            "op operand"
        }
        3 => {
            let new = some_addr(rng, mem);
            match &mut b.op {
                Op::Arith(x) => x.dst = new,
                Op::Nop => return mutate_bundle(rng, b, mem, scale),
            }
            "op destination"
        }
        4 => {
            if let Op::Arith(x) = &mut b.op {
                if !x.kind.info().imm {
                    return mutate_bundle(rng, b, mem, scale);
                }
                x.imm *= 2.0;
                "exp scale"
            } else {
                mutate_bundle(rng, b, mem, scale)
            }
        }
        5 => {
            b.acc = match b.acc {
                Acc::Nop => Acc::Add {
                    src: AccSrc::Mem(addr(rng, mem)),
                    dst: some_addr(rng, mem),
                },
                Acc::Add { src, dst } => match rng.random_range(0..4) {
                    0 => Acc::Nop,
                    1 => Acc::Add {
                        src: match src {
                            AccSrc::Zero => AccSrc::Mem(addr(rng, mem)),
                            AccSrc::Mem(_) => AccSrc::Zero,
                        },
                        dst,
                    },
                    2 => Acc::Add {
                        src: AccSrc::Mem(addr(rng, mem)),
                        dst,
                    },
                    _ => Acc::Add {
                        src,
                        dst: some_addr(rng, mem),
                    },
                },
            };
            "acc"
        }
        6 | 7 => {
            b.xfer = match b.xfer {
                Xfer::Nop => Xfer::Send {
                    src: XferSrc::Mem(addr(rng, mem)),
                    dst: addr(rng, mem),
                },
                Xfer::Send { src, dst } => match rng.random_range(0..4) {
                    0 => Xfer::Nop,
                    1 => Xfer::Send {
                        src,
                        dst: addr(rng, mem),
                    },
                    2 => Xfer::Send {
                        src: XferSrc::Mem(addr(rng, mem)),
                        dst,
                    },
                    _ => Xfer::Send {
                        src: match src {
                            XferSrc::Acc => XferSrc::Mem(addr(rng, mem)),
                            XferSrc::Mem(_) => XferSrc::Acc,
                        },
                        dst,
                    },
                },
            };
            "send"
        }
        _ => {
            *b = Bundle::NOP;
            "bundle to nop"
        }
    }
}

/// Applies one random mutation; returns its kind.
fn mutate(rng: &mut StdRng, programs: &mut [Program], m: &mut Manifest) -> &'static str {
    let pe = rng.random_range(0..programs.len());
    let mem = programs[pe].mem_words;
    let len = programs[pe].bundles.len();
    let scale = m.layer.scale as f32;
    let kind = match rng.random_range(0..20) {
        0..=9 if len > 0 => {
            let i = rng.random_range(0..len);
            mutate_bundle(rng, &mut programs[pe].bundles[i], mem, scale)
        }
        10 if len > 0 => {
            let i = rng.random_range(0..len);
            programs[pe].bundles.remove(i);
            "delete bundle"
        }
        11 if len > 0 => {
            let i = rng.random_range(0..len);
            let b = programs[pe].bundles[i];
            programs[pe].bundles.insert(i, b);
            "duplicate bundle"
        }
        12 | 13 if len > 1 => {
            let i = rng.random_range(0..len);
            let j = if rng.random_bool(0.5) {
                (i + 1) % len
            } else {
                rng.random_range(0..len)
            };
            programs[pe].bundles.swap(i, j);
            "swap bundles"
        }
        14 => {
            m.cycles = if rng.random_bool(0.5) {
                m.cycles + 1
            } else {
                m.cycles.saturating_sub(1)
            };
            return "manifest cycles";
        }
        15 | 16 => {
            let names: Vec<String> = m.inputs.keys().chain(m.outputs.keys()).cloned().collect();
            let name = &names[rng.random_range(0..names.len())];
            let p = m
                .inputs
                .get_mut(name)
                .or_else(|| m.outputs.get_mut(name))
                .unwrap();
            let i = rng.random_range(0..p.pe.len());
            if rng.random_bool(0.5) {
                p.pe[i] = rng.random_range(0..m.pes);
                "manifest placement pe"
            } else {
                p.addr[i] = addr(rng, mem);
                "manifest placement addr"
            }
        }
        17 => {
            let delta: i64 = if rng.random_bool(0.5) { 1 } else { -1 };
            let w = (i64::from(m.mem_words[pe]) + delta).max(0) as u32;
            m.mem_words[pe] = w;
            if rng.random_bool(0.7) {
                // Both sides agree, so the mutant loads; only the memory size changed.
                programs[pe].mem_words = w;
            }
            return "mem_words";
        }
        18 => {
            let other = rng.random_range(0..programs.len());
            if other != pe && len > 0 {
                // A bundle moved to another PE's program at the same cycle.
                let i = rng.random_range(0..len);
                let b = programs[pe].bundles[i];
                if let Some(slot) = programs[other].bundles.get_mut(i) {
                    *slot = b;
                }
            }
            "copy bundle to another PE"
        }
        _ => {
            let name = if rng.random_bool(0.5) { "qkv" } else { "mask" };
            if name == "qkv" {
                m.layer.qkv = if m.layer.qkv == "shared" {
                    "separate".into()
                } else {
                    "shared".into()
                };
            } else {
                m.layer.mask = if m.layer.mask == "causal" {
                    "none".into()
                } else {
                    "causal".into()
                };
            }
            return "manifest layer";
        }
    };
    // Program edits keep the manifest's cycle count honest, so that mutants exercise the
    // programs rather than stopping at the cycle-count check.
    m.cycles = programs
        .iter()
        .map(|p| p.bundles.len() as u64)
        .max()
        .unwrap_or(0);
    kind
}

/// Every name `mutate` can return, and the name of a double mutation.
const KINDS: [&str; 17] = [
    "acc",
    "bundle to nop",
    "copy bundle to another PE",
    "delete bundle",
    "duplicate bundle",
    "exp scale",
    "manifest cycles",
    "manifest layer",
    "manifest placement addr",
    "manifest placement pe",
    "mem_words",
    "op destination",
    "op operand",
    "opcode",
    "send",
    "swap bundles",
    "two mutations",
];

#[test]
fn verifier_rejects_every_wrong_mutant() {
    let bases = [
        (safe_source(4, 4, 1, true, false), 2),
        (safe_source(3, 3, 1, false, true), 3),
        (safe_source(4, 4, 2, false, false), 4),
        (safe_source(4, 4, 1, true, true), 2),
        // The paper's formulation, whose programs use neither `max` nor `expd`.
        (source(4, 4, 1, true, false), 2),
    ];
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let (mut total, mut neutral, mut wrong, mut stricter) = (0, 0, 0, 0);
    let mut kinds: std::collections::BTreeMap<&str, (u32, u32)> = Default::default();
    let mut why_stricter: std::collections::BTreeMap<&str, u32> = Default::default();
    for (src, pes) in &bases {
        let c = build(src, *pes, Choice::Auto).expect("base case compiles");
        assert!(verifier::verify(&c.programs, &c.manifest).is_ok());
        assert!(numerically_correct(&c.programs, &c.manifest));
        for _ in 0..400 {
            let mut programs = c.programs.clone();
            let mut m = c.manifest.clone();
            let mut kind = mutate(&mut rng, &mut programs, &mut m);
            if rng.random_range(0..5) == 0 {
                mutate(&mut rng, &mut programs, &mut m);
                kind = "two mutations";
            }
            let report = verifier::verify(&programs, &m);
            let correct = numerically_correct(&programs, &m);
            total += 1;
            let entry = kinds.entry(kind).or_default();
            entry.0 += 1;
            match (report.is_ok(), correct) {
                (true, true) => neutral += 1,
                (true, false) => panic!(
                    "the verifier accepted a wrong mutant ({kind}) of {src} on {pes} PEs:\n{report}\nprograms:\n{}",
                    programs.iter().map(|p| p.to_string()).collect::<String>()
                ),
                (false, false) => {
                    wrong += 1;
                    entry.1 += 1;
                }
                (false, true) => {
                    stricter += 1;
                    entry.1 += 1;
                    for inv in report.counts.keys() {
                        *why_stricter.entry(inv.name()).or_default() += 1;
                    }
                    if std::env::var_os("MUTANT_DEBUG").is_some() {
                        println!("--- {kind}, numerically correct, rejected:\n{report}");
                    }
                }
            }
            // Something was reported, and the report renders.
            if !report.is_ok() {
                assert!(!report.violations.is_empty());
                let _ = report.to_string();
                let _ = report.to_json();
            }
        }
    }
    println!("{total} mutants: {neutral} semantically neutral (accepted, numerically correct), {wrong} wrong and rejected, {stricter} numerically correct but rejected by a structural invariant");
    for (k, (n, rejected)) in &kinds {
        println!("  {k:28} {n:4} mutants, {rejected:4} rejected");
    }
    println!("invariants violated by the numerically correct rejected mutants: {why_stricter:?}");
    // Every kind of mutation was drawn and caught at least once: a mutator that silently stops
    // producing one kind (or a verifier that stops rejecting it) fails here.
    for kind in KINDS {
        let (drawn, rejected) = kinds.get(kind).copied().unwrap_or_default();
        assert!(
            drawn > 0 && rejected > 0,
            "{kind}: {drawn} mutants, {rejected} rejected"
        );
    }
    assert_eq!(kinds.len(), KINDS.len(), "kinds drawn: {kinds:?}");
    assert!(wrong > total / 2, "most mutants should be wrong");
}

/// The flat index of the first bundle of PE `pe` whose op is `kind`, with that op.
fn find_op(programs: &[Program], kind: OpKind) -> Option<(usize, usize, isa::Arith)> {
    programs.iter().enumerate().find_map(|(pe, p)| {
        p.bundles.iter().enumerate().find_map(|(i, b)| match b.op {
            Op::Arith(x) if x.kind == kind => Some((pe, i, x)),
            _ => None,
        })
    })
}

/// The safe form's own failure modes: a maximum that misses a score, an exponential that drops
/// the subtracted maximum, and a bias that is not the row's maximum. Over the reals the first and
/// the last still give the right weights (softmax is shift invariant), so only the verifier's
/// insistence on the exact maximum catches them; that is what keeps the exponents at most 0.
#[test]
fn wrong_max_and_dropped_bias_are_caught() {
    for (src, pes) in [
        (safe_source(5, 3, 1, false, false), 2),
        (safe_source(4, 4, 2, true, true), 3),
    ] {
        let c = build(&src, pes, Choice::Auto).expect("compiles");
        assert!(verifier::verify(&c.programs, &c.manifest).is_ok());

        // max(a, b) -> max(a, a): the row maximum misses the score in b.
        let (pe, i, x) = find_op(&c.programs, OpKind::Max).expect("a safe program has max ops");
        let mut programs = c.programs.clone();
        programs[pe].bundles[i].op = Op::max(x.a, x.a, x.dst);
        let report = verifier::verify(&programs, &c.manifest);
        assert!(
            !report.is_ok(),
            "a max missing a score was accepted ({src})"
        );

        // expd(a, M, s) -> exp(a, s): the bias is dropped.
        let (pe, i, x) = find_op(&c.programs, OpKind::Expd).expect("a safe program has expd ops");
        let mut programs = c.programs.clone();
        programs[pe].bundles[i].op = Op::exp(x.a, x.imm, x.dst);
        let report = verifier::verify(&programs, &c.manifest);
        assert!(!report.is_ok(), "a dropped bias was accepted ({src})");
        assert!(
            report.counts.contains_key(&verifier::Invariant::Output),
            "{report}"
        );

        // expd(a, M, s) -> expd(a, a, s): a bias that is not the maximum (in a row of more than
        // one score, so that the score is not itself the maximum).
        let (pe, i, x) = c
            .programs
            .iter()
            .enumerate()
            .find_map(|(pe, p)| {
                p.bundles.iter().enumerate().find_map(|(i, b)| match b.op {
                    Op::Arith(x) if x.kind == OpKind::Expd && x.a != x.b => Some((pe, i, x)),
                    _ => None,
                })
            })
            .expect("a row of several scores");
        let mut programs = c.programs.clone();
        programs[pe].bundles[i].op = Op::expd(x.a, x.a, x.imm, x.dst);
        let report = verifier::verify(&programs, &c.manifest);
        assert!(!report.is_ok(), "a wrong bias was accepted ({src})");
    }
}
