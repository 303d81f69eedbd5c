; The op slot comes first; a bundle cannot start with the acc.
; parse-error: line 7:1: `add` is not an op; the op slot comes first (write `nop | add ...`)
.format 1
.pe 0
.pes 1
.mem 4
add 0 -> m1
