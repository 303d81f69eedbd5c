; A nop op cannot have a destination.
; bytes: set 29 0x01
; bytes: crc
; decode-error: invalid-bundle: invalid bundle 0: op is nop but the op-dst flag is set
.format 1
.pe 0
.pes 1
.mem 4
nop
