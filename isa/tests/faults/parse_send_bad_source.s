; send's source is acc or an address.
; parse-error: line 7:27: bad address `ac` (expected `m` followed by a decimal number)
.format 1
.pe 0
.pes 1
.mem 4
mul m0, m1 | add 0 | send ac -> m2
