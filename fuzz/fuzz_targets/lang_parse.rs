//! The `.attn` front end: any bytes parse, check and render without panicking, and the
//! rendered text stays bounded (capped diagnostics, long lines cut around the label).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let parsed = lang::parse_bytes(0, data);
    let text = String::from_utf8_lossy(data);
    let out = lang::render("f.attn", &text, &parsed.diagnostics);
    // Each rendered diagnostic shows at most a few lines of a few hundred bytes, plus notes.
    assert!(
        out.len() <= 64 * 1024 + 8 * data.len().min(4096),
        "rendered {} bytes from {} input bytes",
        out.len(),
        data.len()
    );
});
