//! The reroll pass is exact: the loop program it makes flattens to the flat program it was
//! given, bundle for bundle, on random programs (structured and unstructured) and on the
//! programs the schedulers emit.

use compiler::passes::reroll;
use isa::{
    Acc, AccSrc, Bundle, CountStep, Field, LBundle, Loop, LoopProgram, Node, Op, Program, Term,
    Xfer, XferSrc,
};
use proptest::prelude::*;

/// A small deterministic generator, so that one proptest seed gives one program.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A bundle from a small alphabet of slot forms, addresses near `base` so that random
/// programs repeat by accident as well as by construction.
fn bundle(rng: &mut Rng, spread: u32) -> Bundle {
    let mut a = || 1000 + rng.below(u64::from(spread)) as u32;
    let (x, y, z, w) = (a(), a(), a(), a());
    let op = match rng.below(5) {
        0 => Op::Nop,
        1 => Op::mul(x, y, None),
        2 => Op::mul(x, y, Some(z)),
        3 => Op::exp(x, 0.5, Some(z)),
        _ => Op::max(x, y, Some(z)),
    };
    let acc = if op == Op::Nop || rng.chance(40) {
        Acc::Nop
    } else {
        Acc::Add {
            src: if rng.chance(30) {
                AccSrc::Zero
            } else {
                AccSrc::Mem(w)
            },
            dst: rng.chance(70).then_some(w),
        }
    };
    let xfer = if rng.chance(50) {
        Xfer::Nop
    } else {
        Xfer::Send {
            src: if acc != Acc::Nop && rng.chance(30) {
                XferSrc::Acc
            } else {
                XferSrc::Mem(y)
            },
            dst: z,
        }
    };
    Bundle { op, acc, xfer }
}

/// A random loop body `depth` loops deep (`stepped`: inside a stepped loop).
fn nodes(rng: &mut Rng, depth: u8, stepped: bool) -> Vec<Node> {
    let len = 1 + rng.below(3);
    (0..len)
        .map(|_| {
            if depth < 4 && rng.chance(45) {
                let count = 1 + rng.below(5) as u32;
                let step = (depth > 0 && !stepped && rng.chance(40)).then(|| CountStep {
                    level: rng.below(u64::from(depth)) as u8,
                    per: 1,
                });
                Node::Loop(Loop {
                    count,
                    step,
                    body: nodes(rng, depth + 1, stepped || step.is_some()),
                })
            } else {
                let b = bundle(rng, 8);
                let mut terms = Vec::new();
                for f in Field::ALL {
                    if isa::looped::field(&b, f).is_none() {
                        continue;
                    }
                    for level in 0..depth {
                        if rng.chance(35) {
                            terms.push(Term {
                                field: f,
                                level,
                                stride: rng.below(7) as i32 - 3,
                                wrap: 0,
                            });
                        }
                    }
                }
                terms.retain(|t| t.stride != 0);
                Node::Bundle(LBundle {
                    bundle: b,
                    terms,
                    preds: Vec::new(),
                })
            }
        })
        .collect()
}

fn check(p: &Program) {
    let l = reroll::run(p);
    let cycles = l.validate().expect("the rerolled program is valid");
    assert_eq!(cycles, p.bundles.len() as u64);
    let back = l.flatten(u64::MAX).expect("flattens");
    assert_eq!(&back, p, "reroll is not exact:\n{}", l.to_text());
    let bin = isa::encode_looped(&l).expect("encodes");
    assert_eq!(isa::looped_binary::encoded_len(&l), bin.len() as u64);
    assert_eq!(isa::decode_looped(&bin).expect("decodes"), l);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Programs that are flattenings of random loop nests (with affine addresses and stepped
    /// counts): the shapes reroll looks for, mixed with whatever the nests do by accident.
    #[test]
    fn structured_programs_reroll_exactly(seed in any::<u64>()) {
        let mut rng = Rng(seed | 1);
        let lp = LoopProgram { pe: 0, pes: 1, mem_words: 4096, body: nodes(&mut rng, 0, false) };
        prop_assume!(lp.validate().is_ok());
        let flat = lp.flatten(1 << 20).expect("small");
        check(&flat);
    }

    /// Unstructured programs from a small alphabet: runs and repeats by chance only.
    #[test]
    fn random_programs_reroll_exactly(seed in any::<u64>(), len in 0usize..300, spread in 1u32..6) {
        let mut rng = Rng(seed | 1);
        let bundles = (0..len).map(|_| bundle(&mut rng, spread)).collect();
        check(&Program { pe: 0, pes: 1, mem_words: 4096, bundles });
    }
}

#[test]
fn empty_and_uniform_programs() {
    let p = |bundles: Vec<Bundle>| Program {
        pe: 0,
        pes: 1,
        mem_words: 64,
        bundles,
    };
    check(&p(Vec::new()));
    check(&p(vec![Bundle::NOP; 1000]));
    // A strided run folds to one loop of one template.
    let run: Vec<Bundle> = (0..50)
        .map(|i| Bundle {
            op: Op::mul(i, 2 * i, None),
            acc: Acc::Nop,
            xfer: Xfer::Nop,
        })
        .collect();
    check(&p(run.clone()));
    assert_eq!(reroll::run(&p(run)).bundle_count(), 1);
}

/// The programs the schedulers emit for small layers of every kind.
#[test]
fn compiled_programs_reroll_exactly() {
    for (src, pes) in [
        ("layer t { tokens = 8; dim = 4; }", 2),
        (
            "layer t { tokens = 12; dim = 3; heads = 2; mask = causal; }",
            4,
        ),
        ("layer t { tokens = 9; dim = 5; qkv = shared; }", 3),
        (
            "layer t { tokens = 6; dim = 8; heads = 2; softmax = plain; }",
            6,
        ),
        ("layer t { tokens = 2; dim = 16; }", 8),
    ] {
        let parsed = lang::parse(0, src);
        let opts = compiler::Options {
            pes,
            ..Default::default()
        };
        let c = compiler::compile(&parsed.layers[0], &opts).expect("compiles");
        for p in &c.programs {
            check(p);
        }
    }
}
