; An exp scale of +inf (0x7f800000 in op_b).
; bytes: set 36 0
; bytes: set 37 0
; bytes: set 38 0x80
; bytes: set 39 0x7f
; bytes: crc
; decode-error: invalid-bundle: invalid bundle 0: exp scale inf is not finite
.format 1
.pe 0
.pes 1
.mem 4
exp m0, 1
