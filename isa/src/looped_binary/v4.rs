//! Loop programs in binary version 4, the written form: variable-length records whose
//! addresses, wraps and predicate values take `W` bytes and whose strides take 1 or `X` bytes,
//! `W` and `X` stated in the header as the smallest widths the program needs. A bundle
//! record carries only the fields its op kind and flags say are present, as a hardware
//! decoder would expand them; docs/isa.md specifies every bit.
//!
//! Canonical: widths, count lengths and stride forms are the smallest that hold the values,
//! and every bit without a meaning is zero, so `encode(decode(b)?) == b`.

use super::{header, seal, u32_le, Frame, Tree};
use crate::binary::{
    decode_record, encode_record, DecodeError, EncodeError, BUNDLE_BYTES_V2, CHECKSUM_BYTES, F_ACC,
    F_ACC_DST, F_ACC_ZERO, F_OP_DST, F_XFER, F_XFER_ACC, HEADER_BYTES,
};
use crate::inst::{OpInfo, OpKind};
use crate::looped::{
    field, Cmp, CountStep, Field, LBundle, LoopProgram, Node, Pred, Slot, Term, MAX_LOOP_DEPTH,
};

/// The header's version field.
pub const VERSION: u16 = 4;

/// Bits 0–1 of a record's first byte: what the record is.
const REC_TYPE: u8 = 0b11;
const REC_BUNDLE: u8 = 0;
const REC_OPEN: u8 = 1;
const REC_CLOSE: u8 = 2;

/// Bundle head: bits 2–4 the op kind, then whether a term count and a predicate count follow.
const B_TERMS: u8 = 1 << 5;
const B_PREDS: u8 = 1 << 6;
const B_USED: u8 = REC_TYPE | 0b111 << 2 | B_TERMS | B_PREDS;

// Every op kind's code fits the head's 3 bits (a kind coded 8 or more needs a new version),
// and every level the depth limit allows fits 3 bits of a term, predicate or step.
const _: () = {
    let mut i = 0;
    while i < crate::inst::OPS.len() {
        assert!(crate::inst::OPS[i].code < 8);
        i += 1;
    }
    assert!(MAX_LOOP_DEPTH <= LEVELS as usize);
};

/// Loop-open head: bits 2–3 the count's length in bytes minus 1, then whether a step follows.
const L_STEPPED: u8 = 1 << 4;
const L_USED: u8 = REC_TYPE | 0b11 << 2 | L_STEPPED;

/// Term byte: bits 0–2 the field code, 3–5 the level, then whether a wrap follows and whether
/// the stride takes `X` bytes instead of one.
const T_WRAP: u8 = 1 << 6;
const T_LONG: u8 = 1 << 7;

/// Predicate byte: bits 0–1 the slot, 2–4 the level, 5–6 the comparison; bit 7 zero.
const P_USED: u8 = 0x7f;

/// Word index of the immediate among the version-2 record's eight fields (op a, op b,
/// immediate, op dst, acc src, acc dst, xfer src, xfer dst); it always takes 4 bytes.
const IMM_WORD: usize = 2;
/// The levels a 3-bit level field holds.
const LEVELS: u8 = 8;

/// The two widths the header states.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Widths {
    /// `W`: bytes of every address, wrap and predicate value, and of `mem_words − 1`.
    value: usize,
    /// `X`: bytes of a stride outside `i8`.
    stride: usize,
}

impl Widths {
    /// The smallest widths that hold `p`'s values: each of 2, 3 or 4 bytes.
    fn of(p: &LoopProgram) -> Widths {
        fn walk(nodes: &[Node], value: &mut u32, stride: &mut usize) {
            for n in nodes {
                match n {
                    Node::Loop(l) => walk(&l.body, value, stride),
                    Node::Bundle(b) => {
                        for f in Field::ALL {
                            *value = (*value).max(field(&b.bundle, f).unwrap_or(0));
                        }
                        for t in &b.terms {
                            *value = (*value).max(t.wrap);
                            if !is_short(t.stride) {
                                *stride = (*stride).max(signed_bytes(t.stride));
                            }
                        }
                        for pr in &b.preds {
                            *value = (*value).max(pr.value);
                        }
                    }
                }
            }
        }
        let mut value = p.mem_words.saturating_sub(1);
        let mut stride = 2;
        walk(&p.body, &mut value, &mut stride);
        Widths {
            value: unsigned_bytes(value).max(2),
            stride,
        }
    }
}

/// Bytes that hold `v` unsigned (at least 1).
fn unsigned_bytes(v: u32) -> usize {
    4 - (v.leading_zeros() as usize / 8).min(3)
}

/// Bytes that hold `s` in two's complement (at least 1).
fn signed_bytes(s: i32) -> usize {
    let magnitude = if s < 0 { !s } else { s } as u32;
    // One bit more than the magnitude's for the sign.
    (33 - magnitude.leading_zeros() as usize).div_ceil(8)
}

fn is_short(s: i32) -> bool {
    i8::try_from(s).is_ok()
}

/// The fields a bundle record holds, in the version-2 record's order, for op kind `kind`
/// (`None`: `nop`) and version-2 `flags`.
fn present(kind: Option<&OpInfo>, flags: u8) -> [bool; 8] {
    let has = |bit: u8| flags & bit != 0;
    [
        kind.is_some(),
        kind.is_some_and(|k| k.reads == 2),
        kind.is_some_and(|k| k.imm),
        has(F_OP_DST),
        has(F_ACC) && !has(F_ACC_ZERO),
        has(F_ACC) && has(F_ACC_DST),
        has(F_XFER) && !has(F_XFER_ACC),
        has(F_XFER),
    ]
}

/// Where records go: bytes, or only their count.
trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

struct Count(u64);

impl Sink for Count {
    fn put(&mut self, bytes: &[u8]) {
        self.0 += bytes.len() as u64;
    }
}

/// Encodes a loop program in version 4. Refuses what the records cannot hold (a level above
/// 7, more than 255 terms or predicates on a bundle: see [`EncodeError`]) and a record stream
/// over 4 GiB.
pub fn encode_looped(p: &LoopProgram) -> Result<Vec<u8>, EncodeError> {
    encodable(&p.body)?;
    let w = Widths::of(p);
    let mut recs = Vec::new();
    records(&p.body, w, &mut recs);
    let len = u32::try_from(recs.len()).map_err(|_| EncodeError::TooLarge {
        what: "bytes of loop records",
        count: recs.len() as u64,
    })?;
    Ok(seal(
        header(p, VERSION, [w.value as u8, w.stride as u8], len),
        &recs,
    ))
}

/// The length [`encode_looped`] gives `p`, without encoding it (for a program it refuses, the
/// length its records would take if every field were wide enough).
pub fn encoded_len(p: &LoopProgram) -> u64 {
    let mut n = Count(0);
    records(&p.body, Widths::of(p), &mut n);
    (HEADER_BYTES + CHECKSUM_BYTES) as u64 + n.0
}

fn encodable(nodes: &[Node]) -> Result<(), EncodeError> {
    let level = |l: u8| {
        if l < LEVELS {
            Ok(())
        } else {
            Err(EncodeError::OutOfRange {
                what: "loop level",
                value: u64::from(l),
                max: u64::from(LEVELS - 1),
            })
        }
    };
    let count = |what: &'static str, n: usize| {
        if n <= 255 {
            Ok(())
        } else {
            Err(EncodeError::OutOfRange {
                what,
                value: n as u64,
                max: 255,
            })
        }
    };
    for n in nodes {
        match n {
            Node::Loop(l) => {
                if let Some(s) = l.step {
                    level(s.level)?;
                }
                encodable(&l.body)?;
            }
            Node::Bundle(b) => {
                count("number of terms on one bundle", b.terms.len())?;
                count("number of predicates on one bundle", b.preds.len())?;
                for t in &b.terms {
                    level(t.level)?;
                }
                for pr in &b.preds {
                    level(pr.level)?;
                }
            }
        }
    }
    Ok(())
}

/// Writes the records of `nodes`, which [`encodable`] accepts (elsewhere levels and counts
/// are cut to their fields, for [`encoded_len`]).
fn records(nodes: &[Node], w: Widths, out: &mut impl Sink) {
    for n in nodes {
        match n {
            Node::Loop(l) => {
                let bytes = unsigned_bytes(l.count);
                let stepped = if l.step.is_some() { L_STEPPED } else { 0 };
                out.put(&[REC_OPEN | ((bytes - 1) as u8) << 2 | stepped]);
                out.put(&l.count.to_le_bytes()[..bytes]);
                if let Some(s) = l.step {
                    out.put(&[s.level & (LEVELS - 1)]);
                    out.put(&s.per.to_le_bytes());
                }
                records(&l.body, w, out);
                out.put(&[REC_CLOSE]);
            }
            Node::Bundle(b) => bundle(b, w, out),
        }
    }
}

fn bundle(b: &LBundle, w: Widths, out: &mut impl Sink) {
    let rec = encode_record(&b.bundle);
    let (kind, flags) = (rec[0], rec[1]);
    let info = OpKind::from_code(kind).map(OpKind::info);
    let mut head = REC_BUNDLE | kind << 2;
    if !b.terms.is_empty() {
        head |= B_TERMS;
    }
    if !b.preds.is_empty() {
        head |= B_PREDS;
    }
    out.put(&[head, flags]);
    for n in [b.terms.len(), b.preds.len()] {
        if n > 0 {
            out.put(&[n.min(255) as u8]);
        }
    }
    for (i, _) in present(info, flags).iter().enumerate().filter(|(_, &p)| p) {
        let bytes = if i == IMM_WORD { 4 } else { w.value };
        out.put(&rec[4 + 4 * i..4 + 4 * i + bytes]);
    }
    for t in b.terms.iter().take(255) {
        let long = !is_short(t.stride);
        let mut tb = t.field.code() | (t.level & (LEVELS - 1)) << 3;
        if t.wrap != 0 {
            tb |= T_WRAP;
        }
        if long {
            tb |= T_LONG;
        }
        out.put(&[tb]);
        out.put(&t.stride.to_le_bytes()[..if long { w.stride } else { 1 }]);
        if t.wrap != 0 {
            out.put(&t.wrap.to_le_bytes()[..w.value]);
        }
    }
    for pr in b.preds.iter().take(255) {
        out.put(&[pr.slot as u8 | (pr.level & (LEVELS - 1)) << 2 | (pr.cmp as u8) << 5]);
        out.put(&pr.value.to_le_bytes()[..w.value]);
    }
}

/// The record stream, read front to back.
struct Reader<'a> {
    recs: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    /// The next `n` bytes; `None` when the stream ends first.
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let b = self.recs.get(self.at..self.at + n)?;
        self.at += n;
        Some(b)
    }

    fn byte(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
}

/// `bytes` (1 to 4) as a little-endian two's-complement number.
fn signed_le(bytes: &[u8]) -> i32 {
    let shift = 32 - 8 * bytes.len() as u32;
    ((u32_le(bytes) << shift) as i32) >> shift
}

/// Decodes the records of a version-4 frame, checks that the header's widths are the smallest
/// the program needs, and validates the program.
pub(super) fn decode(frame: &Frame) -> Result<LoopProgram, DecodeError> {
    let [value, stride] = frame.widths.map(usize::from);
    for (what, bytes) in [("value width", value), ("long stride width", stride)] {
        if !(2..=4).contains(&bytes) {
            return Err(DecodeError::InvalidHeader {
                reason: format!("{what} is {bytes} bytes, must be 2, 3 or 4"),
            });
        }
    }
    let w = Widths { value, stride };
    let mut r = Reader {
        recs: frame.records,
        at: 0,
    };
    let mut tree = Tree::new();
    while r.at < r.recs.len() {
        let start = r.at;
        let bad = |reason: String| DecodeError::InvalidBundle {
            index: start,
            reason,
        };
        let cut = || bad("record cut off by the end of the stream".into());
        let head = r.byte().ok_or_else(cut)?;
        match head & REC_TYPE {
            REC_OPEN => {
                if head & !L_USED != 0 {
                    return Err(bad(format!("undefined bits set in loop head {head:#04x}")));
                }
                let bytes = usize::from(head >> 2 & 0b11) + 1;
                let count = u32_le(r.take(bytes).ok_or_else(cut)?);
                if unsigned_bytes(count) != bytes {
                    return Err(bad(format!(
                        "loop count {count} written in {bytes} bytes, not the fewest that hold it"
                    )));
                }
                let step = if head & L_STEPPED != 0 {
                    let level = r.byte().ok_or_else(cut)?;
                    if level >= LEVELS {
                        return Err(bad(format!(
                            "undefined bits set in step level {level:#04x}"
                        )));
                    }
                    let p = r.take(2).ok_or_else(cut)?;
                    let per = i16::from_le_bytes([p[0], p[1]]);
                    if per == 0 {
                        return Err(bad("a stepped loop's step is 0".into()));
                    }
                    Some(CountStep { level, per })
                } else {
                    None
                };
                tree.open(count, step).map_err(bad)?;
            }
            REC_CLOSE => {
                if head != REC_CLOSE {
                    return Err(bad(format!("undefined bits set in loop end {head:#04x}")));
                }
                tree.close().map_err(bad)?;
            }
            REC_BUNDLE => {
                let b = read_bundle(&mut r, head, w).map_err(|e| {
                    bad(e.unwrap_or_else(|| "record cut off by the end of the stream".into()))
                })?;
                tree.bundle(b);
            }
            _ => return Err(bad(format!("unknown record type {}", head & REC_TYPE))),
        }
    }
    let p = frame.program(tree.finish(r.recs.len())?);
    let need = Widths::of(&p);
    if need != w {
        return Err(DecodeError::InvalidHeader {
            reason: format!(
                "widths {} and {} bytes, but the program's values need exactly {} and its strides {}",
                w.value, w.stride, need.value, need.stride
            ),
        });
    }
    Frame::validated(p)
}

/// One bundle record after its head byte. `Err(None)`: the stream ends inside it.
fn read_bundle(r: &mut Reader, head: u8, w: Widths) -> Result<LBundle, Option<String>> {
    if head & !B_USED != 0 {
        return Err(Some(format!(
            "undefined bits set in bundle head {head:#04x}"
        )));
    }
    let kind = head >> 2 & 0b111;
    let info = match kind {
        0 => None,
        k => Some(
            OpKind::from_code(k)
                .ok_or_else(|| Some(format!("unknown op kind {k}")))?
                .info(),
        ),
    };
    let flags = r.byte().ok_or(None)?;
    let mut counts = [0usize; 2];
    for (n, (bit, what)) in counts
        .iter_mut()
        .zip([(B_TERMS, "term"), (B_PREDS, "predicate")])
    {
        if head & bit != 0 {
            *n = usize::from(r.byte().ok_or(None)?);
            if *n == 0 {
                return Err(Some(format!("{what} count 0 with its bit set in the head")));
            }
        }
    }
    // The version-2 record of the same bundle, so that its flags and fields are checked
    // by the one decoder of bundle records.
    let mut rec = [0u8; BUNDLE_BYTES_V2];
    rec[0] = kind;
    rec[1] = flags;
    for (i, p) in present(info, flags).into_iter().enumerate() {
        if p {
            let bytes = if i == IMM_WORD { 4 } else { w.value };
            let v = u32_le(r.take(bytes).ok_or(None)?);
            rec[4 + 4 * i..8 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
    }
    let bundle = decode_record(&rec).map_err(Some)?;
    let mut terms = Vec::with_capacity(counts[0]);
    for _ in 0..counts[0] {
        let tb = r.byte().ok_or(None)?;
        let field = Field::from_code(tb & 0b111)
            .ok_or_else(|| Some(format!("unknown address field {}", tb & 0b111)))?;
        let stride = if tb & T_LONG != 0 {
            let s = signed_le(r.take(w.stride).ok_or(None)?);
            if is_short(s) {
                return Err(Some(format!(
                    "stride {s} in the long form, but it fits in one byte"
                )));
            }
            s
        } else {
            i32::from(r.byte().ok_or(None)? as i8)
        };
        let wrap = if tb & T_WRAP != 0 {
            let v = u32_le(r.take(w.value).ok_or(None)?);
            if v == 0 {
                return Err(Some("wrap bit set with a wrap of 0".into()));
            }
            v
        } else {
            0
        };
        terms.push(Term {
            field,
            level: tb >> 3 & 0b111,
            stride,
            wrap,
        });
    }
    let mut preds = Vec::with_capacity(counts[1]);
    for _ in 0..counts[1] {
        let pb = r.byte().ok_or(None)?;
        if pb & !P_USED != 0 {
            return Err(Some(format!("undefined bit set in predicate {pb:#04x}")));
        }
        let slot = *Slot::ALL
            .get(usize::from(pb & 0b11))
            .ok_or_else(|| Some(format!("unknown predicate slot {}", pb & 0b11)))?;
        let cmp = Cmp::ALL[usize::from(pb >> 5 & 0b11)];
        preds.push(Pred {
            slot,
            level: pb >> 2 & 0b111,
            cmp,
            value: u32_le(r.take(w.value).ok_or(None)?),
        });
    }
    Ok(LBundle {
        bundle,
        terms,
        preds,
    })
}
