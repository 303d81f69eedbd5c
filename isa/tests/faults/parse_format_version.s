; Text from another format version is refused, not guessed at.
; parse-error: line 3:9: unsupported format version 3 (this assembler reads versions 1 to 2)
.format 3
.pe 0
.pes 1
.mem 4
