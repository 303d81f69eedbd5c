; The scale is a decimal number.
; parse-error: line 7:9: bad scale `half` (expected a decimal number)
.format 1
.pe 0
.pes 1
.mem 4
exp m0, half
