; Every directive is required before the first bundle.
; parse-error: line 6:1: missing `.format` directive (required before the first bundle)
.pe 0
.pes 1
.mem 4
nop
