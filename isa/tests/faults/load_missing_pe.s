; A ring of 3 with programs for PEs 0 and 2 only.
; load-error: missing-pe: no program for PE 1
.format 1
.pe 0
.pes 3
.mem 4
; ---
.format 1
.pe 2
.pes 3
.mem 4
