//! Binary forms of loop programs. Version 4 ([`v4`]) is the one written: a dense record
//! stream whose address fields are as wide as the program needs. Version 3 ([`v3`]), fixed
//! 4-byte fields around embedded 36-byte bundle records, stays readable so that directories
//! written before version 4 still run. Both share the flat formats' 28-byte header layout and
//! trailing CRC-32, so one dispatch on the version field reads any attnc binary.
//!
//! Both encodings are canonical: the decoder rejects every byte string that is not exactly
//! what the encoder writes for the program it describes, so `encode(decode(b)?) == b`.

pub mod v3;
pub mod v4;

use crate::binary::{self, DecodeError, CHECKSUM_BYTES, HEADER_BYTES, MAGIC};
use crate::looped::{CountStep, LBundle, Loop, LoopProgram, Node, MAX_LOOP_DEPTH};
use crate::looped_text::AnyProgram;

pub use v4::{encode_looped, encoded_len};

/// The binary version attnc writes loop programs in.
pub const LOOP_BINARY_VERSION: u16 = v4::VERSION;

/// Decodes any attnc binary: a loop program of version 3 or 4, else a flat program (whose
/// decoder reports versions it does not know).
pub fn decode_any(bytes: &[u8]) -> Result<AnyProgram, DecodeError> {
    match version_of(bytes) {
        Some(v3::VERSION | v4::VERSION) => decode_looped(bytes).map(AnyProgram::Looped),
        _ => binary::decode(bytes).map(AnyProgram::Flat),
    }
}

/// Decodes a loop program of binary version 3 or 4 and validates it. `InvalidBundle`'s `index`
/// is the byte offset of the offending record in the stream (for a rule of
/// [`LoopProgram::validate`], the pre-order node index, named in the reason).
pub fn decode_looped(bytes: &[u8]) -> Result<LoopProgram, DecodeError> {
    let frame = Frame::read(bytes)?;
    match frame.version {
        v3::VERSION => v3::decode(&frame),
        v4::VERSION => v4::decode(&frame),
        v => Err(DecodeError::UnsupportedVersion(v)),
    }
}

/// The version field of an input that starts with the magic.
fn version_of(bytes: &[u8]) -> Option<u16> {
    (bytes.get(..MAGIC.len())? == MAGIC).then_some(())?;
    let v = bytes.get(8..10)?;
    Some(u16::from_le_bytes([v[0], v[1]]))
}

/// The header and record stream of a loop binary whose magic, length and checksum are right.
pub(crate) struct Frame<'a> {
    pub version: u16,
    /// Header bytes 10 and 11: reserved in version 3, the field widths in version 4.
    pub widths: [u8; 2],
    pub pe: u32,
    pub pes: u32,
    pub mem_words: u32,
    pub records: &'a [u8],
}

impl<'a> Frame<'a> {
    /// Checks, in order: magic, version (3 or 4, before anything else is read, since another
    /// version lays out the rest differently), length against the header's record length,
    /// checksum.
    fn read(bytes: &'a [u8]) -> Result<Frame<'a>, DecodeError> {
        binary::check_magic(bytes)?;
        let version = version_of(bytes).ok_or(DecodeError::Truncated)?;
        if version != v3::VERSION && version != v4::VERSION {
            return Err(DecodeError::UnsupportedVersion(version));
        }
        let header = bytes.get(..HEADER_BYTES).ok_or(DecodeError::Truncated)?;
        let [pe, pes, mem_words, len] = [12, 16, 20, 24].map(|at| u32_le(&header[at..at + 4]));
        let expected = HEADER_BYTES as u64 + u64::from(len) + CHECKSUM_BYTES as u64;
        if (bytes.len() as u64) < expected {
            return Err(DecodeError::Truncated);
        }
        if bytes.len() as u64 > expected {
            return Err(DecodeError::TrailingBytes);
        }
        let end = bytes.len() - CHECKSUM_BYTES;
        if crc32fast::hash(&bytes[..end]) != u32_le(&bytes[end..]) {
            return Err(DecodeError::ChecksumMismatch);
        }
        Ok(Frame {
            version,
            widths: [header[10], header[11]],
            pe,
            pes,
            mem_words,
            records: &bytes[HEADER_BYTES..end],
        })
    }

    /// The program with `body` and this frame's header, not yet validated.
    fn program(&self, body: Vec<Node>) -> LoopProgram {
        LoopProgram {
            pe: self.pe,
            pes: self.pes,
            mem_words: self.mem_words,
            body,
        }
    }

    /// `p` if it passes [`LoopProgram::validate`].
    fn validated(p: LoopProgram) -> Result<LoopProgram, DecodeError> {
        p.validate().map_err(|e| DecodeError::InvalidBundle {
            index: e.node,
            reason: format!("node {}: {}", e.node, e.message),
        })?;
        Ok(p)
    }
}

/// `bytes` (at most 4) as a little-endian unsigned number.
pub(crate) fn u32_le(bytes: &[u8]) -> u32 {
    bytes
        .iter()
        .rev()
        .fold(0u32, |acc, &b| (acc << 8) | u32::from(b))
}

/// The header both versions write: magic, `version`, header bytes 10 and 11, pe, pes,
/// mem_words and the record stream's byte length.
pub(crate) fn header(p: &LoopProgram, version: u16, widths: [u8; 2], len: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&widths);
    for v in [p.pe, p.pes, p.mem_words, len] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// `header`, `records` and the CRC-32 of both.
pub(crate) fn seal(mut header: Vec<u8>, records: &[u8]) -> Vec<u8> {
    header.reserve(records.len() + CHECKSUM_BYTES);
    header.extend_from_slice(records);
    let crc = crc32fast::hash(&header);
    header.extend_from_slice(&crc.to_le_bytes());
    header
}

/// The loop tree as records open, fill and close it, in pre-order.
pub(crate) struct Tree {
    /// The open loops' counts, steps and bodies so far; the first entry is the program's body.
    stack: Vec<(u32, Option<CountStep>, Vec<Node>)>,
}

impl Tree {
    pub fn new() -> Tree {
        Tree {
            stack: vec![(1, None, Vec::new())],
        }
    }

    /// Opens a loop. The depth limit is checked here, not only by validation, so that a hostile
    /// file cannot build an unbounded stack first.
    pub fn open(&mut self, count: u32, step: Option<CountStep>) -> Result<(), String> {
        if self.stack.len() > MAX_LOOP_DEPTH {
            return Err(format!("loops nested deeper than {MAX_LOOP_DEPTH}"));
        }
        self.stack.push((count, step, Vec::new()));
        Ok(())
    }

    pub fn close(&mut self) -> Result<(), String> {
        if self.stack.len() == 1 {
            return Err("loop end without an open loop".into());
        }
        if let Some((count, step, body)) = self.stack.pop() {
            self.push(Node::Loop(Loop { count, step, body }));
        }
        Ok(())
    }

    pub fn bundle(&mut self, b: LBundle) {
        self.push(Node::Bundle(b));
    }

    fn push(&mut self, n: Node) {
        if let Some(top) = self.stack.last_mut() {
            top.2.push(n);
        }
    }

    /// The program's body; `end` is the stream's length, the offset an unclosed loop is
    /// reported at.
    pub fn finish(mut self, end: usize) -> Result<Vec<Node>, DecodeError> {
        if self.stack.len() != 1 {
            return Err(DecodeError::InvalidBundle {
                index: end,
                reason: "loop not closed at the end of the stream".into(),
            });
        }
        Ok(self.stack.pop().map(|s| s.2).unwrap_or_default())
    }
}
