; A word goes once round a ring of three, one hop per cycle, and back to where it began.
; The programs have different lengths: PE 1's ends after cycle 0 and it still receives.
; preload: 1 m0=7
; check: 2 m1=7
; check: 0 m2=7
; check: 1 m3=7
; expect: ok after 3 cycles
.format 1
.pe 0
.pes 3
.mem 4
nop
nop
nop | nop | send m2 -> m3
; ---
.format 1
.pe 1
.pes 3
.mem 4
nop | nop | send m0 -> m1
; ---
.format 1
.pe 2
.pes 3
.mem 4
nop
nop | nop | send m1 -> m2
