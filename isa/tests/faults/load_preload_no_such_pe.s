; A preload for a PE the ring does not have.
; preload: 1 m0=1
; load-error: no-such-pe: preload to PE 1, but the ring has 1 PEs
.format 1
.pe 0
.pes 1
.mem 4
nop
