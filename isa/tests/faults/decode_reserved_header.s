; The reserved header field must be zero (checksum fixed so that the check is reached).
; bytes: set 10 1
; bytes: crc
; decode-error: invalid-header: invalid header: reserved field is 0x0001, must be 0
.format 1
.pe 0
.pes 1
.mem 4
nop
