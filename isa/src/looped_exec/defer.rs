//! Sends held back to the end of a window, for blocks that rotate in place.
//!
//! A window runs its PEs one after another, so a send written straight into the receiver's
//! memory is seen by everything the receiver does later in the window, whatever its cycle.
//! The planners therefore refuse a window in which a PE touches a word its predecessor sends.
//! One pattern needs exactly that: a block rotating in place, where every PE reads word `a`
//! of its block in the cycle its predecessor overwrites it (the write lands at the end of the
//! cycle, so the read sees the old word). Such a window may run if every read of a sent word
//! comes no later than each write to it; the sends then go to a list that is applied after
//! every PE has run its part, so every read sees the word as it was before the window, which
//! is what cycle-by-cycle execution gives it.

use super::Prog;

/// Where a window's sends land.
pub(super) struct Sink {
    /// Held back (receiver, address, word), in the order they were made; `None`: straight
    /// into the receiver's memory.
    held: Option<Vec<(usize, usize, f32)>>,
}

impl Sink {
    /// Sends that land as they are made.
    pub(super) fn direct() -> Sink {
        Sink { held: None }
    }

    /// Sends held back until [`Sink::flush`], reusing the allocation of `buf` (empty: what
    /// the last flush gave back).
    pub(super) fn held(buf: Vec<(usize, usize, f32)>) -> Sink {
        Sink { held: Some(buf) }
    }

    #[inline(always)]
    pub(super) fn put(&mut self, mems: &mut [Vec<Option<f32>>], pe: usize, addr: usize, v: f32) {
        match &mut self.held {
            None => mems[pe][addr] = Some(v),
            Some(buf) => buf.push((pe, addr, v)),
        }
    }

    /// Applies the held sends in the order they were made (a PE's sends come in its cycle
    /// order, and each word has one sender, so the last write to a word is the one kept) and
    /// gives back the buffer.
    pub(super) fn flush(self, mems: &mut [Vec<Option<f32>>]) -> Vec<(usize, usize, f32)> {
        let mut buf = self.held.unwrap_or_default();
        for &(pe, addr, v) in &buf {
            mems[pe][addr] = Some(v);
        }
        buf.clear();
        buf
    }
}

/// A stretch's accesses of one field: the cycle it starts at within the window, the address
/// progression and its length.
pub(super) type Access = (i64, Prog, i64);

/// How a predecessor's sends in a window meet a PE's own accesses in it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Meet {
    /// No word is both sent and touched: sends may land at once.
    Apart,
    /// Some sent words are read, each read no later than every write to its word: the
    /// window runs with its sends held back.
    ReadsFirst,
    /// A sent word is written by the PE too, or may be read after it is sent (or the
    /// progressions are not simple enough to tell): the window cannot run.
    Clash,
}

fn hull((_, pr, len): Access) -> (i64, i64) {
    pr.span(len)
}

fn overlap(a: (i64, i64), b: (i64, i64)) -> bool {
    a.0 <= b.1 && b.0 <= a.1
}

/// Whether every word both sent by `send` and read by `read` is read no later than it is
/// sent. Only progressions of one non-zero stride are decided (a send in cycle `os + t` of
/// word `s + σt` meets a read in cycle `or + u` of word `r + σu` exactly where
/// `u − t = (s − r)/σ`, so the read comes first everywhere or nowhere); anything else is
/// answered no.
fn read_first(send: Access, read: Access) -> bool {
    let ((os, s, _), (or, r, _)) = (send, read);
    if s.stride != r.stride || s.stride == 0 {
        return false;
    }
    let gap = s.addr - r.addr;
    if gap % s.stride != 0 {
        // The two progressions never name the same word.
        return true;
    }
    or + gap / s.stride <= os
}

/// How `sends` (the predecessor's send destinations) meet the PE's `reads` and `writes`.
pub(super) fn meet(sends: &[Access], reads: &[Access], writes: &[Access]) -> Meet {
    let mut out = Meet::Apart;
    for &s in sends {
        let hs = hull(s);
        if writes.iter().any(|&w| overlap(hs, hull(w))) {
            return Meet::Clash;
        }
        for &r in reads {
            if overlap(hs, hull(r)) {
                if !read_first(s, r) {
                    return Meet::Clash;
                }
                out = Meet::ReadsFirst;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pr(addr: i64, stride: i64) -> Prog {
        Prog { addr, stride }
    }

    #[test]
    fn a_read_in_the_cycle_of_the_send_comes_first() {
        let send = (0, pr(100, 1), 64);
        assert_eq!(meet(&[send], &[(0, pr(100, 1), 64)], &[]), Meet::ReadsFirst);
        // Read one cycle before the word is sent: still first.
        assert_eq!(meet(&[send], &[(0, pr(101, 1), 63)], &[]), Meet::ReadsFirst);
        // Read one cycle after: the old word is gone by then.
        assert_eq!(meet(&[send], &[(1, pr(100, 1), 63)], &[]), Meet::Clash);
        assert_eq!(meet(&[send], &[(0, pr(99, 1), 64)], &[]), Meet::Clash);
    }

    #[test]
    fn writes_strides_and_disjoint_words() {
        let send = (0, pr(100, 2), 10);
        // Interleaved words (odd against even) never meet.
        assert_eq!(meet(&[send], &[(5, pr(101, 2), 10)], &[]), Meet::ReadsFirst);
        // Other strides are not decided.
        assert_eq!(meet(&[send], &[(0, pr(100, 1), 10)], &[]), Meet::Clash);
        assert_eq!(
            meet(&[(0, pr(100, 0), 4)], &[(0, pr(100, 0), 1)], &[]),
            Meet::Clash
        );
        // Any write to a sent word clashes; words apart do not meet at all.
        assert_eq!(meet(&[send], &[], &[(0, pr(118, 1), 1)]), Meet::Clash);
        assert_eq!(
            meet(&[send], &[(0, pr(200, 1), 9)], &[(0, pr(0, 1), 9)]),
            Meet::Apart
        );
    }
}
