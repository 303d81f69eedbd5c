; Operands are read in order: m3 (never written) faults before m7 (beyond the memory) is
; looked at.
; preload: 0 m0=2
; fault: read-uninitialized: PE 0, cycle 0 (bundle 0: div m3, m7 -> m2): read of uninitialized word m3
.format 1
.pe 0
.pes 1
.mem 4
div m3, m7 -> m2
