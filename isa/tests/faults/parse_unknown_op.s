; Only nop, mul, exp and div are ops.
; parse-error: line 7:1: unknown op mnemonic `fma` (expected nop, mul, exp, div, max, expd)
.format 1
.pe 0
.pes 1
.mem 4
fma m0, m1
