//! Where the split simulation books what it does: into a [`Builder`], which makes the schedule,
//! or into a [`Tally`], which keeps only what decides whether the builder would have accepted
//! it. Most of the local search's runs are compared by their length and dropped; they are
//! simulated against a tally, and the few whose schedule is kept are simulated again, the same
//! way, into a builder (a run depends only on its plan, priorities and limit).

use crate::schedule::{accepts, Builder, Element, Val, Work};

/// What the simulation books.
pub(super) trait Book {
    fn computed(&mut self) -> Val;
    fn work(&mut self, pe: u32, cycle: usize, phase: u8, work: Work);
    fn send(&mut self, pe: u32, cycle: usize, val: Val);
    fn output(&mut self, element: Element, pe: u32, val: Val);
    fn bug(&mut self, pass: &'static str, what: String);
}

impl Book for Builder {
    fn computed(&mut self) -> Val {
        Builder::computed(self)
    }
    fn work(&mut self, pe: u32, cycle: usize, phase: u8, work: Work) {
        Builder::work(self, pe, cycle, phase, work)
    }
    fn send(&mut self, pe: u32, cycle: usize, val: Val) {
        Builder::send(self, pe, cycle, val)
    }
    fn output(&mut self, element: Element, pe: u32, val: Val) {
        Builder::output(self, element, pe, val)
    }
    fn bug(&mut self, pass: &'static str, what: String) {
        Builder::bug(self, pass, what)
    }
}

/// A booking that records nothing but whether the builder would have refused any of it: a PE
/// outside the ring, work outside its phase, a slot booked twice in one cycle, or a reported
/// inconsistency. Values are numbered as the builder numbers them.
pub(super) struct Tally {
    pes: u32,
    next: u32,
    /// Per PE, one more than the last cycle with an operation booked, and with a send (0: none).
    /// The simulation books each PE's cycles in increasing order, so a slot booked twice is
    /// one booked in the cycle last booked.
    ops: Vec<usize>,
    sends: Vec<usize>,
    pub(super) failed: bool,
}

impl Tally {
    /// Against `b`'s values and errors so far: the same start as `b.fork(..)`.
    pub(super) fn new(b: &Builder) -> Tally {
        let pes = b.pes();
        Tally {
            pes,
            next: b.vals() as u32,
            ops: vec![0; pes as usize],
            sends: vec![0; pes as usize],
            failed: b.failed(),
        }
    }

    /// Marks `cycle` booked in `last` (one more than the cycle last booked) on `pe`.
    fn book(&mut self, pe: u32, cycle: usize, ops: bool) {
        let last = if ops { &mut self.ops } else { &mut self.sends };
        match last.get_mut(pe as usize) {
            None => self.failed = true,
            Some(l) => {
                // Cycles come in increasing order per PE: anything at or before the last
                // booked one is either a double booking or out of order, and the builder would
                // refuse the first (the second never happens; refusing it too is safe).
                if cycle < *l {
                    self.failed = true;
                }
                *l = cycle + 1;
            }
        }
    }
}

impl Book for Tally {
    fn computed(&mut self) -> Val {
        let v = Val::from_u32(self.next);
        self.next += 1;
        v
    }
    fn work(&mut self, pe: u32, cycle: usize, phase: u8, work: Work) {
        if !accepts(phase, &work) {
            self.failed = true;
            return;
        }
        self.book(pe, cycle, true);
    }
    fn send(&mut self, pe: u32, cycle: usize, _val: Val) {
        if self.pes == 1 {
            return;
        }
        self.book(pe, cycle, false);
    }
    fn output(&mut self, _element: Element, _pe: u32, _val: Val) {}
    fn bug(&mut self, _pass: &'static str, _what: String) {
        self.failed = true;
    }
}
