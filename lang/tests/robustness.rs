//! No input may make the front end panic: arbitrary bytes, arbitrary text,
//! and "token soup" (random sequences of valid token texts, which reach far
//! deeper into the parser and checker than random bytes do).

use proptest::prelude::*;

/// Parse and render, checking the invariants the API promises.
fn exercise_bytes(bytes: &[u8]) {
    let parsed = lang::parse_bytes(0, bytes);
    let source = String::from_utf8_lossy(bytes);
    let rendered = lang::render("fuzz.attn", &source, &parsed.diagnostics);
    if lang::has_errors(&parsed.diagnostics) {
        assert!(!rendered.is_empty());
    } else {
        assert!(!parsed.layers.is_empty(), "no layers and no errors");
    }
    for d in &parsed.diagnostics {
        assert!(d.code.is_some(), "diagnostic without a code: {d:?}");
        assert!(!d.labels.is_empty(), "diagnostic without a label: {d:?}");
    }
    for l in &parsed.layers {
        assert!(l.tokens >= 1 && l.dim >= 1 && l.heads >= 1);
        assert!(l.scale > 0.0 && l.scale.is_finite());
        for (_, span) in &l.field_spans {
            assert!(source.get(span.clone()).is_some());
        }
    }
}

const TOKENS: &[&str] = &[
    "layer",
    "layer",
    "{",
    "}",
    "{",
    "}",
    "=",
    "=",
    ";",
    ";",
    ";",
    "-",
    "tokens",
    "dim",
    "heads",
    "qkv",
    "mask",
    "scale",
    "shared",
    "separate",
    "causal",
    "none",
    "tokns",
    "x",
    "0",
    "1",
    "16",
    "65537",
    "99999999999999999999999",
    "2.5",
    "1e999",
    ".5",
    "1e-400",
    "$",
    "é",
    "//",
    "\n",
    " ",
    "\t",
    "/",
    ".",
    "\u{feff}",
    "🦀",
];

fn token_soup() -> impl Strategy<Value = String> {
    prop::collection::vec((prop::sample::select(TOKENS), prop::bool::ANY), 0..80).prop_map(
        |parts| {
            let mut s = String::new();
            for (tok, space) in parts {
                s.push_str(tok);
                if space {
                    s.push(' ');
                }
            }
            s
        },
    )
}

/// Valid layers with one token deleted, duplicated or swapped: the kind of
/// input recovery has to handle in practice.
fn damaged_layers() -> impl Strategy<Value = String> {
    let layer =
        "layer a { tokens = 16; dim = 16; heads = 2; qkv = shared; mask = causal; scale = 0.25; }";
    let toks: Vec<&'static str> = layer.split(' ').collect();
    let n = toks.len();
    (
        1usize..4,
        prop::collection::vec((0..3u8, 0..n * 3, 0..TOKENS.len()), 1..6),
    )
        .prop_map(move |(copies, edits)| {
            let mut all: Vec<&str> = Vec::new();
            for _ in 0..copies {
                all.extend(&toks);
            }
            for (kind, at, with) in edits {
                let at = at % all.len().max(1);
                match kind {
                    0 if !all.is_empty() => {
                        all.remove(at);
                    }
                    1 => all.insert(at, TOKENS[with]),
                    _ if !all.is_empty() => all[at] = TOKENS[with],
                    _ => {}
                }
            }
            all.join(" ")
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        exercise_bytes(&bytes);
    }

    #[test]
    fn arbitrary_text(text in "\\PC{0,200}") {
        exercise_bytes(text.as_bytes());
    }

    #[test]
    fn soup(text in token_soup()) {
        exercise_bytes(text.as_bytes());
    }

    #[test]
    fn damaged(text in damaged_layers()) {
        exercise_bytes(text.as_bytes());
    }

    /// Rendering must cope with diagnostics that do not belong to the source
    /// it is given, e.g. spans past the end or inside a character.
    #[test]
    fn render_with_mismatched_source(a in token_soup(), b in "\\PC{0,40}") {
        let parsed = lang::parse(0, &a);
        let _ = lang::render("other.attn", &b, &parsed.diagnostics);
    }
}

#[test]
fn large_inputs_do_not_recurse_deeply() {
    // Long runs of one token must not recurse deeply in the parser: that would overflow the
    // test thread's stack and fail here. (Going quadratic would show as this test taking
    // minutes; it is not timed, since no test may depend on the machine's speed. Rendering is
    // left out: codespan prints the whole source line for every diagnostic, so one-line inputs
    // with thousands of errors are inherently quadratic to render.)
    let braces = "{".repeat(200_000);
    let layers = "layer a {\n".repeat(50_000);
    let fields = format!("layer a {{\n{}}}", "tokens = 1;\n".repeat(50_000));
    let soup = "= ; } - 1.5 tokens layer { ".repeat(20_000);
    for src in [braces, layers, fields, soup] {
        let parsed = lang::parse(0, &src);
        assert!(lang::has_errors(&parsed.diagnostics));
    }
}
