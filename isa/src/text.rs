//! Text assembly: the canonical printer ([`fmt::Display`]) and the parser.
//!
//! The printer is the single source of the canonical form; the parser accepts
//! that form and harmless variations of it (extra spaces, explicit trailing
//! `nop` slots, leading zeros in numbers), so printing a parsed canonical
//! file reproduces it byte for byte.

use std::fmt::{self, Write as _};
use std::str::FromStr;

use crate::inst::{
    Acc, AccSrc, Addr, Arith, Bundle, Op, OpKind, Program, Xfer, XferSrc, FORMAT_VERSION, OPS,
};

/// First line of every printed program; only for humans, the parser skips it
/// like any other comment.
const HEADER_COMMENT: &str = "; attnc ring microcode";

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Op::Arith(x) = self else {
            return f.write_str("nop");
        };
        let info = x.kind.info();
        write!(f, "{} m{}", info.mnemonic, x.a)?;
        if info.reads == 2 {
            write!(f, ", m{}", x.b)?;
        }
        if info.imm {
            // `{:?}` is the shortest text that parses back to the same bits.
            write!(f, ", {:?}", x.imm)?;
        }
        write_dst(f, x.dst)
    }
}

impl fmt::Display for Acc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Acc::Nop => f.write_str("nop"),
            Acc::Add { src, dst } => {
                match src {
                    AccSrc::Mem(s) => write!(f, "add m{s}")?,
                    AccSrc::Zero => f.write_str("add 0")?,
                }
                write_dst(f, dst)
            }
        }
    }
}

impl fmt::Display for Xfer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Xfer::Nop => f.write_str("nop"),
            Xfer::Send {
                src: XferSrc::Mem(s),
                dst,
            } => write!(f, "send m{s} -> m{dst}"),
            Xfer::Send {
                src: XferSrc::Acc,
                dst,
            } => write!(f, "send acc -> m{dst}"),
        }
    }
}

fn write_dst(f: &mut fmt::Formatter<'_>, dst: Option<Addr>) -> fmt::Result {
    match dst {
        Some(d) => write!(f, " -> m{d}"),
        None => Ok(()),
    }
}

impl fmt::Display for Bundle {
    /// One line, trailing nop slots omitted.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.op)?;
        if self.acc != Acc::Nop || self.xfer != Xfer::Nop {
            write!(f, " | {}", self.acc)?;
        }
        if self.xfer != Xfer::Nop {
            write!(f, " | {}", self.xfer)?;
        }
        Ok(())
    }
}

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{HEADER_COMMENT}")?;
        writeln!(f, ".format {}", self.format_version())?;
        writeln!(f, ".pe {}", self.pe)?;
        writeln!(f, ".pes {}", self.pes)?;
        writeln!(f, ".mem {}", self.mem_words)?;
        for b in &self.bundles {
            writeln!(f, "{b}")?;
        }
        Ok(())
    }
}

impl Program {
    /// The canonical text form. A program with a non-finite `exp` scale
    /// prints, but the result does not parse.
    pub fn to_text(&self) -> String {
        // ~24 bytes is a typical bundle line; sizing up front keeps printing
        // million-bundle programs from reallocating repeatedly.
        let mut s = String::with_capacity(64 + 24 * self.bundles.len());
        // Writing into a String cannot fail.
        let _ = write!(s, "{self}");
        s
    }

    /// Parses a whole program in text form.
    pub fn parse(text: &str) -> Result<Program, ParseError> {
        parse(text)
    }
}

impl FromStr for Program {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(s)
    }
}

impl FromStr for Bundle {
    type Err = ParseError;
    /// Parses one bundle line (a comment is allowed; errors report line 1).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let code = strip_comment(s);
        if code.trim().is_empty() {
            return Err(ParseError::at(1, s, s.len(), "expected a bundle"));
        }
        parse_bundle(1, s, code.len())
    }
}

/// A syntax error, positioned at a 1-based line and column (columns count
/// characters, not bytes).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ParseError {
    pub line: usize,
    pub col: usize,
    pub message: String,
}

impl ParseError {
    fn at(line: usize, src: &str, byte: usize, message: impl Into<String>) -> Self {
        let byte = byte.min(src.len());
        // `byte` always comes from a token boundary, so it is a char
        // boundary; `get` keeps a mistake here from becoming a panic.
        let col = src.get(..byte).map_or(byte, |p| p.chars().count()) + 1;
        ParseError {
            line,
            col,
            message: message.into(),
        }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}:{}: {}", self.line, self.col, self.message)
    }
}

impl std::error::Error for ParseError {}

/// Parses a whole program in text form.
pub fn parse(text: &str) -> Result<Program, ParseError> {
    let mut header = Header::default();
    let mut bundles = Vec::new();
    // Set once the first bundle has been seen; directives are then closed.
    let mut fields: Option<(u16, u32, u32, u32)> = None;
    let mut last_line = 0;
    for (i, src) in text.lines().enumerate() {
        let line = i + 1;
        last_line = line;
        let code = strip_comment(src);
        let Some(start) = code.find(|c: char| !c.is_whitespace()) else {
            continue;
        };
        if code[start..].starts_with('.') {
            if fields.is_some() {
                return Err(ParseError::at(
                    line,
                    src,
                    start,
                    "directives must come before the first bundle",
                ));
            }
            header.directive(line, src, code.len())?;
        } else {
            let version = match fields {
                Some(f) => f.0,
                None => fields.insert(header.complete(line)?).0,
            };
            let b = parse_bundle(line, src, code.len())?;
            if let Some(k) = b.op.kind() {
                if k.info().since > version {
                    return Err(ParseError::at(
                        line,
                        src,
                        start,
                        format!(
                            "`{}` needs `.format {}` or later (this file declares `.format {version}`)",
                            k.mnemonic(),
                            k.info().since
                        ),
                    ));
                }
            }
            bundles.push(b);
        }
    }
    let (_, pe, pes, mem_words) = match fields {
        Some(f) => f,
        None => header.complete(last_line + 1)?,
    };
    Ok(Program {
        pe,
        pes,
        mem_words,
        bundles,
    })
}

fn strip_comment(src: &str) -> &str {
    match src.find(';') {
        Some(i) => &src[..i],
        None => src,
    }
}

/// Directive values seen so far, each with the line that set it so a
/// duplicate can point at the original.
#[derive(Default)]
struct Header {
    format: Option<(u16, usize)>,
    pe: Option<(u32, usize)>,
    pes: Option<(u32, usize)>,
    mem: Option<(u32, usize)>,
}

impl Header {
    fn directive(&mut self, line: usize, src: &str, end: usize) -> Result<(), ParseError> {
        let mut c = Cursor::new(line, src, end);
        let (name_at, name) = c.expect_word("a directive")?;
        let (val_at, val) = c.expect_word(&format!("a number after `{name}`"))?;
        let value = parse_u32(val).ok_or_else(|| {
            ParseError::at(
                line,
                src,
                val_at,
                format!(
                    "bad value `{val}` for `{name}` (expected a decimal number up to {})",
                    u32::MAX
                ),
            )
        })?;
        c.expect_end("after the directive's value")?;
        let slot = match name {
            ".format" => {
                if value == 0 || value > u32::from(FORMAT_VERSION) {
                    return Err(ParseError::at(
                        line,
                        src,
                        val_at,
                        format!("unsupported format version {value} (this assembler reads versions 1 to {FORMAT_VERSION})"),
                    ));
                }
                return match self.format.replace((value as u16, line)) {
                    Some((_, prev)) => Err(duplicate(line, src, name_at, name, prev)),
                    None => Ok(()),
                };
            }
            ".pe" => &mut self.pe,
            ".pes" => &mut self.pes,
            ".mem" => &mut self.mem,
            _ => {
                return Err(ParseError::at(
                    line,
                    src,
                    name_at,
                    format!("unknown directive `{name}` (expected .format, .pe, .pes or .mem)"),
                ))
            }
        };
        match slot.replace((value, line)) {
            Some((_, prev)) => Err(duplicate(line, src, name_at, name, prev)),
            None => Ok(()),
        }
    }

    /// Checks that every directive was given; `line` is where the first
    /// bundle (or the end of input) was reached without them.
    fn complete(&self, line: usize) -> Result<(u16, u32, u32, u32), ParseError> {
        let missing = |name: &str| ParseError {
            line,
            col: 1,
            message: format!("missing `{name}` directive (required before the first bundle)"),
        };
        let (version, _) = self.format.ok_or_else(|| missing(".format"))?;
        let (pe, _) = self.pe.ok_or_else(|| missing(".pe"))?;
        let (pes, _) = self.pes.ok_or_else(|| missing(".pes"))?;
        let (mem, _) = self.mem.ok_or_else(|| missing(".mem"))?;
        Ok((version, pe, pes, mem))
    }
}

fn duplicate(line: usize, src: &str, at: usize, name: &str, prev: usize) -> ParseError {
    ParseError::at(
        line,
        src,
        at,
        format!("duplicate `{name}` directive (first given on line {prev})"),
    )
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Tok<'a> {
    Comma,
    Arrow,
    Bar,
    Word(&'a str),
}

impl fmt::Display for Tok<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Comma => f.write_str("`,`"),
            Tok::Arrow => f.write_str("`->`"),
            Tok::Bar => f.write_str("`|`"),
            Tok::Word(w) => write!(f, "`{w}`"),
        }
    }
}

/// A tokenizer over the code part of one line. Tokens are produced lazily
/// so parsing a line allocates nothing unless it fails.
struct Cursor<'a> {
    line: usize,
    src: &'a str,
    pos: usize,
    end: usize,
    /// One token of lookahead: `(start, token)`.
    peeked: Option<Option<(usize, Tok<'a>)>>,
}

impl<'a> Cursor<'a> {
    fn new(line: usize, src: &'a str, end: usize) -> Self {
        Cursor {
            line,
            src,
            pos: 0,
            end,
            peeked: None,
        }
    }

    fn scan(&mut self) -> Option<(usize, Tok<'a>)> {
        let code = &self.src[..self.end];
        let rest = &code[self.pos..];
        let skipped = rest.len() - rest.trim_start().len();
        self.pos += skipped;
        let rest = &code[self.pos..];
        let start = self.pos;
        let tok = if rest.is_empty() {
            return None;
        } else if rest.starts_with(',') {
            self.pos += 1;
            Tok::Comma
        } else if rest.starts_with('|') {
            self.pos += 1;
            Tok::Bar
        } else if rest.starts_with("->") {
            self.pos += 2;
            Tok::Arrow
        } else {
            // A word runs to whitespace or punctuation. A `-` alone does not
            // end it, so negative scales and `1e-5` stay whole.
            let len = rest
                .char_indices()
                .find(|&(i, ch)| {
                    ch.is_whitespace() || ch == ',' || ch == '|' || rest[i..].starts_with("->")
                })
                .map_or(rest.len(), |(i, _)| i);
            self.pos += len;
            Tok::Word(&rest[..len])
        };
        Some((start, tok))
    }

    fn peek(&mut self) -> Option<(usize, Tok<'a>)> {
        if self.peeked.is_none() {
            self.peeked = Some(self.scan());
        }
        self.peeked.flatten()
    }

    fn next(&mut self) -> Option<(usize, Tok<'a>)> {
        match self.peeked.take() {
            Some(t) => t,
            None => self.scan(),
        }
    }

    fn err(&self, at: usize, message: impl Into<String>) -> ParseError {
        ParseError::at(self.line, self.src, at, message)
    }

    fn found(&mut self, expected: &str) -> ParseError {
        match self.peek() {
            Some((at, t)) => self.err(at, format!("expected {expected}, found {t}")),
            None => self.err(self.end, format!("expected {expected}, found end of line")),
        }
    }

    fn expect_word(&mut self, expected: &str) -> Result<(usize, &'a str), ParseError> {
        match self.peek() {
            Some((at, Tok::Word(w))) => {
                self.next();
                Ok((at, w))
            }
            _ => Err(self.found(expected)),
        }
    }

    fn expect(&mut self, tok: Tok<'a>, expected: &str) -> Result<(), ParseError> {
        match self.peek() {
            Some((_, t)) if t == tok => {
                self.next();
                Ok(())
            }
            _ => Err(self.found(expected)),
        }
    }

    fn expect_end(&mut self, context: &str) -> Result<(), ParseError> {
        match self.peek() {
            None => Ok(()),
            Some((at, t)) => Err(self.err(at, format!("unexpected {t} {context}"))),
        }
    }

    fn addr(&mut self, what: &str) -> Result<Addr, ParseError> {
        let (at, w) = self.expect_word(what)?;
        self.addr_word(at, w)
    }

    fn addr_word(&self, at: usize, w: &str) -> Result<Addr, ParseError> {
        let digits = w
            .strip_prefix('m')
            .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()));
        let Some(digits) = digits else {
            return Err(self.err(
                at,
                format!("bad address `{w}` (expected `m` followed by a decimal number)"),
            ));
        };
        parse_u32(digits).ok_or_else(|| {
            self.err(
                at,
                format!("address `{w}` is too large (the largest is m{})", u32::MAX),
            )
        })
    }

    /// An optional `-> mD`.
    fn dst(&mut self) -> Result<Option<Addr>, ParseError> {
        if let Some((_, Tok::Arrow)) = self.peek() {
            self.next();
            Ok(Some(self.addr("a destination address after `->`")?))
        } else {
            Ok(None)
        }
    }

    /// After a slot: a `|` (returns true), the end of the line (false), or
    /// an error naming what could have come instead.
    fn slot_end(&mut self, slot: &str, more: &str) -> Result<bool, ParseError> {
        match self.peek() {
            None => Ok(false),
            Some((_, Tok::Bar)) => {
                self.next();
                Ok(true)
            }
            Some((at, t)) => Err(self.err(
                at,
                format!("unexpected {t} after the {slot} slot; expected {more}"),
            )),
        }
    }

    /// The mnemonic opening a slot; an empty slot gets its own message since
    /// `a | | b` is an easy mistake to make.
    fn mnemonic(&mut self, slot: &str) -> Result<(usize, &'a str), ParseError> {
        match self.peek() {
            Some((at, Tok::Bar)) => Err(self.err(
                at,
                format!("empty {slot} slot (write `nop` for an idle slot)"),
            )),
            None => Err(self.err(
                self.end,
                format!("empty {slot} slot (write `nop` for an idle slot)"),
            )),
            _ => self.expect_word("a mnemonic"),
        }
    }
}

fn parse_u32(digits: &str) -> Option<u32> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Parses the bundle in `src[..end]` (the part before any comment).
fn parse_bundle(line: usize, src: &str, end: usize) -> Result<Bundle, ParseError> {
    let mut c = Cursor::new(line, src, end);
    let op = parse_op(&mut c)?;
    let mut b = Bundle { op, ..Bundle::NOP };
    if !c.slot_end("op", "`->`, `|` or end of line")? {
        return Ok(b);
    }
    b.acc = parse_acc(&mut c)?;
    if !c.slot_end("acc", "`->`, `|` or end of line")? {
        return Ok(b);
    }
    b.xfer = parse_xfer(&mut c)?;
    match c.peek() {
        None => Ok(b),
        Some((at, Tok::Bar)) => Err(c.err(
            at,
            "too many slots (a bundle has at most three: op | acc | xfer)",
        )),
        Some((at, t)) => Err(c.err(
            at,
            format!("unexpected {t} after the xfer slot; expected end of line"),
        )),
    }
}

fn parse_op(c: &mut Cursor<'_>) -> Result<Op, ParseError> {
    let (at, m) = c.mnemonic("op")?;
    if m == "nop" {
        return Ok(Op::Nop);
    }
    let Some(kind) = OpKind::from_mnemonic(m) else {
        let known: Vec<&str> = OPS.iter().map(|o| o.mnemonic).collect();
        return Err(if m == "add" || m == "send" {
            c.err(
                at,
                format!("`{m}` is not an op; the op slot comes first (write `nop | {m} ...`)"),
            )
        } else {
            c.err(
                at,
                format!(
                    "unknown op mnemonic `{m}` (expected nop, {})",
                    known.join(", ")
                ),
            )
        });
    };
    let info = kind.info();
    let two = info.reads == 2;
    let a = c.addr(if two {
        "the first operand address"
    } else {
        "the operand address"
    })?;
    let mut b = 0;
    if two {
        c.expect(Tok::Comma, "`,` between the operands")?;
        b = c.addr("the second operand address")?;
    }
    let mut imm: f32 = 0.0;
    if info.imm {
        c.expect(Tok::Comma, "`,` between the operands and the scale")?;
        let (s_at, s) = c.expect_word("the scale (a decimal number)")?;
        // Rust's float syntax also admits `inf` and `NaN`, hence the
        // separate finiteness check.
        imm = s
            .parse()
            .map_err(|_| c.err(s_at, format!("bad scale `{s}` (expected a decimal number)")))?;
        if !imm.is_finite() {
            return Err(c.err(s_at, format!("scale `{s}` is not a finite f32")));
        }
    }
    let dst = c.dst()?;
    Ok(Op::Arith(Arith {
        kind,
        a,
        b,
        imm,
        dst,
    }))
}

fn parse_acc(c: &mut Cursor<'_>) -> Result<Acc, ParseError> {
    let (at, m) = c.mnemonic("acc")?;
    match m {
        "nop" => Ok(Acc::Nop),
        "add" => {
            let src = match c.expect_word("`0` or an address after `add`")? {
                (_, "0") => AccSrc::Zero,
                (w_at, w) => AccSrc::Mem(c.addr_word(w_at, w)?),
            };
            let dst = c.dst()?;
            Ok(Acc::Add { src, dst })
        }
        _ => Err(c.err(
            at,
            format!("unknown acc mnemonic `{m}` (expected nop or add)"),
        )),
    }
}

fn parse_xfer(c: &mut Cursor<'_>) -> Result<Xfer, ParseError> {
    let (at, m) = c.mnemonic("xfer")?;
    match m {
        "nop" => Ok(Xfer::Nop),
        "send" => {
            let src = match c.expect_word("`acc` or an address after `send`")? {
                (_, "acc") => XferSrc::Acc,
                (w_at, w) => XferSrc::Mem(c.addr_word(w_at, w)?),
            };
            c.expect(
                Tok::Arrow,
                "`->` and the receiver's address (a send always names one)",
            )?;
            let dst = c.addr("the receiver's address after `->`")?;
            Ok(Xfer::Send { src, dst })
        }
        _ => Err(c.err(
            at,
            format!("unknown xfer mnemonic `{m}` (expected nop or send)"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_example_round_trips() {
        let text = "; attnc ring microcode
.format 1
.pe 0
.pes 4
.mem 120
mul m3, m7 | add m12 -> m12 | send acc -> m0
exp m5, 0.25 -> m5 | add 0 -> m9
div m2, m9 -> m2 | nop | send m9 -> m1
nop
";
        let p = parse(text).unwrap();
        assert_eq!(p.bundles.len(), 4);
        assert_eq!(p.to_text(), text);
    }

    #[test]
    fn loose_spacing_and_explicit_nops_are_accepted() {
        let b: Bundle = "  mul m3,m7->m1|add 0->m2 |nop ; hi".parse().unwrap();
        assert_eq!(b.to_string(), "mul m3, m7 -> m1 | add 0 -> m2");
        let b: Bundle = "exp m1, -1e-5->m2".parse().unwrap();
        assert_eq!(b.op, Op::exp(1, -1e-5, Some(2)));
        let b: Bundle = "nop | nop | nop".parse().unwrap();
        assert_eq!(b, Bundle::NOP);
        assert_eq!(b.to_string(), "nop");
    }

    #[test]
    fn columns_count_characters() {
        let e = "mul m1, m2 | héé".parse::<Bundle>().unwrap_err();
        assert_eq!((e.line, e.col), (1, 14));
        let e = "; é\n.format 1\n.pe 0\n.pes 1\n.mem 1\nné mul"
            .parse::<Program>()
            .unwrap_err();
        assert_eq!((e.line, e.col), (6, 1), "{e}");
    }
}
