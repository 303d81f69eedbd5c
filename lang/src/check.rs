//! Semantic checks: turn the raw syntax tree into [`Layer`]s, reporting every
//! problem found rather than stopping at the first.
//!
//! A layer is returned only when nothing at all was reported inside it, so a
//! caller that ignores diagnostics still never sees a half-valid layer.

use std::collections::HashMap;

use crate::ast::{BodyItem, Close, File, Found, Item, LayerAst, SyntaxError, Value, ValueKind};
use crate::diagnostics as diag;
use crate::{Diagnostic, Field, FileId, Layer, Mask, Qkv, Softmax, Span};

/// Upper bounds on sizes. They are far beyond anything the target can run
/// but keep arithmetic on sizes (products, buffer lengths) well inside `u64`
/// and reject obvious typos such as an extra digit or two.
pub const MAX_TOKENS: u64 = 65536;
pub const MAX_DIM: u64 = 65536;
pub const MAX_HEADS: u64 = 1024;

/// Check a parsed file. `stray` are the lexer's runs of unrecognised
/// characters, reported here so that all diagnostics come from one place.
pub fn check(
    file: FileId,
    source: &str,
    ast: &File<'_>,
    stray: &[Span],
) -> (Vec<Layer>, Vec<Diagnostic<FileId>>) {
    let mut cx = Checker {
        file,
        diags: Vec::new(),
    };
    for span in stray {
        let text = source.get(span.clone()).unwrap_or("");
        cx.diags
            .push(diag::stray_characters(file, span.clone(), text));
    }

    let mut layers = Vec::new();
    let mut names: HashMap<&str, Span> = HashMap::new();
    let mut saw_layer = false;
    for item in &ast.items {
        match item {
            Item::Error(e) => cx.syntax(e),
            Item::Layer(l) => {
                saw_layer = true;
                let before = cx.diags.len();
                let layer = cx.layer(l);
                if let Some(first) = names.get(l.name.text) {
                    cx.diags.push(diag::duplicate_layer(
                        file,
                        l.name.text,
                        first.clone(),
                        l.name.span.clone(),
                    ));
                } else {
                    names.insert(l.name.text, l.name.span.clone());
                }
                if let Some(layer) = layer.filter(|_| cx.diags.len() == before) {
                    layers.push(layer);
                }
            }
        }
    }
    // Only when nothing else was said: after a syntax error the file may well
    // hold a layer the parser could not make sense of.
    if !saw_layer && cx.diags.is_empty() {
        cx.diags.push(diag::no_layers(file));
    }

    let mut diags = cx.diags;
    diags.sort_by_key(|d| d.labels.first().map_or(0, |l| l.range.start));
    (layers, diags)
}

struct Checker {
    file: FileId,
    diags: Vec<Diagnostic<FileId>>,
}

/// Field values as resolved so far; `None` until a valid value is seen.
#[derive(Default)]
struct Values {
    tokens: Option<u32>,
    dim: Option<u32>,
    heads: Option<u32>,
    qkv: Option<Qkv>,
    mask: Option<Mask>,
    scale: Option<f64>,
    softmax: Option<Softmax>,
}

impl Checker {
    fn syntax(&mut self, e: &SyntaxError) {
        // The lexer has already reported these characters.
        if e.found != Found::Stray {
            self.diags.push(diag::syntax(self.file, e));
        }
    }

    /// `None` when a required field is missing or unusable, or when syntax
    /// errors inside the block may have swallowed part of it.
    fn layer(&mut self, l: &LayerAst<'_>) -> Option<Layer> {
        let file = self.file;
        let mut written: HashMap<Field, Span> = HashMap::new();
        let mut values = Values::default();
        let mut field_spans = Vec::new();
        let mut lost_fields = false;
        // Fields offered as corrections of unknown names; they need no
        // separate "missing" error.
        let mut suggested: Vec<Field> = Vec::new();

        for (i, item) in l.body.iter().enumerate() {
            let f = match item {
                BodyItem::Error(e) => {
                    lost_fields = true;
                    self.syntax(e);
                    continue;
                }
                BodyItem::Field(f) => f,
            };
            // When the token after the value is not one a field can end at,
            // the syntax error there already says that `;` was expected.
            let reported_next = matches!(
                l.body.get(i + 1),
                Some(BodyItem::Error(e)) if e.expected.iter().any(|t| t == "\";\"")
            );
            if f.semi.is_none() && !reported_next {
                self.diags.push(diag::missing_semicolon(
                    file,
                    f.name.text,
                    f.value.span.clone(),
                ));
            }
            let Some(field) = Field::from_name(f.name.text) else {
                let suggestion =
                    closest(f.name.text, &Field::ALL.map(Field::name)).and_then(Field::from_name);
                suggested.extend(suggestion);
                self.diags.push(diag::unknown_field(
                    file,
                    f.name.span.clone(),
                    f.name.text,
                    suggestion,
                ));
                continue;
            };
            if let Some(first) = written.get(&field) {
                self.diags.push(diag::duplicate_field(
                    file,
                    field,
                    first.clone(),
                    f.name.span.clone(),
                ));
                continue;
            }
            written.insert(field, f.name.span.clone());
            let v = &f.value;
            let ok = match field {
                Field::Tokens => set(&mut values.tokens, self.size(field, v, MAX_TOKENS)),
                Field::Dim => set(&mut values.dim, self.size(field, v, MAX_DIM)),
                Field::Heads => set(&mut values.heads, self.size(field, v, MAX_HEADS)),
                Field::Qkv => set(
                    &mut values.qkv,
                    self.choice(
                        field,
                        v,
                        &[("separate", Qkv::Separate), ("shared", Qkv::Shared)],
                    ),
                ),
                Field::Mask => set(
                    &mut values.mask,
                    self.choice(field, v, &[("none", Mask::None), ("causal", Mask::Causal)]),
                ),
                Field::Scale => set(&mut values.scale, self.scale(v)),
                Field::Softmax => set(
                    &mut values.softmax,
                    self.choice(
                        field,
                        v,
                        &[("safe", Softmax::Safe), ("plain", Softmax::Plain)],
                    ),
                ),
            };
            if ok {
                field_spans.push((field, v.span.clone()));
            }
        }

        if let Close::Missing { at } = l.close {
            self.diags.push(diag::unclosed_block(
                file,
                l.name.text,
                l.open_brace.clone(),
                at,
            ));
        }
        // A field may have been swallowed by syntax error recovery, so its
        // absence would be a guess.
        if !lost_fields {
            for field in [Field::Tokens, Field::Dim] {
                if !written.contains_key(&field) && !suggested.contains(&field) {
                    self.diags.push(diag::missing_field(
                        file,
                        l.name.text,
                        l.name.span.clone(),
                        field,
                    ));
                }
            }
        }

        if lost_fields {
            return None;
        }
        let dim = values.dim?;
        Some(Layer {
            name: l.name.text.to_string(),
            name_span: l.name.span.clone(),
            span: l.span.clone(),
            tokens: values.tokens?,
            dim,
            heads: values.heads.unwrap_or(1),
            qkv: values.qkv.unwrap_or(Qkv::Separate),
            mask: values.mask.unwrap_or(Mask::None),
            scale: values.scale.unwrap_or(1.0 / f64::from(dim).sqrt()),
            scale_given: values.scale.is_some(),
            softmax: values.softmax.unwrap_or_default(),
            field_spans,
        })
    }

    fn size(&mut self, field: Field, v: &Value<'_>, limit: u64) -> Option<u32> {
        let file = self.file;
        let span = v.span.clone();
        let ValueKind::Int(digits) = v.kind else {
            let found = format!("`{}`", v.source_text());
            self.diags.push(diag::wrong_kind(file, field, span, &found));
            return None;
        };
        let negative = v.negative;
        // The lexer only produces digits, so the only possible failure is
        // overflow.
        let d = match digits.parse::<u64>() {
            Err(_) if negative => diag::negative(file, field, span),
            Err(_) => diag::integer_too_large(file, field, span, limit),
            Ok(0) => diag::zero_size(file, field, span),
            Ok(_) if negative => diag::negative(file, field, span),
            Ok(n) if n > limit => diag::size_limit(file, field, span, n, limit),
            Ok(n) => return u32::try_from(n).ok(),
        };
        self.diags.push(d);
        None
    }

    fn choice<T: Copy>(&mut self, field: Field, v: &Value<'_>, options: &[(&str, T)]) -> Option<T> {
        let file = self.file;
        let name = match v.kind {
            ValueKind::Ident(name) if !v.negative => name,
            _ => {
                let found = format!("`{}`", v.source_text());
                self.diags
                    .push(diag::wrong_kind(file, field, v.span.clone(), &found));
                return None;
            }
        };
        if let Some(&(_, value)) = options.iter().find(|(n, _)| *n == name) {
            return Some(value);
        }
        let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
        let suggestion = closest(name, &names);
        self.diags.push(diag::invalid_choice(
            file,
            field,
            v.span.clone(),
            name,
            suggestion,
        ));
        None
    }

    fn scale(&mut self, v: &Value<'_>) -> Option<f64> {
        let file = self.file;
        let text = match v.kind {
            ValueKind::Int(text) | ValueKind::Float(text) => text,
            ValueKind::Ident(_) => {
                let found = format!("`{}`", v.source_text());
                self.diags
                    .push(diag::wrong_kind(file, Field::Scale, v.span.clone(), &found));
                return None;
            }
        };
        // Every literal the lexer accepts is valid `f64` syntax; huge ones
        // become infinity and are rejected below.
        let magnitude = text.parse::<f64>().unwrap_or(f64::NAN);
        let value = if v.negative { -magnitude } else { magnitude };
        if value > 0.0 && value.is_finite() {
            return Some(value);
        }
        self.diags.push(diag::bad_scale(
            file,
            v.span.clone(),
            &v.source_text(),
            value,
        ));
        None
    }
}

/// Store `value` and say whether it was valid.
fn set<T>(slot: &mut Option<T>, value: Option<T>) -> bool {
    let ok = value.is_some();
    *slot = value;
    ok
}

/// The candidate closest to `word`, if close enough to be a likely typo:
/// at most one edit per three characters of the candidate, ignoring case.
fn closest<'c>(word: &str, candidates: &[&'c str]) -> Option<&'c str> {
    let word = word.to_ascii_lowercase();
    candidates
        .iter()
        .map(|c| (edit_distance(&word, c), *c))
        .filter(|&(d, c)| d <= c.len().div_ceil(3))
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

/// Optimal string alignment distance: insertions, deletions, substitutions
/// and swaps of adjacent characters each cost one, so `casual` is one edit
/// from `causal`.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Rows i-2, i-1 and i of the usual dynamic-programming table.
    let mut prev2: Vec<usize> = vec![0; b.len() + 1];
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur: Vec<usize> = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        cur[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            cur[j] = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                cur[j] = cur[j].min(prev2[j - 2] + 1);
            }
        }
        std::mem::swap(&mut prev2, &mut prev);
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_swaps_as_one() {
        assert_eq!(edit_distance("casual", "causal"), 1);
        assert_eq!(edit_distance("tokns", "tokens"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("abc", ""), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn suggestions_only_for_likely_typos() {
        let fields = Field::ALL.map(Field::name);
        assert_eq!(closest("tokns", &fields), Some("tokens"));
        assert_eq!(closest("Tokens", &fields), Some("tokens"));
        assert_eq!(closest("hed", &fields), Some("heads"));
        assert_eq!(closest("qk", &fields), Some("qkv"));
        assert_eq!(closest("x", &fields), None);
        assert_eq!(closest("width", &fields), None);
    }
}
