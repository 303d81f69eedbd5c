//! Text and binary formats: round trips, canonicality, and rejection of bad
//! input.

use isa::{
    decode, encode, parse, Acc, AccSrc, Addr, Bundle, DecodeError, Op, Program, Xfer, XferSrc,
};
use proptest::prelude::*;

fn addr() -> impl Strategy<Value = Addr> {
    // Small addresses are what programs use; the full range catches width
    // and sign mistakes.
    prop_oneof![3 => 0u32..64, 1 => any::<u32>()]
}

fn dst() -> impl Strategy<Value = Option<Addr>> {
    proptest::option::of(addr())
}

fn scale() -> impl Strategy<Value = f32> {
    // Arbitrary bits reach subnormals, -0.0 and extreme exponents, which
    // are where text round trips break.
    prop_oneof![
        any::<u32>().prop_map(f32::from_bits),
        prop::sample::select(vec![0.25f32, 1.0, -0.0, 0.0, 0.176_776_7, 1e-7, f32::MAX]),
    ]
    .prop_filter("finite", |s| s.is_finite())
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        Just(Op::Nop),
        (addr(), addr(), dst()).prop_map(|(a, b, dst)| Op::mul(a, b, dst)),
        (addr(), scale(), dst()).prop_map(|(a, scale, dst)| Op::exp(a, scale, dst)),
        (addr(), addr(), dst()).prop_map(|(a, b, dst)| Op::div(a, b, dst)),
        (addr(), addr(), dst()).prop_map(|(a, b, dst)| Op::max(a, b, dst)),
        (addr(), addr(), scale(), dst()).prop_map(|(a, b, s, dst)| Op::expd(a, b, s, dst)),
    ]
}

fn acc() -> impl Strategy<Value = Acc> {
    let src = prop_oneof![addr().prop_map(AccSrc::Mem), Just(AccSrc::Zero)];
    prop_oneof![
        Just(Acc::Nop),
        (src, dst()).prop_map(|(src, dst)| Acc::Add { src, dst }),
    ]
}

fn xfer() -> impl Strategy<Value = Xfer> {
    let src = prop_oneof![addr().prop_map(XferSrc::Mem), Just(XferSrc::Acc)];
    prop_oneof![
        Just(Xfer::Nop),
        (src, addr()).prop_map(|(src, dst)| Xfer::Send { src, dst }),
    ]
}

fn bundle() -> impl Strategy<Value = Bundle> {
    (op(), acc(), xfer()).prop_map(|(op, acc, xfer)| Bundle { op, acc, xfer })
}

fn program() -> impl Strategy<Value = Program> {
    (
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        prop::collection::vec(bundle(), 0..40),
    )
        .prop_map(|(pe, pes, mem_words, bundles)| Program {
            pe,
            pes,
            mem_words,
            bundles,
        })
}

fn fix_crc(bytes: &mut [u8]) {
    let n = bytes.len() - 4;
    let crc = crc32fast::hash(&bytes[..n]);
    bytes[n..].copy_from_slice(&crc.to_le_bytes());
}

proptest! {
    #[test]
    fn text_and_binary_round_trip(p in program()) {
        let text = p.to_text();
        let parsed = parse(&text).unwrap();
        let bytes = encode(&parsed).unwrap();
        // Comparing encodings rather than programs also checks the bits of
        // every scale (`==` on f32 equates 0.0 and -0.0).
        prop_assert_eq!(&bytes, &encode(&p).unwrap());
        let decoded = decode(&bytes).unwrap();
        prop_assert_eq!(decoded.to_text(), text);
        prop_assert_eq!(encode(&decoded).unwrap(), bytes);
    }

    #[test]
    fn decode_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = decode(&bytes);
    }

    /// Whatever a corrupted-but-checksummed file decodes to must be the
    /// file's one canonical encoding.
    #[test]
    fn accepted_bytes_are_canonical(
        p in program(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut bytes = encode(&p).unwrap();
        let body = bytes.len() - 4;
        for (i, byte) in edits {
            // Leave magic and version alone so the edits reach the bundles.
            let at = 12 + i.index(body - 12);
            bytes[at] = byte;
        }
        fix_crc(&mut bytes);
        if let Ok(back) = decode(&bytes) {
            prop_assert_eq!(encode(&back).unwrap(), bytes);
        }
    }

    #[test]
    fn parse_never_panics(lines in prop::collection::vec("[a-z0-9 ,.|>;éE+-]{0,30}", 0..8)) {
        let text = format!(".format 1\n.pe 0\n.pes 1\n.mem 4\n{}", lines.join("\n"));
        let _ = parse(&text);
        let _ = parse(&lines.join("\n"));
    }

    #[test]
    fn parse_never_panics_on_any_text(text in ".*") {
        let _ = parse(&text);
        let _ = text.parse::<Bundle>();
    }
}

fn small() -> Program {
    parse(
        ".format 1\n.pe 1\n.pes 2\n.mem 16\n\
         mul m3, m7 | add m12 -> m12 | send acc -> m0\n\
         exp m5, 0.25 -> m5 | add 0 -> m9\n\
         div m2, m9 -> m2 | nop | send m9 -> m1\n",
    )
    .unwrap()
}

#[test]
fn layout_matches_the_spec() {
    let bytes = encode(&small()).unwrap();
    assert_eq!(bytes.len(), 28 + 3 * 32 + 4);
    assert_eq!(&bytes[..8], b"ATNCISA\0");
    assert_eq!(&bytes[8..12], &[1, 0, 0, 0]);
    assert_eq!(
        &bytes[12..28],
        &[1, 0, 0, 0, 2, 0, 0, 0, 16, 0, 0, 0, 3, 0, 0, 0]
    );
    // mul m3, m7 | add m12 -> m12 | send acc -> m0
    let b0 = &bytes[28..60];
    assert_eq!(b0[0], 1);
    assert_eq!(b0[1], 0b11_1010);
    let words: Vec<u32> = b0[4..]
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(words, [3, 7, 0, 12, 12, 0, 0]);
    // exp m5, 0.25 -> m5 | add 0 -> m9
    let b1 = &bytes[60..92];
    assert_eq!((b1[0], b1[1]), (2, 0b1111));
    assert_eq!(&b1[8..12], &0.25f32.to_bits().to_le_bytes());

    // The worked example in docs/isa.md.
    let p = Program {
        bundles: vec!["mul m0, m1 | add 0 | send acc -> m10".parse().unwrap()],
        ..small()
    };
    let rec = &encode(&p).unwrap()[28..60];
    let mut want = vec![1u8, 0x36, 0, 0, 0, 0, 0, 0, 1];
    want.resize(28, 0);
    want.extend_from_slice(&[10, 0, 0, 0]);
    assert_eq!(rec, &want[..]);
}

#[test]
fn every_truncation_is_rejected() {
    let bytes = encode(&small()).unwrap();
    for n in 0..bytes.len() {
        assert_eq!(
            decode(&bytes[..n]),
            Err(DecodeError::Truncated),
            "prefix {n}"
        );
    }
    assert!(decode(&bytes).is_ok());
}

#[test]
fn every_flipped_byte_is_rejected() {
    let bytes = encode(&small()).unwrap();
    for i in 0..bytes.len() {
        for mask in [0x01u8, 0x80] {
            let mut b = bytes.clone();
            b[i] ^= mask;
            let err = decode(&b).unwrap_err();
            match i {
                0..=7 => assert_eq!(err, DecodeError::BadMagic),
                8..=9 => assert!(matches!(err, DecodeError::UnsupportedVersion(_))),
                24..=27 => assert!(
                    matches!(err, DecodeError::Truncated | DecodeError::TrailingBytes),
                    "{err}"
                ),
                _ => assert_eq!(err, DecodeError::ChecksumMismatch, "byte {i}"),
            }
        }
    }
}

#[test]
fn wrong_magic_version_and_trailing_bytes() {
    let good = encode(&small()).unwrap();

    let mut b = good.clone();
    b[..8].copy_from_slice(b"ATNCISB\0");
    assert_eq!(decode(&b), Err(DecodeError::BadMagic));
    assert_eq!(decode(b"ELF"), Err(DecodeError::BadMagic));

    let mut b = good.clone();
    b[8..10].copy_from_slice(&3u16.to_le_bytes());
    fix_crc(&mut b);
    assert_eq!(decode(&b), Err(DecodeError::UnsupportedVersion(3)));
    assert_eq!(
        decode(&b).unwrap_err().to_string(),
        "unsupported format version 3 (flat programs are versions 1 to 2, loop programs 3 and 4)"
    );

    let mut b = good.clone();
    b.push(0);
    assert_eq!(decode(&b), Err(DecodeError::TrailingBytes));

    let mut b = good.clone();
    b[10] = 1;
    fix_crc(&mut b);
    assert!(matches!(decode(&b), Err(DecodeError::InvalidHeader { .. })));

    // A count that would need more memory than exists must not be trusted.
    let mut b = good;
    b[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(decode(&b), Err(DecodeError::Truncated));
}

#[test]
fn non_canonical_bundles_are_rejected_by_index() {
    let good = encode(&small()).unwrap();
    // (bundle index, byte within the bundle, new value, expected reason)
    let cases: &[(usize, usize, u8, &str)] = &[
        (0, 0, 7, "unknown op kind 7"),
        (0, 1, 0b11_1010 | 0x40, "undefined flag bits"),
        (0, 2, 1, "reserved bytes"),
        (0, 3, 1, "reserved bytes"),
        (0, 12, 5, "op_dst"),          // mul without the op-dst flag
        (0, 24, 5, "xfer_src"),        // send acc with a source address
        (1, 16, 5, "acc_src"),         // add 0 with a source address
        (1, 24, 1, "xfer_src"),        // no xfer, yet a field is set
        (1, 1, 0b1111 | 0x20, "xfer"), // src-is-acc flag without a send
        (2, 1, 0b1_0001 | 0x04, "acc flags"),
    ];
    for &(index, at, byte, reason) in cases {
        let mut b = good.clone();
        b[28 + 32 * index + at] = byte;
        fix_crc(&mut b);
        match decode(&b) {
            Err(DecodeError::InvalidBundle {
                index: i,
                reason: r,
            }) => {
                assert_eq!(i, index);
                assert!(r.contains(reason), "{r:?} should mention {reason:?}");
                let msg = decode(&b).unwrap_err().to_string();
                assert!(
                    msg.starts_with(&format!("invalid bundle {index}: ")),
                    "{msg}"
                );
            }
            other => panic!("byte {at} of bundle {index} = {byte}: {other:?}"),
        }
    }

    // A NaN scale: exp m5, NaN
    let mut b = good;
    let at = 28 + 32 + 8;
    b[at..at + 4].copy_from_slice(&f32::NAN.to_bits().to_le_bytes());
    fix_crc(&mut b);
    assert!(matches!(
        decode(&b),
        Err(DecodeError::InvalidBundle { index: 1, reason }) if reason.contains("not finite")
    ));
}

const HEADER: &str = ".format 1\n.pe 0\n.pes 1\n.mem 8\n";

fn parse_err(body: &str) -> String {
    parse(&format!("{HEADER}{body}\n")).unwrap_err().to_string()
}

#[test]
fn malformed_bundles_are_reported_with_position() {
    let cases = [
        ("mux m1, m2", "line 5:1: unknown op mnemonic `mux`"),
        ("mul m1, x2", "line 5:9: bad address `x2`"),
        ("mul m1, m", "line 5:9: bad address `m`"),
        (
            "mul m1, m99999999999",
            "line 5:9: address `m99999999999` is too large",
        ),
        (
            "mul m1 m2",
            "line 5:8: expected `,` between the operands, found `m2`",
        ),
        (
            "mul m1, m2, m3",
            "line 5:11: unexpected `,` after the op slot",
        ),
        ("exp m1, inf", "line 5:9: scale `inf` is not a finite f32"),
        (
            "exp m1, NaN -> m2",
            "line 5:9: scale `NaN` is not a finite f32",
        ),
        ("exp m1, 1e39", "line 5:9: scale `1e39` is not a finite f32"),
        ("exp m1, 0.2.5", "line 5:9: bad scale `0.2.5`"),
        ("nop | sub m1", "line 5:7: unknown acc mnemonic `sub`"),
        ("mul m1, m2 | | nop", "line 5:14: empty acc slot"),
        ("mul m1, m2 |", "line 5:13: empty acc slot"),
        ("add m1", "line 5:1: `add` is not an op"),
        ("nop | nop | send m1", "line 5:20: expected `->`"),
        (
            "nop | nop | send m1 -> m2 | nop",
            "line 5:27: too many slots",
        ),
        (
            "nop | nop | fetch m1",
            "line 5:13: unknown xfer mnemonic `fetch`",
        ),
        (
            "mul m1, m2 -> ",
            "line 5:15: expected a destination address after `->`",
        ),
        ("  mul m1, é2", "line 5:11: bad address `é2`"),
        (
            ".pe 3",
            "line 5:1: directives must come before the first bundle",
        ),
    ];
    for (body, want) in cases {
        let got = if body.starts_with('.') {
            parse(&format!("{HEADER}nop\n{body}\n"))
                .unwrap_err()
                .to_string()
                .replace("line 6", "line 5")
        } else {
            parse_err(body)
        };
        assert!(
            got.starts_with(want),
            "{body:?}: got {got:?}, want {want:?}"
        );
    }
}

#[test]
fn malformed_headers_are_reported() {
    let err = |t: &str| parse(t).unwrap_err().to_string();
    assert_eq!(
        err(".format 3\n"),
        "line 1:9: unsupported format version 3 (this assembler reads versions 1 to 2)"
    );
    assert_eq!(
        err("; c\n.format 1\n.pe 0\n.pes 1\nnop\n"),
        "line 5:1: missing `.mem` directive (required before the first bundle)"
    );
    assert_eq!(
        err(".format 1\n.pe 0\n.pes 1\n"),
        "line 4:1: missing `.mem` directive (required before the first bundle)"
    );
    assert_eq!(
        err(".format 1\n.pe 0\n.pe 1\n"),
        "line 3:1: duplicate `.pe` directive (first given on line 2)"
    );
    assert_eq!(
        err(".org 1\n"),
        "line 1:1: unknown directive `.org` (expected .format, .pe, .pes or .mem)"
    );
    assert!(err(".pes -1\n").starts_with("line 1:6: bad value `-1` for `.pes`"));
    assert!(err(".pes\n").starts_with("line 1:5: expected a number after `.pes`"));
    assert!(err(".mem 4 5\n").starts_with("line 1:8: unexpected `5`"));
}

#[test]
fn comments_blank_lines_and_empty_programs() {
    let p = parse("\n  ; nothing\n.mem 3 ; words\n.pes 2\n.pe 1\n.format 1\n\n").unwrap();
    assert_eq!((p.pe, p.pes, p.mem_words, p.bundles.len()), (1, 2, 3, 0));
    assert_eq!(
        p.to_text(),
        "; attnc ring microcode\n.format 1\n.pe 1\n.pes 2\n.mem 3\n"
    );
}

/// A program using a format-2 kind (`max`, `expd`) is written as version 2 in both forms, and
/// each form reads back to the same program.
#[test]
fn format_2_kinds_round_trip_in_version_2() {
    let text = "; attnc ring microcode
.format 2
.pe 0
.pes 1
.mem 4
max m0, m1 -> m2
expd m0, m2, 0.125 -> m3 | add 0 -> m1
";
    let p = parse(text).unwrap();
    assert_eq!(p.format_version(), 2);
    assert_eq!(p.to_text(), text);
    let bytes = encode(&p).unwrap();
    assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), 2);
    assert_eq!(bytes.len(), 28 + 2 * 36 + 4);
    assert_eq!(decode(&bytes).unwrap(), p);
}

/// One encoding per program: version 2 is refused for a program that version 1 can hold, and a
/// version-1 file cannot name a version-2 kind.
#[test]
fn versions_are_canonical() {
    let p = small();
    assert_eq!(p.format_version(), 1);
    let v1 = encode(&p).unwrap();
    // Re-lay the same bundles out as version 2 by hand: 36-byte records, immediate in word 2.
    let mut v2 = v1[..28].to_vec();
    v2[8..10].copy_from_slice(&2u16.to_le_bytes());
    for rec in v1[28..v1.len() - 4].chunks_exact(32) {
        let exp = rec[0] == 2;
        let words: Vec<&[u8]> = rec[4..].chunks_exact(4).collect();
        v2.extend_from_slice(&rec[..4]);
        v2.extend_from_slice(words[0]);
        v2.extend_from_slice(if exp { &[0; 4] } else { words[1] });
        v2.extend_from_slice(if exp { words[1] } else { &[0; 4] });
        for w in &words[2..] {
            v2.extend_from_slice(w);
        }
    }
    let crc = crc32fast::hash(&v2);
    v2.extend_from_slice(&crc.to_le_bytes());
    let e = decode(&v2).unwrap_err().to_string();
    assert!(e.contains("must be stored as version 1"), "{e}");

    let e = parse(".format 1\n.pe 0\n.pes 1\n.mem 3\nmax m0, m1\n")
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "line 5:1: `max` needs `.format 2` or later (this file declares `.format 1`)"
    );
    // Version 1 records have no kind 4 or 5.
    let mut b = v1.clone();
    b[28] = 4;
    fix_crc(&mut b);
    let e = decode(&b).unwrap_err().to_string();
    assert!(e.contains("unknown op kind 4 in format version 1"), "{e}");
}
