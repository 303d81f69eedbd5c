; One value per directive.
; parse-error: line 4:7: unexpected `1` after the directive's value
.format 1
.pe 0 1
.pes 2
.mem 4
