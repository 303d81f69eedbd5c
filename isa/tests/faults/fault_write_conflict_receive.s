; PE 0 sends into m1 of PE 1 in the same cycle as PE 1's op writes its own m1: the fault
; names the PE whose memory would be written twice.
; preload: 0 m0=3
; preload: 1 m0=2
; fault: write-conflict: PE 1, cycle 0 (bundle 0: mul m0, m0 -> m1): two writes to m1 in one cycle
.format 1
.pe 0
.pes 2
.mem 4
nop | nop | send m0 -> m1
; ---
.format 1
.pe 1
.pes 2
.mem 4
mul m0, m0 -> m1
