; The input ends before the bundles the header announces.
; bytes: drop 10
; decode-error: truncated: truncated input
.format 1
.pe 0
.pes 1
.mem 4
mul m0, m1
