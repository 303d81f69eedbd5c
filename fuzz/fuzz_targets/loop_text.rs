//! Loop-program text (format 3): any text parses or is refused; what parses prints canonically,
//! re-parses to the same program and survives the binary round trip, and its length and op
//! counts computed from the loop structure are those of its flattening.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "loop_common.rs"]
mod loop_common;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(p) = isa::parse_looped(text) {
        let printed = p.to_text();
        assert_eq!(
            isa::parse_looped(&printed).expect("canonical text re-parses"),
            p
        );
        loop_common::check(&p);
    }
});
