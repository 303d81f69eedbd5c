; Bundle bytes 2..4 are reserved.
; bytes: set 30 1
; bytes: crc
; decode-error: invalid-bundle: invalid bundle 0: reserved bytes 2..4 are not 0
.format 1
.pe 0
.pes 1
.mem 4
mul m0, m1
