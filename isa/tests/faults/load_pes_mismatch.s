; Every program must be for the same ring size as the first.
; load-error: pes-mismatch: program for PE 1 is for a ring of 3 PEs, but the first program is for 2
.format 1
.pe 0
.pes 2
.mem 4
; ---
.format 1
.pe 1
.pes 3
.mem 4
