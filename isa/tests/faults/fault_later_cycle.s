; A fault in a later cycle, on the last PE of three: cycle 0 and 1 commit (PE 2 received
; the value PE 1 sent in cycle 0), and cycle 2 commits nothing, so m3 of PE 0 keeps its
; value from cycle 1 and PE 2's m1 stays unwritten.
; preload: 0 m0=2
; preload: 1 m0=5
; check: 0 m3=4
; check: 2 m0=5
; fault: read-uninitialized: PE 2, cycle 2 (bundle 2: div m2, m1 -> m1): read of uninitialized word m1
.format 1
.pe 0
.pes 3
.mem 4
mul m0, m0 -> m3
nop
mul m3, m3 -> m3
; ---
.format 1
.pe 1
.pes 3
.mem 4
nop | nop | send m0 -> m0
; ---
.format 1
.pe 2
.pes 3
.mem 4
nop
mul m0, m0 -> m2
div m2, m1 -> m1
