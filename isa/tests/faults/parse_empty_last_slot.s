; A trailing bar opens a slot that must not be empty.
; parse-error: line 7:13: empty acc slot (write `nop` for an idle slot)
.format 1
.pe 0
.pes 1
.mem 4
mul m0, m1 |
