//! Helpers shared by the `isa` integration tests.

/// CRC-32/ISO-HDLC (the IEEE polynomial, reflected) bit by bit: an oracle written from the
/// definition, independent of the crate the decoder uses, so a checksum test cannot pass by
/// comparing the decoder's own arithmetic with itself.
pub fn crc32_bitwise(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xEDB8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}
