//! The allocator of every program that proves or compiles large layers: the `attnc` binary,
//! the benches that stand for it, and the test suite each name `mimalloc::MiMalloc` their
//! global allocator (a library cannot choose it for them). The per-PE proofs build and drop
//! the same structures PE after PE; with the system allocator that took about a third of a
//! large proof's time.

/// Lets the allocator keep the pages it frees instead of handing them back to the system
/// after 10 ms: faulting them in again took about a tenth of a large proof's time. Call it
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
