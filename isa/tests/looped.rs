//! Format 3: the native loop interpreter (cycle by cycle and in bulk)
//! against the flattened format-1 program on the format-1 machine, text and
//! binary round trips, and rejection of malformed programs.

use isa::{
    decode_any, decode_looped, encode_looped, parse_any, parse_looped, Acc, AccSrc, AnyProgram,
    Bundle, Cmp, CountStep, F32Domain, Fault, Field, LBundle, Loop, LoopMachine, LoopProgram,
    Machine, NoObserver, Node, Op, OpKind, Pred, RunStats, Slot, Term, Xfer, XferSrc,
    MAX_LOOP_DEPTH,
};
use proptest::prelude::*;

use crate::common;
use common::crc32_bitwise;

/// A small deterministic generator, so one proptest seed describes a whole
/// ring of programs and their preloads.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

struct Gen {
    mem: u32,
    /// Percent of bundles that may fault (out-of-range bases, odd slots).
    wild: u64,
    /// Whether the loop being generated is inside a stepped one.
    in_stepped: std::cell::Cell<bool>,
}

impl Gen {
    fn addr(&self, r: &mut Rng) -> u32 {
        if r.chance(self.wild) {
            self.mem + r.below(3) as u32
        } else {
            r.below(u64::from(self.mem)) as u32
        }
    }

    fn bundle(&self, r: &mut Rng, depth: usize) -> LBundle {
        let scale = [0.5f32, -0.25, 1.0][r.below(3) as usize];
        let op = match r.below(7) {
            0 => Op::Nop,
            1 | 2 => Op::mul(
                self.addr(r),
                self.addr(r),
                r.chance(40).then(|| self.addr(r)),
            ),
            3 => Op::exp(self.addr(r), scale, r.chance(50).then(|| self.addr(r))),
            4 => Op::max(
                self.addr(r),
                self.addr(r),
                r.chance(50).then(|| self.addr(r)),
            ),
            5 => Op::expd(
                self.addr(r),
                self.addr(r),
                scale,
                r.chance(50).then(|| self.addr(r)),
            ),
            _ => Op::div(
                self.addr(r),
                self.addr(r),
                r.chance(50).then(|| self.addr(r)),
            ),
        };
        let acc = if op == Op::Nop && !r.chance(self.wild) {
            Acc::Nop
        } else {
            match r.below(4) {
                0 => Acc::Nop,
                1 => Acc::Add {
                    src: AccSrc::Zero,
                    dst: r.chance(70).then(|| self.addr(r)),
                },
                2 => {
                    // The running-sum idiom the bulk path keeps in a register.
                    let s = self.addr(r);
                    Acc::Add {
                        src: AccSrc::Mem(s),
                        dst: Some(s),
                    }
                }
                _ => Acc::Add {
                    src: AccSrc::Mem(self.addr(r)),
                    dst: r.chance(70).then(|| self.addr(r)),
                },
            }
        };
        let xfer = match r.below(4) {
            0 | 1 => Xfer::Nop,
            2 => Xfer::Send {
                src: XferSrc::Mem(self.addr(r)),
                dst: self.addr(r),
            },
            _ if acc != Acc::Nop || r.chance(self.wild) => Xfer::Send {
                src: XferSrc::Acc,
                dst: self.addr(r),
            },
            _ => Xfer::Nop,
        };
        let bundle = Bundle { op, acc, xfer };
        let mut terms = Vec::new();
        if depth > 0 {
            for f in Field::ALL {
                if isa::looped::field(&bundle, f).is_none() {
                    continue;
                }
                for level in 0..depth as u8 {
                    if r.chance(35) {
                        let stride = [1i32, 1, 2, -1, 3, -2][r.below(6) as usize];
                        let wrap = if r.chance(25) {
                            2 + r.below(3) as u32
                        } else {
                            0
                        };
                        terms.push(Term {
                            field: f,
                            level,
                            stride,
                            wrap,
                        });
                    }
                }
            }
        }
        let mut preds = Vec::new();
        if depth > 0 && r.chance(30) {
            let slots: Vec<Slot> = [
                (Slot::Op, op != Op::Nop),
                (Slot::Acc, acc != Acc::Nop),
                (Slot::Xfer, xfer != Xfer::Nop),
            ]
            .into_iter()
            .filter(|x| x.1)
            .map(|x| x.0)
            .collect();
            if !slots.is_empty() {
                preds.push(Pred {
                    slot: slots[r.below(slots.len() as u64) as usize],
                    level: r.below(depth as u64) as u8,
                    cmp: Cmp::ALL[r.below(4) as usize],
                    value: r.below(4) as u32,
                });
            }
        }
        LBundle {
            bundle,
            terms,
            preds,
        }
    }

    fn body(&self, r: &mut Rng, depth: usize, bounds: &mut Vec<u32>) -> Vec<Node> {
        let n = 1 + r.below(if depth == 0 { 3 } else { 2 }) as usize;
        (0..n)
            .map(|_| {
                if depth < 3 && r.chance(55) {
                    // Long one-bundle loops are what the bulk path takes.
                    let count = if r.chance(50) {
                        1 + r.below(4) as u32
                    } else {
                        4 + r.below(40) as u32
                    };
                    // Some loops step their count with an enclosing index (triangular nests),
                    // never inside another stepped loop.
                    let stepped = !bounds.is_empty() && !self.in_stepped.get() && r.chance(30);
                    let (count, step, most) = if stepped {
                        let level = r.below(bounds.len() as u64) as u8;
                        let outer = bounds[usize::from(level)];
                        let per: i16 = [1, 2, -1][r.below(3) as usize];
                        let count = if per < 0 {
                            count + (outer - 1) * u32::from(per.unsigned_abs())
                        } else {
                            count
                        };
                        let last =
                            (i64::from(count) + i64::from(per) * i64::from(outer - 1)) as u32;
                        (count, Some(CountStep { level, per }), count.max(last))
                    } else {
                        (count, None, count)
                    };
                    bounds.push(most);
                    let was = self.in_stepped.replace(self.in_stepped.get() || stepped);
                    let body = if r.chance(50) {
                        vec![Node::Bundle(self.bundle(r, depth + 1))]
                    } else {
                        self.body(r, depth + 1, bounds)
                    };
                    self.in_stepped.set(was);
                    bounds.pop();
                    Node::Loop(Loop { count, step, body })
                } else {
                    Node::Bundle(self.bundle(r, depth))
                }
            })
            .collect()
    }
}

/// Moves every address base up so that the lowest address is not negative
/// (the format forbids that statically), keeping random programs valid.
fn fix_bases(nodes: &mut [Node], bounds: &mut Vec<u32>) {
    for n in nodes {
        match n {
            Node::Loop(l) => {
                let most = match l.step {
                    None => l.count,
                    Some(st) => {
                        let outer = bounds[usize::from(st.level)];
                        let last = i64::from(l.count) + i64::from(st.per) * i64::from(outer - 1);
                        l.count.max(last as u32)
                    }
                };
                bounds.push(most);
                fix_bases(&mut l.body, bounds);
                bounds.pop();
            }
            Node::Bundle(b) => {
                for f in Field::ALL {
                    let Some(base) = isa::looped::field(&b.bundle, f) else {
                        continue;
                    };
                    let mut lo = 0i64;
                    for t in b.terms.iter().filter(|t| t.field == f) {
                        let n = bounds[usize::from(t.level)];
                        let top = if t.wrap == 0 { n } else { n.min(t.wrap) } - 1;
                        lo += (i64::from(t.stride) * i64::from(top)).min(0);
                    }
                    if i64::from(base) + lo < 0 {
                        isa::looped::set_field(&mut b.bundle, f, (-lo) as u32);
                    }
                }
            }
        }
    }
}

struct Case {
    progs: Vec<LoopProgram>,
    preloads: Vec<(u32, u32, f32)>,
}

fn case(seed: u64, wild: u64) -> Case {
    let mut r = Rng(seed | 1);
    let pes = 1 + r.below(3) as u32;
    let mem = 12 + r.below(20) as u32;
    let g = Gen {
        mem,
        wild,
        in_stepped: Default::default(),
    };
    let spmd = r.chance(60);
    let mut shared = None;
    let progs = (0..pes)
        .map(|pe| {
            let mut body = match (&shared, spmd) {
                (Some(b), true) => Clone::clone(b),
                _ => g.body(&mut r, 0, &mut Vec::new()),
            };
            fix_bases(&mut body, &mut Vec::new());
            if spmd && shared.is_none() {
                shared = Some(body.clone());
            }
            LoopProgram {
                pe,
                pes,
                mem_words: mem,
                body,
            }
        })
        .collect();
    let mut preloads = Vec::new();
    for pe in 0..pes {
        for a in 0..mem {
            if !r.chance(wild / 2) {
                preloads.push((pe, a, (r.below(2000) as f32 - 1000.0) / 512.0));
            }
        }
    }
    Case { progs, preloads }
}

type Outcome = (Result<RunStats, Fault>, u64, Vec<Vec<Option<u32>>>);

fn mem_of(read: impl Fn(u32, u32) -> Option<f32>, pes: u32, mem: u32) -> Vec<Vec<Option<u32>>> {
    // Bits, not values: NaN results must agree too.
    (0..pes)
        .map(|pe| (0..mem).map(|a| read(pe, a).map(f32::to_bits)).collect())
        .collect()
}

fn flat_run(c: &Case) -> Outcome {
    let flat: Vec<_> = c
        .progs
        .iter()
        .map(|p| p.flatten(1 << 20).expect("flatten"))
        .collect();
    let mut m = Machine::new(F32Domain, flat).expect("load");
    for &(pe, a, v) in &c.preloads {
        m.preload(pe, a, v).expect("preload");
    }
    let r = m.run(&mut NoObserver);
    let (pes, mem) = (c.progs.len() as u32, c.progs[0].mem_words);
    (r, m.cycle(), mem_of(|p, a| m.read(p, a).copied(), pes, mem))
}

fn loop_run(c: &Case, fast: bool) -> (Outcome, (u64, u64, u64, u64)) {
    let mut m = LoopMachine::new(F32Domain, c.progs.clone()).expect("load");
    for &(pe, a, v) in &c.preloads {
        m.preload(pe, a, v).expect("preload");
    }
    let r = if fast {
        m.run_fast()
    } else {
        m.run(&mut NoObserver)
    };
    let (pes, mem) = (c.progs.len() as u32, c.progs[0].mem_words);
    let out = (r, m.cycle(), mem_of(|p, a| m.read(p, a).copied(), pes, mem));
    let through = m.nest_through_cycles();
    (
        out,
        (
            m.bulk_cycles(),
            m.nest_cycles(),
            m.general_cycles(),
            through,
        ),
    )
}

/// Runs the case all three ways; the cycles run in bulk and, of those, in whole-iteration
/// windows and in windows over any structure, and the whole-iteration windows' cycles in which
/// some PE went on from one loop into the next.
fn check(c: &Case) -> (u64, u64, u64, u64) {
    for p in &c.progs {
        let cycles = p.validate().expect("generated programs are valid");
        let flat = p.flatten(1 << 20).unwrap();
        assert_eq!(cycles, flat.bundles.len() as u64);
        // One bundle at a time, the same bundles in the same order.
        assert!(p.instances().eq(flat.bundles.iter().copied()));
        assert_eq!(p.cycles(), cycles);
        // The static op count is what the flattening holds.
        let mut ops = [0u64; isa::OPS.len()];
        for b in &flat.bundles {
            if let Some(k) = b.op.kind() {
                ops[k.index()] += 1;
            }
        }
        assert_eq!(p.op_counts(), ops);
        let acc = flat.bundles.iter().filter(|b| b.acc != Acc::Nop).count() as u64;
        let sends = flat.bundles.iter().filter(|b| b.xfer != Xfer::Nop).count() as u64;
        assert_eq!(p.acc_and_send_counts(), (acc, sends));
        // Every address a flattened bundle uses lies in the hull of some template's field
        // over the iterations its slot executes in, and that hull within the plain one.
        let mut hulls: Vec<(Field, (i64, i64))> = Vec::new();
        p.for_each_template(|b, bounds| {
            for f in Field::ALL {
                if let Some(h) = b.live_hull(f, bounds) {
                    let all = b.hull(f, bounds).expect("a live field is a field");
                    assert!(all.0 <= h.0 && h.1 <= all.1, "{h:?} outside {all:?}");
                    hulls.push((f, h));
                }
            }
        });
        for b in &flat.bundles {
            for f in Field::ALL {
                if let Some(a) = isa::looped::field(b, f) {
                    let a = i64::from(a);
                    assert!(
                        hulls
                            .iter()
                            .any(|&(g, (lo, hi))| g == f && lo <= a && a <= hi),
                        "{} at {a} outside every template's hull",
                        f.name()
                    );
                }
            }
        }
        // Both encodings round-trip exactly.
        let text = p.to_text();
        let back = parse_looped(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(&back, p, "{text}");
        assert_eq!(back.to_text(), text);
        let bin = encode_looped(p).unwrap();
        assert_eq!(&decode_looped(&bin).unwrap(), p);
    }
    let flat = flat_run(c);
    let (slow, _) = loop_run(c, false);
    let (fast, bulk) = loop_run(c, true);
    assert_eq!(
        slow, flat,
        "cycle-by-cycle loop run differs from the flat run"
    );
    assert_eq!(fast, flat, "bulk loop run differs from the flat run");
    bulk
}

/// The bundles of `nodes` outside any loop, every loop unrolled by fixing its index
/// ([`isa::looped::fix_level`]) rather than by evaluating its bundles at the indices.
fn unrolled(nodes: &[Node], out: &mut Vec<Bundle>) {
    for n in nodes {
        match n {
            Node::Bundle(b) => out.push(b.instance(&[])),
            Node::Loop(l) => {
                for i in 0..l.trips(&[]) {
                    unrolled(&isa::looped::fix_level(&l.body, 0, i), out);
                }
            }
        }
    }
}

#[test]
fn fixing_loop_indices_level_by_level_gives_the_flattening() {
    let (mut loops, mut stepped, mut preds) = (0, 0, 0);
    for seed in 0..400u64 {
        let c = case(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15), 4);
        for p in &c.progs {
            let flat = p.flatten(1 << 20).expect("generated programs are valid");
            let mut out = Vec::new();
            unrolled(&p.body, &mut out);
            assert_eq!(out, flat.bundles, "seed {seed}");
            fn count(nodes: &[Node], n: &mut (u32, u32, u32)) {
                for x in nodes {
                    match x {
                        Node::Loop(l) => {
                            n.0 += 1;
                            n.1 += u32::from(l.step.is_some());
                            count(&l.body, n);
                        }
                        Node::Bundle(b) => n.2 += u32::from(!b.preds.is_empty()),
                    }
                }
            }
            let mut n = (0, 0, 0);
            count(&p.body, &mut n);
            loops += n.0;
            stepped += n.1;
            preds += n.2;
        }
    }
    // The generator's programs have loops, stepped ones and predicated bundles.
    assert!(
        loops > 1000 && stepped > 100 && preds > 100,
        "{loops} {stepped} {preds}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn loops_match_flattened_execution(seed in any::<u64>()) {
        check(&case(seed, 0));
    }

    #[test]
    fn faulting_loops_match_flattened_execution(seed in any::<u64>()) {
        check(&case(seed, 8));
    }
}

#[test]
fn bulk_path_runs_and_agrees_on_many_random_rings() {
    // The property tests above would pass even if the bulk path never ran;
    // this makes sure it does, often, on the same generator.
    let mut bulk = 0;
    let mut nest = 0;
    let mut general = 0;
    let mut through = 0;
    let mut with_bulk = 0;
    let mut faults = 0;
    for seed in 0..600u64 {
        let c = case(
            seed.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            if seed % 3 == 0 { 8 } else { 0 },
        );
        let (b, w, g, t) = check(&c);
        through += t;
        bulk += b;
        nest += w;
        general += g;
        with_bulk += u64::from(b > 0);
        faults += u64::from(flat_run(&c).0.is_err());
    }
    let stepped = (0..600u64)
        .filter(|seed| {
            let c = case(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15), 0);
            fn has_step(nodes: &[Node]) -> bool {
                nodes.iter().any(|n| match n {
                    Node::Loop(l) => l.step.is_some() || has_step(&l.body),
                    Node::Bundle(_) => false,
                })
            }
            c.progs.iter().any(|p| has_step(&p.body))
        })
        .count();
    assert!(stepped > 50, "only {stepped} cases hold a stepped loop");
    println!("bulk cycles {bulk} ({nest} in whole-iteration windows, {through} of them going on from loop to loop, {general} in windows over any structure) in {with_bulk} cases, {faults} faulting cases");
    assert!(nest > 500, "whole-iteration windows ran {nest} cycles");
    assert!(
        through > 100,
        "whole-iteration windows went on from loop to loop in {through} cycles"
    );
    assert!(
        general > 500,
        "windows over any structure ran {general} cycles"
    );
    assert!(
        bulk > 2_000 && with_bulk > 50,
        "bulk cycles {bulk} in {with_bulk} cases"
    );
    assert!(faults > 20, "faulting cases {faults}");
}

fn dot_ring(pes: u32, n: u32) -> (Vec<LoopProgram>, Vec<(u32, u32, f32)>) {
    // m[2n] += m[i] * m[n + i] for i < n, then send the sum on.
    let mac = LBundle {
        bundle: Bundle {
            op: Op::mul(0, n, None),
            acc: Acc::Add {
                src: AccSrc::Mem(2 * n),
                dst: Some(2 * n),
            },
            xfer: Xfer::Nop,
        },
        terms: vec![
            Term {
                field: Field::OpA,
                level: 0,
                stride: 1,
                wrap: 0,
            },
            Term {
                field: Field::OpB,
                level: 0,
                stride: 1,
                wrap: 0,
            },
        ],
        preds: vec![],
    };
    let send = LBundle::plain(Bundle {
        op: Op::Nop,
        acc: Acc::Nop,
        xfer: Xfer::Send {
            src: XferSrc::Mem(2 * n),
            dst: 2 * n + 1,
        },
    });
    let progs = (0..pes)
        .map(|pe| LoopProgram {
            pe,
            pes,
            mem_words: 2 * n + 2,
            body: vec![
                Node::Loop(Loop::new(n, vec![Node::Bundle(mac.clone())])),
                Node::Bundle(send.clone()),
            ],
        })
        .collect();
    let mut pre = Vec::new();
    for pe in 0..pes {
        for i in 0..2 * n {
            pre.push((pe, i, (i as f32 + pe as f32) / 64.0));
        }
        pre.push((pe, 2 * n, 0.0));
    }
    (progs, pre)
}

#[test]
fn dot_products_run_in_bulk_and_match_the_reference() {
    let (progs, pre) = dot_ring(3, 50);
    let c = Case {
        progs,
        preloads: pre,
    };
    let (bulk, _, _, _) = check(&c);
    assert_eq!(bulk, 50);
    let (mut m, stats) = isa::looped_exec::run_f32(c.progs.clone(), &c.preloads).unwrap();
    assert_eq!(stats.cycles, 51);
    assert_eq!(stats.per_pe[0].count(OpKind::Mul), 50);
    for pe in 0..3u32 {
        // f64 reference of the sum PE pe - 1 computed and sent here.
        let src = (pe + 2) % 3;
        let want: f64 = (0..50)
            .map(|i| {
                f64::from((i as f32 + src as f32) / 64.0)
                    * f64::from(((50 + i) as f32 + src as f32) / 64.0)
            })
            .sum();
        let got = f64::from(*m.read(pe, 101).unwrap());
        assert!((got - want).abs() < 1e-3 * want.abs(), "{got} vs {want}");
    }
    let _ = m.domain();
}

#[test]
fn canonical_text_example() {
    let text = "\
; attnc ring microcode
.format 3
.pe 0
.pes 2
.mem 40
loop 3 {
    loop 4 {
        mul m[0 + 4*i0 + 1*i1], m[16 + 1*i1] | add m30 -> m30
    }
    nop | nop | send m[30 - 1*(i0 % 2)] -> m[32 + 1*i0] if i0 != 2
}
exp m30, 0.5 -> m31
";
    let p = parse_looped(text).unwrap();
    assert_eq!(p.to_text(), text);
    assert_eq!(p.cycles(), 3 * 5 + 1);
    assert_eq!(p.bundle_count(), 3);
    let flat = p.flatten(100).unwrap();
    assert_eq!(flat.bundles.len(), 16);
    // Iteration i0 = 1, i1 = 2 of the inner loop.
    assert_eq!(
        flat.bundles[5 + 2].to_string(),
        "mul m6, m18 | add m30 -> m30"
    );
    assert_eq!(flat.bundles[4].to_string(), "nop | nop | send m30 -> m32");
    assert_eq!(flat.bundles[9].to_string(), "nop | nop | send m29 -> m33");
    assert_eq!(flat.bundles[14].to_string(), "nop");
    match parse_any(text).unwrap() {
        AnyProgram::Looped(q) => assert_eq!(q, p),
        AnyProgram::Flat(_) => panic!("format 2 read as format 1"),
    }
    let bin = encode_looped(&p).unwrap();
    assert_eq!(decode_any(&bin).unwrap(), AnyProgram::Looped(p.clone()));
    // Format 1 stays readable through the same entry points.
    let f1 = isa::encode(&flat).unwrap();
    assert_eq!(decode_any(&f1).unwrap(), AnyProgram::Flat(flat.clone()));
    assert_eq!(parse_any(&flat.to_text()).unwrap(), AnyProgram::Flat(flat));
}

#[test]
fn triangular_nests_have_a_closed_form_length() {
    let text = "\
; attnc ring microcode
.format 3
.pe 0
.pes 1
.mem 64
loop 5 {
    loop 1 + i0 {
        loop 3 {
            mul m[0 + 1*i2], m[8 + 1*i1]
        }
    }
    loop 4 {
        loop 6 - i0 {
            nop
        }
    }
    loop 2 + 2*i0 {
        nop
    }
}
";
    let p = parse_looped(text).unwrap();
    assert_eq!(p.to_text(), text);
    // Row i0 runs 3·(1 + i0) + 4·(6 − i0) + (2 + 2·i0) cycles.
    let want: u64 = (0..5).map(|i| 3 * (1 + i) + 4 * (6 - i) + 2 + 2 * i).sum();
    assert_eq!(p.cycles(), want);
    let flat = p.flatten(1000).unwrap();
    assert_eq!(flat.bundles.len() as u64, want);
    // Rows 0 and 1 take 29 and 30 cycles; row 2's keys loop runs 3 times and its last
    // multiply (i1 = i2 = 2) is its 9th cycle.
    assert_eq!(flat.bundles[29 + 30 + 8].to_string(), "mul m2, m10");
    let bin = encode_looped(&p).unwrap();
    assert_eq!(decode_looped(&bin).unwrap(), p);

    assert!(err("loop 3 {\nloop 2 - i0 {\nnop\n}\n}\n").contains("reaches 0 at i0 = 2"));
    assert!(err("loop 3 {\nloop 2 + i1 {\nnop\n}\n}\n").contains("only 1 loop(s) enclose"));
    assert!(
        err("loop 3 {\nloop 1 + i0 {\nloop 1 + i0 {\nnop\n}\n}\n}\n")
            .contains("stepped loop inside a stepped loop")
    );
    assert!(err("loop 3 {\nloop 1 + 0*i0 {\nnop\n}\n}\n").contains("bad loop count"));
    assert!(err("loop 3 {\nloop 1 + 40000*i0 {\nnop\n}\n}\n").contains("bad loop count"));
}

#[test]
fn loose_affine_spellings_parse() {
    let text = ".format 3\n.pe 0\n.pes 1\n.mem 9\nloop 2 {\nmul m[i0],m[ 3 + 2 * i0 ]->m[8-i0] if i0==1\n}\n";
    let p = parse_looped(text).unwrap();
    let f = p.flatten(10).unwrap();
    assert_eq!(f.bundles[0].to_string(), "nop");
    assert_eq!(f.bundles[1].to_string(), "mul m1, m5 -> m7");
}

fn err(text: &str) -> String {
    let full = format!(".format 3\n.pe 0\n.pes 1\n.mem 8\n{text}");
    parse_looped(&full).unwrap_err().to_string()
}

#[test]
fn malformed_text_is_rejected_with_a_line() {
    assert_eq!(
        err("loop 0 {\nnop\n}\n"),
        "line 5:1: loop count must be at least 1"
    );
    assert_eq!(err("loop 2 {\n}\n"), "line 5:1: loop body is empty");
    assert_eq!(
        err("loop 2 {\nnop\n"),
        "line 5:1: loop is never closed (missing `}`)"
    );
    assert_eq!(err("}\n"), "line 5:1: `}` without an open loop");
    assert!(err("mul m[0 + 1*i0], m1\n").contains("only 0 loop(s) enclose"));
    assert!(err("loop 4 {\nmul m[2 - 1*i0], m1\n}\n").contains("outside the address space"));
    // Two terms of nearly -2^63 each: a sum that wrapped in 64 bits would look in range.
    let wide = "loop 4294967295 {\nloop 4294967295 {\n\
        nop | nop | send m[4294967295 - 2147483648*i0 - 2147483648*i1] -> m0\n}\n}\n";
    assert!(
        err(wide).contains("outside the address space"),
        "{}",
        err(wide)
    );
    let wide = wide.replace(
        "4294967295 - 2147483648*i0 - 2147483648*i1",
        "0 + 2147483647*i0 + 2147483647*i1",
    );
    assert!(
        err(&wide).contains("outside the address space"),
        "{}",
        err(&wide)
    );
    assert!(err("loop 4 {\nmul m[2 + 1*i0 + 2*i0], m1\n}\n").contains("i0 appears twice"));
    assert!(err("loop 4 {\nmul m[1*(i0 % 1)], m1\n}\n").contains("wrap 1"));
    assert!(
        err("loop 4 {\nnop | nop | send m1 -> m2 if i0 ~ 1\n}\n").contains("expected a predicate")
    );
    assert!(err("loop 4 {\nmul m1, m1 | nop if i0 == 1\n}\n").contains("nop"));
    assert!(err("loop 4 {\nmux m[0 + 1*i0], m1\n}\n")
        .starts_with("line 6:1: unknown op mnemonic `mux`"));
    let deep =
        "loop 2 {\n".repeat(MAX_LOOP_DEPTH + 1) + "nop\n" + &"}\n".repeat(MAX_LOOP_DEPTH + 1);
    assert!(err(&deep).contains("nested deeper"));
    let long = "loop 4294967295 {\n".repeat(3) + "nop\n" + &"}\n".repeat(3);
    assert!(err(&long).contains("overflows 64 bits"));
    // The largest trip count is fine, and the length is known without running.
    let p = parse_looped(
        ".format 3\n.pe 0\n.pes 1\n.mem 1\nloop 4294967295 {\nloop 4294967295 {\nnop\n}\n}\n",
    )
    .unwrap();
    assert_eq!(p.cycles(), 4294967295u64 * 4294967295);
}

#[test]
fn malformed_binary_is_rejected() {
    let p = parse_looped(".format 3\n.pe 1\n.pes 2\n.mem 8\nloop 3 {\nmul m[0 + 1*i0], m4 | add 0 | send acc -> m[4 + 1*i0] if i0 >= 1\n}\n").unwrap();
    let written = encode_looped(&p).unwrap();
    let old = isa::looped_binary::v3::encode(&p).unwrap();
    for good in [&written, &old] {
        assert_eq!(&decode_looped(good).unwrap(), &p);
        for cut in 0..good.len() {
            assert!(decode_looped(&good[..cut]).is_err());
        }
        // Every single-bit flip is caught (by the checksum or a field check).
        for i in 0..good.len() {
            for bit in 0..8 {
                let mut b = good.clone();
                b[i] ^= 1 << bit;
                assert_ne!(
                    decode_looped(&b).ok(),
                    Some(p.clone()),
                    "byte {i} bit {bit}"
                );
            }
        }
    }
    // A zero trip count with a valid checksum is still refused: in version 4 the loop-open
    // record's one count byte, in version 3 its u32 at offset 4.
    for (good, at, width) in [(&written, 28 + 1, 1), (&old, 28 + 4, 4)] {
        let mut b = good.clone();
        b[at..at + width].fill(0);
        let end = b.len() - 4;
        let crc = crc32_bitwise(&b[..end]);
        b[end..].copy_from_slice(&crc.to_le_bytes());
        assert!(decode_looped(&b)
            .unwrap_err()
            .to_string()
            .contains("at least 1"));
    }
}

#[test]
fn whole_iteration_windows_match_on_moving_running_sums_and_sends() {
    // Directed cases for windows over whole iterations of `loop 4 { first; loop k { mac } }`:
    // the accumulator's source and destination (and the send's source and destination) move
    // with the outer loop by every pair of strides, so a running sum kept in one word, a send
    // that meets what the next PE touches, and two writes to one word all occur. Every case
    // must run exactly as flattened, and the directed ring must take such windows.
    let mut nest = 0;
    for (src, dst) in [(0, 0), (1, 1), (1, 2), (2, 1), (0, 1), (1, 0)] {
        for k in [1u32, 3] {
            for (send_src, send_dst) in [(None, None), (Some(1), Some(1)), (Some(1), Some(0))] {
                let term = |field, stride: i32| {
                    (stride != 0).then_some(Term {
                        field,
                        level: 0,
                        stride,
                        wrap: 0,
                    })
                };
                let first = LBundle {
                    bundle: Bundle {
                        op: Op::mul(0, 8, None),
                        acc: Acc::Add {
                            src: AccSrc::Zero,
                            dst: Some(40),
                        },
                        xfer: Xfer::Nop,
                    },
                    terms: [term(Field::OpA, 1), term(Field::AccDst, src)]
                        .into_iter()
                        .flatten()
                        .collect(),
                    preds: vec![],
                };
                let mut terms: Vec<Term> = [
                    term(Field::OpA, 2),
                    term(Field::AccSrc, src),
                    term(Field::AccDst, dst),
                ]
                .into_iter()
                .flatten()
                .collect();
                let xfer = match (send_src, send_dst) {
                    (Some(s), Some(d)) => {
                        terms.extend(term(Field::XferSrc, s));
                        terms.extend(term(Field::XferDst, d));
                        Xfer::Send {
                            src: XferSrc::Mem(16),
                            dst: 8,
                        }
                    }
                    _ => Xfer::Nop,
                };
                terms.push(Term {
                    field: Field::OpB,
                    level: 1,
                    stride: 1,
                    wrap: 0,
                });
                terms.sort_by_key(|t| (t.field, t.level));
                let mac = LBundle {
                    bundle: Bundle {
                        op: Op::mul(1, 20, None),
                        acc: Acc::Add {
                            src: AccSrc::Mem(40),
                            dst: Some(40),
                        },
                        xfer,
                    },
                    terms,
                    preds: vec![],
                };
                let body = vec![
                    Node::Bundle(first),
                    Node::Loop(Loop::new(k, vec![Node::Bundle(mac)])),
                ];
                let progs: Vec<LoopProgram> = (0..2)
                    .map(|pe| LoopProgram {
                        pe,
                        pes: 2,
                        mem_words: 64,
                        body: vec![Node::Loop(Loop::new(4, body.clone()))],
                    })
                    .collect();
                let preloads = (0..2u32)
                    .flat_map(|pe| (0..64u32).map(move |a| (pe, a, (a as f32 - 20.0) / 16.0)))
                    .collect();
                nest += check(&Case { progs, preloads }).1;
            }
        }
    }
    assert!(nest > 40, "whole-iteration windows ran {nest} cycles");
}

#[test]
fn windows_over_any_structure_match_on_in_place_updates_and_fresh_words() {
    // The outer body nests two deep, so neither of the other planners takes it. Its in-place
    // scaling reads each word it writes, its running maximum lives in one word, and m50 is
    // first written inside a window, then read there. Each chain's first product reads m10
    // where the rest read m9, so it is no first step of the loop after it, and the chains stay
    // two stretches each (joined, the whole-iteration planner would take them).
    let text = |pe: u32| {
        format!(
            ".format 3\n.pe {pe}\n.pes 2\n.mem 64\nloop 3 {{\n    loop 2 {{\n        mul m[0 + 8*i1], m10 | add 0 -> m[40 + 1*i1]\n        loop 7 {{\n            mul m[1 + 8*i1 + 1*i2], m9 | add m[40 + 1*i1] -> m[40 + 1*i1]\n        }}\n    }}\n    max m40, m41 -> m50\n    loop 6 {{\n        mul m[16 + 1*i1], m9 -> m[16 + 1*i1]\n    }}\n    loop 6 {{\n        max m50, m[16 + 1*i1] -> m50\n    }}\n}}\n"
        )
    };
    let progs: Vec<LoopProgram> = (0..2)
        .map(|pe| parse_looped(&text(pe)).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let preloads = (0..2u32)
        .flat_map(|pe| (0..40u32).map(move |a| (pe, a, (a as f32 - 20.0) / 16.0 + pe as f32)))
        .collect();
    let c = Case { progs, preloads };
    let (_, _, general, _) = check(&c);
    // Of the 87 cycles, such windows cover 72; without the in-place rule none, and without
    // counting words written earlier in the window about 40.
    assert!(
        general > 50,
        "windows over any structure ran {general} cycles"
    );
}

/// A ring whose PEs each run `reps` dot products of `len` steps over a strided operand (the
/// weighted sum over values: `mul m[w + t], m[v + r + stride·t] | add sum_r -> sum_r`), the
/// sum of product `r` at `sum + step·r`, optionally sending a value word alongside, twice
/// over. `hole`: one value word read in the last product is never written (a fault).
fn strided_dots(
    pes: u32,
    reps: u32,
    len: u32,
    stride: u32,
    sum: (u32, i32),
    send: bool,
    hole: bool,
) -> Case {
    let send = if send {
        " | send m[16 + 1*i1 + 8*i2] -> m[112 + 2*i1 + 1*i2]"
    } else {
        ""
    };
    let sum = match sum {
        (base, 0) => format!("m{base}"),
        (base, step) if step < 0 => format!("m[{base} - {}*i1]", -step),
        (base, step) => format!("m[{base} + {step}*i1]"),
    };
    let text = |pe: u32| {
        format!(
            ".format 3\n.pe {pe}\n.pes {pes}\n.mem 128\nloop 2 {{\n    loop {reps} {{\n        loop {len} {{\n            mul m[0 + 1*i2], m[16 + 1*i1 + {stride}*i2] | add {sum} -> {sum}{send}\n        }}\n    }}\n}}\n"
        )
    };
    let progs: Vec<LoopProgram> = (0..pes)
        .map(|pe| parse_looped(&text(pe)).unwrap_or_else(|e| panic!("{e}\n{}", text(pe))))
        .collect();
    let last = 16 + (reps - 1) + stride * (len - 1);
    let preloads = (0..pes)
        .flat_map(|pe| {
            (0..112u32)
                .filter(move |&a| !(hole && a == last))
                .map(move |a| (pe, a, (a as f32 * 0.37 - 9.0) / (3.0 + pe as f32)))
        })
        .collect();
    Case { progs, preloads }
}

#[test]
fn dot_products_interleaved_across_iterations_match_with_strides_sends_and_faults() {
    // Sums in a word per product (independent iterations, run side by side), in one word for
    // all (a chain through the iterations), moving backwards, or inside the values the
    // products read; strided and unit-stride operands; a send beside each step; a word never
    // written. Each must run exactly as flattened, faults included, and the independent ones
    // must run side by side.
    let mut side = 0;
    let mut faults = 0;
    for pes in [1u32, 2, 3] {
        for (reps, len) in [(1u32, 5u32), (3, 1), (4, 2), (8, 5)] {
            for stride in [8u32, 1] {
                for sum in [(96u32, 1i32), (96, 0), (104, -1), (20, 1)] {
                    for send in [false, true] {
                        for hole in [false, true] {
                            let c = strided_dots(pes, reps, len, stride, sum, send, hole);
                            check(&c);
                            let mut m = LoopMachine::new(F32Domain, c.progs.clone()).unwrap();
                            for &(pe, a, v) in &c.preloads {
                                m.preload(pe, a, v).unwrap();
                            }
                            faults += u32::from(m.run_fast().is_err());
                            side += m.interleaved_cycles();
                        }
                    }
                }
            }
        }
    }
    assert!(faults > 100, "{faults} runs faulted");
    assert!(
        side > 1000,
        "dot products ran side by side for {side} PE-cycles"
    );
}

/// A dot product whose send reads the running sum's own word: each step's send carries the sum
/// as it was at the start of that step, as the flat machine reads it, in bulk too.
#[test]
fn a_send_of_the_running_sum_carries_each_steps_value() {
    // The random ring that found it: one step, the sum sent as it is accumulated.
    check(&case(14965313876937140416, 0));
}

#[test]
fn a_looped_send_of_the_running_sum_carries_each_steps_value() {
    let text = |pe: u32| {
        format!(
            ".format 3\n.pe {pe}\n.pes 2\n.mem 24\n\
             loop 6 {{\n    mul m[0 + 1*i0], m[6 + 1*i0] | add m12 -> m12 | send m12 -> m[13 + 1*i0]\n}}\n"
        )
    };
    let progs: Vec<LoopProgram> = (0..2).map(|pe| parse_looped(&text(pe)).unwrap()).collect();
    let preloads = (0..2)
        .flat_map(|pe| (0..13).map(move |a| (pe, a, (a as f32 - 5.5) / (3.0 + pe as f32))))
        .collect();
    check(&Case { progs, preloads });
}

/// Blocks rotating in place: each PE multiplies its own row by the block it holds while it
/// sends that block's words on, into the same words of the next PE, `ahead` cycles before it
/// reads them (0: in the same cycle, so its successor reads each word in the cycle it is
/// overwritten and sees the old one). Three rounds, so every PE works on three blocks.
fn rotating_ring(pes: u32, ahead: u32) -> Result<Case, String> {
    let text = |pe: u32| {
        let send = if ahead == 0 {
            "send m[8 + 1*i1] -> m[8 + 1*i1]".to_string()
        } else {
            let a = 8 + ahead;
            format!("send m[{a} + 1*i1] -> m[{a} + 1*i1] if i1 < {}", 8 - ahead)
        };
        format!(
            ".format 3\n.pe {pe}\n.pes {pes}\n.mem 64\nloop 3 {{\n    mul m0, m8 | add 0 -> m[40 + 1*i0]\n    loop 7 {{\n        mul m[1 + 1*i1], m[9 + 1*i1] | add m[40 + 1*i0] -> m[40 + 1*i0]\n    }}\n    loop 8 {{\n        mul m[0 + 1*i1], m[8 + 1*i1] | add m[48 + 1*i0] -> m[48 + 1*i0] | {send}\n    }}\n}}\n"
        )
    };
    let progs = (0..pes)
        .map(|pe| parse_looped(&text(pe)).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    let preloads = (0..pes)
        .flat_map(|pe| {
            let words = (0..16u32).map(move |a| (pe, a, (a as f32 - 7.5) / 8.0 + pe as f32));
            words.chain((48..51).map(move |a| (pe, a, 0.0)))
        })
        .collect();
    Ok(Case { progs, preloads })
}

#[test]
fn blocks_rotating_in_place_run_in_bulk_with_their_sends_held_back() -> Result<(), String> {
    for pes in 1..=5 {
        for ahead in [0, 1, 2] {
            let c = rotating_ring(pes, ahead)?;
            // Equal to the flat and the cycle-by-cycle runs (bit for bit, every word).
            check(&c);
            let mut m = LoopMachine::new(F32Domain, c.progs.clone()).map_err(|e| e.to_string())?;
            for &(pe, a, v) in &c.preloads {
                m.preload(pe, a, v).map_err(|e| e.to_string())?;
            }
            m.run_fast().map_err(|e| e.to_string())?;
            let held = m.held_cycles();
            // Read in the cycle of the send: the rotating loops run with held sends. Sent
            // ahead of the read, the words must be seen new, and only windows whose reads of
            // them all come first (the end of one round and the start of the next) may hold
            // their sends; `check` above holds every variant to the flat run.
            if ahead == 0 && held < 16 {
                return Err(format!("{pes} PEs: {held} cycles held back"));
            }
        }
    }
    Ok(())
}

#[test]
fn chains_whose_first_product_is_a_bundle_of_its_own_run_side_by_side() -> Result<(), String> {
    // Each iteration's chain is a one-cycle `add 0` bundle and a loop continuing it. Joined,
    // every iteration is one dot product, so on one PE the iterations' chains run side by
    // side; apart, each round holds one chain. Row 0's products are all −0: `add 0` keeps the
    // product's sign, so a join that started the sum from +0 would leave +0 there.
    for (pes, send) in [(1u32, false), (3, false), (3, true)] {
        let sends = |head: bool| match (send, head) {
            (false, _) => String::new(),
            (true, true) => " | send m[0 + 8*i0] -> m[100 + 8*i0]".into(),
            (true, false) => " | send m[1 + 8*i0 + 1*i1] -> m[101 + 8*i0 + 1*i1]".into(),
        };
        let text = |pe: u32| {
            format!(
                ".format 3\n.pe {pe}\n.pes {pes}\n.mem 140\nloop 5 {{\n    mul m[0 + 8*i0], m[40 + 8*i0] | add 0 -> m[90 + 1*i0]{}\n    loop 7 {{\n        mul m[1 + 8*i0 + 1*i1], m[41 + 8*i0 + 1*i1] | add m[90 + 1*i0] -> m[90 + 1*i0]{}\n    }}\n}}\n",
                sends(true),
                sends(false)
            )
        };
        let progs = (0..pes)
            .map(|pe| parse_looped(&text(pe)).map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        let preloads: Vec<(u32, u32, f32)> = (0..pes)
            .flat_map(|pe| {
                (0..80u32).map(move |a| {
                    let v = match a {
                        0..8 => -0.0,
                        40..48 => 0.5 + a as f32,
                        _ => (a as f32 - 30.0) / 8.0 + pe as f32,
                    };
                    (pe, a, v)
                })
            })
            .collect();
        let c = Case {
            progs: progs.clone(),
            preloads: preloads.clone(),
        };
        check(&c);
        let mut m = LoopMachine::new(F32Domain, progs).map_err(|e| e.to_string())?;
        for &(pe, a, v) in &preloads {
            m.preload(pe, a, v).map_err(|e| format!("{e:?}"))?;
        }
        m.run_fast().map_err(|e| format!("{e:?}"))?;
        if m.read(0, 90).map(|v| v.to_bits()) != Some((-0.0f32).to_bits()) {
            return Err(format!("row 0's sum is {:?}, not -0", m.read(0, 90)));
        }
        if pes == 1 && m.interleaved_cycles() < 5 * 8 {
            return Err(format!(
                "the five chains ran side by side for {} cycles",
                m.interleaved_cycles()
            ));
        }
    }
    Ok(())
}
