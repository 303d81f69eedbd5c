//! Helpers shared by the bench binaries.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Threads a bench spreads its items over: one per core.
pub fn workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `f` over `items` on every core, results in the items' order. Items are handed out one at a
/// time, so a few slow ones do not leave a core idle behind a fixed split.
pub fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..workers() {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let out = f(item);
                results.lock().expect("no worker panicked")[i] = Some(out);
            });
        }
    });
    results
        .into_inner()
        .expect("no worker panicked")
        .into_iter()
        .map(|o| o.expect("every item measured"))
        .collect()
}
