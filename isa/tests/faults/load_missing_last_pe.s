; A ring of 2 with a program for PE 0 only.
; load-error: missing-pe: no program for PE 1
.format 1
.pe 0
.pes 2
.mem 4
nop
