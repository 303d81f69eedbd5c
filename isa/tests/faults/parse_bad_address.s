; Addresses are m followed by a decimal number.
; parse-error: line 7:9: bad address `r1` (expected `m` followed by a decimal number)
.format 1
.pe 0
.pes 1
.mem 4
mul m0, r1
