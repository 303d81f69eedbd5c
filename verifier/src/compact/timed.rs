//! Writes with their cycles, for rings whose PEs run different programs.
//!
//! A PE's memory changes by its own writes and by words arriving from the PE before it. When
//! the PEs all run one program, an arrival is the receiver's own send relabelled (the rotation
//! argument in `prove`); otherwise the receiver must be told what the sender put where, and
//! when. Each PE's program is walked once, loops symbolic where no wrapped term or count step
//! uses their index (cut where predicates change, like the evaluation), and every write
//! template becomes an *entry*: the set of words it writes, as a region over the symbolic
//! indices, and the cycle of each write, affine in the same indices (instance cycles are
//! affine in the indices: a loop's iterations all take as long once no inner count steps by
//! its index). A send becomes an entry of the next PE, holding the address it reads on the
//! sender.
//!
//! A read at address `A(x)` in cycle `t(x)` sees the newest write before `t` (an arrival of
//! cycle `t` commits after the cycle's reads). [`Eval::newest`] finds it among the entries:
//! an entry certainly holding `A` gives the solving instance and its cycle; one certainly
//! missing it or certainly later drops out; anything else must be certainly older than the
//! newest found, or the lookup refuses. So the contract of a link is checked, not assumed:
//! what a receiver reads from the ring is what the sender's send instance that last wrote the
//! word read on the sender, resolved the same way there, down to a preloaded input.

use super::aff::Aff;
use super::prove::{Eval, Fact, Fail, Ix, R};
use super::term::Id;
use isa::looped::{field, Field, LBundle, Slot};
use isa::{Acc, Node, Xfer};

/// One write template's instances on one PE.
#[derive(Clone, Debug)]
pub(super) struct Entry {
    /// The address written, over the symbolic indices of its instances.
    addr: Aff,
    /// The words written; the value is unused. `None`: the words are not distinct per
    /// instance, so the entry is only known to write inside `lo..=hi`.
    region: Option<Fact>,
    lo: i64,
    hi: i64,
    /// Cycle of the write at the region's coordinates.
    time: Aff,
    /// Earliest and latest cycle over all instances.
    tlo: i64,
    thi: i64,
    /// For an arrival: the sending PE and the address the send reads there.
    from: Option<(usize, Aff)>,
    /// An arrival's value once resolved, over the region's coordinates.
    value: Option<Id>,
}

/// What a read sees.
pub(super) enum Seen {
    /// A word that arrived: its value.
    Arrival(Id),
    /// The PE's own newest write (no arrival after it).
    Local,
    /// No write at all: the preloaded word, if any.
    Preload,
}

impl Eval {
    /// Walks PE `pe`'s program, adding its writes to `logs[pe]` and its sends to the next PE's.
    pub(super) fn walk(
        &mut self,
        nodes: &[Node],
        pe: usize,
        env: &mut Vec<Ix>,
        logs: &mut [Vec<Entry>],
    ) -> R<()> {
        for n in nodes {
            match n {
                Node::Bundle(b) => {
                    self.walk_bundle(b, pe, env, logs)?;
                    self.now = self.now.clone().add_const(1);
                }
                Node::Loop(l) => {
                    let level = env.len();
                    let n = self.trips(l, env, false)?;
                    // Symbolic only where every loop inside is too, so that an entry's cycles
                    // stay within one iteration of the loops iterated one by one (the ring
                    // steps, and the heads around them), which keeps its cycle range tight.
                    let symbolic = everywhere(&l.body, level);
                    let pieces = if symbolic {
                        super::prove::pieces(&l.body, level, n)
                    } else {
                        vec![(0, n)]
                    };
                    for (a, b) in pieces {
                        if symbolic && b - a >= 2 {
                            let start = self.now.clone();
                            let var = self.fresh(b - a);
                            env.push(Ix::Sym(var, a as i64));
                            let d = self.duration(&l.body, env)?;
                            self.now = start.clone().add_term(var, d);
                            let r = self.walk(&l.body, pe, env, logs);
                            env.pop();
                            r?;
                            self.now = start.add_const(d * (b - a) as i64);
                        } else {
                            for k in a..b {
                                env.push(Ix::At(k));
                                let r = self.walk(&l.body, pe, env, logs);
                                env.pop();
                                r?;
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn walk_bundle(
        &mut self,
        b: &LBundle,
        pe: usize,
        env: &[Ix],
        logs: &mut [Vec<Entry>],
    ) -> R<()> {
        let next = (pe + 1) % logs.len();
        if b.bundle.op.dst().is_some() && self.executes(b, Slot::Op, env)? {
            let e = self.entry(self.addr(b, Field::OpDst, env)?, None)?;
            logs[pe].push(e);
        }
        if matches!(b.bundle.acc, Acc::Add { dst: Some(_), .. })
            && self.executes(b, Slot::Acc, env)?
        {
            let e = self.entry(self.addr(b, Field::AccDst, env)?, None)?;
            logs[pe].push(e);
        }
        if let Xfer::Send { src, .. } = b.bundle.xfer {
            if self.executes(b, Slot::Xfer, env)? {
                if field(&b.bundle, Field::XferSrc).is_none()
                    || !matches!(src, isa::XferSrc::Mem(_))
                {
                    return Err(Fail::Decline(
                        "a send of the accumulator: only input words may travel here".into(),
                    ));
                }
                let from = self.addr(b, Field::XferSrc, env)?;
                let e = self.entry(self.addr(b, Field::XferDst, env)?, Some((pe, from)))?;
                logs[next].push(e);
            }
        }
        Ok(())
    }

    /// The entry of a write at `addr` in the current cycle, over the symbolic indices in scope.
    fn entry(&mut self, addr: Aff, from: Option<(usize, Aff)>) -> R<Entry> {
        let now = self.now.clone();
        self.make_entry(addr, now, from)
    }

    fn make_entry(&mut self, addr: Aff, time: Aff, from: Option<(usize, Aff)>) -> R<Entry> {
        let mut addr = self.pin(addr);
        let mut time = self.pin(time);
        let mut from = from.map(|(p, a)| (p, self.pin(a)));
        // An index the address does not use: its instances rewrite the same words, and the
        // last of them (the latest, cycles growing with every index) is the one that stays.
        let free: Vec<(super::aff::Var, u64)> = time
            .t
            .iter()
            .filter(|&&(v, _)| addr.coef(v) == 0)
            .map(|&(v, _)| (v, self.counts.get(&v).copied().unwrap_or(1)))
            .collect();
        for (v, n) in free {
            let last = Aff::cst(n as i64 - 1);
            time = time.subst(v, &last);
            addr = addr.subst(v, &last);
            from = from.map(|(p, a)| (p, a.subst(v, &last)));
        }
        let (tlo, thi) = self
            .bounds(&time)
            .ok_or_else(|| Fail::Decline("a cycle without bounds".into()))?;
        let (lo, hi) = self
            .bounds(&addr)
            .ok_or_else(|| Fail::Decline("an address without bounds".into()))?;
        // The region over the address's indices, if its words are distinct per instance.
        let mut dims: Vec<(super::aff::Var, i64, u64)> = addr
            .t
            .iter()
            .map(|&(v, k)| (v, k, self.counts.get(&v).copied().unwrap_or(1)))
            .collect();
        dims.sort_by_key(|d| std::cmp::Reverse(d.1));
        let mut span = 0i64;
        let mut distinct = true;
        for &(_, s, n) in dims.iter().rev() {
            if s <= span {
                distinct = false;
            }
            span += s * (n as i64 - 1);
        }
        let region = if distinct && dims.iter().all(|d| d.1 > 0) {
            let base = dims
                .iter()
                .fold(addr.clone(), |a, &(v, k, _)| a.add_term(v, -k));
            let mut f = self.fact(base, dims.clone(), 0, false)?;
            // The coordinates are the loop indices themselves (no shift): `hit` solves for them.
            f.dims = dims;
            Some(f)
        } else {
            None
        };
        Ok(Entry {
            addr,
            region,
            lo,
            hi,
            time,
            tlo,
            thi,
            from,
            value: None,
        })
    }

    /// What a read of `addr` in cycle `t` on PE `pe` sees: the newest arrival before `t`
    /// unless a write of the PE's own is newer (`Local`) or there is no write at all
    /// (`Preload`). `Err(Retry)` when it cannot be decided. Which of the PE's own writes is
    /// newest is not decided here: the evaluation's memory knows (program order is cycle order
    /// on one PE).
    pub(super) fn newest(
        &mut self,
        logs: &mut Vec<Vec<Entry>>,
        pe: usize,
        addr: &Aff,
        t: &Aff,
    ) -> R<Seen> {
        let addr = self.pin(addr.clone());
        let t = self.pin(t.clone());
        let ab = self
            .bounds(&addr)
            .ok_or_else(|| Fail::Decline("an address without bounds".into()))?;
        let tb = self
            .bounds(&t)
            .ok_or_else(|| Fail::Decline("a cycle without bounds".into()))?;
        let undecided = |why: &str| {
            Err(Fail::Retry(format!(
                "which write a read of m{}..=m{} on PE {pe} in cycles {}..={} sees: {why}",
                ab.0, ab.1, tb.0, tb.1
            )))
        };
        // Entries that may hold the word before `t`: (index, cycle at the solution and the
        // coordinates if certain).
        let mut arrivals = Vec::new();
        let mut locals = Vec::new();
        for (i, e) in logs[pe].iter().enumerate() {
            if ab.1 < e.lo || ab.0 > e.hi || e.tlo >= tb.1 {
                continue;
            }
            let hit = match &e.region {
                Some(f) => self.hit(f, &addr, ab),
                None => Err(false),
            };
            let certain = match hit {
                Err(true) => continue,
                Err(false) => {
                    if self.hint.is_none() {
                        self.hint = e
                            .region
                            .as_ref()
                            .and_then(|f| self.cut(f, &addr))
                            .or_else(|| self.edge(&addr, ab, e.lo, e.hi));
                    }
                    None
                }
                Ok(sol) => {
                    let dims = e
                        .region
                        .as_ref()
                        .map(|f| f.dims.clone())
                        .unwrap_or_default();
                    let mut at = e.time.clone();
                    for ((v, _, _), x) in dims.iter().zip(&sol) {
                        at = at.subst(*v, x);
                    }
                    match self.bounds(&at.minus(&t)) {
                        Some((lo, _)) if lo >= 0 => continue,
                        Some((_, hi)) if hi < 0 => Some((at, sol)),
                        _ => return undecided("a write in the cycle range of the read"),
                    }
                }
            };
            if e.is_arrival() {
                arrivals.push((i, certain));
            } else {
                locals.push((i, certain));
            }
        }
        // The newest arrival: certain, and every other one that may hold the word older.
        let mut best: Option<(usize, Aff, Vec<Aff>)> = None;
        for (i, c) in &arrivals {
            if let Some((at, sol)) = c {
                let newer = match &best {
                    None => true,
                    Some((_, bt, _)) => match self.bounds(&at.minus(bt)) {
                        Some((lo, _)) if lo > 0 => true,
                        Some((_, hi)) if hi < 0 => false,
                        _ => return undecided("two arrivals of unknown order"),
                    },
                };
                if newer {
                    best = Some((*i, at.clone(), sol.clone()));
                }
            }
        }
        let Some((i, at, sol)) = best else {
            if !arrivals.is_empty() {
                return undecided("an arrival that may or may not hold the word");
            }
            return Ok(if locals.is_empty() {
                Seen::Preload
            } else {
                Seen::Local
            });
        };
        let (alo, ahi) = self.bounds(&at).unwrap_or((i64::MIN, i64::MAX));
        for (j, c) in &arrivals {
            if *j != i && logs[pe][*j].thi >= alo {
                let older = c.as_ref().is_some_and(
                    |(bt, _)| matches!(self.bounds(&bt.minus(&at)), Some((_, hi)) if hi < 0),
                );
                if !older {
                    let o = &logs[pe][*j];
                    return undecided(&format!(
                        "an arrival to m{}..=m{} in cycles {}..={} ({}) may hold the word, not shown older than the one in cycles {alo}..={ahi}",
                        o.lo, o.hi, o.tlo, o.thi, if c.is_some() { "certain" } else { "maybe" }
                    ));
                }
            }
        }
        // The PE's own writes: all older than the arrival, or one certainly newer.
        let mut local_newer = false;
        for (j, c) in &locals {
            let e = &logs[pe][*j];
            if e.thi < alo {
                continue;
            }
            match c {
                Some((lt, _)) if matches!(self.bounds(&lt.minus(&at)), Some((lo, _)) if lo > 0) => {
                    local_newer = true
                }
                Some((lt, _)) if matches!(self.bounds(&lt.minus(&at)), Some((_, hi)) if hi < 0) => {}
                _ if e.tlo > ahi && c.is_some() => local_newer = true,
                _ => {
                    return undecided(&format!(
                        "a write of its own to m{}..=m{} in cycles {}..={} against an arrival in cycles {alo}..={ahi}",
                        e.lo, e.hi, e.tlo, e.thi
                    ))
                }
            }
        }
        if local_newer {
            return Ok(Seen::Local);
        }
        let v = self.arrival_value(logs, pe, i)?;
        let dims = logs[pe][i]
            .region
            .as_ref()
            .map(|f| f.dims.clone())
            .unwrap_or_default();
        let mut v = v;
        for ((var, _, _), x) in dims.iter().zip(sol) {
            v = self.tm.subst(v, *var, &x);
        }
        Ok(Seen::Arrival(v))
    }

    /// The value arrival `i` of PE `pe` carries: what its send reads on the sender, which must
    /// be an input element (preloaded, or itself arrived there). An arrival whose words came
    /// from places of different shapes (two chunks of tokens, two earlier arrivals) is split
    /// in two along its widest index until each part resolves; the parts replace it.
    pub(super) fn arrival_value(
        &mut self,
        logs: &mut Vec<Vec<Entry>>,
        pe: usize,
        i: usize,
    ) -> R<Id> {
        if let Some(v) = logs[pe][i].value {
            return Ok(v);
        }
        let Some((from, src)) = logs[pe][i].from.clone() else {
            return Err(Fail::Decline("not an arrival".into()));
        };
        self.depth += 1;
        if self.depth > 100_000 {
            return Err(Fail::Decline("arrivals resolved too deep".into()));
        }
        let t = logs[pe][i].time.clone();
        let seen = self.newest(logs, from, &src, &t);
        self.depth -= 1;
        let v = match seen.and_then(|seen| match seen {
            Seen::Arrival(v) => Ok(v),
            Seen::Preload => self.preloaded(from, &src),
            Seen::Local => Err(Fail::Decline(
                "a send of a word the sender computed: only input words may travel here".into(),
            )),
        }) {
            Ok(v) => v,
            Err(Fail::Retry(why)) => {
                if std::env::var_os("ATTNC_DEBUG_PROOF").is_some() {
                    let e = &logs[pe][i];
                    eprintln!(
                        "split arrival PE {pe} m{}..=m{} cycles {}..={} from {:?}: {why}",
                        e.lo, e.hi, e.tlo, e.thi, e.from
                    );
                }
                let Some((a, b)) = self.split(&logs[pe][i])? else {
                    return Err(Fail::Retry(why));
                };
                logs[pe][i] = a;
                logs[pe].push(b);
                let last = logs[pe].len() - 1;
                self.arrival_value(logs, pe, last)?;
                return self.arrival_value(logs, pe, i);
            }
            Err(e) => return Err(e),
        };
        logs[pe][i].value = Some(v);
        Ok(v)
    }

    /// `e` as two entries, halving the index with the largest stride in what the send reads;
    /// `None` if it has no index left to halve or the budget of splits is spent.
    fn split(&mut self, e: &Entry) -> R<Option<(Entry, Entry)>> {
        let Some((_, src)) = &e.from else {
            return Ok(None);
        };
        let Some(&(v, _)) = src
            .t
            .iter()
            .filter(|&&(v, _)| self.counts.get(&v).is_some_and(|&n| n >= 2))
            .max_by_key(|&&(_, k)| k.abs())
        else {
            return Ok(None);
        };
        self.splits += 1;
        if self.splits > MAX_SPLITS {
            return Ok(None);
        }
        let n = self.counts[&v];
        let k = n / 2;
        let (v1, v2) = (self.fresh(k), self.fresh(n - k));
        let mut halves = Vec::new();
        for (w, off) in [(v1, 0), (v2, k as i64)] {
            let by = Aff::var(w).add_const(off);
            let from = e.from.as_ref().map(|(p, a)| (*p, a.subst(v, &by)));
            halves.push(self.make_entry(e.addr.subst(v, &by), e.time.subst(v, &by), from)?);
        }
        let b = halves.pop();
        let a = halves.pop();
        Ok(a.zip(b))
    }
}

/// Splits of arrivals a proof may make before it gives up.
const MAX_SPLITS: u64 = 200_000;

/// Whether the loop at `level` and every loop inside may be evaluated symbolically.
fn everywhere(nodes: &[Node], level: usize) -> bool {
    super::prove::splittable(nodes, level)
        && nodes.iter().all(|n| match n {
            Node::Bundle(_) => true,
            Node::Loop(l) => everywhere(&l.body, level + 1),
        })
}

impl Entry {
    pub(super) fn is_arrival(&self) -> bool {
        self.from.is_some()
    }
}

/// That no word arrives in a cycle in which its PE writes it too (the machine faults on two
/// writes of one word in a cycle): every arrival and local write that may share a word keep
/// their cycle ranges apart. Coarse, and refuses rather than guesses.
pub(super) fn no_collisions(logs: &[Vec<Entry>]) -> Result<(), String> {
    for (pe, log) in logs.iter().enumerate() {
        let (arrivals, local): (Vec<&Entry>, Vec<&Entry>) =
            log.iter().partition(|e| e.is_arrival());
        for a in &arrivals {
            for l in &local {
                let apart = a.hi < l.lo || l.hi < a.lo;
                if !apart && !(a.thi < l.tlo || l.thi < a.tlo) {
                    return Err(format!(
                        "on PE {pe} an arrival and a local write may meet in one cycle (words {}..={}, cycles {}..={} and {}..={})",
                        a.lo.max(l.lo), a.hi.min(l.hi), a.tlo, a.thi, l.tlo, l.thi
                    ));
                }
            }
        }
    }
    Ok(())
}

impl Eval {
    /// Joins arrivals of one PE that continue each other — pieces of one block sent by
    /// different send templates (a triangle's rows each forwarding a few keys), or halves of a
    /// split — into regions, so that a read of the whole block meets one entry per shape. Two
    /// entries join when one starts where the other ends along a coordinate of equal stride
    /// and holds what the other's formula gives there, or when they have equal shapes and the
    /// second is the first moved by constant offsets in address and in every index (then a new
    /// coordinate of two values). The joined entry's cycles are known only as the range of
    /// both (a fresh index over it), which keeps every later comparison sound.
    pub(super) fn coalesce(&mut self, log: &mut Vec<Entry>) -> R<()> {
        loop {
            let mut merged = false;
            let arrivals: Vec<usize> = (0..log.len())
                .filter(|&i| {
                    log[i].is_arrival() && log[i].value.is_some() && log[i].region.is_some()
                })
                .collect();
            'outer: for (x, &i) in arrivals.iter().enumerate() {
                for &j in &arrivals[x + 1..] {
                    for (a, b) in [(i, j), (j, i)] {
                        match self.join_entries(&log[a], &log[b]) {
                            Ok(Some(e)) => {
                                log[i] = e;
                                log.swap_remove(j);
                                merged = true;
                                break 'outer;
                            }
                            Ok(None) | Err(Fail::Retry(_)) => {}
                            Err(e) => return Err(e),
                        }
                    }
                }
            }
            if !merged {
                return Ok(());
            }
        }
    }

    fn join_entries(&mut self, low: &Entry, high: &Entry) -> R<Option<Entry>> {
        let (Some(fl), Some(fh)) = (&low.region, &high.region) else {
            return Ok(None);
        };
        let (Some(vl), Some(vh)) = (low.value, high.value) else {
            return Ok(None);
        };
        if fl.dims.len() != fh.dims.len()
            || low.from.as_ref().map(|f| f.0) != high.from.as_ref().map(|f| f.0)
            || high.lo <= low.hi
        {
            return Ok(None);
        }
        // The high entry's value over the low one's coordinates.
        let mut v = vh;
        let mut th = high.time.clone();
        for (a, b) in fl.dims.iter().zip(&fh.dims) {
            if (a.1, a.2) != (b.1, b.2) && a.1 != b.1 {
                return Ok(None);
            }
            v = self.tm.subst(v, b.0, &Aff::var(a.0));
            th = th.subst(b.0, &Aff::var(a.0));
        }
        let same_shape = fl
            .dims
            .iter()
            .zip(&fh.dims)
            .all(|(a, b)| (a.1, a.2) == (b.1, b.2));
        let delta = fh.base.minus(&fl.base);
        let Some(delta) = delta.as_const() else {
            return Ok(None);
        };
        // Along an existing coordinate: high starts where low ends.
        for k in 0..fl.dims.len() {
            let (var, s, n) = fl.dims[k];
            let others_same = (0..fl.dims.len())
                .filter(|&i| i != k)
                .all(|i| (fl.dims[i].1, fl.dims[i].2) == (fh.dims[i].1, fh.dims[i].2));
            if !others_same || fh.dims[k].1 != s || delta != s * n as i64 {
                continue;
            }
            let moved = self.tm.subst(vl, var, &Aff::var(var).add_const(n as i64));
            if moved != v {
                continue;
            }
            let w = self.fresh(n + fh.dims[k].2);
            let addr = fl.dims.iter().fold(fl.base.clone(), |a, &(u, st, _)| {
                a.add_term(if u == var { w } else { u }, st)
            });
            let value = self.tm.subst(vl, var, &Aff::var(w));
            // Exact cycles if the high piece's are the low formula's continued.
            let time = (low.time.subst(var, &Aff::var(var).add_const(n as i64)) == th)
                .then(|| low.time.subst(var, &Aff::var(w)));
            return self.joined(low, high, addr, value, time).map(Some);
        }
        // A new coordinate: equal shapes, every index moved by a constant.
        if !same_shape || delta <= 0 {
            return Ok(None);
        }
        let (super::term::T::Atom(t1, h1, r1, c1), super::term::T::Atom(t2, h2, r2, c2)) =
            (self.tm.node(vl).clone(), self.tm.node(v).clone())
        else {
            return Ok(None);
        };
        let shift = |a: &Aff, b: &Aff| b.minus(a).as_const();
        let (Some(dh), Some(dr), Some(dc)) = (shift(&h1, &h2), shift(&r1, &r2), shift(&c1, &c2))
        else {
            return Ok(None);
        };
        if t1 != t2 {
            return Ok(None);
        }
        let w = self.fresh(2);
        let addr = fl
            .dims
            .iter()
            .fold(fl.base.clone(), |a, &(u, st, _)| a.add_term(u, st))
            .add_term(w, delta);
        let value = self.tm.atom(
            t1,
            h1.clone().add_term(w, dh),
            r1.clone().add_term(w, dr),
            c1.clone().add_term(w, dc),
        );
        let time = th
            .minus(&low.time)
            .as_const()
            .map(|dt| low.time.clone().add_term(w, dt));
        self.joined(low, high, addr, value, time).map(Some)
    }

    /// The entry for `addr` holding `value`, written at `time` if known, else some time in
    /// both entries' cycles.
    fn joined(
        &mut self,
        a: &Entry,
        b: &Entry,
        addr: Aff,
        value: Id,
        time: Option<Aff>,
    ) -> R<Entry> {
        if let Some(time) = time {
            let mut e = self.make_entry(addr, time, a.from.clone())?;
            if e.region.is_none() {
                return Err(Fail::Retry("joined arrivals overlap".into()));
            }
            e.value = Some(value);
            return Ok(e);
        }
        let (tlo, thi) = (a.tlo.min(b.tlo), a.thi.max(b.thi));
        // Only pieces sent close together: a window spanning other work (another head's
        // sends into the same buffer) would blur what reads in between see.
        let gap = a.tlo.max(b.tlo) - a.thi.min(b.thi);
        if gap > (a.thi - a.tlo) + (b.thi - b.tlo) + 16 {
            return Err(Fail::Retry("pieces sent far apart".into()));
        }
        let z = self.fresh((thi - tlo + 1) as u64);
        let from = a.from.clone();
        let mut e = self.make_entry(addr, Aff::cst(tlo), from)?;
        if e.region.is_none() {
            return Err(Fail::Retry("joined arrivals overlap".into()));
        }
        // Any cycle of the range, for every word (not the latest: `make_entry` would take an
        // index the address does not use at its last value).
        e.time = Aff::cst(tlo).add_term(z, 1);
        e.tlo = tlo;
        e.thi = thi;
        e.value = Some(value);
        Ok(e)
    }
}
