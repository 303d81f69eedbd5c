; A flag bit the format does not define.
; bytes: set 29 0x40
; bytes: crc
; decode-error: invalid-bundle: invalid bundle 0: undefined flag bits set in 0x40
.format 1
.pe 0
.pes 1
.mem 4
mul m0, m1
