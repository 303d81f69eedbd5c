; Errors name the bundle: the second one has an unknown op kind.
; bytes: set 60 9
; bytes: crc
; decode-error: invalid-bundle: invalid bundle 1: unknown op kind 9 in format version 1
.format 1
.pe 0
.pes 1
.mem 4
nop
mul m0, m1
