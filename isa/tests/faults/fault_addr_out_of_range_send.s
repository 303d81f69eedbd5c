; A send into the next PE's memory is checked against the receiver's size: PE 1 has 2
; words, PE 0 has 8. The fault is PE 0's, the sender.
; preload: 0 m5=1
; fault: addr-out-of-range: PE 0, cycle 0 (bundle 0: nop | nop | send m5 -> m5): address m5 is out of range
.format 1
.pe 0
.pes 2
.mem 8
nop | nop | send m5 -> m5
; ---
.format 1
.pe 1
.pes 2
.mem 2
nop
