//! Snapshot tests of rendered diagnostics, one error kind per test plus a
//! file with many errors at once. Update with `UPDATE_EXPECT=1 cargo test -p lang`.

use expect_test::{expect, Expect};

/// Render everything reported for `src`, and check invariants every
/// diagnostic must satisfy whatever the snapshot says.
fn check(src: &str, expected: Expect) {
    let parsed = lang::parse(0, src);
    assert!(
        lang::has_errors(&parsed.diagnostics),
        "no error for {src:?}"
    );
    for d in &parsed.diagnostics {
        assert!(
            d.code.as_deref().is_some_and(|c| c.starts_with('E')),
            "no code: {d:?}"
        );
        assert!(
            d.labels
                .first()
                .is_some_and(|l| l.style == codespan_reporting::diagnostic::LabelStyle::Primary),
            "first label is not primary: {d:?}"
        );
    }
    let starts: Vec<usize> = parsed
        .diagnostics
        .iter()
        .map(|d| d.labels[0].range.start)
        .collect();
    assert!(starts.is_sorted(), "not in source order: {starts:?}");
    expected.assert_eq(&lang::render("layer.attn", src, &parsed.diagnostics));
}

#[test]
fn e0001_unexpected_token_lists_expected_tokens() {
    check(
        "layer a {\n    tokens 16;\n    dim = 16;\n}\n",
        expect![[r#"
            error[E0001]: expected `=`, found integer `16`
              ┌─ layer.attn:2:12
              │
            2 │     tokens 16;
              │            ^^ expected `=`

        "#]],
    );
}

#[test]
fn e0001_missing_layer_name() {
    check(
        "layer { tokens = 1; dim = 1; }\n",
        expect![[r#"
        error[E0001]: expected a name, found `{`
          ┌─ layer.attn:1:7
          │
        1 │ layer { tokens = 1; dim = 1; }
          │       ^ expected a name

    "#]],
    );
}

#[test]
fn e0001_missing_value_at_end_of_file() {
    check(
        "layer a {\n    tokens = 16;\n    dim =",
        expect![[r#"
        error[E0016]: layer `a` is missing its closing `}`
          ┌─ layer.attn:1:9
          │
        1 │ layer a {
          │         ^ this `{` is never closed
        2 │     tokens = 16;
        3 │     dim =
          │          - expected `}` here

        error[E0001]: expected a value (a number or a name), found end of file
          ┌─ layer.attn:3:10
          │
        3 │     dim =
          │          ^ expected a value (a number or a name)

    "#]],
    );
}

#[test]
fn e0001_stray_closing_brace() {
    check(
        "layer a { tokens = 1; dim = 1; } }\n",
        expect![[r#"
            error[E0001]: expected `layer`, found `}`
              ┌─ layer.attn:1:34
              │
            1 │ layer a { tokens = 1; dim = 1; } }
              │                                  ^ expected `layer`

        "#]],
    );
}

#[test]
fn e0002_stray_characters() {
    check(
        "layer a {\n    tokens = 16;\n    dim = 16 @@;\n}\n",
        expect![[r#"
            error[E0002]: unexpected characters `@@`
              ┌─ layer.attn:3:14
              │
            3 │     dim = 16 @@;
              │              ^^ these are not part of the language
              │
              = note: the language has names, numbers, `=`, `;`, `{`, `}`, `-` and `//` comments

        "#]],
    );
}

#[test]
fn e0003_unknown_field_suggests_closest() {
    check(
        "layer a {\n    tokns = 16;\n    dim = 16;\n}\n",
        expect![[r#"
            error[E0003]: unknown field `tokns`
              ┌─ layer.attn:2:5
              │
            2 │     tokns = 16;
              │     ^^^^^ unknown field
              │
              = help: did you mean `tokens`?

        "#]],
    );
}

#[test]
fn e0003_unknown_field_lists_known_fields() {
    check(
        "layer a {\n    tokens = 16;\n    dim = 16;\n    width = 3;\n}\n",
        expect![[r#"
            error[E0003]: unknown field `width`
              ┌─ layer.attn:4:5
              │
            4 │     width = 3;
              │     ^^^^^ unknown field
              │
              = note: the known fields are `tokens`, `dim`, `heads`, `qkv`, `mask`, `scale`, `softmax`

        "#]],
    );
}

#[test]
fn e0004_duplicate_field() {
    check(
        "layer a {\n    tokens = 16;\n    dim = 16;\n    tokens = 8;\n}\n",
        expect![[r#"
            error[E0004]: field `tokens` is set twice
              ┌─ layer.attn:4:5
              │
            2 │     tokens = 16;
              │     ------ first set here
            3 │     dim = 16;
            4 │     tokens = 8;
              │     ^^^^^^ set again here
              │
              = help: remove one of the two

        "#]],
    );
}

#[test]
fn e0005_missing_required_fields() {
    check(
        "layer a {\n    heads = 2;\n}\n",
        expect![[r#"
        error[E0005]: layer `a` is missing the required field `tokens`
          ┌─ layer.attn:1:7
          │
        1 │ layer a {
          │       ^ `tokens` is never set
          │
          = help: add `tokens = <integer>;` (the number of tokens, n) to the block

        error[E0005]: layer `a` is missing the required field `dim`
          ┌─ layer.attn:1:7
          │
        1 │ layer a {
          │       ^ `dim` is never set
          │
          = help: add `dim = <integer>;` (the size of each head, d) to the block

    "#]],
    );
}

#[test]
fn e0006_name_where_integer_needed() {
    check(
        "layer a {\n    tokens = shared;\n    dim = 16;\n}\n",
        expect![[r#"
            error[E0006]: expected a positive integer for `tokens`, found `shared`
              ┌─ layer.attn:2:14
              │
            2 │     tokens = shared;
              │              ^^^^^^ expected a positive integer
              │
              = help: for example `tokens = 16;`

        "#]],
    );
}

#[test]
fn e0006_float_where_integer_needed() {
    check(
        "layer a {\n    tokens = 2.5;\n    dim = 16;\n}\n",
        expect![[r#"
            error[E0006]: expected a positive integer for `tokens`, found `2.5`
              ┌─ layer.attn:2:14
              │
            2 │     tokens = 2.5;
              │              ^^^ expected a positive integer
              │
              = help: for example `tokens = 16;`

        "#]],
    );
}

#[test]
fn e0006_number_where_choice_needed() {
    check(
        "layer a {\n    tokens = 16;\n    dim = 16;\n    qkv = 3;\n}\n",
        expect![[r#"
            error[E0006]: expected `shared` or `separate` for `qkv`, found `3`
              ┌─ layer.attn:4:11
              │
            4 │     qkv = 3;
              │           ^ expected `shared` or `separate`
              │
              = help: for example `qkv = shared;`

        "#]],
    );
}

#[test]
fn e0007_invalid_choice() {
    check(
        "layer a {\n    tokens = 16;\n    dim = 16;\n    mask = maybe;\n    qkv = shard;\n}\n",
        expect![[r#"
            error[E0007]: `maybe` is not a valid value for `mask`
              ┌─ layer.attn:4:12
              │
            4 │     mask = maybe;
              │            ^^^^^ expected `causal` or `none`

            error[E0007]: `shard` is not a valid value for `qkv`
              ┌─ layer.attn:5:11
              │
            5 │     qkv = shard;
              │           ^^^^^ expected `shared` or `separate`
              │
              = help: did you mean `shared`?

        "#]],
    );
}

#[test]
fn e0007_softmax_choices() {
    check(
        "layer a {\n    tokens = 16;\n    dim = 16;\n    softmax = plane;\n}\nlayer b {\n    tokens = 16;\n    dim = 16;\n    softmax = 1;\n}\n",
        expect![[r#"
            error[E0007]: `plane` is not a valid value for `softmax`
              ┌─ layer.attn:4:15
              │
            4 │     softmax = plane;
              │               ^^^^^ expected `safe` or `plain`
              │
              = help: did you mean `plain`?

            error[E0006]: expected `safe` or `plain` for `softmax`, found `1`
              ┌─ layer.attn:9:15
              │
            9 │     softmax = 1;
              │               ^ expected `safe` or `plain`
              │
              = help: for example `softmax = plain;`

        "#]],
    );
}

#[test]
fn softmax_field_misspelt_gets_a_suggestion() {
    check(
        "layer a {\n    tokens = 16;\n    dim = 16;\n    softmx = plain;\n}\n",
        expect![[r#"
            error[E0003]: unknown field `softmx`
              ┌─ layer.attn:4:5
              │
            4 │     softmx = plain;
              │     ^^^^^^ unknown field
              │
              = help: did you mean `softmax`?

        "#]],
    );
}

#[test]
fn e0008_negative_size() {
    check(
        "layer a {\n    tokens = -16;\n    dim = 16;\n}\n",
        expect![[r#"
            error[E0008]: `tokens` cannot be negative
              ┌─ layer.attn:2:14
              │
            2 │     tokens = -16;
              │              ^^^ expected a positive integer
              │
              = help: remove the `-`

        "#]],
    );
}

#[test]
fn e0009_integer_literal_overflows_u64() {
    check(
        "layer a {\n    tokens = 16;\n    dim = 18446744073709551616;\n}\n",
        expect![[r#"
            error[E0009]: integer for `dim` is too large
              ┌─ layer.attn:3:11
              │
            3 │     dim = 18446744073709551616;
              │           ^^^^^^^^^^^^^^^^^^^^ does not fit in 64 bits
              │
              = note: `dim` can be at most 65536

        "#]],
    );
}

#[test]
fn e0010_zero_size() {
    check(
        "layer a {\n    tokens = 0;\n    dim = 16;\n    heads = 0;\n}\n",
        expect![[r#"
            error[E0010]: `tokens` must be at least 1
              ┌─ layer.attn:2:14
              │
            2 │     tokens = 0;
              │              ^ zero
              │
              = help: a layer needs at least one token

            error[E0010]: `heads` must be at least 1
              ┌─ layer.attn:4:13
              │
            4 │     heads = 0;
              │             ^ zero
              │
              = help: omit `heads` for a single head

        "#]],
    );
}

#[test]
fn e0011_size_above_limit() {
    check(
        "layer a {\n    tokens = 65537;\n    dim = 100000;\n    heads = 1025;\n}\n",
        expect![[r#"
            error[E0011]: `tokens` is 65537, above the limit of 65536
              ┌─ layer.attn:2:14
              │
            2 │     tokens = 65537;
              │              ^^^^^ must be at most 65536

            error[E0011]: `dim` is 100000, above the limit of 65536
              ┌─ layer.attn:3:11
              │
            3 │     dim = 100000;
              │           ^^^^^^ must be at most 65536

            error[E0011]: `heads` is 1025, above the limit of 1024
              ┌─ layer.attn:4:13
              │
            4 │     heads = 1025;
              │             ^^^^ must be at most 1024

        "#]],
    );
}

#[test]
fn e0012_scale_not_positive_or_finite() {
    check(
        "layer a { tokens = 4; dim = 4; scale = 0; }\n\
         layer b { tokens = 4; dim = 4; scale = -1; }\n\
         layer c { tokens = 4; dim = 4; scale = 1e400; }\n",
        expect![[r#"
            error[E0012]: `scale` must be positive, found `0`
              ┌─ layer.attn:1:40
              │
            1 │ layer a { tokens = 4; dim = 4; scale = 0; }
              │                                        ^ expected a positive, finite number
              │
              = help: omit `scale` to use the default 1/sqrt(dim)

            error[E0012]: `scale` must be positive, found `-1`
              ┌─ layer.attn:2:40
              │
            2 │ layer b { tokens = 4; dim = 4; scale = -1; }
              │                                        ^^ expected a positive, finite number
              │
              = help: omit `scale` to use the default 1/sqrt(dim)

            error[E0012]: `scale` is not a finite number, found `1e400`
              ┌─ layer.attn:3:40
              │
            3 │ layer c { tokens = 4; dim = 4; scale = 1e400; }
              │                                        ^^^^^ expected a positive, finite number
              │
              = note: the literal is out of range for a 64-bit float
              = help: omit `scale` to use the default 1/sqrt(dim)

        "#]],
    );
}

#[test]
fn e0013_duplicate_layer_name() {
    check(
        "layer a { tokens = 4; dim = 4; }\nlayer b { tokens = 4; dim = 4; }\nlayer a { tokens = 8; dim = 8; }\n",
        expect![[r#"
            error[E0013]: layer `a` is defined twice
              ┌─ layer.attn:3:7
              │
            1 │ layer a { tokens = 4; dim = 4; }
              │       - first defined here
            2 │ layer b { tokens = 4; dim = 4; }
            3 │ layer a { tokens = 8; dim = 8; }
              │       ^ defined again here
              │
              = help: rename one of them

        "#]],
    );
}

#[test]
fn e0014_no_layer() {
    check(
        "// nothing but a comment\n",
        expect![[r#"
        error[E0014]: no layer in this file
          ┌─ layer.attn:1:1
          │
        1 │ // nothing but a comment
          │ ^ expected a `layer` block
          │
          = help: a file holds one or more blocks like `layer head { tokens = 16; dim = 16; }`

    "#]],
    );
}

#[test]
fn e0014_empty_file() {
    check(
        "",
        expect![[r#"
        error[E0014]: no layer in this file
          ┌─ layer.attn:1:1
          │
        1 │ 
          │ ^ expected a `layer` block
          │
          = help: a file holds one or more blocks like `layer head { tokens = 16; dim = 16; }`

    "#]],
    );
}

#[test]
fn e0015_missing_semicolon() {
    check(
        "layer a {\n    tokens = 16\n    dim = 16;\n}\n",
        expect![[r#"
            error[E0015]: missing `;` after the value of `tokens`
              ┌─ layer.attn:2:16
              │
            2 │     tokens = 16
              │                ^ expected `;` here

        "#]],
    );
}

#[test]
fn e0016_missing_closing_brace_before_next_layer() {
    check(
        "layer a {\n    tokens = 16;\n    dim = 16;\n\nlayer b { tokens = 4; dim = 4; }\n",
        expect![[r#"
            error[E0016]: layer `a` is missing its closing `}`
              ┌─ layer.attn:1:9
              │
            1 │ layer a {
              │         ^ this `{` is never closed
            2 │     tokens = 16;
            3 │     dim = 16;
              │              - expected `}` here

        "#]],
    );
}

#[test]
fn e0016_unterminated_block_at_end_of_file() {
    check(
        "layer a {\n    tokens = 16;\n    dim = 16;\n",
        expect![[r#"
        error[E0016]: layer `a` is missing its closing `}`
          ┌─ layer.attn:1:9
          │
        1 │ layer a {
          │         ^ this `{` is never closed
        2 │     tokens = 16;
        3 │     dim = 16;
          │              - expected `}` here

    "#]],
    );
}

#[test]
fn e0017_invalid_utf8() {
    let bytes = b"layer a {\n    tokens = 16;\xff\xfe\n}\n";
    let parsed = lang::parse_bytes(0, bytes);
    assert_eq!(parsed.diagnostics.len(), 1);
    assert!(parsed.layers.is_empty());
    let lossy = String::from_utf8_lossy(bytes);
    expect![[r#"
        error[E0017]: input is not valid UTF-8: invalid byte 0xff at byte offset 26
          ┌─ layer.attn:2:17
          │
        2 │     tokens = 16;��
          │                 ^ not UTF-8 text
          │
          = help: layer files are UTF-8 text; is this a binary file?

    "#]]
    .assert_eq(&lang::render("layer.attn", &lossy, &parsed.diagnostics));
}

#[test]
fn e0017_binary_file() {
    let bytes: Vec<u8> = (0..=255u8).rev().collect();
    let parsed = lang::parse_bytes(0, &bytes);
    assert_eq!(parsed.diagnostics.len(), 1);
    assert_eq!(
        parsed.diagnostics[0].message,
        "input is not valid UTF-8: invalid byte 0xff at byte offset 0"
    );
}

#[test]
fn e0002_habits_from_other_formats_get_hints() {
    check(
        "layer a {\n    tokens: 16;\n    dim = 16,\n}\n",
        expect![[r#"
            error[E0002]: unexpected character `:`
              ┌─ layer.attn:2:11
              │
            2 │     tokens: 16;
              │           ^ this is not part of the language
              │
              = help: set a field with `=`, e.g. `tokens = 16;`

            error[E0002]: unexpected character `,`
              ┌─ layer.attn:3:13
              │
            3 │     dim = 16,
              │             ^ this is not part of the language
              │
              = help: end each field with `;`

        "#]],
    );
}

#[test]
fn e0003_keyword_used_as_field() {
    check(
        "layer a {\n    tokens = 16;\n    dim = 16;\n    layer = 2;\n}\n",
        expect![[r#"
            error[E0003]: unknown field `layer`
              ┌─ layer.attn:4:5
              │
            4 │     layer = 2;
              │     ^^^^^ unknown field
              │
              = note: the known fields are `tokens`, `dim`, `heads`, `qkv`, `mask`, `scale`, `softmax`

        "#]],
    );
}

#[test]
fn e0006_negated_name() {
    check(
        "layer a {\n    tokens = 16;\n    dim = 16;\n    mask = -causal;\n}\n",
        expect![[r#"
            error[E0006]: expected `causal` or `none` for `mask`, found `-causal`
              ┌─ layer.attn:4:12
              │
            4 │     mask = -causal;
              │            ^^^^^^^ expected `causal` or `none`
              │
              = help: for example `mask = causal;`

        "#]],
    );
}

#[test]
fn render_points_into_the_one_source_whatever_the_file_id() {
    let src = "layer a { tokens = 0; dim = 1; }";
    let with_id_7 = lang::parse(7, src);
    let with_id_0 = lang::parse(0, src);
    assert_eq!(
        lang::render("layer.attn", src, &with_id_7.diagnostics),
        lang::render("layer.attn", src, &with_id_0.diagnostics)
    );
}

/// Everything wrong at once: each problem is reported, in source order, and
/// recovery keeps one mistake from hiding the next.
#[test]
fn many_errors_in_one_file() {
    check(
        "\
// A file with many mistakes.
layer first {
    tokns  = 16;
    dim    = 2.5;
    heads  = 0;
    qkv    = both;
    mask   = casual;
    scale  = -1;
    dim    = 8;
}

layer second {
    tokens = shared
    dim    = 99999999999999999999999;
    heads  = 2000;
}

layer first {
    tokens = 4;
    dim    = = 4;
    scale  = 1 $;
}
layer third { tokens = 4;
",
        expect![[r#"
            error[E0003]: unknown field `tokns`
              ┌─ layer.attn:3:5
              │
            3 │     tokns  = 16;
              │     ^^^^^ unknown field
              │
              = help: did you mean `tokens`?

            error[E0006]: expected a positive integer for `dim`, found `2.5`
              ┌─ layer.attn:4:14
              │
            4 │     dim    = 2.5;
              │              ^^^ expected a positive integer
              │
              = help: for example `dim = 16;`

            error[E0010]: `heads` must be at least 1
              ┌─ layer.attn:5:14
              │
            5 │     heads  = 0;
              │              ^ zero
              │
              = help: omit `heads` for a single head

            error[E0007]: `both` is not a valid value for `qkv`
              ┌─ layer.attn:6:14
              │
            6 │     qkv    = both;
              │              ^^^^ expected `shared` or `separate`

            error[E0007]: `casual` is not a valid value for `mask`
              ┌─ layer.attn:7:14
              │
            7 │     mask   = casual;
              │              ^^^^^^ expected `causal` or `none`
              │
              = help: did you mean `causal`?

            error[E0012]: `scale` must be positive, found `-1`
              ┌─ layer.attn:8:14
              │
            8 │     scale  = -1;
              │              ^^ expected a positive, finite number
              │
              = help: omit `scale` to use the default 1/sqrt(dim)

            error[E0004]: field `dim` is set twice
              ┌─ layer.attn:9:5
              │
            4 │     dim    = 2.5;
              │     --- first set here
              ·
            9 │     dim    = 8;
              │     ^^^ set again here
              │
              = help: remove one of the two

            error[E0006]: expected a positive integer for `tokens`, found `shared`
               ┌─ layer.attn:13:14
               │
            13 │     tokens = shared
               │              ^^^^^^ expected a positive integer
               │
               = help: for example `tokens = 16;`

            error[E0015]: missing `;` after the value of `tokens`
               ┌─ layer.attn:13:20
               │
            13 │     tokens = shared
               │                    ^ expected `;` here

            error[E0009]: integer for `dim` is too large
               ┌─ layer.attn:14:14
               │
            14 │     dim    = 99999999999999999999999;
               │              ^^^^^^^^^^^^^^^^^^^^^^^ does not fit in 64 bits
               │
               = note: `dim` can be at most 65536

            error[E0011]: `heads` is 2000, above the limit of 1024
               ┌─ layer.attn:15:14
               │
            15 │     heads  = 2000;
               │              ^^^^ must be at most 1024

            error[E0013]: layer `first` is defined twice
               ┌─ layer.attn:18:7
               │
             2 │ layer first {
               │       ----- first defined here
               ·
            18 │ layer first {
               │       ^^^^^ defined again here
               │
               = help: rename one of them

            error[E0001]: expected a value (a number or a name), found `=`
               ┌─ layer.attn:20:14
               │
            20 │     dim    = = 4;
               │              ^ expected a value (a number or a name)

            error[E0002]: unexpected character `$`
               ┌─ layer.attn:21:16
               │
            21 │     scale  = 1 $;
               │                ^ this is not part of the language
               │
               = note: the language has names, numbers, `=`, `;`, `{`, `}`, `-` and `//` comments

            error[E0005]: layer `third` is missing the required field `dim`
               ┌─ layer.attn:23:7
               │
            23 │ layer third { tokens = 4;
               │       ^^^^^ `dim` is never set
               │
               = help: add `dim = <integer>;` (the size of each head, d) to the block

            error[E0016]: layer `third` is missing its closing `}`
               ┌─ layer.attn:23:13
               │
            23 │ layer third { tokens = 4;
               │             ^            - expected `}` here
               │             │            
               │             this `{` is never closed

        "#]],
    );
}
