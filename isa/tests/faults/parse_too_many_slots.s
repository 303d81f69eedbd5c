; A bundle has three slots.
; parse-error: line 7:17: too many slots (a bundle has at most three: op | acc | xfer)
.format 1
.pe 0
.pes 1
.mem 4
nop | nop | nop | nop
