; Two programs claim PE 0.
; load-error: duplicate-pe: two programs for PE 0
.format 1
.pe 0
.pes 2
.mem 4
; ---
.format 1
.pe 0
.pes 2
.mem 4
