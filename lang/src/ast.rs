//! Raw syntax tree, exactly as written: names are not yet resolved to
//! fields and literals are kept as text, so the checker can tell the user
//! what is wrong with a value in terms of what they typed.

use lalrpop_util::ParseError;

use crate::lexer::{LexError, Token};
use crate::Span;

/// A whole source file. Syntax errors recovered between layers sit next to
/// the layers as [`Item::Error`].
#[derive(Clone, Debug, PartialEq)]
pub struct File<'a> {
    pub items: Vec<Item<'a>>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Item<'a> {
    Layer(LayerAst<'a>),
    Error(SyntaxError),
}

/// `layer NAME { ... }`.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerAst<'a> {
    pub name: Ident<'a>,
    /// From `layer` to the closing `}` (or to the last thing that belongs
    /// to the block when the `}` is missing).
    pub span: Span,
    pub open_brace: Span,
    pub body: Vec<BodyItem<'a>>,
    pub close: Close,
}

/// How a block ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Close {
    Brace(Span),
    /// No `}` before the next `layer` or the end of the file; `at` is where
    /// it was expected (the end of the block's last token).
    Missing {
        at: usize,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub enum BodyItem<'a> {
    Field(FieldAst<'a>),
    Error(SyntaxError),
}

/// `NAME = VALUE;`
#[derive(Clone, Debug, PartialEq)]
pub struct FieldAst<'a> {
    pub name: Ident<'a>,
    pub value: Value<'a>,
    /// `None` when the `;` was left out; the grammar accepts that so the
    /// rest of the block still parses.
    pub semi: Option<Span>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Ident<'a> {
    pub text: &'a str,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Value<'a> {
    /// Written with a leading `-`. Allowed before any value by the grammar
    /// so that `mask = -causal` is one bad value rather than a syntax error
    /// followed by a misparse.
    pub negative: bool,
    pub kind: ValueKind<'a>,
    /// Includes the `-`.
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ValueKind<'a> {
    Ident(&'a str),
    /// Digits only; whether they fit is for the checker to say.
    Int(&'a str),
    Float(&'a str),
}

impl Value<'_> {
    /// How the value was written, for messages such as "found `-2.5`".
    pub fn source_text(&self) -> String {
        let (ValueKind::Ident(t) | ValueKind::Int(t) | ValueKind::Float(t)) = self.kind;
        format!("{}{t}", if self.negative { "-" } else { "" })
    }
}

/// A syntax error, independent of the parser generator's types.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyntaxError {
    pub span: Span,
    pub found: Found,
    /// Terminal names as lalrpop reports them (e.g. `"\";\""`, `"Ident"`).
    pub expected: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    Eof,
    /// Stray characters, already reported by the lexer.
    Stray,
    /// Human-readable description of the offending token.
    Token(String),
}

impl<'a> From<ParseError<usize, Token<'a>, LexError>> for SyntaxError {
    fn from(e: ParseError<usize, Token<'a>, LexError>) -> Self {
        match e {
            ParseError::UnrecognizedToken {
                token: (l, tok, r),
                expected,
            } => SyntaxError {
                span: l..r,
                found: describe_token(tok),
                expected,
            },
            ParseError::ExtraToken { token: (l, tok, r) } => SyntaxError {
                span: l..r,
                found: describe_token(tok),
                expected: Vec::new(),
            },
            ParseError::UnrecognizedEof { location, expected } => SyntaxError {
                span: location..location,
                found: Found::Eof,
                expected,
            },
            // Neither is produced by an external lexer that never yields
            // `Err`; kept total rather than trusting that.
            ParseError::InvalidToken { location } => SyntaxError {
                span: location..location,
                found: Found::Stray,
                expected: Vec::new(),
            },
            ParseError::User { error: LexError } => SyntaxError {
                span: 0..0,
                found: Found::Stray,
                expected: Vec::new(),
            },
        }
    }
}

fn describe_token(tok: Token<'_>) -> Found {
    Found::Token(match tok {
        Token::Layer => "keyword `layer`".to_string(),
        Token::LBrace => "`{`".to_string(),
        Token::RBrace => "`}`".to_string(),
        Token::Eq => "`=`".to_string(),
        Token::Semi => "`;`".to_string(),
        Token::Minus => "`-`".to_string(),
        Token::Ident(s) => format!("identifier `{s}`"),
        Token::Int(s) => format!("integer `{s}`"),
        Token::Float(s) => format!("number `{s}`"),
        Token::Error(_) => return Found::Stray,
        Token::Unclosed(true) => return Found::Eof,
        Token::Unclosed(false) => "keyword `layer`".to_string(),
    })
}
