; Reads see memory as it was at the start of the cycle: in cycle 0, m1 is read (2) and
; overwritten (by 3*3) at once; the read is not disturbed. exp(0 * x) is exactly 1.
; preload: 0 m0=3 m1=2
; check: 0 m1=9 m2=2 m3=1
; expect: ok after 2 cycles
.format 1
.pe 0
.pes 1
.mem 4
mul m0, m0 -> m1 | nop | send m1 -> m2
exp m1, 0 -> m3
