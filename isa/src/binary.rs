//! Binary encoding: fixed-size little-endian records behind a checksummed
//! header.
//!
//! Every program has exactly one encoding. The decoder enforces this by
//! rejecting any set bit or field that the program does not use, so
//! `encode(decode(bytes)?) == bytes` for every accepted input and a stray bit
//! can never be silently dropped.

use std::fmt;

use crate::inst::{Acc, AccSrc, Arith, Bundle, Op, OpKind, Program, Xfer, XferSrc, FORMAT_VERSION};

pub const MAGIC: [u8; 8] = *b"ATNCISA\0";
/// Bytes before the first bundle.
pub const HEADER_BYTES: usize = 28;
/// Bytes per bundle record in format version 1.
pub const BUNDLE_BYTES: usize = 32;
/// Bytes per bundle record in format version 2 (one more word: the op immediate).
pub const BUNDLE_BYTES_V2: usize = 36;
/// Bytes of the trailing checksum.
pub const CHECKSUM_BYTES: usize = 4;

const OP_NOP: u8 = 0;

/// Where each field of a bundle record sits, per format version. Version 1 has no word for the
/// immediate: its only immediate-taking kind (`exp`) reads one operand, so the scale sits in the
/// unused `op_b` word. Version 2 gives the immediate a word of its own, after `op_b`.
#[derive(Clone, Copy)]
struct Layout {
    record: usize,
    /// Word index of the immediate; `None` when it shares `op_b`.
    imm: Option<usize>,
}

impl Layout {
    fn of(version: u16) -> Layout {
        if version == 1 {
            Layout {
                record: BUNDLE_BYTES,
                imm: None,
            }
        } else {
            Layout {
                record: BUNDLE_BYTES_V2,
                imm: Some(2),
            }
        }
    }

    /// Word index of the fields after the op operands: op_dst, acc_src, acc_dst, xfer_src,
    /// xfer_dst.
    fn tail(&self) -> usize {
        if self.imm.is_some() {
            3
        } else {
            2
        }
    }

    fn words(&self) -> usize {
        (self.record - 4) / 4
    }
}

// The flags byte; the loop format's version 4 reuses it, and which fields it says are present.
pub(crate) const F_OP_DST: u8 = 1 << 0;
pub(crate) const F_ACC: u8 = 1 << 1;
pub(crate) const F_ACC_ZERO: u8 = 1 << 2;
pub(crate) const F_ACC_DST: u8 = 1 << 3;
pub(crate) const F_XFER: u8 = 1 << 4;
pub(crate) const F_XFER_ACC: u8 = 1 << 5;
const F_ALL: u8 = F_OP_DST | F_ACC | F_ACC_ZERO | F_ACC_DST | F_XFER | F_XFER_ACC;

/// Why a program cannot be encoded: a count the header holds in 32 bits is
/// larger (about 128 GiB of bundles; no program attnc makes comes near), or
/// a value of a loop program is beyond its field in the record (a loop level
/// above 7 or more than 255 terms on a bundle: programs validation refuses
/// anyway, or more than 255 predicates on one bundle).
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum EncodeError {
    TooLarge {
        what: &'static str,
        count: u64,
    },
    OutOfRange {
        what: &'static str,
        value: u64,
        max: u64,
    },
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::TooLarge { what, count } => write!(
                f,
                "{count} {what}: more than the 32-bit count of the binary header holds"
            ),
            EncodeError::OutOfRange { what, value, max } => write!(
                f,
                "{what} is {value}, more than the {max} its field in the binary record holds"
            ),
        }
    }
}

impl std::error::Error for EncodeError {}

#[derive(Clone, PartialEq, Eq, Debug)]
pub enum DecodeError {
    BadMagic,
    UnsupportedVersion(u16),
    /// The input ends before the header, the bundles it announces, or the
    /// checksum.
    Truncated,
    ChecksumMismatch,
    /// Bytes after the checksum.
    TrailingBytes,
    /// The reserved header field is not zero.
    InvalidHeader {
        reason: String,
    },
    InvalidBundle {
        index: usize,
        reason: String,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::BadMagic => f.write_str("not an attnc ISA binary (bad magic)"),
            DecodeError::UnsupportedVersion(version) => write!(
                f,
                "unsupported format version {version} (flat programs are versions 1 to {FORMAT_VERSION}, loop programs {} and {})",
                crate::looped_binary::v3::VERSION,
                crate::looped_binary::v4::VERSION
            ),
            DecodeError::Truncated => f.write_str("truncated input"),
            DecodeError::ChecksumMismatch => f.write_str("checksum mismatch (corrupted input)"),
            DecodeError::TrailingBytes => f.write_str("trailing bytes after the checksum"),
            DecodeError::InvalidHeader { reason } => write!(f, "invalid header: {reason}"),
            DecodeError::InvalidBundle { index, reason } => {
                write!(f, "invalid bundle {index}: {reason}")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// The length [`encode`] gives `p`, without encoding it.
pub fn encoded_len(p: &Program) -> u64 {
    let record = Layout::of(p.format_version()).record as u64;
    (HEADER_BYTES + CHECKSUM_BYTES) as u64 + record * p.bundles.len() as u64
}

/// Encodes a program.
///
/// A non-finite `exp` scale is encoded as is and then rejected by
/// [`decode`].
///
/// Refuses a program of more than `u32::MAX` bundles, which the header cannot
/// count.
pub fn encode(p: &Program) -> Result<Vec<u8>, EncodeError> {
    let count = u32::try_from(p.bundles.len()).map_err(|_| EncodeError::TooLarge {
        what: "bundles",
        count: p.bundles.len() as u64,
    })?;
    let version = p.format_version();
    let layout = Layout::of(version);
    let mut out =
        Vec::with_capacity(HEADER_BYTES + layout.record * p.bundles.len() + CHECKSUM_BYTES);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    for field in [p.pe, p.pes, p.mem_words, count] {
        out.extend_from_slice(&field.to_le_bytes());
    }
    let mut rec = [0u8; BUNDLE_BYTES_V2];
    for b in &p.bundles {
        encode_bundle(b, layout, &mut rec);
        out.extend_from_slice(&rec[..layout.record]);
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(out)
}

fn encode_bundle(b: &Bundle, layout: Layout, rec: &mut [u8; BUNDLE_BYTES_V2]) {
    let mut kind = OP_NOP;
    let mut flags = 0u8;
    let mut w = [0u32; 8];
    let t = layout.tail();
    if let Op::Arith(x) = b.op {
        let info = x.kind.info();
        kind = info.code;
        w[0] = x.a;
        if info.reads == 2 {
            w[1] = x.b;
        }
        if info.imm {
            w[layout.imm.unwrap_or(1)] = x.imm.to_bits();
        }
        if let Some(d) = x.dst {
            flags |= F_OP_DST;
            w[t] = d;
        }
    }
    if let Acc::Add { src, dst } = b.acc {
        flags |= F_ACC;
        match src {
            AccSrc::Mem(s) => w[t + 1] = s,
            AccSrc::Zero => flags |= F_ACC_ZERO,
        }
        if let Some(d) = dst {
            flags |= F_ACC_DST;
            w[t + 2] = d;
        }
    }
    if let Xfer::Send { src, dst } = b.xfer {
        flags |= F_XFER;
        match src {
            XferSrc::Mem(s) => w[t + 3] = s,
            XferSrc::Acc => flags |= F_XFER_ACC,
        }
        w[t + 4] = dst;
    }
    rec.fill(0);
    rec[0] = kind;
    rec[1] = flags;
    for (i, field) in w.iter().take(layout.words()).enumerate() {
        rec[4 + 4 * i..8 + 4 * i].copy_from_slice(&field.to_le_bytes());
    }
}

/// Decodes a program, accepting only the canonical encoding.
///
/// Checks run in layout order (magic, version, header, length, checksum,
/// bundles), so a file from a future version is reported as such rather than
/// as whatever its unknown layout looks like to this one.
pub fn decode(bytes: &[u8]) -> Result<Program, DecodeError> {
    check_magic(bytes)?;
    let version = u16_at(bytes, 8).ok_or(DecodeError::Truncated)?;
    if version == 0 || version > FORMAT_VERSION {
        return Err(DecodeError::UnsupportedVersion(version));
    }
    let layout = Layout::of(version);
    if bytes.len() < HEADER_BYTES {
        return Err(DecodeError::Truncated);
    }
    let reserved = u16_at(bytes, 10).ok_or(DecodeError::Truncated)?;
    let [pe, pes, mem_words, count] =
        [12, 16, 20, 24].map(|at| u32_at(bytes, at).unwrap_or_default());
    // u64 so that a huge count cannot overflow on 32-bit hosts.
    let expected =
        HEADER_BYTES as u64 + layout.record as u64 * u64::from(count) + CHECKSUM_BYTES as u64;
    let len = bytes.len() as u64;
    if len < expected {
        return Err(DecodeError::Truncated);
    }
    if len > expected {
        return Err(DecodeError::TrailingBytes);
    }
    let body_end = bytes.len() - CHECKSUM_BYTES;
    let stored = u32_at(bytes, body_end).ok_or(DecodeError::Truncated)?;
    if crc32fast::hash(&bytes[..body_end]) != stored {
        return Err(DecodeError::ChecksumMismatch);
    }
    if reserved != 0 {
        return Err(DecodeError::InvalidHeader {
            reason: format!("reserved field is {reserved:#06x}, must be 0"),
        });
    }
    let bundles = bytes[HEADER_BYTES..body_end]
        .chunks_exact(layout.record)
        .enumerate()
        .map(|(index, rec)| {
            decode_bundle(rec, version, layout)
                .map_err(|reason| DecodeError::InvalidBundle { index, reason })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let program = Program {
        pe,
        pes,
        mem_words,
        bundles,
    };
    // One encoding per program: a program expressible in an older version must be stored in it.
    if program.format_version() != version {
        return Err(DecodeError::InvalidHeader {
            reason: format!(
                "format version {version}, but the program uses only version-{} operations (it must be stored as version {})",
                program.format_version(),
                program.format_version()
            ),
        });
    }
    Ok(program)
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    let b = bytes.get(at..at + 2)?;
    Some(u16::from_le_bytes([b[0], b[1]]))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at + 4)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn decode_bundle(rec: &[u8], version: u16, layout: Layout) -> Result<Bundle, String> {
    let kind = rec[0];
    let flags = rec[1];
    let w: [u32; 8] = std::array::from_fn(|i| {
        if i < layout.words() {
            u32_at(rec, 4 + 4 * i).unwrap_or_default()
        } else {
            0
        }
    });
    let t = layout.tail();
    let (op_a, op_b) = (w[0], w[1]);
    let op_imm = layout.imm.map_or(0, |i| w[i]);
    let [op_dst, acc_src, acc_dst, xfer_src, xfer_dst] =
        [w[t], w[t + 1], w[t + 2], w[t + 3], w[t + 4]];
    let has = |bit: u8| flags & bit != 0;
    // `name` must be zero because the flags or kind say it is unused.
    let unused = |name: &str, field: u32| -> Result<(), String> {
        if field == 0 {
            Ok(())
        } else {
            Err(format!("unused field {name} is {field:#x}, must be 0"))
        }
    };

    if flags & !F_ALL != 0 {
        return Err(format!("undefined flag bits set in {flags:#04x}"));
    }
    if rec[2] != 0 || rec[3] != 0 {
        return Err("reserved bytes 2..4 are not 0".into());
    }

    let dst = || -> Result<Option<u32>, String> {
        if has(F_OP_DST) {
            Ok(Some(op_dst))
        } else {
            unused("op_dst", op_dst).map(|()| None)
        }
    };
    let op = if kind == OP_NOP {
        if has(F_OP_DST) {
            return Err("op is nop but the op-dst flag is set".into());
        }
        unused("op_a", op_a)?;
        unused("op_b", op_b)?;
        unused("op_imm", op_imm)?;
        unused("op_dst", op_dst)?;
        Op::Nop
    } else {
        let k = OpKind::from_code(kind)
            .filter(|k| k.info().since <= version)
            .ok_or_else(|| format!("unknown op kind {kind} in format version {version}"))?;
        let info = k.info();
        // In version 1 the immediate of a one-operand kind sits in `op_b`.
        let (b, imm_bits) = match (info.reads, info.imm, layout.imm) {
            (1, true, None) => (0, op_b),
            (1, _, _) => {
                unused("op_b", op_b)?;
                (0, op_imm)
            }
            (_, _, _) => (op_b, op_imm),
        };
        let imm = if info.imm {
            let imm = f32::from_bits(imm_bits);
            if !imm.is_finite() {
                return Err(format!("{} scale {imm} is not finite", info.mnemonic));
            }
            imm
        } else {
            unused("op_imm", imm_bits)?;
            0.0
        };
        Op::Arith(Arith {
            kind: k,
            a: op_a,
            b,
            imm,
            dst: dst()?,
        })
    };

    let acc = if has(F_ACC) {
        let src = if has(F_ACC_ZERO) {
            unused("acc_src", acc_src)?;
            AccSrc::Zero
        } else {
            AccSrc::Mem(acc_src)
        };
        let dst = if has(F_ACC_DST) {
            Some(acc_dst)
        } else {
            unused("acc_dst", acc_dst)?;
            None
        };
        Acc::Add { src, dst }
    } else {
        if has(F_ACC_ZERO) || has(F_ACC_DST) {
            return Err("acc flags set without the acc-present flag".into());
        }
        unused("acc_src", acc_src)?;
        unused("acc_dst", acc_dst)?;
        Acc::Nop
    };

    let xfer = if has(F_XFER) {
        let src = if has(F_XFER_ACC) {
            unused("xfer_src", xfer_src)?;
            XferSrc::Acc
        } else {
            XferSrc::Mem(xfer_src)
        };
        Xfer::Send { src, dst: xfer_dst }
    } else {
        if has(F_XFER_ACC) {
            return Err("xfer-src-acc flag set without the xfer-present flag".into());
        }
        unused("xfer_src", xfer_src)?;
        unused("xfer_dst", xfer_dst)?;
        Xfer::Nop
    };

    Ok(Bundle { op, acc, xfer })
}

/// The version-2 record of one bundle, for containers that embed bundle records (the loop
/// format): one definition of how a bundle's slots are encoded.
pub fn encode_record(b: &Bundle) -> [u8; BUNDLE_BYTES_V2] {
    let mut rec = [0u8; BUNDLE_BYTES_V2];
    encode_bundle(b, Layout::of(2), &mut rec);
    rec
}

/// Decodes a version-2 record of [`BUNDLE_BYTES_V2`] bytes, with every canonicality check.
pub fn decode_record(rec: &[u8]) -> Result<Bundle, String> {
    if rec.len() != BUNDLE_BYTES_V2 {
        return Err(format!("a bundle record is {BUNDLE_BYTES_V2} bytes"));
    }
    decode_bundle(rec, 2, Layout::of(2))
}

/// The magic both program formats start with: a prefix of it is a truncated file, anything else
/// is not a program.
pub(crate) fn check_magic(bytes: &[u8]) -> Result<(), DecodeError> {
    match bytes.get(..MAGIC.len()) {
        Some(head) if head == MAGIC => Ok(()),
        Some(_) => Err(DecodeError::BadMagic),
        None if MAGIC.starts_with(bytes) => Err(DecodeError::Truncated),
        None => Err(DecodeError::BadMagic),
    }
}
