; Nothing may follow the xfer slot.
; parse-error: line 7:27: unexpected `m2` after the xfer slot; expected end of line
.format 1
.pe 0
.pes 1
.mem 4
nop | nop | send m0 -> m1 m2
