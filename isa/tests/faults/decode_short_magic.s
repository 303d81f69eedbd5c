; Fewer bytes than the magic that still match it are a truncation.
; bytes: keep 5
; decode-error: truncated: truncated input
.format 1
.pe 0
.pes 1
.mem 4
nop
