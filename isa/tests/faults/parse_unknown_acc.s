; The acc slot holds nop or add.
; parse-error: line 7:14: unknown acc mnemonic `sub` (expected nop or add)
.format 1
.pe 0
.pes 1
.mem 4
mul m0, m1 | sub m2
