; An operand address beyond the PE's memory (m0..m3).
; preload: 0 m0=2
; fault: addr-out-of-range: PE 0, cycle 0 (bundle 0: mul m0, m4): address m4 is out of range
.format 1
.pe 0
.pes 1
.mem 4
mul m0, m4
