; add's source is 0 or an address, nothing else.
; parse-error: line 7:18: bad address `1` (expected `m` followed by a decimal number)
.format 1
.pe 0
.pes 1
.mem 4
mul m0, m1 | add 1 -> m2
