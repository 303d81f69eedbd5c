; A dot product of two 3-vectors accumulated on PE 0 while PE 1 receives each partial sum:
; 1*4 + 2*5 + 3*6 = 32.
; preload: 0 m0=1 m1=2 m2=3 m3=4 m4=5 m5=6
; check: 0 m6=32
; check: 1 m0=4 m1=14 m2=32
; expect: ok after 3 cycles
.format 1
.pe 0
.pes 2
.mem 8
mul m0, m3 | add 0 -> m6 | send acc -> m0
mul m1, m4 | add m6 -> m6 | send acc -> m1
mul m2, m5 | add m6 -> m6 | send acc -> m2
; ---
.format 1
.pe 1
.pes 2
.mem 3
