//! Which attention phase a value or an operation belongs to, derived from data lineage alone.
//!
//! The emitted programs carry no phase labels, and the compiler's own bookkeeping is not consulted
//! on purpose: a second run over this value domain tags every word with where it came from, so a
//! schedule is classified by what it computes, and a disagreement with the compiler's counts is a
//! finding rather than an echo. Every rule lives in [`op_result`] and [`acc_result`]; a new ISA
//! operation is one more match arm there.

use isa::{Domain, OpKind};

/// Where a value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tag {
    /// Preloaded from an input tensor (q, k, v or x) and never computed on.
    Input,
    /// A product of two inputs, or a sum of such products: a QKᵀ partial or finished score.
    Score,
    /// A result of `exp`.
    Exp,
    /// A sum of `exp` results: a softmax denominator or a partial one.
    ExpSum,
    /// A result of `div` on softmax values: a softmax weight.
    Weight,
    /// A product with a softmax-derived operand, a sum of those, or such a sum divided by a
    /// denominator: a ·V partial, or an output.
    Out,
    /// Anything the rules above do not cover (no attnc schedule produces it today).
    Mixed,
}

/// What a slot of a PE does in one cycle, for colouring and counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Class {
    Idle = 0,
    /// Computing or moving scores (QKᵀ).
    Qk = 1,
    /// exp, denominators, division (softmax).
    Softmax = 2,
    /// Weighted sums of values (·V).
    Av = 3,
    /// Moving an input word (link slot only: ops never just copy).
    Input = 4,
    Other = 5,
}

impl Class {
    pub const COUNT: usize = 6;
    pub const ALL: [Class; Class::COUNT] = [
        Class::Idle,
        Class::Qk,
        Class::Softmax,
        Class::Av,
        Class::Input,
        Class::Other,
    ];

    /// Short stable key, used in JSON output.
    pub fn key(self) -> &'static str {
        match self {
            Class::Idle => "idle",
            Class::Qk => "qk",
            Class::Softmax => "softmax",
            Class::Av => "av",
            Class::Input => "input",
            Class::Other => "other",
        }
    }

    /// Human label, used in pictures and traces.
    pub fn label(self) -> &'static str {
        match self {
            Class::Idle => "idle",
            Class::Qk => "QKᵀ",
            Class::Softmax => "softmax",
            Class::Av => "·V",
            Class::Input => "input move",
            Class::Other => "other",
        }
    }

    /// Colour (sRGB) used for this class in every picture, so a legend means the same everywhere.
    pub fn rgb(self) -> (u8, u8, u8) {
        match self {
            Class::Idle => (226, 226, 226),
            Class::Qk => (31, 119, 180),
            Class::Softmax => (255, 127, 14),
            Class::Av => (44, 160, 44),
            Class::Input => (148, 103, 189),
            Class::Other => (214, 39, 40),
        }
    }
}

impl Tag {
    /// The phase a word of this lineage belongs to when it travels on the link.
    pub fn class(self) -> Class {
        match self {
            Tag::Input => Class::Input,
            Tag::Score => Class::Qk,
            Tag::Exp | Tag::ExpSum | Tag::Weight => Class::Softmax,
            Tag::Out => Class::Av,
            Tag::Mixed => Class::Other,
        }
    }
}

fn softmax_derived(t: Tag) -> bool {
    matches!(t, Tag::Exp | Tag::ExpSum | Tag::Weight | Tag::Out)
}

/// The phase of an op and the lineage of its result, from its kind (`None` for `nop`) and its
/// operands' lineage. `operands` are the tags of the op's memory operands in order (`a`, then
/// `b`).
pub fn op_result(kind: Option<OpKind>, operands: &[Tag]) -> (Class, Tag) {
    let Some(kind) = kind else {
        return (Class::Idle, Tag::Mixed);
    };
    match (kind, operands) {
        (OpKind::Mul, [Tag::Input, Tag::Input]) => (Class::Qk, Tag::Score),
        (OpKind::Mul, [a, b]) if softmax_derived(*a) || softmax_derived(*b) => {
            (Class::Av, Tag::Out)
        }
        (OpKind::Exp | OpKind::Expd, _) => (Class::Softmax, Tag::Exp),
        // A row maximum is a statistic of scores; computing it is softmax work.
        (OpKind::Max, [Tag::Score, Tag::Score]) => (Class::Softmax, Tag::Score),
        (OpKind::Div, [Tag::Out, _]) => (Class::Softmax, Tag::Out),
        (OpKind::Div, _) => (Class::Softmax, Tag::Weight),
        _ => (Class::Other, Tag::Mixed),
    }
}

/// The lineage of an accumulator result: `addend` is the word added (`None` for `add 0`),
/// `result` the op result of the same bundle.
pub fn acc_result(addend: Option<Tag>, result: Tag) -> Tag {
    match (addend, result) {
        (None, r) => r,
        (Some(Tag::Score), Tag::Score) => Tag::Score,
        (Some(Tag::Exp | Tag::ExpSum), Tag::Exp) => Tag::ExpSum,
        (Some(Tag::Out), Tag::Out) => Tag::Out,
        _ => Tag::Mixed,
    }
}

/// The value domain that runs programs on lineage tags instead of numbers.
#[derive(Clone, Copy, Default, Debug)]
pub struct LineageDomain;

impl Domain for LineageDomain {
    type Value = Tag;
    fn op(&mut self, kind: OpKind, a: &Tag, b: Option<&Tag>, _imm: f32) -> Tag {
        match b {
            Some(b) => op_result(Some(kind), &[*a, *b]).1,
            None => op_result(Some(kind), &[*a]).1,
        }
    }
    fn add(&mut self, a: &Tag, b: &Tag) -> Tag {
        acc_result(Some(*a), *b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules() {
        assert_eq!(
            op_result(Some(OpKind::Mul), &[Tag::Input, Tag::Input]),
            (Class::Qk, Tag::Score)
        );
        assert_eq!(
            op_result(Some(OpKind::Mul), &[Tag::Weight, Tag::Input]),
            (Class::Av, Tag::Out)
        );
        assert_eq!(
            op_result(Some(OpKind::Mul), &[Tag::Input, Tag::Exp]),
            (Class::Av, Tag::Out)
        );
        // A score times an input is no attention step: flagged, not guessed.
        assert_eq!(
            op_result(Some(OpKind::Mul), &[Tag::Score, Tag::Input]),
            (Class::Other, Tag::Mixed)
        );
        assert_eq!(
            op_result(Some(OpKind::Div), &[Tag::Exp, Tag::ExpSum]),
            (Class::Softmax, Tag::Weight)
        );
        assert_eq!(
            op_result(Some(OpKind::Div), &[Tag::Out, Tag::ExpSum]),
            (Class::Softmax, Tag::Out)
        );
        assert_eq!(acc_result(Some(Tag::Exp), Tag::Exp), Tag::ExpSum);
        assert_eq!(acc_result(Some(Tag::Score), Tag::Score), Tag::Score);
        assert_eq!(acc_result(Some(Tag::Score), Tag::Out), Tag::Mixed);
        assert_eq!(acc_result(None, Tag::Exp), Tag::Exp);
    }
}
