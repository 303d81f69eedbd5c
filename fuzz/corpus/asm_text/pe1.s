; attnc ring microcode
.format 1
.pe 1
.pes 2
.mem 10
mul m0, m0 | add 0 -> m3
mul m1, m1 | add m3 -> m4
mul m0, m2 | add 0 -> m6
mul m1, m3 | add m6 -> m7
mul m0, m5 | add 0 -> m8
mul m1, m6 | add m8 -> m8
exp m7, 0.70710677 -> m7 | add 0 -> m9
exp m8, 0.70710677 -> m8 | add m9 -> m9
exp m4, 0.70710677 -> m4 | add m9 -> m9
div m7, m9 -> m7
div m8, m9 -> m8
div m4, m9 -> m4
mul m4, m0 | add 0 -> m9
mul m4, m1 | add 0 -> m4
mul m7, m2 | add m9 -> m2
mul m7, m3 | add m4 -> m3
mul m8, m5 | add m2 -> m2
mul m8, m6 | add m3 -> m3
