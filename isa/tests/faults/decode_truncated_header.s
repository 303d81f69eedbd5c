; The input ends inside the header.
; bytes: keep 20
; decode-error: truncated: truncated input
.format 1
.pe 0
.pes 1
.mem 4
nop
