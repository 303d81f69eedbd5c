; Addresses are u32s.
; parse-error: line 7:9: address `m4294967296` is too large (the largest is m4294967295)
.format 1
.pe 0
.pes 1
.mem 4
mul m0, m4294967296
