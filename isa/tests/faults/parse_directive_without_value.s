; A directive needs its number.
; parse-error: line 4:4: expected a number after `.pe`, found end of line
.format 1
.pe
.pes 1
.mem 4
