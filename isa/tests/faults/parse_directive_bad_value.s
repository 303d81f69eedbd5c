; Directive values are decimal u32s.
; parse-error: line 5:6: bad value `0x4` for `.pes` (expected a decimal number up to 4294967295)
.format 1
.pe 0
.pes 0x4
.mem 4
