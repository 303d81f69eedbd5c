; A preload beyond the PE's memory.
; preload: 0 m4=1
; load-error: addr-out-of-range: preload to m4 of PE 0, which has 4 words
.format 1
.pe 0
.pes 1
.mem 4
nop
