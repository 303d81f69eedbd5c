//! Binary programs: any bytes decode or are refused; what decodes re-encodes to the same bytes
//! (the encoding is canonical) and survives the text round trip. Each input is also tried with
//! its checksum recomputed, so mutations reach the bundle decoder instead of stopping at the CRC.
#![no_main]
use libfuzzer_sys::fuzz_target;

fn check(bytes: &[u8]) {
    if let Ok(p) = isa::decode(bytes) {
        assert_eq!(isa::encode(&p).expect("encodes"), bytes, "decoding is canonical");
        assert_eq!(isa::parse(&p.to_string()).expect("printed text parses"), p);
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() >= isa::binary::HEADER_BYTES + isa::binary::CHECKSUM_BYTES {
        let mut fixed = data.to_vec();
        let body = fixed.len() - isa::binary::CHECKSUM_BYTES;
        let crc = crc32fast::hash(&fixed[..body]);
        fixed[body..].copy_from_slice(&crc.to_le_bytes());
        check(&fixed);
    }
});
