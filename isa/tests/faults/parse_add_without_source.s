; add takes 0 or an address.
; parse-error: line 7:17: expected `0` or an address after `add`, found end of line
.format 1
.pe 0
.pes 1
.mem 4
mul m0, m1 | add
