; The line ends where an operand should be.
; parse-error: line 7:8: expected the second operand address, found end of line
.format 1
.pe 0
.pes 1
.mem 4
div m0,
