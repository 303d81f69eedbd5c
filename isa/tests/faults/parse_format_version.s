; Text from another format version is refused, not guessed at.
; parse-error: line 3:9: unsupported format version 2 (this assembler reads version 1)
.format 2
.pe 0
.pes 1
.mem 4
