//! The attnc layer-description language.
//!
//! A source file holds one or more blocks such as
//!
//! ```text
//! layer gpt_head {
//!     tokens = 16;        // n
//!     dim    = 16;        // d, per head
//!     heads  = 2;         // optional, default 1
//!     qkv    = shared;    // shared | separate (default)
//!     mask   = causal;    // causal | none (default)
//!     scale  = 0.25;      // optional, default 1/sqrt(dim)
//!     softmax = safe;     // safe (default) | plain
//! }
//! ```
//!
//! # Pipeline
//!
//! 1. [`lexer`] turns the text into tokens with byte spans. Unknown
//!    characters become error tokens instead of stopping the lexer, and a
//!    block that is never closed gets a marker token where its `}` belongs.
//! 2. The lalrpop grammar (`grammar.lalrpop`) builds an [`ast`], recovering
//!    from syntax errors at `;`, field and block boundaries so that later
//!    problems are still found. Recovered errors are kept in the tree.
//! 3. [`check`] resolves fields and values into [`Layer`]s and reports every
//!    semantic problem: unknown, duplicate or missing fields, values of the
//!    wrong kind or out of range, duplicate layer names.
//! 4. [`diagnostics`] builds the codespan-reporting diagnostics (each with a
//!    code, listed there) and renders them as plain text.
//!
//! Nothing here panics on any input: the lexer accepts every string,
//! [`parse_bytes`] accepts every byte sequence, and [`render`] accepts
//! diagnostics whose spans do not match the source.

pub mod ast;
pub mod check;
pub mod diagnostics;
pub mod lexer;

lalrpop_util::lalrpop_mod!(
    #[allow(clippy::all, clippy::pedantic, unused_qualifications)]
    grammar
);

use std::fmt;

pub use codespan_reporting::diagnostic::{Diagnostic, Label};
pub use diagnostics::{has_errors, render};

/// Identifies the source a diagnostic refers to. [`render`] takes one source
/// and treats every label as pointing into it; by convention it is 0.
pub type FileId = usize;

/// Byte range in the source.
pub type Span = std::ops::Range<usize>;

/// Whether queries, keys and values come from one projection or three.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Qkv {
    Separate,
    Shared,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mask {
    None,
    Causal,
}

/// How the row softmax is formed. Both are the same function over the reals; they differ in
/// which f32 inputs they survive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Softmax {
    /// `exp(s·(w' − max_row w'))`: every exponent is at most 0, so no finite input overflows.
    #[default]
    Safe,
    /// `exp(s·w')` as in the paper: one operation fewer per score, overflows once `s·w'` passes
    /// about 88.7 in f32.
    Plain,
}

impl Softmax {
    pub fn name(self) -> &'static str {
        match self {
            Softmax::Safe => "safe",
            Softmax::Plain => "plain",
        }
    }
}

/// The fields a layer block may set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    Tokens,
    Dim,
    Heads,
    Qkv,
    Mask,
    Scale,
    Softmax,
}

impl Field {
    pub const ALL: [Field; 7] = [
        Field::Tokens,
        Field::Dim,
        Field::Heads,
        Field::Qkv,
        Field::Mask,
        Field::Scale,
        Field::Softmax,
    ];

    /// The name as written in source.
    pub fn name(self) -> &'static str {
        match self {
            Field::Tokens => "tokens",
            Field::Dim => "dim",
            Field::Heads => "heads",
            Field::Qkv => "qkv",
            Field::Mask => "mask",
            Field::Scale => "scale",
            Field::Softmax => "softmax",
        }
    }

    pub fn from_name(name: &str) -> Option<Field> {
        Field::ALL.into_iter().find(|f| f.name() == name)
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A checked layer with every field resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct Layer {
    pub name: String,
    pub name_span: Span,
    /// The whole block, from `layer` to `}`.
    pub span: Span,
    pub tokens: u32,
    pub dim: u32,
    pub heads: u32,
    pub qkv: Qkv,
    pub mask: Mask,
    /// The given value, or 1/sqrt(dim) by default.
    pub scale: f64,
    pub scale_given: bool,
    pub softmax: Softmax,
    /// Span of each written field's value (including a leading `-`), in
    /// source order, so later stages can point diagnostics at it.
    pub field_spans: Vec<(Field, Span)>,
}

impl Layer {
    /// Where `f`'s value is written, or the layer name when it was left to
    /// its default.
    pub fn field_span(&self, f: Field) -> Span {
        self.field_spans
            .iter()
            .find(|(field, _)| *field == f)
            .map_or_else(|| self.name_span.clone(), |(_, span)| span.clone())
    }
}

/// The outcome of parsing one source.
#[derive(Debug)]
pub struct Parsed {
    pub layers: Vec<Layer>,
    pub diagnostics: Vec<Diagnostic<FileId>>,
}

/// Parse and check one source; returns every layer that passed checks, plus
/// all diagnostics found (syntax and semantic), in source order.
pub fn parse(file: FileId, source: &str) -> Parsed {
    let (tokens, stray) = lexer::lex(source);
    let parsed = grammar::FileParser::new().parse(tokens.into_iter().map(Ok));
    let ast = match parsed {
        Ok(ast) => ast,
        // The top level recovers at any token and at the end of input, so
        // this is not expected; if it happens the error is still reported.
        Err(e) => ast::File {
            items: vec![ast::Item::Error(e.into())],
        },
    };
    let (layers, diagnostics) = check::check(file, source, &ast, &stray);
    Parsed {
        layers,
        diagnostics,
    }
}

/// Like [`parse`], from raw bytes. Input that is not UTF-8 gives a single
/// diagnostic naming the offset of the first bad byte; its label is placed
/// for rendering against `String::from_utf8_lossy(bytes)`.
pub fn parse_bytes(file: FileId, bytes: &[u8]) -> Parsed {
    match std::str::from_utf8(bytes) {
        Ok(source) => parse(file, source),
        Err(e) => {
            let offset = e.valid_up_to();
            let byte = match e.error_len() {
                Some(_) => bytes.get(offset).copied(),
                None => None,
            };
            Parsed {
                layers: Vec::new(),
                diagnostics: vec![diagnostics::invalid_utf8(file, offset, byte)],
            }
        }
    }
}
