//! Valid sources: fields resolve, defaults apply, order does not matter.

use lang::{Field, Layer, Mask, Qkv};

fn parse_ok(src: &str) -> Vec<Layer> {
    let parsed = lang::parse(0, src);
    assert!(
        parsed.diagnostics.is_empty(),
        "{}",
        lang::render("t.attn", src, &parsed.diagnostics)
    );
    parsed.layers
}

const GPT_HEAD: &str = "\
// comment
layer gpt_head {
    tokens = 16;        // n
    dim    = 16;        // d, per head
    heads  = 2;         // optional, default 1
    qkv    = shared;    // shared | separate (default)
    mask   = causal;    // causal | none (default)
    scale  = 0.25;      // optional, default 1/sqrt(dim)
}
";

#[test]
fn reference_example() {
    let layers = parse_ok(GPT_HEAD);
    assert_eq!(layers.len(), 1);
    let l = &layers[0];
    assert_eq!(l.name, "gpt_head");
    assert_eq!(&GPT_HEAD[l.name_span.clone()], "gpt_head");
    assert!(GPT_HEAD[l.span.clone()].starts_with("layer gpt_head {"));
    assert!(GPT_HEAD[l.span.clone()].ends_with('}'));
    assert_eq!((l.tokens, l.dim, l.heads), (16, 16, 2));
    assert_eq!(l.qkv, Qkv::Shared);
    assert_eq!(l.mask, Mask::Causal);
    assert_eq!(l.scale, 0.25);
    assert!(l.scale_given);
    let written: Vec<(Field, &str)> = l
        .field_spans
        .iter()
        .map(|(f, s)| (*f, &GPT_HEAD[s.clone()]))
        .collect();
    assert_eq!(
        written,
        vec![
            (Field::Tokens, "16"),
            (Field::Dim, "16"),
            (Field::Heads, "2"),
            (Field::Qkv, "shared"),
            (Field::Mask, "causal"),
            (Field::Scale, "0.25"),
        ]
    );
    assert_eq!(&GPT_HEAD[l.field_span(Field::Mask)], "causal");
}

#[test]
fn defaults() {
    let layers = parse_ok("layer plain { tokens = 8; dim = 64; }");
    let l = &layers[0];
    assert_eq!(l.heads, 1);
    assert_eq!(l.qkv, Qkv::Separate);
    assert_eq!(l.mask, Mask::None);
    assert_eq!(l.scale, 0.125);
    assert!(!l.scale_given);
    // Unwritten fields point at the layer name.
    assert_eq!(l.field_span(Field::Scale), l.name_span);
    assert_eq!(l.field_span(Field::Heads), l.name_span);
}

#[test]
fn default_scale_is_inverse_sqrt_dim() {
    let l = &parse_ok("layer x { tokens = 3; dim = 3; }")[0];
    assert_eq!(l.scale, 1.0 / 3f64.sqrt());
}

#[test]
fn explicit_choices_and_integer_scale() {
    let l = &parse_ok(
        "layer x { tokens = 4; dim = 4; qkv = separate; mask = none; scale = 1; heads = 1024; }",
    )[0];
    assert_eq!(
        (l.qkv, l.mask, l.scale, l.heads),
        (Qkv::Separate, Mask::None, 1.0, 1024)
    );
    assert!(l.scale_given);
}

#[test]
fn float_forms_for_scale() {
    for (text, value) in [("1e-2", 0.01), (".5", 0.5), ("2.", 2.0), ("1.5E1", 15.0)] {
        let l = &parse_ok(&format!(
            "layer x {{ tokens = 4; dim = 4; scale = {text}; }}"
        ))[0];
        assert_eq!(l.scale, value, "{text}");
    }
}

#[test]
fn limits_are_inclusive() {
    let l = &parse_ok("layer big { tokens = 65536; dim = 65536; heads = 1024; }")[0];
    assert_eq!((l.tokens, l.dim, l.heads), (65536, 65536, 1024));
}

#[test]
fn several_layers_in_one_file() {
    let layers = parse_ok(
        "layer a { tokens = 3; dim = 3; }\n\
         // between\n\
         layer b { tokens = 5; dim = 7; mask = causal; }\n\
         layer c{tokens=1;dim=1;}",
    );
    let names: Vec<&str> = layers.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert_eq!((layers[1].tokens, layers[1].dim), (5, 7));
    assert_eq!(layers[1].mask, Mask::Causal);
}

#[test]
fn field_order_does_not_matter() {
    let fields = [
        "tokens = 16;",
        "dim = 16;",
        "heads = 2;",
        "qkv = shared;",
        "mask = causal;",
        "scale = 0.25;",
    ];
    let reference = &parse_ok(GPT_HEAD)[0];
    // Every rotation and its reverse.
    for r in 0..fields.len() {
        let mut order = fields.to_vec();
        order.rotate_left(r);
        for order in [order.clone(), order.into_iter().rev().collect()] {
            let src = format!("layer gpt_head {{ {} }}", order.join(" "));
            let l = &parse_ok(&src)[0];
            assert_eq!(
                (l.tokens, l.dim, l.heads, l.qkv, l.mask, l.scale),
                (
                    reference.tokens,
                    reference.dim,
                    reference.heads,
                    reference.qkv,
                    reference.mask,
                    reference.scale
                ),
                "{src}"
            );
        }
    }
}

#[test]
fn valid_layers_survive_errors_elsewhere() {
    let src = "layer good { tokens = 2; dim = 2; }\nlayer bad { tokens = 0; dim = 2; }\n";
    let parsed = lang::parse(0, src);
    assert!(lang::has_errors(&parsed.diagnostics));
    let names: Vec<&str> = parsed.layers.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["good"]);
}

#[test]
fn parse_bytes_matches_parse_for_utf8() {
    let from_bytes = lang::parse_bytes(0, GPT_HEAD.as_bytes());
    assert!(from_bytes.diagnostics.is_empty());
    assert_eq!(from_bytes.layers, parse_ok(GPT_HEAD));
}

#[test]
fn crlf_tabs_and_bom() {
    let src = "\u{feff}layer\ta {\r\n\ttokens = 2;\r\n\tdim = 2;\r\n}\r\n";
    assert_eq!(parse_ok(src)[0].tokens, 2);
}

#[test]
fn softmax_defaults_to_safe_and_takes_plain() {
    let src = "layer a { tokens = 4; dim = 4; }\nlayer b { tokens = 4; dim = 4; softmax = plain; }\nlayer c { tokens = 4; dim = 4; softmax = safe; }\n";
    let parsed = lang::parse(0, src);
    assert!(parsed.diagnostics.is_empty(), "{:?}", parsed.diagnostics);
    let forms: Vec<lang::Softmax> = parsed.layers.iter().map(|l| l.softmax).collect();
    assert_eq!(
        forms,
        [
            lang::Softmax::Safe,
            lang::Softmax::Plain,
            lang::Softmax::Safe
        ]
    );
    let b = &parsed.layers[1];
    assert_eq!(&src[b.field_span(Field::Softmax)], "plain");
    // Left to its default, the field points at the layer's name.
    assert_eq!(
        parsed.layers[0].field_span(Field::Softmax),
        parsed.layers[0].name_span
    );
}
