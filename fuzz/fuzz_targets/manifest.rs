//! Manifests: any text parses and validates or is refused, and what passes `run`'s checks has
//! sizes that agree with each other (so loading cannot index out of bounds or over-allocate).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(m) = compiler::manifest::Manifest::from_json(text) else {
        return;
    };
    if attnc::rundir::check_manifest(&m).is_ok() {
        let len = (m.layer.heads as usize) * (m.layer.tokens as usize) * (m.layer.dim as usize);
        for p in m.inputs.values().chain(m.outputs.values()) {
            assert_eq!(p.len(), len);
            // Explicit entries or an affine layout: every element lands inside a PE's memory
            // (sampled, since a layout may stand for millions of elements).
            let step = (len / 4096).max(1);
            for i in (0..len).step_by(step).chain([len - 1]) {
                let (pe, addr) = p.locate(m.pes, i);
                assert!(pe < m.pes && addr < m.mem_words[pe as usize]);
            }
        }
        // Serialising and parsing again gives the same manifest.
        let again = compiler::manifest::Manifest::from_json(&m.to_json().unwrap()).expect("round trip");
        assert_eq!(again, m);
    }
});
