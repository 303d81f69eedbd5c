; The send-acc flag without the xfer-present flag.
; bytes: set 29 0x20
; bytes: crc
; decode-error: invalid-bundle: invalid bundle 0: xfer-src-acc flag set without the xfer-present flag
.format 1
.pe 0
.pes 1
.mem 4
mul m0, m1
