; A send always names the receiver's address.
; parse-error: line 7:20: expected `->` and the receiver's address (a send always names one), found end of line
.format 1
.pe 0
.pes 1
.mem 4
nop | nop | send m0
