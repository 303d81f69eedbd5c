; An arrow must be followed by the destination.
; parse-error: line 7:14: expected a destination address after `->`, found end of line
.format 1
.pe 0
.pes 1
.mem 4
mul m0, m1 ->
