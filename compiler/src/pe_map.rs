//! A map from (PE, value) pairs, for the passes that follow every value over a whole unrolled
//! schedule (the list scheduler's arrival times, codegen's lifetimes).
//!
//! Most values of an unrolled schedule are partial sums that never leave the PE that made them,
//! and a hash map per PE holding millions of them spends its time on cache misses. So the first
//! PE a value is recorded on is kept in a vector indexed by the value (one slot each), and only
//! the values that also reach other PEs (inputs and sent values, a small share) go to a hash
//! map per PE. Lookups and updates behave exactly as one map per PE would.

use crate::schedule::Val;
use cranelift_entity::EntityRef;
use rustc_hash::FxHashMap as HashMap;

const NO_PE: u32 = u32::MAX;

pub struct PeValMap<T: Copy> {
    /// Per value: the first PE it was recorded on (`NO_PE` if none yet) and its entry there.
    first: Vec<(u32, T)>,
    /// Per PE: entries of values whose first PE is another one.
    rest: Vec<HashMap<Val, T>>,
    filler: T,
}

impl<T: Copy> PeValMap<T> {
    /// A map for `pes` PEs with room for values below `vals` (more grow it); `filler` is never
    /// read back, it only fills unused slots.
    pub fn new(pes: usize, vals: usize, filler: T) -> Self {
        PeValMap {
            first: vec![(NO_PE, filler); vals],
            rest: (0..pes).map(|_| HashMap::default()).collect(),
            filler,
        }
    }

    pub fn get(&self, pe: usize, v: Val) -> Option<T> {
        match self.first.get(v.index()) {
            Some(&(p, t)) if p as usize == pe => Some(t),
            Some(&(p, _)) if p == NO_PE => None,
            _ => self.rest.get(pe)?.get(&v).copied(),
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
}
