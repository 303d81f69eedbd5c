; Op kinds are 0..3.
; bytes: set 28 7
; bytes: crc
; decode-error: invalid-bundle: invalid bundle 0: unknown op kind 7 in format version 1
.format 1
.pe 0
.pes 1
.mem 4
mul m0, m1
