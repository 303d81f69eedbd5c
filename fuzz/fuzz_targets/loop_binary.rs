//! Loop-program binaries (versions 3 and 4): any bytes decode or are refused; what decodes
//! re-encodes, in its own version, to the same bytes, survives the text round trip, and has the static length and op counts of its
//! flattening. Each input is also tried with its checksum recomputed, so mutations reach the
//! record decoder instead of stopping at the CRC.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "loop_common.rs"]
mod loop_common;

fn decode(bytes: &[u8]) {
    if let Ok(p) = isa::decode_looped(bytes) {
        let again = if bytes[8..10] == isa::looped_binary::v3::VERSION.to_le_bytes() {
            isa::looped_binary::v3::encode(&p)
        } else {
            isa::encode_looped(&p)
        };
        assert_eq!(again.expect("encodes"), bytes, "decoding is canonical");
        loop_common::check(&p);
    }
}

fuzz_target!(|data: &[u8]| {
    decode(data);
    if data.len() >= isa::binary::HEADER_BYTES + isa::binary::CHECKSUM_BYTES {
        let mut fixed = data.to_vec();
        let body = fixed.len() - isa::binary::CHECKSUM_BYTES;
        let crc = crc32fast::hash(&fixed[..body]);
        fixed[body..].copy_from_slice(&crc.to_le_bytes());
        decode(&fixed);
    }
});
