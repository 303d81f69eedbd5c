; Only .format, .pe, .pes and .mem exist.
; parse-error: line 7:1: unknown directive `.org` (expected .format, .pe, .pes or .mem)
.format 1
.pe 0
.pes 1
.mem 4
.org 0
