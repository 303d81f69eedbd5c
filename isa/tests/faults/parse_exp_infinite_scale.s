; inf parses as a float but is not a finite scale.
; parse-error: line 7:9: scale `inf` is not a finite f32
.format 1
.pe 0
.pes 1
.mem 4
exp m0, inf
