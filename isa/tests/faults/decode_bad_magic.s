; The first byte of the magic changed.
; bytes: set 0 0x42
; decode-error: bad-magic: not an attnc ISA binary (bad magic)
.format 1
.pe 0
.pes 1
.mem 4
nop
