//! Text assembly: any text parses or is refused; what parses prints canonically, re-parses to
//! the same program, and encodes to a binary that decodes to it again.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(p) = isa::parse(text) {
        let printed = p.to_string();
        let again = isa::parse(&printed).expect("canonical text re-parses");
        assert_eq!(again, p);
        assert_eq!(isa::decode(&isa::encode(&p).expect("encodes")).expect("encoding decodes"), p);
    }
});
