; Two operands are separated by a comma.
; parse-error: line 7:8: expected `,` between the operands, found `m1`
.format 1
.pe 0
.pes 1
.mem 4
mul m0 m1
