//! The allocator of every program that proves or compiles large layers: the `attnc` binary,
//! the benches that stand for it, and the test suite each name `mimalloc::MiMalloc` their
//! global allocator (a library cannot choose it for them). The per-PE proofs build and drop
//! the same structures PE after PE; with the system allocator that took about a third of a
//! large proof's time.

/// Lets the allocator keep the pages it frees instead of handing them back to the system
/// after a second (its default delay): faulting them in again took a few per cent of a large
/// proof's time. Call it
/// first thing in `main`.
pub fn keep_freed_pages() {
    // Option 15 is `mi_option_purge_delay` of the bundled mimalloc (v3); -1 never purges.
    const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    // SAFETY: sets one of the allocator's options, a plain integer it reads when it purges;
    // callers do this before starting any thread.
    unsafe {
        libmimalloc_sys::mi_option_set(PURGE_DELAY, -1);
    }
}

#[cfg(test)]
mod tests {
    /// Option 15 is the purge delay: its default in the bundled mimalloc v3 is 1000 ms, and
    /// after the call the allocator never purges. Fails if a newer bundled mimalloc numbers its
    /// options otherwise.
    #[test]
    fn the_option_set_is_the_purge_delay() {
        // SAFETY: reads an allocator option, a plain integer.
        let before = unsafe { libmimalloc_sys::mi_option_get(15) };
        assert_eq!(before, 1000, "option 15 is not the purge delay of 1000 ms");
        super::keep_freed_pages();
        // SAFETY: as above.
        let after = unsafe { libmimalloc_sys::mi_option_get(15) };
        assert_eq!(after, -1);
    }
}
