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
//! | E0012 | `scale` that is not a positive, finite number. |
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

pub fn bad_scale(file: FileId, span: Span, text: &str, value: f64) -> Diagnostic<FileId> {
    let (why, note) = if value.is_nan() || value.is_infinite() {
        (
            "is not a finite number",
            "note: the literal is out of range for a 64-bit float",
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

/// Render as codespan-reporting does, without colour. Every label is taken
/// to refer to `source`, whatever its file id; spans are clamped into the
/// source and onto character boundaries so a mismatched source (such as a
/// lossy conversion) cannot make rendering fail.
pub fn render(name: &str, source: &str, diagnostics: &[Diagnostic<FileId>]) -> String {
    let file = SimpleFile::new(name, source);
    let config = Config::default();
    let mut out = String::new();
    for diag in diagnostics {
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
        if term::emit_to_string(&mut out, &config, &file, &single).is_err() {
            // Unreachable with clamped spans; still, never lose the message.
            let code = diag.code.as_deref().unwrap_or("");
            let _ = writeln!(out, "{:?}[{code}]: {}\n", diag.severity, diag.message);
        }
    }
    out
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
