; An acc with no op to add: the slot structure is checked before anything is read, so the
; out-of-range m99 is not what is reported.
; fault: acc-without-op: PE 0, cycle 0 (bundle 0: nop | add m99 -> m1): acc slot used without an op (the acc adds the op result)
.format 1
.pe 0
.pes 1
.mem 4
nop | add m99 -> m1
