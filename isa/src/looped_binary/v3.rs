//! Loop programs in binary version 3: records of fixed 4-byte fields (loop open, loop close,
//! bundle), each bundle embedding the 36-byte version-2 bundle record. Read for compatibility;
//! attnc writes version 4. Canonical like the flat formats: every reserved byte is zero and
//! terms and predicates are in their sorted order, so `encode(decode(b)?) == b`.

use super::{header, seal, u32_le, Frame, Tree};
use crate::binary::{decode_record, encode_record, DecodeError, EncodeError, BUNDLE_BYTES_V2};
use crate::looped::{Cmp, CountStep, Field, LBundle, LoopProgram, Node, Pred, Slot, Term};

/// The header's version field.
pub const VERSION: u16 = 3;

const TAG_LOOP: u8 = 1;
const TAG_END: u8 = 2;
const TAG_BUNDLE: u8 = 3;
/// Bytes of one affine term: field, level, 2 reserved, stride i32, wrap u32.
const TERM_BYTES: usize = 12;
/// Bytes of one predicate: slot, level, cmp, reserved, value u32.
const PRED_BYTES: usize = 8;

/// Encodes a loop program in version 3, for tools and tests that need files of the older
/// version. Refuses what version 3 cannot hold: more than 255 terms or predicates on a bundle,
/// a record stream over 4 GiB.
pub fn encode(p: &LoopProgram) -> Result<Vec<u8>, EncodeError> {
    fn body(out: &mut Vec<u8>, nodes: &[Node]) -> Result<(), EncodeError> {
        for n in nodes {
            match n {
                Node::Loop(l) => {
                    // Byte 1: 0, or 1 + the level a stepped count follows; bytes 2–3: the step.
                    let (level, per) = l
                        .step
                        .map_or((0, 0i16), |s| (s.level.wrapping_add(1), s.per));
                    let [p0, p1] = per.to_le_bytes();
                    out.extend_from_slice(&[TAG_LOOP, level, p0, p1]);
                    out.extend_from_slice(&l.count.to_le_bytes());
                    body(out, &l.body)?;
                    out.extend_from_slice(&[TAG_END, 0, 0, 0]);
                }
                Node::Bundle(b) => {
                    let count = |what: &'static str, n: usize| {
                        u8::try_from(n).map_err(|_| EncodeError::OutOfRange {
                            what,
                            value: n as u64,
                            max: 255,
                        })
                    };
                    let nt = count("number of terms on one bundle", b.terms.len())?;
                    let np = count("number of predicates on one bundle", b.preds.len())?;
                    out.extend_from_slice(&[TAG_BUNDLE, nt, np, 0]);
                    out.extend_from_slice(&encode_record(&b.bundle));
                    for t in &b.terms {
                        out.extend_from_slice(&[t.field.code(), t.level, 0, 0]);
                        out.extend_from_slice(&t.stride.to_le_bytes());
                        out.extend_from_slice(&t.wrap.to_le_bytes());
                    }
                    for pr in &b.preds {
                        out.extend_from_slice(&[pr.slot as u8, pr.level, pr.cmp as u8, 0]);
                        out.extend_from_slice(&pr.value.to_le_bytes());
                    }
                }
            }
        }
        Ok(())
    }
    let mut recs = Vec::new();
    body(&mut recs, &p.body)?;
    let len = u32::try_from(recs.len()).map_err(|_| EncodeError::TooLarge {
        what: "bytes of loop records",
        count: recs.len() as u64,
    })?;
    Ok(seal(header(p, VERSION, [0, 0], len), &recs))
}

/// Decodes the records of a version-3 frame and validates the program.
pub(super) fn decode(frame: &Frame) -> Result<LoopProgram, DecodeError> {
    if frame.widths != [0, 0] {
        let reserved = u16::from_le_bytes(frame.widths);
        return Err(DecodeError::InvalidHeader {
            reason: format!("reserved field is {reserved:#06x}, must be 0"),
        });
    }
    let recs = frame.records;
    let mut tree = Tree::new();
    let mut at = 0usize;
    while at < recs.len() {
        let bad = |reason: String| DecodeError::InvalidBundle { index: at, reason };
        let head = recs
            .get(at..at + 4)
            .ok_or_else(|| bad("record header cut off".into()))?;
        match head[0] {
            TAG_LOOP => {
                let per = i16::from_le_bytes([head[2], head[3]]);
                let step = match (head[1], per) {
                    (0, 0) => None,
                    (0, _) | (_, 0) => {
                        return Err(bad(
                            "a loop record's step level and step must both be zero or both not"
                                .into(),
                        ))
                    }
                    (l, per) => Some(CountStep { level: l - 1, per }),
                };
                let count = recs
                    .get(at + 4..at + 8)
                    .map(u32_le)
                    .ok_or_else(|| bad("loop record cut off".into()))?;
                tree.open(count, step).map_err(bad)?;
                at += 8;
            }
            TAG_END => {
                if head[1..] != [0, 0, 0] {
                    return Err(bad("non-zero reserved bytes in an end record".into()));
                }
                tree.close().map_err(bad)?;
                at += 4;
            }
            TAG_BUNDLE => {
                if head[3] != 0 {
                    return Err(bad("non-zero reserved byte in a bundle record".into()));
                }
                let (nt, np) = (usize::from(head[1]), usize::from(head[2]));
                let size = 4 + BUNDLE_BYTES_V2 + nt * TERM_BYTES + np * PRED_BYTES;
                let rec = recs
                    .get(at..at + size)
                    .ok_or_else(|| bad("bundle record cut off".into()))?;
                let bundle = decode_record(&rec[4..4 + BUNDLE_BYTES_V2]).map_err(&bad)?;
                let mut terms = Vec::with_capacity(nt);
                for t in rec[4 + BUNDLE_BYTES_V2..].chunks_exact(TERM_BYTES).take(nt) {
                    let field = Field::from_code(t[0])
                        .ok_or_else(|| bad(format!("unknown address field {}", t[0])))?;
                    if t[2] != 0 || t[3] != 0 {
                        return Err(bad("non-zero reserved bytes in a term".into()));
                    }
                    terms.push(Term {
                        field,
                        level: t[1],
                        stride: u32_le(&t[4..8]) as i32,
                        wrap: u32_le(&t[8..12]),
                    });
                }
                let mut preds = Vec::with_capacity(np);
                for p in rec[4 + BUNDLE_BYTES_V2 + nt * TERM_BYTES..].chunks_exact(PRED_BYTES) {
                    let slot = *Slot::ALL
                        .get(usize::from(p[0]))
                        .ok_or_else(|| bad(format!("unknown predicate slot {}", p[0])))?;
                    let cmp = *Cmp::ALL
                        .get(usize::from(p[2]))
                        .ok_or_else(|| bad(format!("unknown comparison {}", p[2])))?;
                    if p[3] != 0 {
                        return Err(bad("non-zero reserved byte in a predicate".into()));
                    }
                    preds.push(Pred {
                        slot,
                        level: p[1],
                        cmp,
                        value: u32_le(&p[4..8]),
                    });
                }
                tree.bundle(LBundle {
                    bundle,
                    terms,
                    preds,
                });
                at += size;
            }
            t => return Err(bad(format!("unknown record tag {t}"))),
        }
    }
    Frame::validated(frame.program(tree.finish(recs.len())?))
}
