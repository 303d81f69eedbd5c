//! Binary form of format 3: the flat formats' header layout with version 3, a
//! stream of variable-length records (loop open, loop close, bundle), and a
//! CRC-32. Bundle records embed the 36-byte version-2 bundle record, so
//! there is one definition of how a bundle's slots are encoded.
//!
//! Canonical like format 1: every reserved byte is zero and terms and
//! predicates are in their sorted order, so `encode(decode(b)?) == b`.

use crate::binary::{
    self, decode_record, encode_record, DecodeError, EncodeError, BUNDLE_BYTES_V2, CHECKSUM_BYTES,
    HEADER_BYTES, MAGIC,
};
use crate::looped::{
    Cmp, CountStep, Field, LBundle, Loop, LoopProgram, Node, Pred, Slot, Term, LOOP_FORMAT_VERSION,
    MAX_LOOP_DEPTH,
};
use crate::looped_text::AnyProgram;

const TAG_LOOP: u8 = 1;
const TAG_END: u8 = 2;
const TAG_BUNDLE: u8 = 3;
/// Bytes of one affine term: field, level, 2 reserved, stride i32, wrap u32.
const TERM_BYTES: usize = 12;
/// Bytes of one predicate: slot, level, cmp, reserved, value u32.
const PRED_BYTES: usize = 8;

/// Encodes a loop program; refuses a record stream over 4 GiB, which the
/// header cannot count.
pub fn encode_looped(p: &LoopProgram) -> Result<Vec<u8>, EncodeError> {
    let mut recs = Vec::new();
    fn body(out: &mut Vec<u8>, nodes: &[Node]) {
        for n in nodes {
            match n {
                Node::Loop(l) => {
                    // Byte 1: 0, or 1 + the level a stepped count follows; bytes 2–3: the step.
                    let (level, per) = l.step.map_or((0, 0i16), |s| (s.level + 1, s.per));
                    let [p0, p1] = per.to_le_bytes();
                    out.extend_from_slice(&[TAG_LOOP, level, p0, p1]);
                    out.extend_from_slice(&l.count.to_le_bytes());
                    body(out, &l.body);
                    out.extend_from_slice(&[TAG_END, 0, 0, 0]);
                }
                Node::Bundle(b) => {
                    out.extend_from_slice(&[
                        TAG_BUNDLE,
                        b.terms.len().min(255) as u8,
                        b.preds.len().min(255) as u8,
                        0,
                    ]);
                    out.extend_from_slice(&encode_record(&b.bundle));
                    for t in b.terms.iter().take(255) {
                        out.extend_from_slice(&[t.field.code(), t.level, 0, 0]);
                        out.extend_from_slice(&t.stride.to_le_bytes());
                        out.extend_from_slice(&t.wrap.to_le_bytes());
                    }
                    for pr in b.preds.iter().take(255) {
                        out.extend_from_slice(&[pr.slot as u8, pr.level, pr.cmp as u8, 0]);
                        out.extend_from_slice(&pr.value.to_le_bytes());
                    }
                }
            }
        }
    }
    body(&mut recs, &p.body);
    let len = u32::try_from(recs.len()).map_err(|_| EncodeError::TooLarge {
        what: "bytes of loop records",
        count: recs.len() as u64,
    })?;
    let mut out = Vec::with_capacity(HEADER_BYTES + recs.len() + CHECKSUM_BYTES);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&LOOP_FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    for v in [p.pe, p.pes, p.mem_words, len] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&recs);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// The length [`encode_looped`] gives `p`, without encoding it.
pub fn encoded_len(p: &LoopProgram) -> u64 {
    fn body(nodes: &[Node]) -> u64 {
        nodes
            .iter()
            .map(|n| match n {
                // Open and end records.
                Node::Loop(l) => 8 + 4 + body(&l.body),
                Node::Bundle(b) => {
                    (4 + BUNDLE_BYTES_V2
                        + b.terms.len().min(255) * TERM_BYTES
                        + b.preds.len().min(255) * PRED_BYTES) as u64
                }
            })
            .sum()
    }
    (HEADER_BYTES + CHECKSUM_BYTES) as u64 + body(&p.body)
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Decodes either binary format, dispatching on the version field.
pub fn decode_any(bytes: &[u8]) -> Result<AnyProgram, DecodeError> {
    if bytes.len() >= 10 && bytes[..8] == MAGIC && bytes[8..10] == LOOP_FORMAT_VERSION.to_le_bytes()
    {
        return decode_looped(bytes).map(AnyProgram::Looped);
    }
    binary::decode(bytes).map(AnyProgram::Flat)
}

/// Decodes a format-3 binary and validates the program. `InvalidBundle`'s
/// `index` is the byte offset of the offending record in the stream.
pub fn decode_looped(bytes: &[u8]) -> Result<LoopProgram, DecodeError> {
    if bytes.len() < MAGIC.len() {
        return Err(if MAGIC.starts_with(bytes) {
            DecodeError::Truncated
        } else {
            DecodeError::BadMagic
        });
    }
    if bytes[..MAGIC.len()] != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let version = bytes
        .get(8..10)
        .map(|v| u16::from_le_bytes([v[0], v[1]]))
        .ok_or(DecodeError::Truncated)?;
    if version != LOOP_FORMAT_VERSION {
        return Err(DecodeError::UnsupportedVersion(version));
    }
    if bytes.len() < HEADER_BYTES {
        return Err(DecodeError::Truncated);
    }
    let reserved = u16::from_le_bytes([bytes[10], bytes[11]]);
    let [pe, pes, mem_words, len] = [12, 16, 20, 24].map(|at| u32_at(bytes, at).unwrap_or(0));
    let expected = HEADER_BYTES as u64 + u64::from(len) + CHECKSUM_BYTES as u64;
    if (bytes.len() as u64) < expected {
        return Err(DecodeError::Truncated);
    }
    if bytes.len() as u64 > expected {
        return Err(DecodeError::TrailingBytes);
    }
    let end = bytes.len() - CHECKSUM_BYTES;
    if crc32fast::hash(&bytes[..end]) != u32_at(bytes, end).unwrap_or(0) {
        return Err(DecodeError::ChecksumMismatch);
    }
    if reserved != 0 {
        return Err(DecodeError::InvalidHeader {
            reason: format!("reserved field is {reserved:#06x}, must be 0"),
        });
    }
    let recs = &bytes[HEADER_BYTES..end];
    let mut stack: Vec<(u32, Option<CountStep>, Vec<Node>)> = vec![(1, None, Vec::new())];
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
                let count =
                    u32_at(recs, at + 4).ok_or_else(|| bad("loop record cut off".into()))?;
                // The depth limit is checked here too so that a hostile file
                // cannot build an unbounded stack before validation.
                if stack.len() > MAX_LOOP_DEPTH {
                    return Err(bad(format!("loops nested deeper than {MAX_LOOP_DEPTH}")));
                }
                stack.push((count, step, Vec::new()));
                at += 8;
            }
            TAG_END => {
                if head[1..] != [0, 0, 0] {
                    return Err(bad("non-zero reserved bytes in an end record".into()));
                }
                if stack.len() == 1 {
                    return Err(bad("loop end without an open loop".into()));
                }
                if let Some((count, step, body)) = stack.pop() {
                    if let Some(top) = stack.last_mut() {
                        top.2.push(Node::Loop(Loop { count, step, body }));
                    }
                }
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
                for k in 0..nt {
                    let t = &rec[4 + BUNDLE_BYTES_V2 + k * TERM_BYTES..][..TERM_BYTES];
                    let field = Field::from_code(t[0])
                        .ok_or_else(|| bad(format!("unknown address field {}", t[0])))?;
                    if t[2] != 0 || t[3] != 0 {
                        return Err(bad("non-zero reserved bytes in a term".into()));
                    }
                    terms.push(Term {
                        field,
                        level: t[1],
                        stride: i32::from_le_bytes([t[4], t[5], t[6], t[7]]),
                        wrap: u32::from_le_bytes([t[8], t[9], t[10], t[11]]),
                    });
                }
                let mut preds = Vec::with_capacity(np);
                for k in 0..np {
                    let p = &rec[4 + BUNDLE_BYTES_V2 + nt * TERM_BYTES + k * PRED_BYTES..]
                        [..PRED_BYTES];
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
                        value: u32::from_le_bytes([p[4], p[5], p[6], p[7]]),
                    });
                }
                if let Some(top) = stack.last_mut() {
                    top.2.push(Node::Bundle(LBundle {
                        bundle,
                        terms,
                        preds,
                    }));
                }
                at += size;
            }
            t => return Err(bad(format!("unknown record tag {t}"))),
        }
    }
    if stack.len() != 1 {
        return Err(DecodeError::InvalidBundle {
            index: recs.len(),
            reason: "loop not closed at the end of the stream".into(),
        });
    }
    let body = stack.pop().map(|s| s.2).unwrap_or_default();
    let p = LoopProgram {
        pe,
        pes,
        mem_words,
        body,
    };
    p.validate().map_err(|e| DecodeError::InvalidBundle {
        index: e.node,
        reason: format!("node {}: {}", e.node, e.message),
    })?;
    Ok(p)
}
