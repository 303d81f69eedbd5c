; An op destination beyond the PE's memory.
; preload: 0 m0=2
; fault: addr-out-of-range: PE 0, cycle 0 (bundle 0: exp m0, 0.5 -> m9): address m9 is out of range
.format 1
.pe 0
.pes 1
.mem 4
exp m0, 0.5 -> m9
