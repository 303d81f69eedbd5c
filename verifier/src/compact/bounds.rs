//! Address extents of loop-program bundle templates over their iteration spaces, in closed form.
//!
//! An address is `base + Σ_level stride·g(i_level)` with `g(i) = i` or `i mod wrap`, at most one
//! term per level and field, so its extremes over a product of per-level index sets are the sums
//! of per-level extremes. A slot's predicates compare one index with a constant, so the indices at
//! which it executes are, per level, an interval minus some points. The only coupling between
//! levels is a stepped (triangular) trip count; the product of per-level sets over-approximates
//! it, which keeps an "in range" conclusion sound. An "out of range" conclusion needs a witness:
//! the extreme index vector is checked against the stepped trip count before it is reported.

use isa::looped::{field, Cmp, CountStep, Field, LBundle, Pred, Slot};

/// The enclosing loops of a template, outermost first.
#[derive(Clone, Copy, Debug)]
pub struct Level {
    pub count: u32,
    pub step: Option<CountStep>,
}

/// The indices in `[lo, hi)` except `nes`, at which a slot can execute at one level.
#[derive(Clone, Debug)]
pub(crate) struct Span {
    pub lo: u64,
    pub hi: u64,
    pub nes: Vec<u64>,
}

impl Span {
    fn of(bound: u64, preds: &[Pred], level: usize, slot: Slot) -> Span {
        let (mut lo, mut hi) = (0u64, bound);
        let mut eq: Option<u64> = None;
        let mut empty = false;
        let mut nes = Vec::new();
        for p in preds
            .iter()
            .filter(|p| p.slot == slot && usize::from(p.level) == level)
        {
            let v = u64::from(p.value);
            match p.cmp {
                Cmp::Lt => hi = hi.min(v),
                Cmp::Ge => lo = lo.max(v),
                Cmp::Ne => nes.push(v),
                Cmp::Eq => match eq {
                    Some(e) if e != v => empty = true,
                    _ => eq = Some(v),
                },
            }
        }
        if let Some(e) = eq {
            if e >= lo && e < hi {
                lo = e;
                hi = e + 1;
            } else {
                empty = true;
            }
        }
        if empty {
            hi = lo;
        }
        nes.sort_unstable();
        nes.dedup();
        nes.retain(|&x| x >= lo && x < hi);
        Span { lo, hi, nes }
    }

    pub fn contains(&self, i: u64) -> bool {
        i >= self.lo && i < self.hi && self.nes.binary_search(&i).is_err()
    }

    pub fn is_empty(&self) -> bool {
        self.hi.saturating_sub(self.lo) <= self.nes.len() as u64
    }

    pub fn first(&self) -> Option<u64> {
        (self.lo..self.hi).find(|&i| self.contains(i))
    }

    pub fn last(&self) -> Option<u64> {
        (self.lo..self.hi).rev().find(|&i| self.contains(i))
    }

    /// An index of `self` that `other` lacks, if any.
    pub fn not_in(&self, other: &Span) -> Option<u64> {
        if let Some(f) = self.first().filter(|&f| f < other.lo) {
            return Some(f);
        }
        if let Some(l) = self.last().filter(|&l| l >= other.hi) {
            return Some(l);
        }
        other.nes.iter().copied().find(|&x| self.contains(x))
    }

    /// Indices from both ends that include, for every value of `i mod wrap` the span attains,
    /// the largest and the smallest index attaining it: each excluded point hides at most one
    /// occurrence of a residue, and residues recur every `wrap` indices. `None` when that scan
    /// would be too long to be worth it (a hostile wrap).
    fn candidates(&self, wrap: u64) -> Option<Vec<u64>> {
        let w = wrap.max(1);
        let reach = w.checked_mul(self.nes.len() as u64 + 2)?;
        if reach > 1 << 16 {
            return None;
        }
        let len = self.hi.saturating_sub(self.lo);
        let mut out = Vec::new();
        if len <= 2 * reach {
            out.extend((self.lo..self.hi).filter(|&i| self.contains(i)));
        } else {
            out.extend((self.lo..self.lo + reach).filter(|&i| self.contains(i)));
            out.extend((self.hi - reach..self.hi).filter(|&i| self.contains(i)));
        }
        Some(out)
    }
}

/// What the extent of one field came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Extent {
    /// The slot never executes.
    Never,
    /// Every address lies in `lo..=hi`, which is inside the limit.
    Inside { lo: i64, hi: i64 },
    /// The address at these loop indices (outermost first) is `addr`, outside `0..limit`; the
    /// instance executes.
    Outside { addr: i64, at: Vec<u64> },
    /// The over-approximation leaves the limit but no executing instance was found that does.
    Unknown { lo: i64, hi: i64 },
}

/// Per level, the indices at which `slot` can execute (a stepped level up to its largest trip
/// count over the indices of the level it follows: the product over-approximates a triangle),
/// or `None` if it never executes.
pub(crate) fn spans(levels: &[Level], preds: &[Pred], slot: Slot) -> Option<Vec<Span>> {
    let mut spans: Vec<Span> = Vec::with_capacity(levels.len());
    for (k, lv) in levels.iter().enumerate() {
        let bound = match lv.step {
            None => u64::from(lv.count),
            Some(st) => {
                let outer = spans.get(usize::from(st.level))?;
                let i = if st.per > 0 {
                    outer.last()
                } else {
                    outer.first()
                }?;
                let t = i128::from(lv.count) + i128::from(st.per) * i128::from(i);
                u64::try_from(t.max(0)).unwrap_or(0)
            }
        };
        spans.push(Span::of(bound, preds, k, slot));
    }
    (!spans.iter().any(Span::is_empty)).then_some(spans)
}

/// Whether the loop indices `at` (outermost first) are inside every stepped trip count.
pub(crate) fn feasible(levels: &[Level], at: &[u64]) -> bool {
    levels.iter().enumerate().all(|(k, lv)| match lv.step {
        None => true,
        Some(st) => {
            let o = at.get(usize::from(st.level)).copied().unwrap_or(0);
            let trips = i128::from(lv.count) + i128::from(st.per) * i128::from(o);
            i128::from(at.get(k).copied().unwrap_or(0)) < trips
        }
    })
}

fn slot_of(f: Field) -> Slot {
    match f {
        Field::OpA | Field::OpB | Field::OpDst => Slot::Op,
        Field::AccSrc | Field::AccDst => Slot::Acc,
        Field::XferSrc | Field::XferDst => Slot::Xfer,
    }
}

/// The extent of field `f` of template `b` inside `levels`, against `0..limit`; `None` if the
/// bundle does not use the field.
pub fn extent(b: &LBundle, f: Field, levels: &[Level], limit: u64) -> Option<Extent> {
    let base = i64::from(field(&b.bundle, f)?);
    let Some(spans) = spans(levels, &b.preds, slot_of(f)) else {
        return Some(Extent::Never);
    };
    let (mut lo, mut hi) = (base, base);
    let mut at_lo: Vec<u64> = spans.iter().map(|s| s.first().unwrap_or(0)).collect();
    let mut at_hi = at_lo.clone();
    let mut exact = true;
    for t in b.terms.iter().filter(|t| t.field == f) {
        let k = usize::from(t.level);
        let Some(span) = spans.get(k) else {
            return Some(Extent::Unknown { lo, hi });
        };
        let value = |i: u64| {
            let g = if t.wrap == 0 {
                i
            } else {
                i % u64::from(t.wrap)
            };
            i64::from(t.stride) * g as i64
        };
        match span.candidates(u64::from(t.wrap)) {
            Some(cands) => {
                let (mut best_lo, mut best_hi) = (None::<(i64, u64)>, None::<(i64, u64)>);
                for i in cands {
                    let v = value(i);
                    if best_lo.is_none_or(|(b, _)| v < b) {
                        best_lo = Some((v, i));
                    }
                    if best_hi.is_none_or(|(b, _)| v > b) {
                        best_hi = Some((v, i));
                    }
                }
                let (Some((vl, il)), Some((vh, ih))) = (best_lo, best_hi) else {
                    return Some(Extent::Never);
                };
                lo += vl;
                hi += vh;
                at_lo[k] = il;
                at_hi[k] = ih;
            }
            None => {
                // Interval bound of `stride · (i mod wrap)`.
                let top = (span.hi.saturating_sub(1)).min(u64::from(t.wrap).saturating_sub(1));
                let v = i64::from(t.stride) * top as i64;
                lo += v.min(0);
                hi += v.max(0);
                exact = false;
            }
        }
    }
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    if lo >= 0 && hi < limit {
        return Some(Extent::Inside { lo, hi });
    }
    let feasible = |at: &[u64]| feasible(levels, at);
    if exact && hi >= limit && feasible(&at_hi) {
        return Some(Extent::Outside {
            addr: hi,
            at: at_hi,
        });
    }
    if exact && lo < 0 && feasible(&at_lo) {
        return Some(Extent::Outside {
            addr: lo,
            at: at_lo,
        });
    }
    Some(Extent::Unknown { lo, hi })
}

#[cfg(test)]
mod tests {
    use super::*;
    use isa::looped::Term;
    use isa::{Acc, Bundle, Op, Xfer};

    fn mul(a: u32, b: u32, dst: u32) -> Bundle {
        Bundle {
            op: Op::mul(a, b, Some(dst)),
            acc: Acc::Nop,
            xfer: Xfer::Nop,
        }
    }

    fn term(field: Field, level: u8, stride: i32, wrap: u32) -> Term {
        Term {
            field,
            level,
            stride,
            wrap,
        }
    }

    fn fixed(counts: &[u32]) -> Vec<Level> {
        counts
            .iter()
            .map(|&count| Level { count, step: None })
            .collect()
    }

    #[test]
    fn affine_extent_is_exact_and_a_witness_is_given_outside() {
        let b = LBundle {
            bundle: mul(0, 0, 10),
            terms: vec![
                term(Field::OpA, 0, 64, 0),
                term(Field::OpA, 1, 1, 0),
                term(Field::OpDst, 1, -1, 0),
            ],
            preds: vec![],
        };
        let lv = fixed(&[4, 64]);
        assert_eq!(
            extent(&b, Field::OpA, &lv, 256),
            Some(Extent::Inside { lo: 0, hi: 255 })
        );
        assert_eq!(
            extent(&b, Field::OpA, &lv, 255),
            Some(Extent::Outside {
                addr: 255,
                at: vec![3, 63]
            })
        );
        assert_eq!(
            extent(&b, Field::OpDst, &lv, 11),
            Some(Extent::Outside {
                addr: -53,
                at: vec![0, 63]
            })
        );
        assert_eq!(extent(&b, Field::AccSrc, &lv, 11), None);
    }

    #[test]
    fn wraps_and_predicates_bound_the_extent() {
        let mut bundle = mul(0, 0, 0);
        bundle.xfer = Xfer::Send {
            src: isa::XferSrc::Mem(100),
            dst: 100,
        };
        let b = LBundle {
            bundle,
            terms: vec![term(Field::OpA, 0, 64, 2), term(Field::XferSrc, 0, 1, 0)],
            preds: vec![Pred {
                slot: Slot::Xfer,
                level: 0,
                cmp: Cmp::Lt,
                value: 6,
            }],
        };
        let lv = fixed(&[7]);
        assert_eq!(
            extent(&b, Field::OpA, &lv, 65),
            Some(Extent::Inside { lo: 0, hi: 64 })
        );
        // The send runs for i0 < 6 only.
        assert_eq!(
            extent(&b, Field::XferSrc, &lv, 106),
            Some(Extent::Inside { lo: 100, hi: 105 })
        );
    }

    #[test]
    fn a_triangular_extent_outside_only_in_the_box_is_unknown() {
        // 3 − i0 + i1 with i1 < 1 + i0 (stepped) is at most 3; the box reaches 6 at i0 = 0,
        // i1 = 3, which never runs.
        let b = LBundle {
            bundle: mul(3, 0, 0),
            terms: vec![term(Field::OpA, 0, -1, 0), term(Field::OpA, 1, 1, 0)],
            preds: vec![],
        };
        let lv = vec![
            Level {
                count: 4,
                step: None,
            },
            Level {
                count: 1,
                step: Some(CountStep { level: 0, per: 1 }),
            },
        ];
        assert_eq!(
            extent(&b, Field::OpA, &lv, 4),
            Some(Extent::Unknown { lo: 0, hi: 6 })
        );
    }
}
