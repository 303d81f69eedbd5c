; Fewer bytes than the magic that do not match it are not a program at all.
; bytes: keep 3
; bytes: set 0 0x7f
; decode-error: bad-magic: not an attnc ISA binary (bad magic)
.format 1
.pe 0
.pes 1
.mem 4
nop
