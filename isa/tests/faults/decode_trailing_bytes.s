; Bytes after the checksum.
; bytes: append 0
; decode-error: trailing-bytes: trailing bytes after the checksum
.format 1
.pe 0
.pes 1
.mem 4
nop
