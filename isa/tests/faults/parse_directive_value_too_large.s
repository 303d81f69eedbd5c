; Directive values are decimal u32s; this one does not fit.
; parse-error: line 6:6: bad value `4294967296` for `.mem` (expected a decimal number up to 4294967295)
.format 1
.pe 0
.pes 1
.mem 4294967296
