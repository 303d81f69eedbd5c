; A directive given twice points back at the first.
; parse-error: line 7:1: duplicate `.mem` directive (first given on line 6)
.format 1
.pe 0
.pes 1
.mem 4
.mem 8
