; The op and the acc of one bundle both write m1.
; preload: 0 m0=2 m1=0
; fault: write-conflict: PE 0, cycle 0 (bundle 0: mul m0, m0 -> m1 | add m1 -> m1): two writes to m1 in one cycle
.format 1
.pe 0
.pes 1
.mem 4
mul m0, m0 -> m1 | add m1 -> m1
