//! The binary form of loop programs, version 4 (docs/isa.md, "Binary form"): the byte layout
//! against hand-assembled bytes, round trips of generated programs across every width
//! boundary, one rejection per canonicality rule, truncation, bit flips and the checksum, and
//! version 3 staying readable. Expected bytes and lengths are written from the specification
//! here, not taken from the encoder.

use isa::looped_binary::v3;
use isa::{
    decode_any, decode_looped, encode_looped, Acc, AccSrc, AnyProgram, Bundle, Cmp, CountStep,
    DecodeError, Field, LBundle, Loop, LoopProgram, Node, Op, Pred, Slot, Term, Xfer, XferSrc,
    LOOP_BINARY_VERSION, MAX_LOOP_DEPTH,
};
use proptest::prelude::*;

use crate::common;
use common::crc32_bitwise;

const MAGIC: &[u8; 8] = b"ATNCISA\0";

/// A version-4 file around `records`, with header widths `w` and `x` and a correct checksum.
fn file(w: u8, x: u8, mem_words: u32, records: &[u8]) -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    b.extend_from_slice(&4u16.to_le_bytes());
    b.extend_from_slice(&[w, x]);
    for v in [1u32, 2, mem_words, records.len() as u32] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend_from_slice(records);
    let crc = crc32fast::hash(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

fn fix_crc(b: &mut [u8]) {
    let end = b.len() - 4;
    let crc = crc32fast::hash(&b[..end]);
    b[end..].copy_from_slice(&crc.to_le_bytes());
}

fn send(src: u32, dst: u32) -> Bundle {
    Bundle {
        op: Op::Nop,
        acc: Acc::Nop,
        xfer: Xfer::Send {
            src: XferSrc::Mem(src),
            dst,
        },
    }
}

/// `mul m[0 + 1*i0], m4 | add 0 | send acc -> m[260 + 1*i0] if i0 >= 1` in a loop of 3, then
/// `exp m5, 0.5 -> m6`, on PE 1 of 2 with 300 words.
fn example() -> LoopProgram {
    let body = LBundle {
        bundle: Bundle {
            op: Op::mul(0, 4, None),
            acc: Acc::Add {
                src: AccSrc::Zero,
                dst: None,
            },
            xfer: Xfer::Send {
                src: XferSrc::Acc,
                dst: 260,
            },
        },
        terms: vec![
            Term {
                field: Field::OpA,
                level: 0,
                stride: 1,
                wrap: 0,
            },
            Term {
                field: Field::XferDst,
                level: 0,
                stride: 1,
                wrap: 0,
            },
        ],
        preds: vec![Pred {
            slot: Slot::Xfer,
            level: 0,
            cmp: Cmp::Ge,
            value: 1,
        }],
    };
    LoopProgram {
        pe: 1,
        pes: 2,
        mem_words: 300,
        body: vec![
            Node::Loop(Loop::new(3, vec![Node::Bundle(body)])),
            Node::Bundle(LBundle::plain(Bundle {
                op: Op::exp(5, 0.5, Some(6)),
                acc: Acc::Nop,
                xfer: Xfer::Nop,
            })),
        ],
    }
}

/// The example's records, assembled by hand from the tables of docs/isa.md.
const EXAMPLE_RECORDS: [u8; 30] = [
    0x01, 0x03, // loop open, count in 1 byte: 3
    0x64, 0x36, 0x02, 0x01, // bundle mul with terms and predicates; flags; T = 2, P = 1
    0x00, 0x00, 0x04, 0x00, 0x04, 0x01, // op a 0, op b 4, xfer dst 260
    0x00, 0x01, 0x06, 0x01, // op a +1·i0, xfer dst +1·i0
    0x62, 0x01, 0x00, // xfer if i0 >= 1
    0x02, // loop close
    0x08, 0x01, // bundle exp; flags: op dst
    0x05, 0x00, 0x00, 0x00, 0x00, 0x3f, 0x06, 0x00, // op a 5, scale 0.5, op dst 6
];

#[test]
fn layout_matches_the_spec() {
    let p = example();
    let bytes = encode_looped(&p).unwrap();
    assert_eq!(bytes, file(2, 2, 300, &EXAMPLE_RECORDS));
    assert_eq!(bytes.len(), 28 + 30 + 4);
    assert_eq!(isa::looped_binary::encoded_len(&p), 62);
    assert_eq!(LOOP_BINARY_VERSION, 4);
    assert_eq!(decode_looped(&bytes).unwrap(), p);
    assert_eq!(decode_any(&bytes).unwrap(), AnyProgram::Looped(p.clone()));
    // Version 3 of the same program: 8 + (40 + 2·12 + 8) + 4 + 40 bytes of records.
    assert_eq!(v3::encode(&p).unwrap().len(), 28 + 124 + 4);
}

#[test]
fn version_3_stays_readable() {
    let p = example();
    let old = v3::encode(&p).unwrap();
    assert_eq!(&old[8..10], &3u16.to_le_bytes());
    assert_eq!(decode_looped(&old).unwrap(), p);
    assert_eq!(decode_any(&old).unwrap(), AnyProgram::Looped(p.clone()));
    // Each version's bytes are refused with the other's version number.
    let mut b = old.clone();
    b[8] = 4;
    fix_crc(&mut b);
    assert!(decode_looped(&b).is_err());
    let mut b = encode_looped(&p).unwrap();
    b[8] = 3;
    fix_crc(&mut b);
    assert!(decode_looped(&b).is_err());
    for v in [0u16, 1, 2, 5, 9] {
        let mut b = encode_looped(&p).unwrap();
        b[8..10].copy_from_slice(&v.to_le_bytes());
        fix_crc(&mut b);
        assert_eq!(decode_looped(&b), Err(DecodeError::UnsupportedVersion(v)));
    }
}

#[test]
fn every_truncation_and_bit_flip_is_rejected() {
    let p = example();
    let good = encode_looped(&p).unwrap();
    for cut in 0..good.len() {
        assert!(decode_looped(&good[..cut]).is_err(), "cut at {cut}");
        assert!(decode_any(&good[..cut]).is_err(), "cut at {cut}");
    }
    let mut longer = good.clone();
    longer.push(0);
    assert_eq!(decode_looped(&longer), Err(DecodeError::TrailingBytes));
    for i in 0..good.len() {
        for bit in 0..8 {
            let mut b = good.clone();
            b[i] ^= 1 << bit;
            assert_ne!(
                decode_looped(&b).ok(),
                Some(p.clone()),
                "byte {i} bit {bit}"
            );
            // Past the magic and version, the length field's flips change the expected
            // length; every other flip is what the checksum catches.
            let want = match i {
                0..=9 => continue,
                24..=27 => [DecodeError::Truncated, DecodeError::TrailingBytes],
                _ => [DecodeError::ChecksumMismatch, DecodeError::ChecksumMismatch],
            };
            let got = decode_looped(&b).unwrap_err();
            assert!(want.contains(&got), "byte {i} bit {bit}: {got}");
        }
    }
    // The checksum covers header and records, not itself, and is CRC-32/ISO-HDLC.
    let end = good.len() - 4;
    assert_eq!(
        u32::from_le_bytes(good[end..].try_into().unwrap()),
        crc32_bitwise(&good[..end])
    );
}

/// The decode error of a version-4 file of `records` with widths 2 and 2 and 300 words.
fn refusal(records: &[u8]) -> String {
    refusal_with(2, 2, 300, records)
}

fn refusal_with(w: u8, x: u8, mem: u32, records: &[u8]) -> String {
    match decode_looped(&file(w, x, mem, records)) {
        Ok(p) => panic!("accepted {records:02x?} as {p:?}"),
        Err(e) => e.to_string(),
    }
}

/// `nop | nop | send m1 -> m2` at width 2.
const SEND: [u8; 6] = [0x00, 0x10, 0x01, 0x00, 0x02, 0x00];

fn with(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

#[test]
fn the_smallest_records_decode() {
    // The building blocks of the refusals below are accepted on their own.
    let send_only = decode_looped(&file(2, 2, 300, &SEND)).unwrap();
    assert_eq!(
        send_only.body,
        vec![Node::Bundle(LBundle::plain(send(1, 2)))]
    );
    let looped = decode_looped(&file(2, 2, 300, &with(&[&[0x01, 0x03], &SEND, &[0x02]]))).unwrap();
    assert_eq!(
        looped.body,
        vec![Node::Loop(Loop::new(
            3,
            vec![Node::Bundle(LBundle::plain(send(1, 2)))]
        ))]
    );
}

#[test]
fn each_canonicality_rule_is_enforced() {
    // Header widths: 2, 3 or 4 bytes, and exactly the smallest the program needs.
    for (w, x) in [(0, 2), (1, 2), (5, 2), (2, 0), (2, 1), (2, 5)] {
        assert!(
            refusal_with(w, x, 300, &SEND).contains("must be 2, 3 or 4"),
            "{w} {x}"
        );
    }
    let wide_send = [0x00, 0x10, 0x01, 0x00, 0x00, 0x02, 0x00, 0x00];
    assert!(refusal_with(3, 2, 300, &wide_send).contains("need exactly 2"));
    assert!(refusal_with(2, 3, 300, &SEND).contains("strides 2"));
    // mem_words − 1 = 65536 needs 3 bytes.
    assert!(refusal_with(2, 2, 65537, &SEND).contains("need exactly 3"));
    decode_looped(&file(2, 2, 65536, &SEND)).unwrap();
    decode_looped(&file(3, 2, 65537, &wide_send)).unwrap();
    // A long stride must need its width: 200 fits in 2 bytes, so X = 3 is refused.
    let strided = |x: u8, stride: &[u8]| {
        let mut r = vec![0x01, 0x03, 0x20, 0x10, 0x01];
        r.extend_from_slice(&SEND[2..]);
        r.push(0x85); // xfer src (5), level 0, long
        r.extend_from_slice(stride);
        r.push(0x02);
        decode_looped(&file(2, x, 300, &r))
    };
    strided(2, &[0xc8, 0x00]).unwrap();
    assert!(strided(3, &[0xc8, 0x00, 0x00])
        .unwrap_err()
        .to_string()
        .contains("strides 2"));
    strided(3, &[0x00, 0x00, 0x01]).unwrap();
    assert!(strided(2, &[0x05, 0x00])
        .unwrap_err()
        .to_string()
        .contains("fits in one byte"));
    assert!(strided(2, &[0x80, 0xff])
        .unwrap_err()
        .to_string()
        .contains("stride -128 in the long form"));
    // −129 takes the long form: the record is accepted, and the address 1 − 2·129 is not.
    assert!(strided(2, &[0x7f, 0xff])
        .unwrap_err()
        .to_string()
        .contains("outside the address space"));

    // Record heads.
    assert!(refusal(&[0x03]).contains("unknown record type 3"));
    assert!(refusal(&with(&[&[0x80], &SEND[1..]])).contains("undefined bits set in bundle head"));
    assert!(refusal(&[0x18, 0x00, 0x01, 0x00, 0x02, 0x00]).contains("unknown op kind 6"));
    assert!(refusal(&[0x1c, 0x00, 0x01, 0x00, 0x02, 0x00]).contains("unknown op kind 7"));
    assert!(refusal(&with(&[&[0x21, 0x03], &SEND, &[0x02]])).contains("loop head"));
    assert!(refusal(&with(&[&[0x81, 0x03], &SEND, &[0x02]])).contains("loop head"));
    assert!(refusal(&with(&[&[0x01, 0x03], &SEND, &[0x06]])).contains("loop end"));
    assert!(refusal(&with(&[&[0x01, 0x03], &SEND, &[0x82]])).contains("loop end"));

    // Flags: undefined bits, and combinations that leave a flag without meaning.
    assert!(refusal(&[0x00, 0x50, 0x01, 0x00, 0x02, 0x00]).contains("undefined flag bits"));
    assert!(refusal(&[0x00, 0x90, 0x01, 0x00, 0x02, 0x00]).contains("undefined flag bits"));
    assert!(refusal(&[0x00, 0x04]).contains("without the acc-present flag"));
    assert!(refusal(&[0x00, 0x08]).contains("without the acc-present flag"));
    assert!(refusal(&[0x00, 0x20]).contains("without the xfer-present flag"));
    assert!(refusal(&[0x00, 0x01, 0x05, 0x00]).contains("op is nop"));

    // Counts: a bit set in the head means at least one term or predicate.
    assert!(refusal(&[0x20, 0x10, 0x00, 0x01, 0x00, 0x02, 0x00]).contains("term count 0"));
    assert!(refusal(&[0x40, 0x10, 0x00, 0x01, 0x00, 0x02, 0x00]).contains("predicate count 0"));

    // Terms and predicates.
    let in_loop = |bundle: &[u8]| with(&[&[0x01, 0x03], bundle, &[0x02]]);
    let term = |t: &[u8]| in_loop(&with(&[&[0x20, 0x10, 0x01], &SEND[2..], t]));
    let pred = |pr: &[u8]| in_loop(&with(&[&[0x40, 0x10, 0x01], &SEND[2..], pr]));
    decode_looped(&file(2, 2, 300, &term(&[0x05, 0x01]))).unwrap();
    decode_looped(&file(2, 2, 300, &term(&[0x45, 0x01, 0x02, 0x00]))).unwrap();
    assert!(refusal(&term(&[0x07, 0x01])).contains("unknown address field 7"));
    assert!(refusal(&term(&[0x45, 0x01, 0x00, 0x00])).contains("wrap of 0"));
    decode_looped(&file(2, 2, 300, &pred(&[0x62, 0x01, 0x00]))).unwrap();
    assert!(refusal(&pred(&[0xe2, 0x01, 0x00])).contains("undefined bit set in predicate"));
    assert!(refusal(&pred(&[0x63, 0x01, 0x00])).contains("unknown predicate slot 3"));

    // Loop counts in the fewest bytes; steps.
    assert!(refusal(&with(&[&[0x05, 0x03, 0x00], &SEND, &[0x02]])).contains("not the fewest"));
    assert!(
        refusal(&with(&[&[0x0d, 0xff, 0xff, 0x00, 0x00], &SEND, &[0x02]]))
            .contains("not the fewest")
    );
    decode_looped(&file(
        2,
        2,
        300,
        &with(&[&[0x05, 0x00, 0x01], &SEND, &[0x02]]),
    ))
    .unwrap();
    let stepped = |step: &[u8]| with(&[&[0x01, 0x03, 0x11, 0x02], step, &SEND, &[0x02, 0x02]]);
    let tri = decode_looped(&file(2, 2, 300, &stepped(&[0x00, 0x01, 0x00]))).unwrap();
    let Node::Loop(outer) = &tri.body[0] else {
        panic!("not a loop")
    };
    let Node::Loop(inner) = &outer.body[0] else {
        panic!("not a loop")
    };
    assert_eq!(inner.step, Some(CountStep { level: 0, per: 1 }));
    assert!(refusal(&stepped(&[0x08, 0x01, 0x00])).contains("step level"));
    assert!(refusal(&stepped(&[0x00, 0x00, 0x00])).contains("step is 0"));

    // The immediate is a finite f32.
    assert!(refusal(&[0x08, 0x00, 0x05, 0x00, 0x00, 0x00, 0x80, 0x7f]).contains("not finite"));
    decode_looped(&file(
        2,
        2,
        300,
        &[0x08, 0x00, 0x05, 0x00, 0x00, 0x00, 0x80, 0x3f],
    ))
    .unwrap();

    // Structure.
    assert!(refusal(&[0x02]).contains("loop end without an open loop"));
    assert!(refusal(&with(&[&[0x01, 0x03], &SEND])).contains("loop not closed"));
    let deep = with(&[
        &[0x01, 0x02].repeat(MAX_LOOP_DEPTH + 1),
        &SEND,
        &[0x02].repeat(MAX_LOOP_DEPTH + 1),
    ]);
    assert!(refusal(&deep).contains("nested deeper than 8"));
    for cut in [
        &[0x01][..],
        &[0x05, 0x01],
        &[0x00],
        &[0x00, 0x10, 0x01, 0x00, 0x02],
    ] {
        assert!(refusal(cut).contains("cut off"), "{cut:02x?}");
    }
}

#[test]
fn the_program_rules_apply_after_decoding() {
    let refused = |records: &[u8]| refusal(records);
    assert!(refused(&with(&[&[0x01, 0x00], &SEND, &[0x02]])).contains("at least 1"));
    // A term on i1 inside one loop, a zero stride, terms out of order, a predicate on a nop
    // slot, an address below 0.
    let loop_of = |bundle: &[u8]| with(&[&[0x01, 0x03], bundle, &[0x02]]);
    assert!(refused(&loop_of(&[
        0x20, 0x10, 0x01, 0x01, 0x00, 0x02, 0x00, 0x0d, 0x01
    ]))
    .contains("only 1 loop(s) enclose"));
    assert!(refused(&loop_of(&[
        0x20, 0x10, 0x01, 0x01, 0x00, 0x02, 0x00, 0x05, 0x00
    ]))
    .contains("zero stride"));
    assert!(refused(&loop_of(&[
        0x20, 0x10, 0x02, 0x01, 0x00, 0x02, 0x00, 0x06, 0x01, 0x05, 0x01
    ]))
    .contains("sorted"));
    assert!(refused(&loop_of(&[
        0x40, 0x10, 0x01, 0x01, 0x00, 0x02, 0x00, 0x60, 0x01, 0x00
    ]))
    .contains("nop"));
    assert!(refused(&loop_of(&[
        0x20, 0x10, 0x01, 0x01, 0x00, 0x02, 0x00, 0x05, 0xff
    ]))
    .contains("outside the address space"));
}

/// Values at and around each width boundary.
const VALUES: [u32; 10] = [
    0,
    1,
    0xff,
    0xffff,
    0x1_0000,
    0xff_ffff,
    0x100_0000,
    0x7fff_ffff,
    0xffff_fff0,
    u32::MAX,
];
const STRIDES: [i32; 18] = [
    1,
    -1,
    127,
    -128,
    128,
    -129,
    0x7fff,
    -0x8000,
    0x8000,
    -0x8001,
    0x7f_ffff,
    -0x80_0000,
    0x80_0000,
    -0x80_0001,
    i32::MAX,
    i32::MIN,
    64,
    704,
];
const COUNTS: [u32; 9] = [
    1,
    2,
    255,
    256,
    0xffff,
    0x1_0000,
    0xff_ffff,
    0x100_0000,
    u32::MAX,
];

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

fn addr(r: &mut Rng) -> u32 {
    if r.chance(50) {
        r.below(300) as u32
    } else {
        r.pick(&VALUES)
    }
}

fn gen_bundle(r: &mut Rng, bounds: &[u32]) -> LBundle {
    let op = match r.below(6) {
        0 => Op::Nop,
        1 => Op::mul(addr(r), addr(r), r.chance(50).then(|| addr(r))),
        2 => Op::exp(addr(r), 0.125, r.chance(50).then(|| addr(r))),
        3 => Op::expd(addr(r), addr(r), -2.5, Some(addr(r))),
        4 => Op::max(addr(r), addr(r), Some(addr(r))),
        _ => Op::div(addr(r), addr(r), None),
    };
    let acc = match (op, r.below(3)) {
        (Op::Nop, _) | (_, 0) => Acc::Nop,
        (_, 1) => Acc::Add {
            src: AccSrc::Zero,
            dst: r.chance(50).then(|| addr(r)),
        },
        _ => Acc::Add {
            src: AccSrc::Mem(addr(r)),
            dst: r.chance(50).then(|| addr(r)),
        },
    };
    let xfer = match r.below(3) {
        0 => Xfer::Nop,
        1 if acc != Acc::Nop => Xfer::Send {
            src: XferSrc::Acc,
            dst: addr(r),
        },
        _ => Xfer::Send {
            src: XferSrc::Mem(addr(r)),
            dst: addr(r),
        },
    };
    let mut b = LBundle::plain(Bundle { op, acc, xfer });
    for f in Field::ALL {
        if isa::looped::field(&b.bundle, f).is_none() {
            continue;
        }
        let mut terms = Vec::new();
        for (level, _) in bounds.iter().enumerate() {
            if r.chance(40) {
                terms.push(Term {
                    field: f,
                    level: level as u8,
                    stride: r.pick(&STRIDES),
                    wrap: if r.chance(25) {
                        r.pick(&[2, 3, 0xffff, 0x1_0000, 0xff_ffff, 0x100_0000, u32::MAX])
                    } else {
                        0
                    },
                });
            }
        }
        // Keep the field's addresses inside the address space: drop the terms if their
        // range is wider than it, else move the base into the range that fits.
        let mut t = b.clone();
        isa::looped::set_field(&mut t.bundle, f, 0);
        t.terms = terms.clone();
        let Some((lo, hi)) = t.hull(f, bounds) else {
            continue;
        };
        if i128::from(hi) - i128::from(lo) > i128::from(u32::MAX) {
            continue;
        }
        let (first, last) = (-lo, i64::from(u32::MAX) - hi);
        let base = if r.chance(50) { first } else { last };
        isa::looped::set_field(&mut b.bundle, f, base as u32);
        b.terms.extend(terms);
    }
    b.terms.sort_by_key(|t| (t.field, t.level));
    if !bounds.is_empty() {
        for slot in Slot::ALL {
            let used = match slot {
                Slot::Op => op != Op::Nop,
                Slot::Acc => acc != Acc::Nop,
                Slot::Xfer => xfer != Xfer::Nop,
            };
            if used && r.chance(30) {
                b.preds.push(Pred {
                    slot,
                    level: r.below(bounds.len() as u64) as u8,
                    cmp: r.pick(&Cmp::ALL),
                    value: r.pick(&VALUES),
                });
            }
        }
    }
    b
}

/// A program whose loops run at most one count beyond 16 bits per nest, so that run lengths
/// stay within 64 bits; some nests are stepped.
fn gen_body(r: &mut Rng, bounds: &mut Vec<u32>, big: bool, stepped: bool) -> Vec<Node> {
    let n = 1 + r.below(3);
    (0..n)
        .map(|_| {
            if bounds.len() < MAX_LOOP_DEPTH && r.chance(45) {
                let level = r.below(bounds.len().max(1) as u64) as u8;
                let outer = bounds.get(usize::from(level)).copied().unwrap_or(0);
                let (count, step, most, big) =
                    if (1..=300).contains(&outer) && !stepped && r.chance(20) {
                        let per: i16 = r.pick(&[1, 2, -1, -3]);
                        let count = if per < 0 {
                            1 + (outer - 1) * u32::from(per.unsigned_abs())
                        } else {
                            r.pick(&[1, 5, 300])
                        };
                        let last =
                            (i64::from(count) + i64::from(per) * i64::from(outer - 1)) as u32;
                        (count, Some(CountStep { level, per }), count.max(last), big)
                    } else if !big && r.chance(30) {
                        let c = r.pick(&COUNTS);
                        (c, None, c, true)
                    } else {
                        let c = r.pick(&[1, 2, 3, 255, 256]);
                        (c, None, c, big)
                    };
                bounds.push(most);
                let body = gen_body(r, bounds, big, stepped || step.is_some());
                bounds.pop();
                Node::Loop(Loop { count, step, body })
            } else {
                Node::Bundle(gen_bundle(r, bounds))
            }
        })
        .collect()
}

fn gen_program(seed: u64) -> LoopProgram {
    let mut r = Rng(seed | 1);
    LoopProgram {
        pe: r.below(4) as u32,
        pes: 4,
        mem_words: r.pick(&[
            0,
            1,
            300,
            0x1_0000,
            0x1_0001,
            0x100_0000,
            0x100_0001,
            u32::MAX,
        ]),
        body: gen_body(&mut r, &mut Vec::new(), false, false),
    }
}

/// Bytes that hold `v` unsigned, at least 2: the header's value width.
fn value_width(v: u32) -> usize {
    match v {
        0..=0xffff => 2,
        0x1_0000..=0xff_ffff => 3,
        _ => 4,
    }
}

fn stride_bytes(s: i32) -> usize {
    if i8::try_from(s).is_ok() {
        1
    } else if i16::try_from(s).is_ok() {
        2
    } else if (-0x80_0000..0x80_0000).contains(&s) {
        3
    } else {
        4
    }
}

/// `(W, X, length)` of the file for `p`, from the specification's tables.
fn spec(p: &LoopProgram) -> (usize, usize, usize) {
    fn widths(nodes: &[Node], top: &mut u32, x: &mut usize) {
        for n in nodes {
            match n {
                Node::Loop(l) => widths(&l.body, top, x),
                Node::Bundle(b) => {
                    for f in Field::ALL {
                        *top = (*top).max(isa::looped::field(&b.bundle, f).unwrap_or(0));
                    }
                    for t in &b.terms {
                        *top = (*top).max(t.wrap);
                        *x = (*x).max(stride_bytes(t.stride));
                    }
                    for pr in &b.preds {
                        *top = (*top).max(pr.value);
                    }
                }
            }
        }
    }
    fn len(nodes: &[Node], w: usize, x: usize) -> usize {
        nodes
            .iter()
            .map(|n| match n {
                Node::Loop(l) => {
                    let count = 1
                        + (l.count > 0xff) as usize
                        + (l.count > 0xffff) as usize
                        + (l.count > 0xff_ffff) as usize;
                    1 + count + 3 * l.step.is_some() as usize + len(&l.body, w, x) + 1
                }
                Node::Bundle(b) => {
                    let addrs = Field::ALL
                        .iter()
                        .filter(|&&f| isa::looped::field(&b.bundle, f).is_some())
                        .count();
                    let imm = matches!(b.bundle.op, Op::Arith(a) if a.kind.info().imm);
                    let terms: usize = b
                        .terms
                        .iter()
                        .map(|t| {
                            1 + if stride_bytes(t.stride) == 1 { 1 } else { x }
                                + if t.wrap != 0 { w } else { 0 }
                        })
                        .sum();
                    2 + !b.terms.is_empty() as usize
                        + !b.preds.is_empty() as usize
                        + w * addrs
                        + 4 * imm as usize
                        + terms
                        + (1 + w) * b.preds.len()
                }
            })
            .sum()
    }
    let mut top = p.mem_words.saturating_sub(1);
    let mut x = 2;
    widths(&p.body, &mut top, &mut x);
    let w = value_width(top);
    (w, x, 28 + len(&p.body, w, x) + 4)
}

#[test]
fn generated_programs_round_trip_at_every_width() {
    let mut seen_w = [0u32; 5];
    let mut seen_x = [0u32; 5];
    let mut seen_count_bytes = [0u32; 5];
    let mut valid = 0;
    let mut seen_v3_smaller = 0;
    for seed in 0..3000u64 {
        let p = gen_program(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        if p.validate().is_err() {
            continue;
        }
        valid += 1;
        let bytes = encode_looped(&p).unwrap();
        let (w, x, len) = spec(&p);
        assert_eq!(bytes.len(), len, "seed {seed}\n{}", p.to_text());
        assert_eq!((usize::from(bytes[10]), usize::from(bytes[11])), (w, x));
        assert_eq!(isa::looped_binary::encoded_len(&p), len as u64);
        assert_eq!(
            decode_looped(&bytes).unwrap(),
            p,
            "seed {seed}\n{}",
            p.to_text()
        );
        let old = v3::encode(&p).unwrap();
        assert_eq!(decode_looped(&old).unwrap(), p);
        if old.len() <= bytes.len() {
            seen_v3_smaller += 1;
        }
        seen_w[w] += 1;
        seen_x[x] += 1;
        count_bytes(&p.body, &mut seen_count_bytes);
    }
    assert!(
        valid >= 2000,
        "only {valid} of 3000 generated programs are valid"
    );
    assert_eq!(seen_v3_smaller, 0, "version 4 is never larger");
    for k in 2..=4 {
        assert!(seen_w[k] > 20, "value width {k} seen {} times", seen_w[k]);
        assert!(seen_x[k] > 20, "stride width {k} seen {} times", seen_x[k]);
    }
    for (k, &seen) in seen_count_bytes.iter().enumerate().skip(1) {
        assert!(seen > 20, "{k}-byte counts seen {seen}");
    }
}

fn count_bytes(nodes: &[Node], seen: &mut [u32; 5]) {
    for n in nodes {
        if let Node::Loop(l) = n {
            seen[match l.count {
                0..=0xff => 1,
                0x100..=0xffff => 2,
                0x1_0000..=0xff_ffff => 3,
                _ => 4,
            }] += 1;
            count_bytes(&l.body, seen);
        }
    }
}

#[test]
fn programs_beyond_the_fields_are_refused_by_the_encoder() {
    /// The example with its looped bundle changed by `edit`.
    fn edited(edit: impl FnOnce(&mut LBundle)) -> LoopProgram {
        let mut p = example();
        if let Node::Loop(l) = &mut p.body[0] {
            if let Node::Bundle(b) = &mut l.body[0] {
                edit(b);
            }
        }
        p
    }
    let p = edited(|b| b.terms[0].level = 8);
    assert!(encode_looped(&p)
        .unwrap_err()
        .to_string()
        .contains("loop level is 8"));
    let preds = |n: u32| {
        move |b: &mut LBundle| {
            b.preds = (0..n)
                .map(|v| Pred {
                    slot: Slot::Xfer,
                    level: 0,
                    cmp: Cmp::Ne,
                    value: v,
                })
                .collect()
        }
    };
    assert!(encode_looped(&edited(preds(256)))
        .unwrap_err()
        .to_string()
        .contains("predicates on one bundle is 256"));
    let p = edited(preds(255));
    let bytes = encode_looped(&p).unwrap();
    assert_eq!(decode_looped(&bytes).unwrap(), p);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    /// Whatever record stream the decoder accepts is exactly what the encoder writes for it.
    #[test]
    fn accepted_streams_are_canonical(
        w in 2u8..=4,
        x in 2u8..=4,
        records in prop::collection::vec(
            prop_oneof![
                4 => prop::sample::select(vec![0x00u8, 0x01, 0x02, 0x04, 0x05, 0x10, 0x20, 0x36, 0x40, 0x62, 0x80, 0xff]),
                1 => any::<u8>(),
            ],
            0..24,
        ),
    ) {
        let bytes = file(w, x, 300, &records);
        if let Ok(p) = decode_looped(&bytes) {
            prop_assert_eq!(encode_looped(&p).unwrap(), bytes);
        }
    }

    #[test]
    fn any_bytes_decode_or_are_refused(bytes in prop::collection::vec(any::<u8>(), 0..80)) {
        let mut b = bytes;
        if b.len() >= 12 {
            b[..8].copy_from_slice(MAGIC);
            b[8..10].copy_from_slice(&4u16.to_le_bytes());
        }
        if let Ok(p) = decode_looped(&b) {
            prop_assert_eq!(encode_looped(&p).unwrap(), b);
        }
    }
}
