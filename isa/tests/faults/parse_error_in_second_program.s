; Line numbers are the file's, also in a later PE's program.
; parse-error: line 14:11: unexpected `,` after the op slot; expected `->`, `|` or end of line
.format 1
.pe 0
.pes 2
.mem 4
nop
; ---
.format 1
.pe 1
.pes 2
.mem 4
nop
mul m0, m1, m2
