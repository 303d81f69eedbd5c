; The acc-zero flag without the acc-present flag.
; bytes: set 29 0x04
; bytes: crc
; decode-error: invalid-bundle: invalid bundle 0: acc flags set without the acc-present flag
.format 1
.pe 0
.pes 1
.mem 4
mul m0, m1
