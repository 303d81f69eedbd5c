; A future format version is reported as such, before anything else is looked at.
; bytes: set 8 9
; decode-error: unsupported-version: unsupported format version 9 (flat programs are versions 1 to 2, loop programs 3 and 4)
.format 1
.pe 0
.pes 1
.mem 4
nop
