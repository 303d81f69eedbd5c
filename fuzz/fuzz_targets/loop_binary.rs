//! Loop-program binaries (format 3): any bytes decode or are refused; what decodes re-encodes to
//! the same bytes, survives the text round trip, and has the static length and op counts of its
//! flattening. Each input is also tried with its checksum recomputed, so mutations reach the
//! record decoder instead of stopping at the CRC.
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "loop_common.rs"]
mod loop_common;

fn decode(bytes: &[u8]) {
    if let Ok(p) = isa::decode_looped(bytes) {
        assert_eq!(
            isa::encode_looped(&p).expect("encodes"),
            bytes,
            "decoding is canonical"
        );
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
