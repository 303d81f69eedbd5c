; A program edited in its binary form that still decodes runs as decoded: the header's
; .mem changed from 4 to 2, so writing m3 is out of range.
; bytes: set 20 2
; bytes: crc
; preload: 0 m0=1
; fault: addr-out-of-range: PE 0, cycle 0 (bundle 0: mul m0, m0 -> m3): address m3 is out of range
.format 1
.pe 0
.pes 1
.mem 4
mul m0, m0 -> m3
