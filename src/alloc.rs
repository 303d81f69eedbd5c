//! The allocator of every program that proves or compiles large layers: the `attnc` binary,
//! the benches that stand for it, and the test suite each name `mimalloc::MiMalloc` their
//! global allocator. This library does not declare it for them: the fuzz targets link it too,
//! and their sanitizers watch the system allocator's heap. The per-PE proofs build and drop
//! the same structures PE after PE; with the system allocator that took about 30 % of a large
//! proof's CPU time.

/// `mi_option_purge_delay` of the bundled mimalloc (v3), which `libmimalloc_sys` does not
/// name.
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Lets the allocator keep the pages it frees instead of handing them back to the system
/// after a second (its default delay): faulting them in again took a few per cent of a large
/// proof's time. Call it first thing in `main`.
pub fn keep_freed_pages() {
    // SAFETY: sets one of the allocator's options, a plain integer it reads when it purges;
    // callers do this before starting any thread. -1 never purges.
    unsafe {
        libmimalloc_sys::mi_option_set(PURGE_DELAY, -1);
    }
}

#[cfg(test)]
mod tests {
    use super::PURGE_DELAY;

    /// The option set is the purge delay: its default in the bundled mimalloc v3 is 1000 ms,
    /// and after the call the allocator never purges. Fails if a newer bundled mimalloc
    /// numbers its options otherwise.
    #[test]
    fn the_option_set_is_the_purge_delay() {
        // SAFETY: reads an allocator option, a plain integer.
        let before = unsafe { libmimalloc_sys::mi_option_get(PURGE_DELAY) };
        assert_eq!(
            before, 1000,
            "option {PURGE_DELAY} is not the purge delay of 1000 ms"
        );
        super::keep_freed_pages();
        // SAFETY: as above.
        let after = unsafe { libmimalloc_sys::mi_option_get(PURGE_DELAY) };
        assert_eq!(after, -1);
    }
}
