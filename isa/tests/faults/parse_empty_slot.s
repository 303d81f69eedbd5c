; An idle slot is written nop, not left empty.
; parse-error: line 7:14: empty acc slot (write `nop` for an idle slot)
.format 1
.pe 0
.pes 1
.mem 4
mul m0, m1 | | send m0 -> m1
