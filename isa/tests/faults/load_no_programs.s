; A file with no program at all: there is nothing to load.
; (nothing here)
; load-error: no-programs: no programs to load
