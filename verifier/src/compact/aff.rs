//! Affine functions of index variables, `c + Σ k_v·v`.

/// An index variable. Those below [`BINDERS`] are bound by ranges in expressions; the others are
/// loop indices and region coordinates, each with a range known to the evaluator.
pub type Var = u32;

/// The terms of an [`Aff`].
pub type Terms = smallvec::SmallVec<[(Var, i64); 3]>;

/// Variables reserved for range binders (a range binds one above every binder inside it, so
/// nesting depth bounds them).
pub const BINDERS: Var = 1024;

#[derive(Clone, PartialEq, Eq, Hash, Debug, PartialOrd, Ord, Default)]
pub struct Aff {
    pub c: i64,
    /// Sorted by variable, no zero coefficient. Most forms have a few terms: kept inline,
    /// they cost no allocation (the evaluator builds and drops millions of them).
    pub t: Terms,
}

impl Aff {
    pub fn cst(c: i64) -> Aff {
        Aff { c, t: Terms::new() }
    }

    pub fn var(v: Var) -> Aff {
        Aff {
            c: 0,
            t: smallvec::smallvec![(v, 1)],
        }
    }

    pub fn coef(&self, v: Var) -> i64 {
        self.t.iter().find(|&&(w, _)| w == v).map_or(0, |&(_, k)| k)
    }

    pub fn add_const(mut self, k: i64) -> Aff {
        self.c += k;
        self
    }

    pub fn add_term(mut self, v: Var, k: i64) -> Aff {
        if k == 0 {
            return self;
        }
        match self.t.binary_search_by_key(&v, |&(w, _)| w) {
            Ok(i) => {
                self.t[i].1 += k;
                if self.t[i].1 == 0 {
                    self.t.remove(i);
                }
            }
            Err(i) => self.t.insert(i, (v, k)),
        }
        self
    }

    /// `self + k·o` by one merge of the sorted terms.
    fn combined(&self, o: &Aff, k: i64) -> Aff {
        if k == 0 {
            return self.clone();
        }
        self.merged(None, o, k)
    }

    /// `self + k·o` with `self`'s term in `skip` (if any) left out, by one merge of the
    /// sorted terms (`k ≠ 0`).
    fn merged(&self, skip: Option<Var>, o: &Aff, k: i64) -> Aff {
        let (a, b) = (&self.t, &o.t);
        let mut t = Terms::with_capacity(a.len() + b.len());
        let (mut i, mut j) = (0, 0);
        while i < a.len() || j < b.len() {
            if i < a.len() && Some(a[i].0) == skip {
                i += 1;
            } else if j == b.len() || (i < a.len() && a[i].0 < b[j].0) {
                t.push(a[i]);
                i += 1;
            } else if i == a.len() || b[j].0 < a[i].0 {
                t.push((b[j].0, b[j].1 * k));
                j += 1;
            } else {
                let x = a[i].1 + b[j].1 * k;
                if x != 0 {
                    t.push((a[i].0, x));
                }
                i += 1;
                j += 1;
            }
        }
        Aff {
            c: self.c + o.c * k,
            t,
        }
    }

    pub fn scaled(&self, k: i64) -> Aff {
        if k == 0 {
            return Aff::cst(0);
        }
        Aff {
            c: self.c * k,
            t: self.t.iter().map(|&(v, x)| (v, x * k)).collect(),
        }
    }

    pub fn minus(&self, o: &Aff) -> Aff {
        self.combined(o, -1)
    }

    pub fn subst(&self, v: Var, by: &Aff) -> Aff {
        let k = self.coef(v);
        if k == 0 {
            return self.clone();
        }
        self.merged(Some(v), by, k)
    }

    pub fn as_const(&self) -> Option<i64> {
        self.t.is_empty().then_some(self.c)
    }

    /// [`Aff::bounds`] of `self − o`, without building it: the terms are merged as
    /// [`Aff::minus`] merges them, a coefficient that cancels contributing nothing.
    pub fn bounds_of_difference(
        &self,
        o: &Aff,
        count: &impl Fn(Var) -> Option<u64>,
    ) -> Option<(i64, i64)> {
        Aff::bounds_of_difference_of(self.c - o.c, &self.t, &o.t, count)
    }

    /// [`Aff::bounds_of_difference`] of forms given by their sorted terms, `c` the difference
    /// of their constants.
    pub fn bounds_of_difference_of(
        c: i64,
        a: &[(Var, i64)],
        b: &[(Var, i64)],
        count: &impl Fn(Var) -> Option<u64>,
    ) -> Option<(i64, i64)> {
        let (mut lo, mut hi) = (c, c);
        let mut add = |v: Var, k: i64| -> Option<()> {
            if k == 0 {
                return Some(());
            }
            let n = count(v)?;
            let top = i64::try_from(n.checked_sub(1)?).ok()?;
            let x = k.checked_mul(top)?;
            lo = lo.checked_add(x.min(0))?;
            hi = hi.checked_add(x.max(0))?;
            Some(())
        };
        let (mut i, mut j) = (0, 0);
        while i < a.len() || j < b.len() {
            if j == b.len() || (i < a.len() && a[i].0 < b[j].0) {
                add(a[i].0, a[i].1)?;
                i += 1;
            } else if i == a.len() || b[j].0 < a[i].0 {
                add(b[j].0, -b[j].1)?;
                j += 1;
            } else {
                add(a[i].0, a[i].1 - b[j].1)?;
                i += 1;
                j += 1;
            }
        }
        Some((lo, hi))
    }

    /// Smallest and largest value over the variables' ranges (`count(v)` values from 0), or
    /// `None` if a variable has no known range.
    pub fn bounds(&self, count: &impl Fn(Var) -> Option<u64>) -> Option<(i64, i64)> {
        Aff::bounds_from(self.c, &self.t, count)
    }

    /// [`Aff::bounds`] of the form with constant `c` and terms `t`, without building it.
    pub fn bounds_from(
        c: i64,
        t: &[(Var, i64)],
        count: &impl Fn(Var) -> Option<u64>,
    ) -> Option<(i64, i64)> {
        let (mut lo, mut hi) = (c, c);
        for &(v, k) in t {
            let n = count(v)?;
            let top = i64::try_from(n.checked_sub(1)?).ok()?;
            let x = k.checked_mul(top)?;
            lo = lo.checked_add(x.min(0))?;
            hi = hi.checked_add(x.max(0))?;
        }
        Some((lo, hi))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_and_bounds() {
        let a = Aff::var(2000).scaled(64).add_const(3).add_term(2001, 1);
        let b = a.subst(2000, &Aff::var(2001).add_const(1));
        assert_eq!(b, Aff::var(2001).scaled(65).add_const(67));
        assert_eq!(a.minus(&a), Aff::cst(0));
        let count = |v: Var| Some(if v == 2000 { 4 } else { 64 });
        assert_eq!(a.bounds(&count), Some((3, 3 + 192 + 63)));
        let c = Aff::var(7).add_term(3, 2).add_const(1);
        assert_eq!(c.minus(&a).minus(&a.scaled(-1)), c);
        assert_eq!(c.minus(&c), Aff::cst(0));
        assert_eq!(c.minus(&Aff::var(3)).coef(3), 1);
        for (x, y) in [(&a, &b), (&b, &a), (&a, &a), (&c, &a), (&a, &c)] {
            assert_eq!(x.bounds_of_difference(y, &count), x.minus(y).bounds(&count));
        }
        let partial = |v: Var| (v != 3).then_some(8);
        assert_eq!(c.bounds_of_difference(&a, &partial), None);
        assert_eq!(c.bounds_of_difference(&c, &partial), Some((0, 0)));
    }

    /// Substitution by one merge against its definition: remove `v`'s term, then add `k·by`
    /// (forms over a few variables, `by` with and without `v` itself, cancelling terms).
    #[test]
    fn substitution_is_removal_then_scaled_addition() {
        let forms = [
            Aff::cst(5),
            Aff::var(1),
            Aff::var(2).scaled(-3).add_term(1, 4).add_const(7),
            Aff::var(1).add_term(2, 2).add_term(3, -1).add_term(4, 9),
            Aff::var(3).scaled(2).add_term(1, -1),
        ];
        for x in &forms {
            for by in &forms {
                for v in 1..=4 {
                    let k = x.coef(v);
                    let want = x.clone().add_term(v, -k).combined(by, k);
                    assert_eq!(x.subst(v, by), want, "{x:?}[v{v} := {by:?}]");
                }
            }
        }
    }
}
