; attnc ring microcode
.format 1
.pe 0
.pes 2
.mem 9
mul m0, m0 | add 0 -> m4 | send m0 -> m2
mul m1, m1 | add m4 -> m4 | send m1 -> m3
mul m2, m0 | add 0 -> m5 | send m2 -> m5
mul m3, m1 | add m5 -> m5 | send m3 -> m6
mul m2, m2 | add 0 -> m6
mul m3, m3 | add m6 -> m6
exp m4, 0.70710677 -> m4 | add 0 -> m7
div m4, m7 -> m4
exp m5, 0.70710677 -> m5 | add 0 -> m7
exp m6, 0.70710677 -> m6 | add m7 -> m7
div m5, m7 -> m5
div m6, m7 -> m6
mul m4, m0 | add 0 -> m7
mul m4, m1 | add 0 -> m4
mul m5, m0 | add 0 -> m8
mul m5, m1 | add 0 -> m5
mul m6, m2 | add m8 -> m8
mul m6, m3 | add m5 -> m5
