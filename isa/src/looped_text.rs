//! Text form of format 3: `loop N {` … `}` blocks around format-1 bundle
//! lines whose addresses may be affine (`m[B + S*iK - S*(iK % W)]`) and whose
//! slots may end in a predicate (`if iK == V && …`).
//!
//! A bundle line is parsed by rewriting it into a flat bundle line of the same
//! character length (each affine address becomes `mB` padded with spaces,
//! each predicate becomes spaces) and handing that to the flat bundle
//! parser, so the two formats cannot disagree about slots and mnemonics and
//! error columns stay those of the original line.

use std::fmt::{self, Write as _};
use std::str::FromStr;

use crate::inst::{Bundle, Program};
use crate::looped::{
    field, Cmp, CountStep, Field, LBundle, Loop, LoopProgram, Node, Pred, Slot, Term,
    LOOP_FORMAT_VERSION,
};
use crate::text::ParseError;

const HEADER_COMMENT: &str = "; attnc ring microcode";

fn perr(line: usize, src: &str, byte: usize, message: impl Into<String>) -> ParseError {
    let byte = byte.min(src.len());
    let col = src.get(..byte).map_or(byte, |p| p.chars().count()) + 1;
    ParseError {
        line,
        col,
        message: message.into(),
    }
}

impl fmt::Display for LBundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Print the flat bundle, then splice the affine addresses and
        // the predicates into it. Address tokens appear in `Field` order.
        let flat = self.bundle.to_string();
        let fields: Vec<Field> = Field::ALL
            .into_iter()
            .filter(|&fl| field(&self.bundle, fl).is_some())
            .collect();
        let mut out = String::with_capacity(flat.len() + 32);
        let mut k = 0;
        let bytes = flat.as_bytes();
        let mut i = 0;
        let mut slot = 0usize;
        while i < bytes.len() {
            let c = bytes[i];
            if c == b'|' {
                write_preds(&mut out, &self.preds, Slot::ALL[slot]);
                slot += 1;
            }
            if c == b'm'
                && (i == 0 || !bytes[i - 1].is_ascii_alphanumeric())
                && bytes.get(i + 1).is_some_and(|d| d.is_ascii_digit())
            {
                let mut j = i + 1;
                while j < bytes.len() && bytes[j].is_ascii_digit() {
                    j += 1;
                }
                let fl = fields[k];
                k += 1;
                let terms: Vec<&Term> = self.terms.iter().filter(|t| t.field == fl).collect();
                if terms.is_empty() {
                    out.push_str(&flat[i..j]);
                } else {
                    let _ = write!(out, "m[{}", &flat[i + 1..j]);
                    for t in terms {
                        let sign = if t.stride < 0 { '-' } else { '+' };
                        let mag = i64::from(t.stride).unsigned_abs();
                        if t.wrap == 0 {
                            let _ = write!(out, " {sign} {mag}*i{}", t.level);
                        } else {
                            let _ = write!(out, " {sign} {mag}*(i{} % {})", t.level, t.wrap);
                        }
                    }
                    out.push(']');
                }
                i = j;
                continue;
            }
            out.push(c as char);
            i += 1;
        }
        write_preds(&mut out, &self.preds, Slot::ALL[slot.min(2)]);
        f.write_str(&out)
    }
}

fn write_preds(out: &mut String, preds: &[Pred], slot: Slot) {
    let mut first = true;
    // Predicates are spliced before the ` | ` separator, so trim the space.
    let had_space = out.ends_with(' ');
    if had_space && preds.iter().any(|p| p.slot == slot) {
        out.pop();
    }
    for p in preds.iter().filter(|p| p.slot == slot) {
        let _ = write!(
            out,
            " {} i{} {} {}",
            if first { "if" } else { "&&" },
            p.level,
            p.cmp.symbol(),
            p.value
        );
        first = false;
    }
    if had_space && !first {
        out.push(' ');
    }
}

impl fmt::Display for LoopProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{HEADER_COMMENT}")?;
        writeln!(f, ".format {LOOP_FORMAT_VERSION}")?;
        writeln!(f, ".pe {}", self.pe)?;
        writeln!(f, ".pes {}", self.pes)?;
        writeln!(f, ".mem {}", self.mem_words)?;
        fn body(f: &mut fmt::Formatter<'_>, nodes: &[Node], depth: usize) -> fmt::Result {
            for n in nodes {
                match n {
                    Node::Bundle(b) => writeln!(f, "{:w$}{b}", "", w = 4 * depth)?,
                    Node::Loop(l) => {
                        write!(f, "{:w$}loop {}", "", l.count, w = 4 * depth)?;
                        if let Some(s) = l.step {
                            let sign = if s.per < 0 { '-' } else { '+' };
                            match s.per.unsigned_abs() {
                                1 => write!(f, " {sign} i{}", s.level)?,
                                k => write!(f, " {sign} {k}*i{}", s.level)?,
                            }
                        }
                        writeln!(f, " {{")?;
                        body(f, &l.body, depth + 1)?;
                        writeln!(f, "{:w$}}}", "", w = 4 * depth)?;
                    }
                }
            }
            Ok(())
        }
        body(f, &self.body, 0)
    }
}

impl LoopProgram {
    /// The canonical text form (docs/isa.md, format 3).
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let _ = write!(s, "{self}");
        s
    }
}

impl FromStr for LoopProgram {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_looped(s)
    }
}

/// A program of either format, as read from a file.
#[derive(Clone, PartialEq, Debug)]
pub enum AnyProgram {
    Flat(Program),
    Looped(LoopProgram),
}

impl AnyProgram {
    /// The program as a loop program (a flat program has no loops).
    pub fn into_looped(self) -> LoopProgram {
        match self {
            AnyProgram::Flat(p) => LoopProgram::from_flat(&p),
            AnyProgram::Looped(p) => p,
        }
    }
}

/// Parses text of either format, dispatching on the `.format` directive.
pub fn parse_any(text: &str) -> Result<AnyProgram, ParseError> {
    for src in text.lines() {
        let code = src.split(';').next().unwrap_or("").trim();
        if let Some(rest) = code.strip_prefix(".format") {
            if rest.trim() == LOOP_FORMAT_VERSION.to_string() {
                return parse_looped(text).map(AnyProgram::Looped);
            }
            break;
        }
    }
    crate::text::parse(text).map(AnyProgram::Flat)
}

#[derive(Default)]
struct Header {
    format: Option<usize>,
    pe: Option<(u32, usize)>,
    pes: Option<(u32, usize)>,
    mem: Option<(u32, usize)>,
}

/// Parses a format-3 program and validates it (every error carries a line).
pub fn parse_looped(text: &str) -> Result<LoopProgram, ParseError> {
    let mut h = Header::default();
    let mut started = false;
    // Open loops: (count, body, line of `loop`).
    let mut stack: Vec<(u32, Option<CountStep>, Vec<Node>, usize)> = vec![(1, None, Vec::new(), 0)];
    // Line of every node in pre-order, to place validation errors.
    let mut node_lines: Vec<usize> = Vec::new();
    // Pre-order numbering needs a node's slot reserved when it opens.
    let mut last_line = 0;
    for (i, src) in text.lines().enumerate() {
        let line = i + 1;
        last_line = line;
        let code = match src.find(';') {
            Some(k) => &src[..k],
            None => src,
        };
        let Some(start) = code.find(|c: char| !c.is_whitespace()) else {
            continue;
        };
        let t = code[start..].trim_end();
        if t.starts_with('.') {
            if started {
                return Err(perr(
                    line,
                    src,
                    start,
                    "directives must come before the first bundle or loop",
                ));
            }
            directive(&mut h, line, src, start, t)?;
            continue;
        }
        if !started {
            complete(&h, line)?;
            started = true;
        }
        if t == "}" {
            if stack.len() == 1 {
                return Err(perr(line, src, start, "`}` without an open loop"));
            }
            let Some((count, step, body, _)) = stack.pop() else {
                continue;
            };
            if let Some(top) = stack.last_mut() {
                top.2.push(Node::Loop(Loop { count, step, body }));
            }
            continue;
        }
        if let Some(rest) = t.strip_prefix("loop") {
            if rest.starts_with(char::is_whitespace) {
                let rest = rest.trim();
                let Some(num) = rest.strip_suffix('{') else {
                    return Err(perr(line, src, start, "expected `loop COUNT {`"));
                };
                let num = num.trim();
                let (count, step) = parse_count(num).ok_or_else(|| {
                    perr(
                        line,
                        src,
                        start + 5,
                        format!("bad loop count `{num}` (expected a decimal u32, optionally `+ K*iL` or `- K*iL`)"),
                    )
                })?;
                node_lines.push(line);
                stack.push((count, step, Vec::new(), line));
                continue;
            }
        }
        node_lines.push(line);
        let b = parse_lbundle(line, src, code.len())?;
        if let Some(top) = stack.last_mut() {
            top.2.push(Node::Bundle(b));
        }
    }
    if !started {
        complete(&h, last_line + 1)?;
    }
    if stack.len() > 1 {
        let open = stack.last().map_or(0, |s| s.3);
        return Err(ParseError {
            line: open,
            col: 1,
            message: "loop is never closed (missing `}`)".into(),
        });
    }
    let body = stack.pop().map(|s| s.2).unwrap_or_default();
    let (pe, pes, mem_words) = (
        h.pe.map_or(0, |x| x.0),
        h.pes.map_or(0, |x| x.0),
        h.mem.map_or(0, |x| x.0),
    );
    let p = LoopProgram {
        pe,
        pes,
        mem_words,
        body,
    };
    p.validate().map_err(|e| ParseError {
        line: node_lines.get(e.node).copied().unwrap_or(0),
        col: 1,
        message: e.message,
    })?;
    Ok(p)
}

fn parse_u32(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `N`, `N + iL`, `N - K*iL`: a loop count, optionally stepped by an enclosing loop's index.
/// Printing never writes a step of 0 or a `+ -`, so neither is accepted.
fn parse_count(s: &str) -> Option<(u32, Option<CountStep>)> {
    let Some(at) = s.find(['+', '-']) else {
        return Some((parse_u32(s)?, None));
    };
    let count = parse_u32(s[..at].trim())?;
    let negative = s[at..].starts_with('-');
    let term = s[at + 1..].trim();
    let (k, index) = match term.split_once('*') {
        Some((k, i)) => (parse_u32(k.trim())?, i.trim()),
        None => (1, term),
    };
    let level = index.strip_prefix('i').and_then(parse_u32)?;
    let signed = if negative {
        -i64::from(k)
    } else {
        i64::from(k)
    };
    let per = i16::try_from(signed).ok().filter(|&p| p != 0)?;
    Some((
        count,
        Some(CountStep {
            level: u8::try_from(level).ok()?,
            per,
        }),
    ))
}

fn directive(
    h: &mut Header,
    line: usize,
    src: &str,
    start: usize,
    t: &str,
) -> Result<(), ParseError> {
    let mut it = t.split_whitespace();
    let name = it.next().unwrap_or("");
    let val = it.next();
    if it.next().is_some() {
        return Err(perr(line, src, start, format!("`{name}` takes one number")));
    }
    let num = || {
        val.and_then(parse_u32)
            .ok_or_else(|| perr(line, src, start, format!("`{name}` needs a decimal u32")))
    };
    let dup = |prev: usize| {
        perr(
            line,
            src,
            start,
            format!("duplicate `{name}` directive (first given on line {prev})"),
        )
    };
    match name {
        ".format" => {
            if let Some(prev) = h.format {
                return Err(dup(prev));
            }
            let v = num()?;
            if v != u32::from(LOOP_FORMAT_VERSION) {
                return Err(perr(
                    line,
                    src,
                    start,
                    format!("this is a format-3 reader; `.format {v}` is not 3"),
                ));
            }
            h.format = Some(line);
        }
        ".pe" | ".pes" | ".mem" => {
            let slot = match name {
                ".pe" => &mut h.pe,
                ".pes" => &mut h.pes,
                _ => &mut h.mem,
            };
            if let Some((_, prev)) = *slot {
                return Err(dup(prev));
            }
            *slot = Some((num()?, line));
        }
        _ => {
            return Err(perr(
                line,
                src,
                start,
                format!("unknown directive `{name}` (expected .format, .pe, .pes or .mem)"),
            ))
        }
    }
    Ok(())
}

fn complete(h: &Header, line: usize) -> Result<(), ParseError> {
    let missing = if h.format.is_none() {
        ".format"
    } else if h.pe.is_none() {
        ".pe"
    } else if h.pes.is_none() {
        ".pes"
    } else if h.mem.is_none() {
        ".mem"
    } else {
        return Ok(());
    };
    Err(ParseError {
        line,
        col: 1,
        message: format!("missing `{missing}` directive (required before the first bundle)"),
    })
}

/// An affine address found in a line: its byte span and meaning.
struct Affine {
    base: u32,
    terms: Vec<(u8, i32, u32)>,
}

/// Parses the bundle in `src[..end]`.
fn parse_lbundle(line: usize, src: &str, end: usize) -> Result<LBundle, ParseError> {
    let code = &src[..end];
    let mut flat = String::with_capacity(code.len());
    // Per address token in order of appearance: its affine terms (empty
    // for a plain `mN`).
    let mut addrs: Vec<Vec<(u8, i32, u32)>> = Vec::new();
    let mut preds: Vec<Pred> = Vec::new();
    let bytes = code.as_bytes();
    let mut slot = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let word_start = i == 0 || !bytes[i - 1].is_ascii_alphanumeric();
        if c == b'|' {
            slot += 1;
            flat.push('|');
            i += 1;
            continue;
        }
        if c == b'm' && word_start && bytes.get(i + 1) == Some(&b'[') {
            let close = code[i..]
                .find(']')
                .map(|k| i + k)
                .ok_or_else(|| perr(line, src, i, "affine address without a closing `]`"))?;
            let a = parse_affine(line, src, i + 2, close)?;
            let rep = format!("m{}", a.base);
            let width = code[i..=close].chars().count();
            flat.push_str(&rep);
            for _ in rep.len()..width {
                flat.push(' ');
            }
            addrs.push(a.terms);
            i = close + 1;
            continue;
        }
        if c == b'm' && word_start && bytes.get(i + 1).is_some_and(|d| d.is_ascii_digit()) {
            addrs.push(Vec::new());
        }
        if c == b'i'
            && word_start
            && bytes.get(i + 1) == Some(&b'f')
            && bytes.get(i + 2).is_none_or(|d| !d.is_ascii_alphanumeric())
        {
            let stop = code[i..].find('|').map_or(code.len(), |k| i + k);
            let Some(&s) = Slot::ALL.get(slot) else {
                return Err(perr(line, src, i, "predicate after the third slot"));
            };
            parse_preds(line, src, i + 2, stop, s, &mut preds)?;
            for ch in code[i..stop].chars() {
                let _ = ch;
                flat.push(' ');
            }
            i = stop;
            continue;
        }
        let ch = code[i..].chars().next().unwrap_or(' ');
        flat.push(ch);
        i += ch.len_utf8();
    }
    let bundle: Bundle = flat
        .parse()
        .map_err(|e: ParseError| ParseError { line, ..e })?;
    let fields: Vec<Field> = Field::ALL
        .into_iter()
        .filter(|&f| field(&bundle, f).is_some())
        .collect();
    if fields.len() != addrs.len() {
        return Err(perr(
            line,
            src,
            0,
            "could not match addresses to bundle fields",
        ));
    }
    let mut terms = Vec::new();
    for (f, ts) in fields.into_iter().zip(addrs) {
        for (level, stride, wrap) in ts {
            terms.push(Term {
                field: f,
                level,
                stride,
                wrap,
            });
        }
    }
    terms.sort_by_key(|t| (t.field, t.level));
    preds.sort();
    Ok(LBundle {
        bundle,
        terms,
        preds,
    })
}

/// Parses `B + S*iK - S*(iK % W) ...` in `src[from..to]`.
fn parse_affine(line: usize, src: &str, from: usize, to: usize) -> Result<Affine, ParseError> {
    let s = &src[from..to];
    let mut base: Option<u32> = None;
    let mut terms = Vec::new();
    let mut pos = 0usize;
    let mut sign = 1i64;
    let mut first = true;
    let err = |at: usize, m: String| perr(line, src, from + at, m);
    loop {
        let rest = &s[pos..];
        let trimmed = rest.trim_start();
        pos += rest.len() - trimmed.len();
        if !first {
            if trimmed.is_empty() {
                break;
            }
            match trimmed.as_bytes()[0] {
                b'+' => sign = 1,
                b'-' => sign = -1,
                _ => return Err(err(pos, "expected `+` or `-` between address terms".into())),
            }
            pos += 1;
            let rest = &s[pos..];
            pos += rest.len() - rest.trim_start().len();
        } else if trimmed.is_empty() {
            return Err(err(pos, "empty affine address".into()));
        }
        first = false;
        // A term: N | [N*] iK | [N*] (iK % W)
        let t = &s[pos..];
        let num_len = t.bytes().take_while(u8::is_ascii_digit).count();
        let mut coef: i64 = 1;
        let mut has_num = false;
        let mut p = pos;
        if num_len > 0 {
            coef = t[..num_len]
                .parse::<i64>()
                .ok()
                .filter(|v| *v <= i64::from(u32::MAX))
                .ok_or_else(|| err(pos, format!("number `{}` is too large", &t[..num_len])))?;
            has_num = true;
            p += num_len;
            let r = &s[p..];
            let rt = r.trim_start();
            if let Some(after) = rt.strip_prefix('*') {
                p += r.len() - after.len();
                let r2 = &s[p..];
                p += r2.len() - r2.trim_start().len();
            } else {
                // A constant.
                if sign < 0 {
                    return Err(err(pos, "the base address cannot be negative".into()));
                }
                if base.is_some() {
                    return Err(err(pos, "more than one constant in an address".into()));
                }
                base = Some(coef as u32);
                pos = p;
                continue;
            }
        }
        let _ = has_num;
        let t = &s[p..];
        let (level, wrap, used) = if let Some(inner) = t.strip_prefix('(') {
            let close = inner
                .find(')')
                .ok_or_else(|| err(p, "missing `)` in a wrapped term".into()))?;
            let body = &inner[..close];
            let (iv, w) = body
                .split_once('%')
                .ok_or_else(|| err(p, "expected `(iK % W)`".into()))?;
            let level = parse_index(iv.trim()).ok_or_else(|| {
                err(
                    p,
                    format!("bad loop index `{}` (expected i0..i7)", iv.trim()),
                )
            })?;
            let w =
                parse_u32(w.trim()).ok_or_else(|| err(p, format!("bad wrap `{}`", w.trim())))?;
            (level, w, close + 2)
        } else {
            let len = t.bytes().take_while(|b| b.is_ascii_alphanumeric()).count();
            let level = parse_index(&t[..len])
                .ok_or_else(|| err(p, format!("bad address term `{}`", &t[..len])))?;
            (level, 0, len)
        };
        let stride = sign * coef;
        let stride = i32::try_from(stride)
            .map_err(|_| err(pos, format!("stride {stride} does not fit in i32")))?;
        if terms.iter().any(|&(l, _, _)| l == level) {
            return Err(err(pos, format!("i{level} appears twice in one address")));
        }
        terms.push((level, stride, wrap));
        pos = p + used;
    }
    Ok(Affine {
        base: base.unwrap_or(0),
        terms,
    })
}

fn parse_index(s: &str) -> Option<u8> {
    let d = s.strip_prefix('i')?;
    let v = parse_u32(d)?;
    u8::try_from(v).ok()
}

/// Parses `iK OP V { && iK OP V }` in `src[from..to]`.
fn parse_preds(
    line: usize,
    src: &str,
    from: usize,
    to: usize,
    slot: Slot,
    out: &mut Vec<Pred>,
) -> Result<(), ParseError> {
    let s = &src[from..to];
    let mut off = 0;
    for part in s.split("&&") {
        let p = part.trim();
        let at = from + off + (part.len() - part.trim_start().len());
        off += part.len() + 2;
        let (cmp, k) = [
            ("==", Cmp::Eq),
            ("!=", Cmp::Ne),
            (">=", Cmp::Ge),
            ("<", Cmp::Lt),
        ]
        .into_iter()
        .find_map(|(sym, c)| p.find(sym).map(|k| ((c, sym.len()), k)))
        .map(|((c, l), k)| (c, (k, l)))
        .ok_or_else(|| {
            perr(
                line,
                src,
                at,
                "expected a predicate `iK == V`, `!=`, `<` or `>=`",
            )
        })?;
        let (k, l) = k;
        let level = parse_index(p[..k].trim())
            .ok_or_else(|| perr(line, src, at, format!("bad loop index `{}`", p[..k].trim())))?;
        let value = parse_u32(p[k + l..].trim()).ok_or_else(|| {
            perr(
                line,
                src,
                at,
                format!("bad predicate value `{}`", p[k + l..].trim()),
            )
        })?;
        let pr = Pred {
            slot,
            level,
            cmp,
            value,
        };
        if out.contains(&pr) {
            return Err(perr(line, src, at, "duplicate predicate"));
        }
        out.push(pr);
    }
    Ok(())
}
