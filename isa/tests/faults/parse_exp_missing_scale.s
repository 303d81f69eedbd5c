; exp takes an operand and a scale.
; parse-error: line 7:7: expected `,` between the operands and the scale, found end of line
.format 1
.pe 0
.pes 1
.mem 4
exp m0
