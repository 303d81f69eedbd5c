; The xfer slot holds nop or send.
; parse-error: line 7:20: unknown xfer mnemonic `recv` (expected nop or send)
.format 1
.pe 0
.pes 1
.mem 4
mul m0, m1 | nop | recv m2
