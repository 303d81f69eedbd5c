; Directives close at the first bundle.
; parse-error: line 8:1: directives must come before the first bundle
.format 1
.pe 0
.pes 1
.mem 4
nop
.mem 8
