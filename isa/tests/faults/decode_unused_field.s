; A field the bundle does not use must be zero, so no stray bit is dropped: op_a of a nop.
; bytes: set 32 3
; bytes: crc
; decode-error: invalid-bundle: invalid bundle 0: unused field op_a is 0x3, must be 0
.format 1
.pe 0
.pes 1
.mem 4
nop
