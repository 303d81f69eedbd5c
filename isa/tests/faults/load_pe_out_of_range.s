; PE 2 does not exist on a ring of 2.
; load-error: pe-out-of-range: program for PE 2 does not fit a ring of 2 PEs
.format 1
.pe 0
.pes 2
.mem 4
; ---
.format 1
.pe 2
.pes 2
.mem 4
