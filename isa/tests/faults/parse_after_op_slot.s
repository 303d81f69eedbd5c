; Something other than a bar after the op slot.
; parse-error: line 7:18: unexpected `m3` after the op slot; expected `->`, `|` or end of line
.format 1
.pe 0
.pes 1
.mem 4
mul m0, m1 -> m2 m3
