; send acc needs an acc in the same bundle.
; preload: 0 m0=1
; fault: send-acc-without-acc: PE 0, cycle 0 (bundle 0: mul m0, m0 -> m1 | nop | send acc -> m2): send acc without an acc in the same bundle
.format 1
.pe 0
.pes 1
.mem 4
mul m0, m0 -> m1 | nop | send acc -> m2
