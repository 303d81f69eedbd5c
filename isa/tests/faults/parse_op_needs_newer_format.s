; A version-1 file cannot name an op kind that version 2 introduced.
; parse-error: line 7:1: `max` needs `.format 2` or later (this file declares `.format 1`)
.format 1
.pe 0
.pes 1
.mem 4
max m0, m1
