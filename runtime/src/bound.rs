//! A lower bound on the cycles of every program for a layer that is stronger than counting
//! operations when the ring has more PEs than the layer has work to spread: the longest chain of
//! dependent operations with the ring hops it forces, and the words that must cross links.
//! docs/scheduling.md ("When the lower bound cannot be reached") derives each part.
//!
//! The programs bounded are the ones the verifier accepts for the manifest's formulation: they
//! perform exactly the necessary operations (no recomputed values, no extra additions; see docs/verifier.md),
//! so every sum is a chain of accumulations, one term per bundle. Nothing here assumes a
//! placement or a schedule: inputs may be preloaded anywhere, one copy each ([`Shape::bound`]),
//! or several ([`Shape::bound_with_copies`], which claims only the parts that hold then).

use crate::layer::{Normalisation, Shape, Softmax};
use serde::{Deserialize, Serialize};

/// `max(lower_bound, critical_path, link)` and its parts, in cycles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bound {
    /// The largest part: no program of the formulation runs in fewer cycles.
    pub value: u64,
    /// `ceil(necessary operations / PEs)`, the manifest's `lower_bound`.
    pub lower_bound: u64,
    /// The longest dependent chain of a row, with the time its results need to reach enough PEs.
    pub critical_path: u64,
    /// Inputs and weights that must cross links, against what the links carry; 0 (nothing
    /// claimed) with `copies`.
    pub link: u64,
    /// The bound is for programs that may preload an input element on several PEs
    /// ([`Shape::bound_with_copies`]): no input need cross a link, so the link part and the
    /// critical path's term for the spread from one preloaded word are not claimed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub copies: bool,
}

impl Shape {
    /// The bound on `pes` PEs for programs that normalise as `norm`; `None` on overflow or an
    /// empty ring.
    pub fn bound(&self, pes: u32, norm: Normalisation) -> Option<Bound> {
        let lower_bound = self.lower_bound_as(pes, norm)?;
        let critical_path = self.critical_path(pes, norm)?;
        let link = self.link_bound(pes, norm)?;
        Some(Bound {
            value: lower_bound.max(critical_path).max(link),
            lower_bound,
            critical_path,
            link,
            copies: false,
        })
    }

    /// [`Shape::bound`] for programs that may preload copies of an input element on several
    /// PEs: the lower bound and the critical path without its one-home term ([`reach`]); the
    /// link part claims nothing, since every operand a product needs can be preloaded where
    /// it runs.
    pub fn bound_with_copies(&self, pes: u32, norm: Normalisation) -> Option<Bound> {
        let lower_bound = self.lower_bound_as(pes, norm)?;
        let critical_path = self.chains_bound(pes, norm)?;
        Some(Bound {
            value: lower_bound.max(critical_path),
            lower_bound,
            critical_path,
            link: 0,
            copies: true,
        })
    }

    /// [`Shape::bound`] or, with `copies`, [`Shape::bound_with_copies`].
    pub fn bound_for(&self, pes: u32, norm: Normalisation, copies: bool) -> Option<Bound> {
        if copies {
            self.bound_with_copies(pes, norm)
        } else {
            self.bound(pes, norm)
        }
    }

    /// The critical-path part: the longest row's chain (`tokens` unmasked scores) with the
    /// cycles its results need to reach enough PEs, and the work that must wait for the rows'
    /// denominators or be done before them, spread over the ring.
    pub fn critical_path(&self, pes: u32, norm: Normalisation) -> Option<u64> {
        let chains = self.chains_bound(pes, norm)?;
        if !norm.is_per_weight() {
            return Some(chains);
        }
        // One head's work after its rows' maxima or denominators (exponentials of a safe
        // softmax, divisions, phase-3 products) all reads a value computed from k[0][0] (every
        // row sees key 0), preloaded on one PE: in cycle r at most r + 1 PEs can run it, and
        // none of it runs before the first such value exists (a score, cycle d; with a safe
        // softmax and no mask, the maximum of n scores, d + its depth).
        let (m, n, d) = (u64::from(pes), u64::from(self.tokens), u64::from(self.dim));
        let safe = self.softmax == Softmax::Safe;
        let dependants = self
            .weights_per_head()?
            .checked_mul(self.dependants_per_weight())?;
        let first = if safe && !self.causal {
            Row::new(n, d, m, safe)?.z - n
        } else {
            d
        };
        Some(chains.max(reach(m, first, dependants)?))
    }

    /// The critical path's parts that hold wherever inputs are preloaded, however many copies
    /// of each: the rows' chains and the work spread from their denominators.
    fn chains_bound(&self, pes: u32, norm: Normalisation) -> Option<u64> {
        if pes == 0 {
            return None;
        }
        let (m, k, d) = (u64::from(pes), u64::from(self.tokens), u64::from(self.dim));
        if !norm.is_per_weight() {
            // A score (d accumulation cycles), its exponential, one product with v, the final
            // division (per row, a weight's division before the product instead): the
            // rescaling of an online softmax may combine partial sums, so no chain over the
            // row is claimed.
            return d.checked_add(3);
        }
        let (h, n) = (u64::from(self.heads), k);
        let safe = self.softmax == Softmax::Safe;
        let row = |k: u64| Row::new(k, d, m, safe);
        let longest = row(n)?;
        let mut best = longest.z.checked_add(longest.tail)?;
        // Rows of at least `k0` scores, all heads: their divisions and phase-3 products run
        // after their own Z, from cycle `z(k0)` on; their products, maxima and exponentials run
        // before their Z, `tail(k0)` or more cycles before the end, and the products one cycle
        // earlier still (two with a maximum after them). On `m` PEs that takes
        // `ceil(work / m)` cycles. Causal rows have k = 1 … n; the others all have n.
        let shortest = if self.causal { 1 } else { n };
        let per_pe = |ops: u64| -> Option<u64> { Some(ops.checked_mul(h)?.div_ceil(m)) };
        // Longest rows first, so that the sums over the rows of at least `k0` scores grow.
        let (mut after, mut before, mut products) = (0u64, 0u64, 0u64);
        for k0 in (shortest..=n).rev() {
            let (post, pre, p1) = self.row_work(k0, d)?;
            after = after.checked_add(post)?;
            before = before.checked_add(pre)?;
            products = products.checked_add(p1)?;
            let r = row(k0)?;
            let product_tail = r.tail.checked_add(1 + u64::from(safe && k0 >= 2))?;
            best = best
                .max(r.z.checked_add(per_pe(after)?)?)
                .max(r.tail.checked_add(per_pe(before)?)?)
                .max(product_tail.checked_add(per_pe(products)?)?);
        }
        Some(best)
    }

    /// One head's operations of the rows of `k` scores (one row, or with q = k = v and no mask
    /// all `n` rows together): after Z (divisions and phase-3 products), before Z (phase-1
    /// products, maxima, exponentials), and the phase-1 products alone. With q = k = v and no
    /// mask a product serves two rows, all of length n, so it is counted once for the layer.
    fn row_work(&self, k: u64, d: u64) -> Option<(u64, u64, u64)> {
        let rows = if self.causal {
            1
        } else {
            u64::from(self.tokens)
        };
        let weights = k.checked_mul(rows)?;
        let scores = if self.shared && !self.causal {
            k.checked_mul(k + 1)? / 2
        } else {
            weights
        };
        let maxima = match self.softmax {
            Softmax::Safe => weights - rows,
            Softmax::Plain => 0,
        };
        let products = scores.checked_mul(d)?;
        let after = weights.checked_mul(d.checked_add(1)?)?;
        let before = products.checked_add(maxima)?.checked_add(weights)?;
        Some((after, before, products))
    }

    /// The link part: the fewest cycles `T` for which the words that must cross links in a
    /// `T`-cycle program fit on them: on all `pes` links together (each carries `T − 1` words a
    /// program can still read), and on the links into arcs that each do an equal share of the
    /// products ([`Shape::cut_bound`]).
    pub fn link_bound(&self, pes: u32, norm: Normalisation) -> Option<u64> {
        Some(
            self.reuse_bound(pes, norm)?
                .max(self.cut_bound(pes, norm)?)
                .max(self.one_way_bound(pes, norm)?),
        )
    }

    /// The fewest cycles `T` for which the operands the products of each group need beyond
    /// those preloaded or computed on their PEs fit on the `pes` links together.
    fn reuse_bound(&self, pes: u32, norm: Normalisation) -> Option<u64> {
        if pes == 0 {
            return None;
        }
        let m = u64::from(pes);
        let fits = |t: u64| -> Option<bool> {
            Some(self.words_to_cross(t, norm)? <= m.checked_mul(t - 1)?)
        };
        // Once `T` reaches the largest group, no group needs a word from elsewhere.
        let mut hi = 1u64;
        while !fits(hi)? {
            hi = hi.checked_mul(2)?;
        }
        least(1, hi, fits)
    }

    /// Words any `t`-cycle program must receive over links, summed over groups of products that
    /// share no operand.
    fn words_to_cross(&self, t: u64, norm: Normalisation) -> Option<u64> {
        let (h, n, d) = (
            u64::from(self.heads),
            u64::from(self.tokens),
            u64::from(self.dim),
        );
        let w = self.weights_per_head()?;
        // Phase 1, one group per head and column: column c's products of q and k (or of x with
        // itself, one per unordered pair).
        let phase1 = if self.shared {
            let pairs = n.checked_mul(n + 1)? / 2;
            short(min_words(pairs, t, triangle_side), n)
        } else {
            short(min_words(w, t, square_sides), 2 * n)
        }
        .checked_mul(h.checked_mul(d)?)?;
        if !norm.is_per_weight() {
            // Online rescaling creates several versions of a weight, so only phase 1 is counted.
            return Some(phase1);
        }
        // Phase 3, one group per head and key j: the products of the weights w[i][j] (rows
        // that see j) with the row v[j].
        let mut phase3 = 0u64;
        for j in 0..n {
            let rows = if self.causal { n - j } else { n };
            let products = rows.checked_mul(d)?;
            phase3 = phase3.checked_add(short(
                min_words(products, t, square_sides),
                rows.checked_add(d)?,
            ))?;
        }
        let phase3 = phase3.checked_mul(h)?;
        // With q = k = v = x a word of x may serve both phases on one PE.
        Some(if self.shared {
            phase1.max(phase3)
        } else {
            phase1.checked_add(phase3)?
        })
    }
}

impl Shape {
    /// The cut part: the fewest cycles `T` for which, whenever the ring is cut into `k` arcs
    /// that each do more than `P/k − T` of the `P` products counted, the words that must enter
    /// the arcs fit on their `k` incoming links (`T − 1` readable words each).
    /// docs/scheduling.md ("Cuts") derives it. With separate q, k, v both phases' products are
    /// counted, and phase 3's alone; with q = k = v (a word of x serves lines of both phases,
    /// and phase 1 may be recomputed) phase 3's alone. Per-weight normalisation only (fact 4);
    /// otherwise 1.
    pub fn cut_bound(&self, pes: u32, norm: Normalisation) -> Option<u64> {
        if pes == 0 {
            return None;
        }
        let (h, n, d) = (
            u64::from(self.heads),
            u64::from(self.tokens),
            u64::from(self.dim),
        );
        if !norm.is_per_weight() || pes < 2 || n == 0 || d == 0 {
            return Some(1);
        }
        let m = u64::from(pes);
        // Weights: every ordered pair that is not masked, once.
        let pairs = if self.causal {
            n.checked_mul(n + 1)? / 2
        } else {
            n.checked_mul(n)?
        }
        .checked_mul(h)?;
        let columns = h.checked_mul(n)?.checked_mul(d)?;
        // Phase 3: d products per weight; lines: one per weight, and per (token, column) the
        // lines of v[j][c] and of the chain y[i][c].
        let phase3 = cut(
            m,
            pairs.checked_mul(d)?,
            pairs.checked_add(columns.checked_mul(2)?)?,
            d,
            n,
        );
        if self.shared {
            return Some(phase3);
        }
        // Both phases: d products of each phase per pair on its pair line, and per (token,
        // column) four lines: q[i][c], k[j][c], v[j][c] and the chain of y[i][c].
        let both = cut(
            m,
            pairs.checked_mul(d.checked_mul(2)?)?,
            pairs.checked_add(columns.checked_mul(4)?)?,
            d.checked_mul(2)?,
            n,
        );
        Some(both.max(phase3))
    }
}

impl Shape {
    /// The one-way part: the fewest cycles `T` below `pes` for which one head's phase 3 can be
    /// fed in a `T`-cycle program, `pes` if there is none. In fewer than `pes` cycles no word
    /// goes round the ring, so every PE that computes a weight lies within `T − 1` hops after the
    /// home of every input the weight depends on; the homes fall into a few clusters, and the
    /// inputs phase 3 reads must leave them through the links out of the clusters' last PEs.
    /// docs/scheduling.md ("One-way rings") derives it. Per-weight normalisation only (the
    /// weights read by every phase-3 product depend on the whole row); otherwise 1. Also 1 when
    /// the operations alone take `pes` cycles or more, since this part never exceeds `pes`.
    pub fn one_way_bound(&self, pes: u32, norm: Normalisation) -> Option<u64> {
        if pes == 0 {
            return None;
        }
        let (n, m) = (u64::from(self.tokens), u64::from(pes));
        if !norm.is_per_weight() || n == 0 || self.dim == 0 || self.lower_bound_as(pes, norm)? >= m
        {
            return Some(1);
        }
        // Rows from `first` on all depend on keys `0..=first`; without a mask every row
        // depends on every key, so all rows together give the most.
        let firsts = if self.causal { 0..n } else { n - 1..n };
        let mut best = 1;
        for first in firsts {
            let feed = Feed::new(self, first);
            if feed.fits(best, m) {
                continue;
            }
            // `fits` only gets easier as `T` grows, and holds from `m` on.
            best = least(best + 1, m, |t| Some(feed.fits(t, m)))?;
        }
        Some(best)
    }
}

impl Shape {
    /// The operations per weight that read a value computed from its row's denominator or
    /// maximum: the division and the `d` phase-3 products, and with a safe softmax the
    /// exponential.
    fn dependants_per_weight(&self) -> u64 {
        u64::from(self.dim) + 1 + u64::from(self.softmax == Softmax::Safe)
    }
}

/// One head's keys `0..=first` (the k rows, or the x rows with q = k = v), on which every
/// weight of the rows `first..n` depends, and the phase-3 work of those rows.
struct Feed {
    /// Keys `0..=first`.
    keys: u128,
    /// Rows from `first` on that see each of those keys.
    rows: u128,
    dim: u128,
    shared: bool,
    /// The operations of those rows that read a value computed from their denominators or
    /// maxima: divisions and phase-3 products, and with a safe softmax the exponentials.
    dependent: u128,
}

impl Feed {
    fn new(shape: &Shape, first: u64) -> Feed {
        let (n, first) = (u128::from(shape.tokens), u128::from(first));
        let dim = u128::from(shape.dim);
        // Row i sees i + 1 keys under the mask, n without.
        let (rows, weights) = if shape.causal {
            (n - first, (n * (n + 1) - first * (first + 1)) / 2)
        } else {
            (n, n * n)
        };
        let per_weight = u128::from(shape.dependants_per_weight());
        Feed {
            keys: first + 1,
            rows,
            dim,
            shared: shape.shared,
            dependent: weights * per_weight,
        }
    }

    /// Whether a `t`-cycle program on `m` PEs can meet the necessary conditions: for some
    /// number `k` of clusters of homes (each followed by at least `m − t` PEs without one), the
    /// dependent operations fit on the PEs that can run them in time, and the words that must
    /// leave the clusters fit on their `k` outgoing links (`t − 1` readable words each).
    fn fits(&self, t: u64, m: u64) -> bool {
        if t >= m {
            return true;
        }
        let (t, m) = (u128::from(t), u128::from(m));
        (1..=m / (m - t + 1)).any(|k| {
            // Σ over clusters of the PEs after its last home that every home reaches in time,
            // each running dependent operations only from the cycle the farthest home's words
            // can have arrived: the `u` PEs after one cluster give `u(u + 1)/2` slots at most.
            let room = m - k * (m - t);
            2 * self.dependent <= room * (room + 1) && self.crossing(room) <= k * (t - 1)
        })
    }

    /// Words that must cross the links out of the clusters when the clusters' last PEs run at
    /// most `absorbed` phase-3 products between them (the only products that need no word
    /// from across such a link).
    fn crossing(&self, absorbed: u128) -> u128 {
        if self.shared {
            // Every word x[j][c] phase 3 reads off those PEs crosses; one kept on them whole
            // takes its `rows` products there.
            let words = self.keys * self.dim;
            return words - (absorbed / self.rows).min(words);
        }
        // A weight's products off those PEs need either a value of its pair from across the
        // link, or the pair's whole score chain after it and so all `d` words of k[j]: per key
        // min(d, pairs not kept on the last PEs). Keeping a pair there takes its d products;
        // the first `rows − d` pairs of a key save nothing, each further one saves a word.
        let per_key = self.dim.min(self.rows);
        let pairs = absorbed / self.dim;
        let whole = (pairs / self.rows).min(self.keys);
        let mut saved = whole * per_key;
        if whole < self.keys {
            let rest = pairs - whole * self.rows;
            saved += rest.saturating_sub(self.rows - per_key).min(per_key);
        }
        self.keys * per_key - saved
    }
}

/// The least `T` for which every cut of `m` PEs into `k ≥ 2` arcs that each do more than
/// `products/k − T` products leaves room on the `k` incoming links (`T − 1` words each) for the
/// words entering the arcs: all but one of the arcs a line meets receive one of its values, and
/// an arc doing `s` products meets at least [`lines_meeting`] lines (pair lines of at most
/// `pair_len` products, the others of at most `row_len`).
fn cut(m: u64, products: u64, lines: u64, pair_len: u64, row_len: u64) -> u64 {
    // Beyond f64's exact integers the counts below would be rounded: claim nothing.
    if products > 1 << 50 || lines > 1 << 50 {
        return 1;
    }
    let most_arcs = m.min(MAX_ARCS);
    let fits = |t: u64| -> bool {
        let mut k = 2;
        while k <= most_arcs && k * t < products {
            let share = (products - k * t) / k + 1;
            let touched = lines_meeting(share, pair_len, row_len);
            if ((k * (t - 1) + lines) as f64) < k as f64 * touched {
                return false;
            }
            k += 1;
        }
        true
    };
    // `T = products` always fits (no two arcs can each do more than half of them).
    least(1, products.max(1), |t| Some(fits(t))).unwrap_or(1)
}

/// Most arcs a cut is tried with: more only add conditions, so fewer keep the bound sound.
const MAX_ARCS: u64 = 4096;

/// Fewest lines a set of `s` products can meet, rounded up to a whole line: the products are
/// points of a grid whose axis-parallel lines are the pair lines (at most `pair_len` points each)
/// and the two other kinds (at most `row_len` each). By Loomis–Whitney the three counts of lines
/// met, `L1, L2, L3`, have `L1·L2·L3 ≥ s²`, and `Lk ≥ s / (points per line)`; their sum is least
/// with `Lk = max(ak, λ)` for one `λ` (the constraints are convex in `log L`).
fn lines_meeting(s: u64, pair_len: u64, row_len: u64) -> f64 {
    let s = s as f64;
    let mut floors = [s / pair_len as f64, s / row_len as f64, s / row_len as f64];
    floors.sort_by(|a, b| b.total_cmp(a));
    let target = s * s;
    // Raise the `free` smallest counts to a common λ; the others stay at their floors.
    let mut best = floors.iter().sum::<f64>();
    if floors.iter().product::<f64>() < target {
        best = f64::INFINITY;
        for free in 1..=3usize {
            let fixed: f64 = floors[..3 - free].iter().product();
            let lambda = (target / fixed).powf(1.0 / free as f64);
            if floors[..3 - free].iter().all(|&a| a >= lambda) && lambda >= floors[3 - free] {
                best = floors[..3 - free].iter().sum::<f64>() + free as f64 * lambda;
                break;
            }
        }
        if !best.is_finite() {
            // Unreachable for exact arithmetic; the common level is a valid floor anyway.
            best = 3.0 * target.cbrt();
        }
    }
    // A count of lines is whole; the margin absorbs floating-point error.
    (best - 1e-9 * best.max(1.0)).ceil().max(0.0)
}

/// The critical path of one row of `k` scores: `z`, the first cycle its denominator Z can be
/// readable, and `tail`, the fewest cycles from then to the end.
struct Row {
    z: u64,
    tail: u64,
}

impl Row {
    fn new(k: u64, d: u64, m: u64, safe: bool) -> Option<Row> {
        // The row maximum is a tree of two-operand maxima over the row's k scores.
        let depth = if safe && k >= 2 {
            u64::from(k.next_power_of_two().trailing_zeros())
        } else {
            0
        };
        // Every score takes d chained accumulations (readable from cycle d), the exponentials
        // follow the maximum, and Z is a chain of k accumulations, one per exponential.
        let z = d.checked_add(depth)?.checked_add(k)?;
        // Each output element of the row is a chain of k accumulations of products with
        // weights, and every weight needs Z.
        let chains = k.checked_add(1)?;
        // The last of the k divisions by Z, then that weight's d products.
        let last_weight = spread(m, k)?.checked_add(spread(m, d)?)?.checked_add(2)?;
        // The k divisions and k·d products all read a value computed from Z.
        let after_z = spread(m, k.checked_mul(d.checked_add(1)?)?)?.checked_add(1)?;
        Some(Row {
            z,
            tail: chains.max(last_weight).max(after_z),
        })
    }
}

/// The fewest cycles `T` for which `ops` operations that all read a value computed from one
/// preloaded word, none before cycle `first`, fit on the PEs that can hold such a value: in
/// cycle `r` at most `min(r + 1, m)` of them (a word moves one hop per cycle).
fn reach(m: u64, first: u64, ops: u64) -> Option<u64> {
    // Operation slots in cycles 0..t.
    let slots = |t: u64| -> Option<u128> {
        let (t, m) = (u128::from(t), u128::from(m));
        Some(if t <= m {
            t * (t + 1) / 2
        } else {
            m * (m + 1) / 2 + (t - m) * m
        })
    };
    let before = slots(first)?;
    least(first, first.checked_add(ops)?, |t| {
        Some(slots(t)? - before >= u128::from(ops))
    })
}

/// Fewest distinct operands among `products` products of a group done by PEs that do at most
/// `t` each: `operands(p)` is the least a PE needs for `p` of them, concave with
/// `operands(0) = 0`, so the sum over PEs is least when all but one do exactly `t`.
fn min_words(products: u64, t: u64, operands: fn(f64) -> f64) -> f64 {
    let full = (products / t) as f64;
    full * operands(t as f64) + operands((products % t) as f64)
}

/// Words a group must receive: what its PEs need beyond the `local` ones that start on a PE
/// (each input preloaded once, each weight computed once). Rounded down after a margin for
/// floating-point error, since a count of words is whole.
fn short(needed: f64, local: u64) -> u64 {
    let missing = needed - local as f64 - 1e-6 * needed.max(1.0);
    if missing <= 0.0 {
        0
    } else {
        missing.ceil() as u64
    }
}

/// `p` products `a_i·b_j` need `|I| + |J| ≥ 2√p` operands (`p ≤ |I|·|J|`).
fn square_sides(p: f64) -> f64 {
    2.0 * p.sqrt()
}

/// `p` products `x_a·x_b` over unordered pairs need `s` operands with `s(s + 1)/2 ≥ p`.
fn triangle_side(p: f64) -> f64 {
    ((8.0 * p + 1.0).sqrt() - 1.0) / 2.0
}

/// Fewest cycles `s` after a value becomes readable on at most two neighbouring PEs (the one
/// that computed it and, through `send acc`, the next) until `ops` operations reading it or
/// anything computed from it can have run: in the `r`-th cycle at most `min(2 + r, m)` PEs hold
/// such a value, because a unidirectional link adds one PE per cycle to the run that holds it.
/// Returns the `s` such that cycles `0..=s` give room for `ops`.
fn spread(m: u64, ops: u64) -> Option<u64> {
    let room = |s: u64| -> Option<u64> {
        let cap = m.saturating_sub(2);
        if s < cap {
            (s + 1).checked_mul(s + 4).map(|x| x / 2)
        } else {
            let below = cap.checked_mul(cap + 3)? / 2;
            below.checked_add((s - cap + 1).checked_mul(m)?)
        }
    };
    least(0, ops, |s| Some(room(s)? >= ops))
}

/// The least `t` in `lo..=hi` for which `fits(t)` holds, by bisection: `fits` must hold at
/// `hi` and only get easier as `t` grows. `None` when `fits` does (an overflow).
fn least(mut lo: u64, mut hi: u64, mut fits: impl FnMut(u64) -> Option<bool>) -> Option<u64> {
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if fits(mid)? {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Some(lo)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(n: u32, d: u32, shared: bool, causal: bool, softmax: Softmax) -> Shape {
        Shape {
            heads: 1,
            tokens: n,
            dim: d,
            shared,
            causal,
            softmax,
        }
    }

    fn plain(n: u32, d: u32) -> Shape {
        shape(n, d, false, false, Softmax::Plain)
    }

    #[test]
    fn spread_counts_one_more_pe_per_cycle() {
        // 2, 3, 4, 5, ... PEs per cycle on a large ring.
        assert_eq!(spread(256, 1), Some(0));
        assert_eq!(spread(256, 2), Some(0));
        assert_eq!(spread(256, 3), Some(1));
        assert_eq!(spread(256, 5), Some(1));
        assert_eq!(spread(256, 6), Some(2));
        assert_eq!(spread(256, 9), Some(2));
        assert_eq!(spread(256, 10), Some(3));
        // One PE: one operation per cycle.
        assert_eq!(spread(1, 3), Some(2));
        // Two PEs: two per cycle from the start.
        assert_eq!(spread(2, 3), Some(1));
        // Three PEs: 2, then 3 per cycle.
        assert_eq!(spread(3, 5), Some(1));
        assert_eq!(spread(3, 6), Some(2));
        assert_eq!(spread(3, 8), Some(2));
    }

    #[test]
    fn one_token_on_a_large_ring() {
        // Worked by hand: the score chain takes cycles 0-7 on PEs 0-7 and arrives on PE 8;
        // exp in cycle 8, the division in 9, and the weight then reaches 2, 3, 4 PEs in cycles
        // 10, 11, 12, which is the earliest its 8 products can be done: 13 cycles.
        let s = plain(1, 8);
        assert_eq!(s.critical_path(256, Normalisation::PerWeight), Some(13));
        let b = s.bound(256, Normalisation::PerWeight).unwrap();
        assert_eq!(b.lower_bound, 1); // 18 operations on 256 PEs
        assert_eq!(b.value, 13);
        // A row of one score has no maximum, so safe is the same.
        let safe = shape(1, 8, false, false, Softmax::Safe);
        assert_eq!(safe.critical_path(256, Normalisation::PerWeight), Some(13));
    }

    #[test]
    fn longer_rows_pay_their_chains_and_the_spread_of_their_weights() {
        // n = 4, d = 64: Z from cycle 64 + 4 = 68; the 4 divisions and 256 products after Z
        // need 22 cycles of a run growing from 2 PEs (2 + 3 + ... + 23 = 275 ≥ 260 > 252).
        let s = plain(4, 64);
        assert_eq!(
            s.critical_path(256, Normalisation::PerWeight),
            Some(68 + 22)
        );
        // Safe adds the depth of a 4-score maximum tree, 2.
        let safe = shape(4, 64, false, false, Softmax::Safe);
        assert_eq!(
            safe.critical_path(256, Normalisation::PerWeight),
            Some(70 + 22)
        );
        // On 4 PEs the 16 divisions and 1024 products after Z need 1040 / 4 = 260 cycles.
        assert_eq!(s.critical_path(4, Normalisation::PerWeight), Some(68 + 260));
        // The mask and sharing do not change the longest row.
        let causal = shape(4, 64, true, true, Softmax::Plain);
        assert_eq!(
            causal.critical_path(256, Normalisation::PerWeight),
            Some(90)
        );
    }

    #[test]
    fn work_released_after_the_denominator_fills_the_ring() {
        // n = 8, d = 64, 64 PEs, plain: 8320 operations, LB 130. Z is readable from cycle
        // 64 + 8 = 72 and the 64 divisions and 4096 products that read it or its weights cannot
        // start earlier: 4160 / 64 = 65 more cycles.
        let s = plain(8, 64);
        let b = s.bound(64, Normalisation::PerWeight).unwrap();
        assert_eq!((b.lower_bound, b.critical_path), (130, 72 + 65));
        // Causal: all rows (36 scores, every Z from cycle 65 on) have 36·65 = 2340 operations
        // after their Z, 37 cycles on 64 PEs: 102. The longest row alone needs 72 + 31 = 103
        // (its 520 divisions and products on a run of PEs growing from 2: 31 cycles).
        let c = shape(8, 64, false, true, Softmax::Plain);
        assert_eq!(c.critical_path(64, Normalisation::PerWeight), Some(103));
    }

    #[test]
    fn chains_of_the_output_dominate_when_d_is_tiny() {
        // n = 8, d = 1 on 64 PEs: Z from 1 + 8 = 9; each output is a chain of 8 products.
        let s = plain(8, 1);
        assert_eq!(
            s.critical_path(64, Normalisation::PerWeight),
            Some(9 + 8 + 1)
        );
    }

    #[test]
    fn deferred_claims_only_one_path() {
        let s = shape(16, 8, false, false, Softmax::Safe);
        assert_eq!(s.critical_path(64, Normalisation::Deferred), Some(11));
    }

    #[test]
    fn link_bound_never_asks_for_more_than_the_operations_allow() {
        // With plenty of work per PE the reuse of every word is high and the links idle.
        for (n, d, m) in [(4, 4, 4), (16, 16, 4), (64, 64, 8), (32, 128, 256)] {
            let s = plain(n, d);
            let b = s.bound(m, Normalisation::PerWeight).unwrap();
            assert!(b.link <= b.lower_bound, "{n} {d} {m}: {b:?}");
        }
    }

    #[test]
    fn link_bound_counts_missing_operands() {
        // One column, two tokens (separate). In 1 cycle each PE does at most 1 operation.
        // Phase 1: 4 products q[i][0]·k[j][0], 2 operands each, 4 of the 8 preloaded.
        // Phase 3: per key j, 2 products w[i][j]·v[j][0], 4 operands, of which the 2 weights and
        // v[j][0] start on some PE: 1 word per key.
        let s = plain(2, 1);
        assert_eq!(s.words_to_cross(1, Normalisation::PerWeight), Some(4 + 2));
        // A single PE per group needs nothing from elsewhere once T covers the group.
        assert_eq!(s.words_to_cross(4, Normalisation::PerWeight), Some(0));
        // Shared: 3 pairs of one column on 3 PEs need at least 3·1 operands by the pair formula
        // (1 beyond the 2 preloaded); phase 3 is as above (2). A word of x may serve both
        // phases, so the larger count stands.
        let shared = shape(2, 1, true, false, Softmax::Plain);
        assert_eq!(shared.words_to_cross(1, Normalisation::PerWeight), Some(2));
    }

    #[test]
    fn four_arcs_decide_a_short_sequence_with_small_columns() {
        // n = 32, d = 8, one head: 16384 products on 1024 + 4·256 = 2048 lines. At T = 228 four
        // arcs each do at least (16384 − 4·228)/4 + 1 = 3869 products, so each meets at least
        // 3·3869^(2/3) ≈ 739.4, i.e. 740 lines (the floors 3869/16 and 3869/32 are below that):
        // 4·740 − 2048 = 912 words must enter over 4 links of 227 words. At 229 they fit.
        assert_eq!(lines_meeting(3869, 16, 32), 740.0);
        let s = shape(32, 8, false, false, Softmax::Safe);
        assert_eq!(s.cut_bound(256, Normalisation::PerWeight), Some(229));
        let b = s.bound(256, Normalisation::PerWeight).unwrap();
        // The critical path counts the 1024·10 operations after the rows' maxima spreading
        // from k[0][0]'s PE from cycle 8 + 5 on: T(T + 1)/2 − 91 ≥ 10240 from T = 144.
        assert_eq!(
            (b.lower_bound, b.critical_path, b.link, b.value),
            (76, 144, 229, 229)
        );
        // The arcs need not be short: the cut does not depend on the ring once it has 4 PEs.
        assert_eq!(s.cut_bound(4, Normalisation::PerWeight), Some(229));
        assert_eq!(s.cut_bound(64, Normalisation::PerWeight), Some(229));
        assert_eq!(s.bound(64, Normalisation::PerWeight).unwrap().value, 304);
    }

    #[test]
    fn lines_met_follow_the_floors_when_a_line_kind_is_short() {
        // 8000 points with pair lines of 16 and the others of 32: the pair floor 500 exceeds
        // 8000^(2/3) = 400, so L1 = 500 and L2 = L3 = √(8000²/500) ≈ 357.8.
        assert_eq!(
            lines_meeting(8000, 16, 32),
            (500.0 + 2.0 * 8000.0 / 500f64.sqrt()).ceil()
        );
        // All floors: s²  ≤ product of the floors (long lines everywhere is impossible, but
        // the count is then just their sum).
        assert_eq!(lines_meeting(1, 1, 1), 3.0);
        assert_eq!(lines_meeting(0, 4, 4), 0.0);
    }

    #[test]
    fn lines_met_never_exceed_those_of_any_set_of_products() {
        // Every subset of an n × n × D grid (D points per pair line, n per other line): the
        // fewest lines a set of each size meets is at least `lines_meeting`.
        for (n, depth) in [(2usize, 2usize), (3, 2), (2, 4), (2, 3)] {
            let points = n * n * depth;
            let mut fewest = vec![usize::MAX; points + 1];
            for set in 0u32..1 << points {
                let (mut pair, mut row, mut col) = (0u64, 0u64, 0u64);
                for p in 0..points {
                    if set >> p & 1 == 1 {
                        let (i, j, c) = (p / (n * depth), p / depth % n, p % depth);
                        pair |= 1 << (i * n + j);
                        row |= 1 << (i * depth + c);
                        col |= 1 << (j * depth + c);
                    }
                }
                let met = (pair.count_ones() + row.count_ones() + col.count_ones()) as usize;
                let size = set.count_ones() as usize;
                fewest[size] = fewest[size].min(met);
            }
            for (s, &f) in fewest.iter().enumerate() {
                let claimed = lines_meeting(s as u64, depth as u64, n as u64);
                assert!(
                    claimed <= f as f64,
                    "{n}×{n}×{depth}, {s} points: {claimed} > {f}"
                );
            }
        }
    }

    #[test]
    fn shared_layers_are_cut_on_their_phase_3_products() {
        // q = k = v, n = 16, d = 8: 2048 phase-3 products on 256 weight lines and 2·128 lines
        // of x (as v) and of y. At T = 52 four arcs each do at least (2048 − 208)/4 + 1 = 461
        // products and meet at least 3·461^(2/3) ≈ 179.2, i.e. 180 lines: 4·180 − 512 = 208
        // words over 4 links of 51. At 53 every cut fits.
        assert_eq!(lines_meeting(461, 8, 16), 180.0);
        let s = shape(16, 8, true, false, Softmax::Safe);
        assert_eq!(s.cut_bound(256, Normalisation::PerWeight), Some(53));
        // On 256 PEs the one-way part says more (122); on 64 it finds no program shorter than
        // the ring, and the critical path says 73: the 256·10 operations after the maxima
        // spread from k[0][0]'s PE from cycle 8 + 4 on, one more PE per cycle up to 64:
        // 2080 + 64(T − 64) − 78 ≥ 2560 from T = 73.
        assert_eq!(s.one_way_bound(64, Normalisation::PerWeight), Some(64));
        assert_eq!(
            s.bound(64, Normalisation::PerWeight)
                .map(|b| b.critical_path),
            Some(73)
        );
        // With separate q, k, v both phases together say more than phase 3 alone.
        let separate = shape(16, 8, false, false, Softmax::Safe);
        assert_eq!(separate.cut_bound(256, Normalisation::PerWeight), Some(97));
    }

    #[test]
    fn cuts_need_per_weight_normalisation_and_two_pes() {
        let shared = shape(32, 8, true, false, Softmax::Safe);
        assert_eq!(shared.cut_bound(256, Normalisation::Deferred), Some(1));
        let s = shape(32, 8, false, false, Softmax::Safe);
        assert_eq!(s.cut_bound(256, Normalisation::Deferred), Some(1));
        assert_eq!(s.cut_bound(1, Normalisation::PerWeight), Some(1));
        assert_eq!(s.cut_bound(0, Normalisation::PerWeight), None);
        // Causal rows have fewer pairs and lines: 8448 products on 528 + 1024 lines.
        let c = shape(32, 8, false, true, Softmax::Safe);
        assert_eq!(c.cut_bound(256, Normalisation::PerWeight), Some(102));
    }

    #[test]
    fn work_spreading_from_one_word_fills_one_more_pe_per_cycle() {
        // Cycles 0..t hold t(t + 1)/2 slots below the ring's length, then m per cycle.
        assert_eq!(reach(64, 0, 1), Some(1));
        assert_eq!(reach(64, 0, 3), Some(2));
        assert_eq!(reach(64, 0, 4), Some(3));
        assert_eq!(reach(4, 0, 10), Some(4));
        assert_eq!(reach(4, 0, 11), Some(5));
        // From cycle 2 on: 3 + 4 + 4 slots by the end of cycle 4.
        assert_eq!(reach(4, 2, 11), Some(5));
        assert_eq!(reach(4, 2, 12), Some(6));
        assert_eq!(reach(4, 2, 0), Some(2));
    }

    #[test]
    fn one_way_rings_pass_every_word_of_x_over_one_link() {
        // 16 tokens, d = 8, q = k = v, 256 PEs. Below 129 cycles a second cluster of homes would
        // need a gap of 256 − T ≥ 128 PEs after each, so there is one: all 128 words of x
        // phase 3 reads off its last PE cross the link out of it, and that PE runs at most T
        // of the products, 16 per word. T = 121 leaves 120 slots for 128 − 7 words; T = 122
        // carries 128 − 7 = 121 on its 121 slots.
        let s = shape(16, 8, true, false, Softmax::Safe);
        assert_eq!(s.one_way_bound(256, Normalisation::PerWeight), Some(122));
        assert_eq!(
            s.bound(256, Normalisation::PerWeight)
                .map(|b| (b.link, b.value)),
            Some((122, 122))
        );
        // Separate q, k, v: per key, its 8 words of k or a value of each of its 16 pairs; the
        // last PE keeps at most 122/8 = 15 pairs whole, and a key saves nothing for its first
        // 16 − 8 pairs kept and a word for each further one: 7 saved, 128 − 7 words again.
        let separate = shape(16, 8, false, false, Softmax::Safe);
        assert_eq!(
            separate.one_way_bound(256, Normalisation::PerWeight),
            Some(122)
        );
    }

    #[test]
    fn one_way_rings_fit_the_dependent_work_after_the_clusters() {
        // 8 tokens, d = 64, q = k = v, 256 PEs: 512 words of x. One cluster would need
        // T − 1 + T/8 ≥ 512; two, 2(T − 1) + (2T − 256)/8 ≥ 512 (T ≥ 229). With three the
        // words fit from T = 172, but the 64 · 66 dependent operations (divisions, products,
        // exponentials) need u(u + 1)/2 ≥ 4224 slots on u = 3T − 512 PEs: T ≥ 202.
        let s = shape(8, 64, true, false, Softmax::Safe);
        assert_eq!(s.one_way_bound(256, Normalisation::PerWeight), Some(202));
        // Plain softmax: the exponentials do not wait for a maximum, 64 · 65 operations.
        let plain = shape(8, 64, true, false, Softmax::Plain);
        assert_eq!(
            plain.one_way_bound(256, Normalisation::PerWeight),
            Some(201)
        );
    }

    #[test]
    fn one_way_rings_take_the_causal_rows_that_decide() {
        // 16 tokens, d = 8, causal, 256 PEs. The rows from 8 on (8 rows) see keys 0..=8: each
        // of the 9 keys costs min(8, 8) words, 72. Below 129 cycles there is one cluster, whose
        // last PE keeps at most T/8 pairs whole; at T = 64 that is 8, one whole key, so 64
        // words cross on 63 slots; at 65 they fit. The rows from 13 on need only 3 words per
        // key (39), the last row alone 16: the rows in the middle decide.
        let c = shape(16, 8, false, true, Softmax::Safe);
        assert_eq!(c.one_way_bound(256, Normalisation::PerWeight), Some(65));
        assert!(c
            .cut_bound(256, Normalisation::PerWeight)
            .is_some_and(|cut| cut < 65));
    }

    #[test]
    fn one_way_part_claims_nothing_from_the_ring_length_on() {
        for (n, d, m) in [(2, 2, 4), (3, 1, 6), (32, 64, 64), (4, 8, 16)] {
            for (shared, causal) in [(false, false), (true, false), (false, true)] {
                let s = shape(n, d, shared, causal, Softmax::Safe);
                let t = s.one_way_bound(m, Normalisation::PerWeight);
                assert!(t.is_some_and(|t| t <= u64::from(m)), "{n} {d} {m}: {t:?}");
                assert_eq!(s.one_way_bound(m, Normalisation::Deferred), Some(1));
            }
        }
        // The work alone needs more than the ring's length: nothing to add.
        let big = shape(64, 64, false, false, Softmax::Safe);
        assert_eq!(big.one_way_bound(16, Normalisation::PerWeight), Some(1));
        assert_eq!(big.one_way_bound(0, Normalisation::PerWeight), None);
    }

    #[test]
    fn bound_is_the_largest_part_and_no_less_than_the_lower_bound() {
        for n in [1, 2, 3, 4, 8, 12, 16, 32] {
            for d in [1, 8, 64, 128] {
                for m in [1, 4, 8, 16, 64, 256] {
                    for (shared, causal) in [(false, false), (true, false), (false, true)] {
                        let s = shape(n, d, shared, causal, Softmax::Safe);
                        let b = s.bound(m, Normalisation::PerWeight).unwrap();
                        assert_eq!(b.value, b.lower_bound.max(b.critical_path).max(b.link));
                        assert_eq!(Some(b.lower_bound), s.lower_bound(m));
                    }
                }
            }
        }
    }

    #[test]
    fn with_copies_only_the_parts_that_need_no_single_home() {
        // 16 tokens, d = 8, safe, separate, on 256 PEs. The row: scores from cycle 8, a maximum
        // tree of depth 4, Z a chain of 16: z = 28. From Z: output chains of 17; the last
        // division spread(16) = 4 and its weight's products spread(8) = 2, + 2: 8; the 144
        // divisions and products spread(144) = 15, + 1: 16. So 28 + 17 = 45, above what the
        // rows' work adds on 256 PEs. With one home per element the spread from k[0][0] and the
        // one-way part say 73 and 122; with copies neither holds.
        let s = shape(16, 8, false, false, Softmax::Safe);
        let b = s.bound_with_copies(256, Normalisation::PerWeight).unwrap();
        assert_eq!((b.value, b.critical_path, b.link), (45, 45, 0));
        assert!(b.copies);
        let single = s.bound(256, Normalisation::PerWeight).unwrap();
        assert_eq!((single.critical_path, single.value), (73, 122));
        assert!(!single.copies);
        for n in [1, 2, 3, 4, 8, 12, 16, 32] {
            for d in [1, 8, 64] {
                for m in [1, 4, 16, 64, 256] {
                    for (shared, causal) in [(false, false), (true, false), (false, true)] {
                        let s = shape(n, d, shared, causal, Softmax::Safe);
                        let b = s.bound_with_copies(m, Normalisation::PerWeight).unwrap();
                        let single = s.bound(m, Normalisation::PerWeight).unwrap();
                        assert_eq!(b.value, b.lower_bound.max(b.critical_path));
                        assert!(b.critical_path <= single.critical_path);
                        assert!(b.value <= single.value && b.lower_bound == single.lower_bound);
                        assert_eq!(s.bound_for(m, Normalisation::PerWeight, true), Some(b));
                        assert_eq!(
                            s.bound_for(m, Normalisation::PerWeight, false),
                            Some(single)
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn overflow_and_empty_rings_are_none() {
        assert_eq!(plain(2, 2).bound(0, Normalisation::PerWeight), None);
        let huge = Shape {
            heads: u32::MAX,
            tokens: u32::MAX,
            dim: u32::MAX,
            shared: false,
            causal: false,
            softmax: Softmax::Safe,
        };
        assert_eq!(huge.bound(4, Normalisation::PerWeight), None);
    }
}
