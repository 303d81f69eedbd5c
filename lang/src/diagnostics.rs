//! Diagnostic codes, the constructors that build each diagnostic, and
//! plain-text rendering.
//!
//! Every error carries a code. Codes are stable: tests and users may match on
//! them, so a retired code is never reused.
//!
//! | Code  | Meaning |
//! |-------|---------|
//! | E0001 | Syntax error: a token or the end of the file where the grammar expects something else. |
//! | E0002 | Stray characters that start no token (e.g. `$`, `#`, non-ASCII letters). |
//! | E0003 | Unknown field name in a layer block. |
//! | E0004 | The same field is set twice in one layer. |
//! | E0005 | A required field (`tokens` or `dim`) is missing. |
//! | E0006 | Wrong kind of value, e.g. a name where a number is needed or a fraction where an integer is needed. |
//! | E0007 | A name that is not one of the field's allowed choices (e.g. `mask = maybe`). |
//! | E0008 | A negative number for a size. |
//! | E0009 | An integer literal too large to represent (more than 64 bits). |
//! | E0010 | A size of zero. |
//! | E0011 | A size above its limit (tokens, dim ≤ 65536; heads ≤ 1024). |
//! | E0012 | `scale` that is not a positive number finite as a 32-bit float, or so large that exp(scale·√dim) overflows a 32-bit float. |
//! | E0013 | Two layers with the same name in one file. |
//! | E0014 | A file without any layer block. |
//! | E0015 | A missing `;` after a field's value. |
//! | E0016 | A layer block whose `{` is never closed by `}`. |
//! | E0017 | The input is not valid UTF-8 (e.g. a binary file). |

use std::fmt::Write as _;

use codespan_reporting::diagnostic::{Diagnostic, Label, Severity};
use codespan_reporting::files::SimpleFile;
use codespan_reporting::term::{self, Config};

use crate::ast::{Found, SyntaxError};
use crate::{Field, FileId, Span};

pub const SYNTAX: &str = "E0001";
pub const STRAY_CHARACTERS: &str = "E0002";
pub const UNKNOWN_FIELD: &str = "E0003";
pub const DUPLICATE_FIELD: &str = "E0004";
pub const MISSING_FIELD: &str = "E0005";
pub const WRONG_KIND: &str = "E0006";
pub const INVALID_CHOICE: &str = "E0007";
pub const NEGATIVE: &str = "E0008";
pub const INTEGER_TOO_LARGE: &str = "E0009";
pub const ZERO_SIZE: &str = "E0010";
pub const SIZE_LIMIT: &str = "E0011";
pub const BAD_SCALE: &str = "E0012";
pub const DUPLICATE_LAYER: &str = "E0013";
pub const NO_LAYERS: &str = "E0014";
pub const MISSING_SEMICOLON: &str = "E0015";
pub const UNCLOSED_BLOCK: &str = "E0016";
pub const INVALID_UTF8: &str = "E0017";

/// The example shown when a file has no layer or a layer lacks a field.
const EXAMPLE: &str = "layer head { tokens = 16; dim = 16; }";

fn error(code: &str, message: impl Into<String>) -> Diagnostic<FileId> {
    Diagnostic::error()
        .with_code(code)
        .with_message(message.into())
}

pub fn syntax(file: FileId, e: &SyntaxError) -> Diagnostic<FileId> {
    let found = match &e.found {
        Found::Eof => "end of file".to_string(),
        Found::Stray => "stray characters".to_string(),
        Found::Token(t) => t.clone(),
    };
    let expected = describe_expected(&e.expected);
    match expected {
        Some(expected) => {
            error(SYNTAX, format!("expected {expected}, found {found}"))
                .with_labels(vec![Label::primary(file, e.span.clone())
                    .with_message(format!("expected {expected}"))])
        }
        None => error(SYNTAX, format!("unexpected {found}")).with_labels(vec![Label::primary(
            file,
            e.span.clone(),
        )
        .with_message("unexpected")]),
    }
}

/// Turn lalrpop's terminal names into words. Some terminals are only
/// acceptable because of recovery productions (a field without `;`, the
/// lexer's `Unclosed` marker); they are left out when the real continuation
/// is also acceptable, since suggesting them would be misleading.
fn describe_expected(expected: &[String]) -> Option<String> {
    let has = |t: &str| expected.iter().any(|e| e == t);
    let mut words: Vec<String> = Vec::new();
    if has("\";\"") {
        words.push("`;`".into());
    } else if has("Integer") && has("Float") && has("Identifier") {
        words.push("a value (a number or a name)".into());
    } else if has("Integer") && has("Float") {
        words.push("a number".into());
    } else {
        for e in expected {
            let word = match e.as_str() {
                "Identifier" if has("\"}\"") => "a field name".to_string(),
                "Identifier" => "a name".to_string(),
                "Integer" => "an integer".to_string(),
                "Float" => "a number".to_string(),
                "Unclosed" | "Stray" => continue,
                quoted => format!("`{}`", quoted.trim_matches('"')),
            };
            words.push(word);
        }
    }
    match words.as_slice() {
        [] => None,
        [one] => Some(one.clone()),
        [init @ .., last] => Some(format!("{} or {last}", init.join(", "))),
    }
}

pub fn stray_characters(file: FileId, span: Span, text: &str) -> Diagnostic<FileId> {
    let (what, this) = if text.chars().nth(1).is_some() {
        ("characters", "these are")
    } else {
        ("character", "this is")
    };
    // Habits from other configuration formats get a targeted hint.
    let note = match text {
        ":" => "help: set a field with `=`, e.g. `tokens = 16;`",
        "," => "help: end each field with `;`",
        "\"" | "'" => "help: values are written without quotes, e.g. `mask = causal;`",
        "#" => "help: comments start with `//`",
        _ => "note: the language has names, numbers, `=`, `;`, `{`, `}`, `-` and `//` comments",
    };
    error(STRAY_CHARACTERS, format!("unexpected {what} `{text}`"))
        .with_labels(vec![
            Label::primary(file, span).with_message(format!("{this} not part of the language"))
        ])
        .with_notes(vec![note.to_string()])
}

pub fn unknown_field(
    file: FileId,
    span: Span,
    name: &str,
    suggestion: Option<Field>,
) -> Diagnostic<FileId> {
    let known = Field::ALL.map(|f| format!("`{f}`")).join(", ");
    let note = match suggestion {
        Some(f) => format!("help: did you mean `{f}`?"),
        None => format!("note: the known fields are {known}"),
    };
    error(UNKNOWN_FIELD, format!("unknown field `{name}`"))
        .with_labels(vec![
            Label::primary(file, span).with_message("unknown field")
        ])
        .with_notes(vec![note])
}

pub fn duplicate_field(file: FileId, field: Field, first: Span, again: Span) -> Diagnostic<FileId> {
    error(DUPLICATE_FIELD, format!("field `{field}` is set twice"))
        .with_labels(vec![
            Label::primary(file, again).with_message("set again here"),
            Label::secondary(file, first).with_message("first set here"),
        ])
        .with_notes(vec!["help: remove one of the two".into()])
}

pub fn missing_field(
    file: FileId,
    layer: &str,
    name_span: Span,
    field: Field,
) -> Diagnostic<FileId> {
    let what = match field {
        Field::Tokens => "the number of tokens, n",
        _ => "the size of each head, d",
    };
    error(
        MISSING_FIELD,
        format!("layer `{layer}` is missing the required field `{field}`"),
    )
    .with_labels(vec![
        Label::primary(file, name_span).with_message(format!("`{field}` is never set"))
    ])
    .with_notes(vec![format!(
        "help: add `{field} = <integer>;` ({what}) to the block"
    )])
}

/// What a field accepts, for messages and labels.
pub fn accepted(field: Field) -> &'static str {
    match field {
        Field::Tokens | Field::Dim | Field::Heads => "a positive integer",
        Field::Qkv => "`shared` or `separate`",
        Field::Mask => "`causal` or `none`",
        Field::Scale => "a positive number",
        Field::Softmax => "`safe` or `plain`",
    }
}

/// `found` describes the value, e.g. "identifier `shared`".
pub fn wrong_kind(file: FileId, field: Field, span: Span, found: &str) -> Diagnostic<FileId> {
    let example = match field {
        Field::Tokens | Field::Dim => "16",
        Field::Heads => "2",
        Field::Qkv => "shared",
        Field::Mask => "causal",
        Field::Scale => "0.25",
        Field::Softmax => "plain",
    };
    error(
        WRONG_KIND,
        format!("expected {} for `{field}`, found {found}", accepted(field)),
    )
    .with_labels(vec![
        Label::primary(file, span).with_message(format!("expected {}", accepted(field)))
    ])
    .with_notes(vec![format!("help: for example `{field} = {example};`")])
}

pub fn invalid_choice(
    file: FileId,
    field: Field,
    span: Span,
    found: &str,
    suggestion: Option<&str>,
) -> Diagnostic<FileId> {
    let mut diag = error(
        INVALID_CHOICE,
        format!("`{found}` is not a valid value for `{field}`"),
    )
    .with_labels(vec![
        Label::primary(file, span).with_message(format!("expected {}", accepted(field)))
    ]);
    if let Some(s) = suggestion {
        diag = diag.with_notes(vec![format!("help: did you mean `{s}`?")]);
    }
    diag
}

pub fn negative(file: FileId, field: Field, span: Span) -> Diagnostic<FileId> {
    error(NEGATIVE, format!("`{field}` cannot be negative"))
        .with_labels(vec![
            Label::primary(file, span).with_message(format!("expected {}", accepted(field)))
        ])
        .with_notes(vec!["help: remove the `-`".into()])
}

pub fn integer_too_large(file: FileId, field: Field, span: Span, limit: u64) -> Diagnostic<FileId> {
    error(
        INTEGER_TOO_LARGE,
        format!("integer for `{field}` is too large"),
    )
    .with_labels(vec![
        Label::primary(file, span).with_message("does not fit in 64 bits")
    ])
    .with_notes(vec![format!("note: `{field}` can be at most {limit}")])
}

pub fn zero_size(file: FileId, field: Field, span: Span) -> Diagnostic<FileId> {
    error(ZERO_SIZE, format!("`{field}` must be at least 1"))
        .with_labels(vec![Label::primary(file, span).with_message("zero")])
        .with_notes(vec![match field {
            Field::Heads => "help: omit `heads` for a single head".to_string(),
            _ => format!("help: a layer needs at least one {}", singular(field)),
        }])
}

fn singular(field: Field) -> &'static str {
    match field {
        Field::Tokens => "token",
        Field::Dim => "dimension",
        _ => "head",
    }
}

pub fn size_limit(
    file: FileId,
    field: Field,
    span: Span,
    value: u64,
    limit: u64,
) -> Diagnostic<FileId> {
    error(
        SIZE_LIMIT,
        format!("`{field}` is {value}, above the limit of {limit}"),
    )
    .with_labels(vec![
        Label::primary(file, span).with_message(format!("must be at most {limit}"))
    ])
}

/// A scale so large that exp(scale·score) overflows f32 for typical scores.
pub fn scale_overflows(file: FileId, span: Span, scale: f64, dim: u32) -> Diagnostic<FileId> {
    error(
        BAD_SCALE,
        format!("`scale` {scale} makes exp overflow for typical scores"),
    )
    .with_labels(vec![Label::primary(file, span).with_message(format!(
        "scale·√dim = {:.4e}, more than {}",
        scale * f64::from(dim).sqrt(),
        crate::check::MAX_SCALED_SCORE
    ))])
    .with_notes(vec![
        format!("note: with unit-variance inputs a score q·k has standard deviation √dim = {:.3}, and exp(scale·score) overflows a 32-bit float beyond 88.7", f64::from(dim).sqrt()),
        "help: omit `scale` to use the default 1/sqrt(dim)".into(),
    ])
}

pub fn bad_scale(file: FileId, span: Span, text: &str, value: f64) -> Diagnostic<FileId> {
    let (why, note) = if value.is_nan() || value.is_infinite() {
        (
            "is not a finite number",
            "note: the literal is out of range for a 64-bit float",
        )
    } else if value > 0.0 && (value as f32).is_infinite() {
        (
            "is not a finite 32-bit float",
            "note: the microcode stores the scale as a 32-bit float, whose largest value is about 3.4e38",
        )
    } else if value > 0.0 && value as f32 == 0.0 {
        (
            "rounds to zero as a 32-bit float",
            "note: the microcode stores the scale as a 32-bit float, whose smallest positive value is about 1.4e-45",
        )
    } else if value == 0.0 && text.bytes().any(|b| (b'1'..=b'9').contains(&b)) {
        (
            "rounds to zero",
            "note: the literal is below the smallest 64-bit float",
        )
    } else if value > 0.0 {
        // Not produced by the checker; kept so the function is total.
        ("is invalid", "")
    } else {
        ("must be positive", "")
    };
    error(BAD_SCALE, format!("`scale` {why}, found `{text}`"))
        .with_labels(vec![
            Label::primary(file, span).with_message("expected a positive, finite number")
        ])
        .with_notes(
            [note, "help: omit `scale` to use the default 1/sqrt(dim)"]
                .into_iter()
                .filter(|n| !n.is_empty())
                .map(String::from)
                .collect(),
        )
}

pub fn duplicate_layer(file: FileId, name: &str, first: Span, again: Span) -> Diagnostic<FileId> {
    error(DUPLICATE_LAYER, format!("layer `{name}` is defined twice"))
        .with_labels(vec![
            Label::primary(file, again).with_message("defined again here"),
            Label::secondary(file, first).with_message("first defined here"),
        ])
        .with_notes(vec!["help: rename one of them".into()])
}

pub fn no_layers(file: FileId) -> Diagnostic<FileId> {
    error(NO_LAYERS, "no layer in this file")
        .with_labels(vec![
            Label::primary(file, 0..0).with_message("expected a `layer` block")
        ])
        .with_notes(vec![format!(
            "help: a file holds one or more blocks like `{EXAMPLE}`"
        )])
}

pub fn missing_semicolon(file: FileId, field: &str, value: Span) -> Diagnostic<FileId> {
    error(
        MISSING_SEMICOLON,
        format!("missing `;` after the value of `{field}`"),
    )
    .with_labels(vec![
        Label::primary(file, value.end..value.end).with_message("expected `;` here")
    ])
}

pub fn unclosed_block(file: FileId, layer: &str, open: Span, at: usize) -> Diagnostic<FileId> {
    error(
        UNCLOSED_BLOCK,
        format!("layer `{layer}` is missing its closing `}}`"),
    )
    .with_labels(vec![
        Label::primary(file, open).with_message("this `{` is never closed"),
        Label::secondary(file, at..at).with_message("expected `}` here"),
    ])
}

/// `offset` is where the first invalid byte sits in the raw input; the label
/// points at the replacement character a lossy conversion puts there (the
/// prefix before it is unchanged by the conversion).
pub fn invalid_utf8(file: FileId, offset: usize, byte: Option<u8>) -> Diagnostic<FileId> {
    let what = match byte {
        Some(b) => format!("invalid byte 0x{b:02x}"),
        None => "truncated character".to_string(),
    };
    error(
        INVALID_UTF8,
        format!("input is not valid UTF-8: {what} at byte offset {offset}"),
    )
    .with_labels(vec![Label::primary(
        file,
        offset..offset + '\u{FFFD}'.len_utf8(),
    )
    .with_message("not UTF-8 text")])
    .with_notes(vec![
        "help: layer files are UTF-8 text; is this a binary file?".into(),
    ])
}

/// Whether any diagnostic is an error (or worse).
pub fn has_errors(diags: &[Diagnostic<FileId>]) -> bool {
    diags.iter().any(|d| d.severity >= Severity::Error)
}

/// At most this many diagnostics are rendered; the rest are counted in one closing line, so a
/// file of garbage cannot produce an unbounded amount of text.
pub const MAX_RENDERED: usize = 50;

/// Lines longer than this (in bytes) are shown only around the labels, with `…` marking what is
/// left out.
const LONG_LINE: usize = 240;
/// Bytes kept on each side of a label on a long line.
const CONTEXT: usize = 80;

/// Render as codespan-reporting does, without colour. Every label is taken
/// to refer to `source`, whatever its file id; spans are clamped into the
/// source and onto character boundaries so a mismatched source (such as a
/// lossy conversion) cannot make rendering fail. Only the first
/// [`MAX_RENDERED`] diagnostics are rendered, and long lines only around the
/// labels, so the text is bounded whatever the input.
pub fn render(name: &str, source: &str, diagnostics: &[Diagnostic<FileId>]) -> String {
    let file = SimpleFile::new(name, source);
    let config = Config::default();
    let mut out = String::new();
    let mut line_starts: Option<Vec<usize>> = None;
    for diag in diagnostics.iter().take(MAX_RENDERED) {
        let single: Diagnostic<()> = Diagnostic {
            severity: diag.severity,
            code: diag.code.clone(),
            message: diag.message.clone(),
            labels: diag
                .labels
                .iter()
                .map(|l| Label {
                    style: l.style,
                    file_id: (),
                    range: clamp(source, &l.range),
                    message: l.message.clone(),
                })
                .collect(),
            notes: diag.notes.clone(),
        };
        let starts = line_starts.get_or_insert_with(|| {
            codespan_reporting::files::line_starts(source).collect::<Vec<_>>()
        });
        let emitted = match Window::around(name, source, starts, &single) {
            None => term::emit_to_string(&mut out, &config, &file, &single),
            Some((window, windowed)) => term::emit_to_string(&mut out, &config, &window, &windowed),
        };
        if emitted.is_err() {
            // Unreachable with clamped spans; still, never lose the message.
            let code = diag.code.as_deref().unwrap_or("");
            let _ = writeln!(out, "{:?}[{code}]: {}\n", diag.severity, diag.message);
        }
    }
    if diagnostics.len() > MAX_RENDERED {
        let _ = writeln!(
            out,
            "note: {} more diagnostics not shown (only the first {MAX_RENDERED} are rendered)",
            diagnostics.len() - MAX_RENDERED
        );
    }
    out
}

/// The lines a diagnostic's labels touch, each cut down to the neighbourhood of its labels,
/// presented to codespan-reporting with their real line and column numbers.
struct Window {
    name: String,
    text: String,
    /// Byte offset in `text` of each shown line.
    starts: Vec<usize>,
    /// Real (0-based) line index of each shown line.
    lines: Vec<usize>,
    /// Characters of the real line hidden before each shown line's first character.
    skipped_chars: Vec<usize>,
}

impl Window {
    /// `None` when every touched line is short: then the whole source renders as it is.
    fn around(
        name: &str,
        source: &str,
        starts: &[usize],
        diag: &Diagnostic<()>,
    ) -> Option<(Window, Diagnostic<()>)> {
        let line_of = |b: usize| starts.partition_point(|&s| s <= b).saturating_sub(1);
        let line_end = |l: usize| {
            let end = starts.get(l + 1).copied().unwrap_or(source.len());
            let text = &source[starts[l]..end];
            starts[l] + text.trim_end_matches(['\n', '\r']).len()
        };
        let mut touched: Vec<usize> = diag
            .labels
            .iter()
            .flat_map(|l| {
                [
                    line_of(l.range.start),
                    line_of(l.range.end.max(l.range.start)),
                ]
            })
            .collect();
        touched.sort_unstable();
        touched.dedup();
        if touched
            .iter()
            .all(|&l| line_end(l) - starts[l] <= LONG_LINE)
        {
            return None;
        }
        let mut w = Window {
            name: name.to_string(),
            text: String::new(),
            starts: Vec::new(),
            lines: Vec::new(),
            skipped_chars: Vec::new(),
        };
        // Per shown line: real window [from, to) and where it starts in `text`, for mapping.
        let mut spans: Vec<(usize, usize, usize, usize)> = Vec::new();
        for &l in &touched {
            let (ls, le) = (starts[l], line_end(l));
            let marks = diag
                .labels
                .iter()
                .flat_map(|lab| [lab.range.start, lab.range.end]);
            let on_line: Vec<usize> = marks.filter(|&b| b >= ls && b <= le).collect();
            let lo = on_line.iter().copied().min().unwrap_or(ls);
            let hi = on_line.iter().copied().max().unwrap_or(ls);
            let hi = hi.min(lo + 2 * CONTEXT);
            let mut from = lo.saturating_sub(CONTEXT).max(ls);
            let mut to = (hi + CONTEXT).min(le);
            while !source.is_char_boundary(from) {
                from -= 1;
            }
            while !source.is_char_boundary(to) {
                to += 1;
            }
            let start = w.text.len();
            let mut skipped = source[ls..from].chars().count();
            if from > ls {
                w.text.push('…');
                skipped -= 1;
            }
            let body = w.text.len();
            w.text.push_str(&source[from..to]);
            if to < le {
                w.text.push('…');
            }
            w.text.push('\n');
            w.starts.push(start);
            w.lines.push(l);
            w.skipped_chars.push(skipped);
            spans.push((ls, from, to, body));
        }
        let map = |b: usize| {
            let i = touched
                .partition_point(|&l| starts[l] <= b)
                .saturating_sub(1);
            let (_, from, to, body) = spans[i];
            body + b.clamp(from, to) - from
        };
        let mut windowed = diag.clone();
        for lab in &mut windowed.labels {
            let (s, e) = (
                map(lab.range.start),
                map(lab.range.end.max(lab.range.start)),
            );
            lab.range = s..e;
        }
        Some((w, windowed))
    }
}

impl<'a> codespan_reporting::files::Files<'a> for Window {
    type FileId = ();
    type Name = &'a str;
    type Source = &'a str;

    fn name(&'a self, (): ()) -> Result<&'a str, codespan_reporting::files::Error> {
        Ok(&self.name)
    }
    fn source(&'a self, (): ()) -> Result<&'a str, codespan_reporting::files::Error> {
        Ok(&self.text)
    }
    fn line_index(
        &'a self,
        (): (),
        byte: usize,
    ) -> Result<usize, codespan_reporting::files::Error> {
        Ok(self
            .starts
            .partition_point(|&s| s <= byte)
            .saturating_sub(1))
    }
    fn line_range(
        &'a self,
        (): (),
        line: usize,
    ) -> Result<std::ops::Range<usize>, codespan_reporting::files::Error> {
        let start =
            *self
                .starts
                .get(line)
                .ok_or(codespan_reporting::files::Error::LineTooLarge {
                    given: line,
                    max: self.starts.len().saturating_sub(1),
                })?;
        let end = self
            .starts
            .get(line + 1)
            .copied()
            .unwrap_or(self.text.len());
        Ok(start..end)
    }
    fn line_number(
        &'a self,
        (): (),
        line: usize,
    ) -> Result<usize, codespan_reporting::files::Error> {
        Ok(self.lines.get(line).map_or(line, |&l| l) + 1)
    }
    fn column_number(
        &'a self,
        (): (),
        line: usize,
        byte: usize,
    ) -> Result<usize, codespan_reporting::files::Error> {
        let range = self.line_range((), line)?;
        let col = codespan_reporting::files::column_index(&self.text, range, byte);
        Ok(self.skipped_chars.get(line).copied().unwrap_or(0) + col + 1)
    }
}

fn clamp(source: &str, range: &Span) -> Span {
    let len = source.len();
    let mut start = range.start.min(len);
    while !source.is_char_boundary(start) {
        start -= 1;
    }
    if range.end <= range.start {
        return start..start;
    }
    let mut end = range.end.min(len);
    while !source.is_char_boundary(end) {
        end += 1;
    }
    start..end
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_cut_around_the_label_with_real_positions() {
        // Line 2 is 10000 bytes long; the label sits at byte 6000 of it.
        let line = format!("{}@{}", "é".repeat(3000), " ".repeat(3999));
        let source = format!("first\n{line}\nlast\n");
        let at = 6 + 6000;
        let d = error(STRAY_CHARACTERS, "stray")
            .with_labels(vec![Label::primary(0, at..at + 1).with_message("here")]);
        let out = render("f", &source, &[d]);
        // Column counts characters: 3000 `é` come before the `@`.
        assert!(out.contains("f:2:3001"), "{out}");
        assert!(out.contains("2 │ …éé"), "{out}");
        assert!(out.contains("@     "), "{out}");
        assert!(out.len() < 1000, "{} bytes:\n{out}", out.len());
    }

    #[test]
    fn only_the_first_diagnostics_are_rendered() {
        let source = "@".repeat(200);
        let diags: Vec<_> = (0..200)
            .map(|i| {
                error(STRAY_CHARACTERS, "stray").with_labels(vec![Label::primary(0, i..i + 1)])
            })
            .collect();
        let out = render("f", &source, &diags);
        assert_eq!(out.matches("error[E0002]").count(), MAX_RENDERED);
        assert!(out
            .ends_with("note: 150 more diagnostics not shown (only the first 50 are rendered)\n"));
    }

    #[test]
    fn clamp_keeps_spans_inside_and_on_char_boundaries() {
        let s = "aé b";
        assert_eq!(clamp(s, &(2..2)), 1..1);
        assert_eq!(clamp(s, &(0..2)), 0..3);
        assert_eq!(clamp(s, &(7..9)), 5..5);
        // A label may arrive reversed; it must come out empty, not inverted.
        assert_eq!(clamp(s, &Span { start: 4, end: 1 }), 4..4);
    }

    #[test]
    fn expected_tokens_in_words() {
        let e =
            |v: &[&str]| describe_expected(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            e(&["\";\"", "\"}\"", "Identifier", "Unclosed"]).unwrap(),
            "`;`"
        );
        assert_eq!(
            e(&["\"}\"", "Identifier", "Unclosed"]).unwrap(),
            "`}` or a field name"
        );
        assert_eq!(
            e(&["\"-\"", "Identifier", "Integer", "Float"]).unwrap(),
            "a value (a number or a name)"
        );
        assert_eq!(e(&["\"layer\""]).unwrap(), "`layer`");
        assert_eq!(e(&[]), None);
    }
}
