; A program with no bundles still needs its header; the error is placed past the last line.
; parse-error: line 6:1: missing `.mem` directive (required before the first bundle)
.format 1
.pe 0
.pes 1
