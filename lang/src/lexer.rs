//! Tokens of the layer language, produced by a [`logos`] lexer.
//!
//! Characters the lexer does not recognise are not fatal: each run of them
//! becomes a single [`Token::Error`] that is both reported and passed on to
//! the parser, so parsing resynchronises exactly as it would after any other
//! unexpected token.
//!
//! The token stream also marks blocks that are never closed (see
//! [`Token::Unclosed`]): `layer` cannot occur inside a block, so `layer NAME`
//! or the end of the file while a block is open is a missing `}`. Marking it
//! here lets the grammar treat it as an ordinary alternative to `}`.

use logos::Logos;

use crate::Span;

/// One lexical token. Literals borrow their text so the checker can report
/// them exactly as written and decide about overflow itself.
#[derive(Logos, Clone, Copy, Debug, PartialEq, Eq)]
// U+FEFF is skipped as whitespace so a byte-order mark some editors write
// at the start of a file is not a stray character.
#[logos(skip r"[ \t\r\n\f\u{FEFF}]+")]
#[logos(skip(r"//[^\n]*", allow_greedy = true))]
pub enum Token<'a> {
    #[token("layer")]
    Layer,
    #[token("{")]
    LBrace,
    #[token("}")]
    RBrace,
    #[token("=")]
    Eq,
    #[token(";")]
    Semi,
    #[token("-")]
    Minus,
    #[regex("[A-Za-z_][A-Za-z0-9_]*", |lex| lex.slice())]
    Ident(&'a str),
    #[regex("[0-9]+", |lex| lex.slice())]
    Int(&'a str),
    #[regex(
        r"[0-9]+\.[0-9]*([eE][+-]?[0-9]+)?|\.[0-9]+([eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+",
        |lex| lex.slice()
    )]
    Float(&'a str),
    /// A run of characters that start no token. Never produced by the
    /// derived lexer itself; [`lex`] substitutes it for logos' `Err`.
    Error(&'a str),
    /// Zero-width stand-in for a `}` the source is missing, inserted by
    /// [`lex`] before the next `layer` (`false`) or the end of the file
    /// (`true`). Never produced by the derived lexer itself.
    Unclosed(bool),
}

/// Error type the parser is declared with. The token stream handed to the
/// parser never carries it, because stray characters travel as
/// [`Token::Error`] instead (an `Err` would abort lalrpop without recovery).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LexError;

/// `(start, token, end)` as lalrpop expects from an external lexer.
pub type Spanned<'a> = (usize, Token<'a>, usize);

/// Tokenise all of `source`. Also returns the span of every run of stray
/// characters, in order, so they can be reported once each.
pub fn lex(source: &str) -> (Vec<Spanned<'_>>, Vec<Span>) {
    let mut tokens: Vec<Spanned<'_>> = Vec::new();
    for (tok, span) in Token::lexer(source).spanned() {
        match (tok, tokens.last_mut()) {
            (Ok(t), _) => tokens.push((span.start, t, span.end)),
            // Adjacent stray characters read as one mistake, so they become
            // one token and one diagnostic.
            (Err(()), Some((start, Token::Error(run), end))) if *end == span.start => {
                *end = span.end;
                *run = source.get(*start..span.end).unwrap_or("");
            }
            (Err(()), _) => {
                let text = source.get(span.clone()).unwrap_or("");
                tokens.push((span.start, Token::Error(text), span.end));
            }
        }
    }
    let tokens = mark_unclosed_blocks(tokens);
    let stray = tokens
        .iter()
        .filter(|(_, t, _)| matches!(t, Token::Error(_)))
        .map(|&(start, _, end)| start..end)
        .collect();
    (tokens, stray)
}

/// Insert [`Token::Unclosed`] where a block opened by `layer NAME {` is still
/// open at the next `layer NAME` or at the end of the input. Only that exact
/// opening counts, so a stray `{` inside a block cannot unbalance anything.
fn mark_unclosed_blocks(tokens: Vec<Spanned<'_>>) -> Vec<Spanned<'_>> {
    let mut out: Vec<Spanned<'_>> = Vec::with_capacity(tokens.len() + 1);
    let mut in_block = false;
    let mut rest = tokens.into_iter().peekable();
    while let Some(tok) = rest.next() {
        match tok.1 {
            // Inside a block, `layer` followed by a name starts the next
            // block; any other `layer` there is read as a (unknown) field
            // name, which reports it far better than a keyword the parser
            // has to recover from.
            Token::Layer if in_block => {
                if matches!(rest.peek(), Some((_, Token::Ident(_), _))) {
                    let at = out.last().map_or(tok.0, |t| t.2);
                    out.push((at, Token::Unclosed(false), at));
                    in_block = false;
                } else {
                    out.push((tok.0, Token::Ident("layer"), tok.2));
                    continue;
                }
            }
            Token::LBrace
                if matches!(
                    out.as_slice(),
                    [.., (_, Token::Layer, _), (_, Token::Ident(_), _)]
                ) =>
            {
                in_block = true;
            }
            Token::RBrace => in_block = false,
            _ => {}
        }
        out.push(tok);
    }
    if in_block {
        let at = out.last().map_or(0, |t| t.2);
        out.push((at, Token::Unclosed(true), at));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(src: &str) -> Vec<Token<'_>> {
        lex(src).0.into_iter().map(|(_, t, _)| t).collect()
    }

    #[test]
    fn keywords_literals_and_comments() {
        assert_eq!(
            kinds("layer a { tokens = 16; // x\n scale = 0.25; s = 1e3; t = .5; u = 2.; }"),
            vec![
                Token::Layer,
                Token::Ident("a"),
                Token::LBrace,
                Token::Ident("tokens"),
                Token::Eq,
                Token::Int("16"),
                Token::Semi,
                Token::Ident("scale"),
                Token::Eq,
                Token::Float("0.25"),
                Token::Semi,
                Token::Ident("s"),
                Token::Eq,
                Token::Float("1e3"),
                Token::Semi,
                Token::Ident("t"),
                Token::Eq,
                Token::Float(".5"),
                Token::Semi,
                Token::Ident("u"),
                Token::Eq,
                Token::Float("2."),
                Token::Semi,
                Token::RBrace,
            ]
        );
    }

    #[test]
    fn layers_is_an_identifier_not_a_keyword() {
        assert_eq!(kinds("layers"), vec![Token::Ident("layers")]);
    }

    #[test]
    fn stray_runs_merge_and_respect_char_boundaries() {
        let (toks, stray) = lex("a @#é$ b ü");
        assert_eq!(stray, vec![2..7, 10..12]);
        assert_eq!(toks[1], (2, Token::Error("@#é$"), 7));
        assert_eq!(toks[3], (10, Token::Error("ü"), 12));
    }

    #[test]
    fn unclosed_blocks_are_marked_where_the_brace_belongs() {
        assert_eq!(
            kinds("layer a { x = 1; layer b { } layer c {"),
            vec![
                Token::Layer,
                Token::Ident("a"),
                Token::LBrace,
                Token::Ident("x"),
                Token::Eq,
                Token::Int("1"),
                Token::Semi,
                Token::Unclosed(false),
                Token::Layer,
                Token::Ident("b"),
                Token::LBrace,
                Token::RBrace,
                Token::Layer,
                Token::Ident("c"),
                Token::LBrace,
                Token::Unclosed(true),
            ]
        );
        assert_eq!(
            kinds("layer a { layer = 1; }"),
            vec![
                Token::Layer,
                Token::Ident("a"),
                Token::LBrace,
                Token::Ident("layer"),
                Token::Eq,
                Token::Int("1"),
                Token::Semi,
                Token::RBrace,
            ]
        );
        // A `{` that opens no block neither opens nor closes anything.
        assert_eq!(
            kinds("layer a { x = { ;").last(),
            Some(&Token::Unclosed(true))
        );
        let (toks, _) = lex("layer a { x = 1;\n");
        assert_eq!(toks.last(), Some(&(16, Token::Unclosed(true), 16)));
    }
}
