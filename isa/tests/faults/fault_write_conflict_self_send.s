; With one PE the link loops back: a send to m2 and the op's write to m2 collide.
; preload: 0 m0=3
; fault: write-conflict: PE 0, cycle 0 (bundle 0: exp m0, 1.0 -> m2 | nop | send m0 -> m2): two writes to m2 in one cycle
.format 1
.pe 0
.pes 1
.mem 4
exp m0, 1 -> m2 | nop | send m0 -> m2
