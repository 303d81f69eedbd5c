; One bit of a bundle flipped: the checksum catches it.
; bytes: xor 33 0x10
; decode-error: checksum-mismatch: checksum mismatch (corrupted input)
.format 1
.pe 0
.pes 1
.mem 4
mul m0, m1
