; Reading a word nothing has written: m1 was never preloaded.
; preload: 0 m0=2
; fault: read-uninitialized: PE 0, cycle 0 (bundle 0: mul m0, m1 -> m2): read of uninitialized word m1
.format 1
.pe 0
.pes 1
.mem 4
mul m0, m1 -> m2
