//! A map from (PE, value) pairs, for the passes that follow every value over a whole unrolled
//! schedule (the list scheduler's arrival times, codegen's lifetimes).
//!
//! Most values of an unrolled schedule are partial sums that never leave the PE that made them,
//! and a hash map per PE holding millions of them spends its time on cache misses. So the first
//! PE a value is recorded on is kept in a vector indexed by the value (one slot each). A value
//! that also reaches other PEs (inputs and sent values, a small share) travels over the ring's
//! links, so it is mostly recorded on the PEs right after its first, one after another: those
//! entries are kept as the value's run, in one block of a shared vector, and only an entry off
//! its run goes to a hash map per PE (hashing every travelling value cost the row dataflow's list
//! scheduler about half its time on rings of 256 PEs). Lookups and updates behave exactly as one
//! map per PE would.

use crate::schedule::Val;
use cranelift_entity::EntityRef;
use rustc_hash::FxHashMap as HashMap;

const NO_PE: u32 = u32::MAX;

pub struct PeValMap<T: Copy> {
    /// Per value: the first PE it was recorded on (`NO_PE` if none yet) and its entry there.
    first: Vec<(u32, T)>,
    /// Per value with a run (grown only that far): where its run starts in `runs` and how many
    /// PEs after the first it covers. A block holds the next power of two of entries at least,
    /// and moves to the end, twice the size, when the run outgrows it.
    run: Vec<(u32, u32)>,
    runs: Vec<T>,
    /// Per PE: entries of values whose first PE is another one, off the value's run.
    rest: Vec<HashMap<Val, T>>,
    filler: T,
}

impl<T: Copy> PeValMap<T> {
    /// A map for `pes` PEs with room for values below `vals` (more grow it); `filler` is never
    /// read back, it only fills unused slots.
    pub fn new(pes: usize, vals: usize, filler: T) -> Self {
        PeValMap {
            first: vec![(NO_PE, filler); vals],
            run: Vec::new(),
            runs: Vec::new(),
            rest: (0..pes).map(|_| HashMap::default()).collect(),
            filler,
        }
    }

    /// Going round the ring, how many PEs `pe` is after `first` (both on the ring).
    #[inline]
    fn hop(&self, first: u32, pe: usize) -> Option<usize> {
        let m = self.rest.len();
        let first = first as usize;
        if first >= m || pe >= m {
            return None;
        }
        Some(if pe >= first {
            pe - first
        } else {
            pe + m - first
        })
    }

    /// The slot in `runs` of the entry of value `i` (first on `first`) on `pe`, if on its run.
    #[inline]
    fn on_run(&self, i: usize, first: u32, pe: usize) -> Option<usize> {
        let &(start, len) = self.run.get(i)?;
        let j = self.hop(first, pe)?;
        (j >= 1 && j <= len as usize).then(|| start as usize + j - 1)
    }

    #[inline]
    pub fn get(&self, pe: usize, v: Val) -> Option<T> {
        let i = v.index();
        match self.first.get(i) {
            Some(&(p, t)) if p as usize == pe => Some(t),
            Some(&(p, _)) if p == NO_PE => None,
            Some(&(p, _)) => match self.on_run(i, p, pe) {
                Some(k) => self.runs.get(k).copied(),
                None => self.rest.get(pe)?.get(&v).copied(),
            },
            None => self.rest.get(pe)?.get(&v).copied(),
        }
    }

    /// Sets the entry of `v` on `pe`; returns the one it replaces.
    pub fn insert(&mut self, pe: usize, v: Val, t: T) -> Option<T> {
        let i = v.index();
        if i >= self.first.len() {
            self.first.resize(i + 1, (NO_PE, self.filler));
        }
        let slot = &mut self.first[i];
        if slot.0 == NO_PE {
            *slot = (pe as u32, t);
            return None;
        }
        if slot.0 as usize == pe {
            return Some(std::mem::replace(&mut slot.1, t));
        }
        let first = slot.0;
        if let Some(k) = self.on_run(i, first, pe) {
            return self.runs.get_mut(k).map(|e| std::mem::replace(e, t));
        }
        let (start, len) = self.run.get(i).copied().unwrap_or((0, 0));
        let next = self.hop(first, pe) == Some(len as usize + 1);
        if next && self.rest.get(pe).is_some_and(|r| !r.contains_key(&v)) {
            // The run grows by one PE: into its block while there is room (a block holds
            // `len.next_power_of_two()` entries), else into one twice the size at the end.
            let start = if len == 0 || len.is_power_of_two() {
                let at = self.runs.len();
                let (from, n) = (start as usize, len as usize);
                self.runs.extend_from_within(from..from + n);
                let room = (2 * n).max(1);
                self.runs.resize(at + room, self.filler);
                at as u32
            } else {
                start
            };
            if self.run.len() <= i {
                self.run.resize(i + 1, (0, 0));
            }
            self.run[i] = (start, len + 1);
            self.runs[(start + len) as usize] = t;
            return None;
        }
        self.rest[pe].insert(v, t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against one hash map per PE, over values that stay, travel and come back.
    #[test]
    fn behaves_as_one_map_per_pe() {
        let pes = 5;
        let mut map = PeValMap::new(pes, 3, 0u32);
        let mut plain: Vec<HashMap<Val, u32>> = vec![HashMap::default(); pes];
        let mut x = 12345u64;
        for step in 0..20_000u32 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let pe = ((x >> 33) % pes as u64) as usize;
            let v = Val::new(((x >> 40) % 64) as usize);
            if (x >> 20).is_multiple_of(3) {
                assert_eq!(map.insert(pe, v, step), plain[pe].insert(v, step));
            }
            for (q, one) in plain.iter().enumerate() {
                assert_eq!(map.get(q, v), one.get(&v).copied());
            }
        }
        assert_eq!(map.get(pes, Val::new(1000)), None);
    }

    /// Against one hash map per PE, over values that travel round the ring one PE at a time (the
    /// runs, growing past several block sizes and wrapping round), with some off their run.
    #[test]
    fn runs_behave_as_one_map_per_pe() {
        let pes = 37;
        let mut map = PeValMap::new(pes, 0, 0u32);
        let mut plain: Vec<HashMap<Val, u32>> = vec![HashMap::default(); pes];
        let mut x = 99u64;
        let mut step = 0u32;
        for v in 0..200usize {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let first = ((x >> 33) % pes as u64) as usize;
            let hops = ((x >> 45) % (2 * pes as u64)) as usize;
            let v = Val::new(v);
            for j in 0..hops {
                step += 1;
                // Mostly the next PE of the run, sometimes one further on, sometimes back.
                let pe = match (x >> (j % 40)) % 7 {
                    0 => (first + j + 2) % pes,
                    1 => (first + j / 2) % pes,
                    _ => (first + j) % pes,
                };
                assert_eq!(map.insert(pe, v, step), plain[pe].insert(v, step));
                for (q, one) in plain.iter().enumerate() {
                    assert_eq!(map.get(q, v), one.get(&v).copied());
                }
            }
        }
        for v in 0..210usize {
            let v = Val::new(v);
            for (q, one) in plain.iter().enumerate() {
                assert_eq!(map.get(q, v), one.get(&v).copied());
            }
        }
    }
}
