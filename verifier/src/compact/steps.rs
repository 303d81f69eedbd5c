//! When words sent over the ring land, proved for each pair of neighbours alone and for runs of
//! ring steps at once: the timing half of the per-step contracts (docs/verifier.md, "Timing of
//! ring steps, pair by pair").
//!
//! [`super::ring`] forms its phases over all PEs together, so a phase ends wherever any PE
//! changes the kind of ring step it runs, and on a large ring that is every step. Whether PE
//! `p`'s arrivals can meet its own reads and writes, though, depends only on PE `p − 1` (which
//! sends them) and PE `p`. This module walks the two programs of each such pair through time
//! and accepts the stretches of cycles in one of two ways:
//!
//! * a *phase*, as in [`super::ring`]: the two PEs' items between two instants at which both
//!   are between items; no word that may arrive in it is one the receiver may write in it, nor
//!   read unless it lasts one cycle (a cycle's reads precede its writes);
//! * a *window of aligned iterations*: both PEs at the start of a run of `r ≥ 2` iterations of
//!   a loop whose every iteration lasts the same `L` cycles, so that iteration `k` of each run
//!   fills cycles `[T + kL, T + (k + 1)L)` on both. It is accepted if, for every `k`, no word
//!   the sender's iteration `k` may send is one the receiver's iteration `k` may write, or read
//!   when `L > 1`. The iterations are tested in classes of one residue modulo the period of
//!   the loop's wrapped terms (two for double buffers), so a term `i mod 2` is exact in each
//!   class and the other index terms range over the class (over-approximated, so "apart" is
//!   certain). Each iteration is then a phase of its own, with its arrivals committed at its
//!   end; a window is one test for any number of ring steps.
//!
//! A stretch that passes neither is cut finer as [`super::ring`] cuts (a loop into its first
//! iteration and the rest, an iteration into its body), so where the two PEs change the kind of
//! step at different steps, the runs re-align after the cut. With the head loop of every PE one
//! of the same shape, each head `h` is tested on its own, as [`super::ring`] does.
//!
//! The result is the sequence of instants at which each receiver may take its arrivals as
//! committed. It establishes no value: it is what the per-step contracts' timing condition
//! needs, and it does not prove an output by itself.

use super::ring::{extents, head_loops, meet, split, strided_extents, trips, Ext, Item, Lengths};
use isa::looped::LBundle;
use isa::{Loop, LoopProgram, Node};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// `count` consecutive stretches of `len` cycles from cycle `start`, in each of which the
/// receiver's arrivals meet none of its writes, nor its reads when `len > 1`: the arrivals of
/// each may be taken as committed at its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stretch {
    pub start: u64,
    pub len: u64,
    pub count: u64,
}

/// What the timing of every pair of neighbours established.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Timing {
    /// Per receiving PE, the stretches that cover its cycles while both it and the PE before
    /// it run (after either has ended, nothing of one meets the other).
    pub stretches: Vec<Vec<Stretch>>,
    /// When every PE's program is one head loop of one shape: its count and the cycles of one
    /// head. The stretches are then those of every head, from the head's first cycle.
    pub heads: Option<(u64, u64)>,
    /// Pairs of neighbours proved (the ring's PEs).
    pub pairs: usize,
    /// Phases accepted, over all pairs.
    pub phases: u64,
    /// Windows of aligned iterations accepted, over all pairs.
    pub windows: u64,
    /// Iterations those windows stand for (each a phase of its own), over all pairs.
    pub aligned: u64,
}

/// Stretches tested per pair before giving up (the wall-clock bound below usually comes first).
const MOST_TESTS: u64 = 1_000_000;

/// Proves, for every PE `p`, that the words PE `p − 1` sends never land in a word PE `p` reads
/// or writes in the same stretch (the module documentation), or says why not: a stretch that
/// no cut makes apart, or the bound on work or time reached. `Err` claims nothing either way.
pub fn timing(programs: &[LoopProgram], within: Duration) -> Result<Timing, String> {
    let deadline = Instant::now() + within;
    let m = programs.len();
    if m < 2 {
        return Err("a ring of two PEs or more".into());
    }
    // Items are timed at head 0; that is every head's timing only if no count inside steps
    // with the head index.
    let heads = head_loops(programs).filter(|hs| hs.iter().all(|h| !steps_with_head(&h.body)));
    let mut out = Timing::default();
    if let Some(hs) = &heads {
        let lin = Lengths::default().body(&hs[0].body, 1);
        let per = u64::try_from(Lengths::at(&lin, &[0])).map_err(|_| "a head's length")?;
        out.heads = Some((u64::from(hs[0].count), per));
    }
    for p in 0..m {
        let from = (p + m - 1) % m;
        let queue = |q: usize| -> VecDeque<Item> {
            match &heads {
                Some(hs) => hs[q].body.iter().map(|n| Item::Node(n, vec![0])).collect(),
                None => programs[q]
                    .body
                    .iter()
                    .map(|n| Item::Node(n, Vec::new()))
                    .collect(),
            }
        };
        let count = heads.as_ref().map_or(1, |hs| u64::from(hs[0].count));
        let mut mine = Vec::new();
        pair(
            [queue(from), queue(p)],
            count,
            heads.is_some(),
            deadline,
            (&mut out, &mut mine),
        )
        .map_err(|why| format!("PE {from} to PE {p}: {why}"))?;
        out.pairs += 1;
        out.stretches.push(mine);
    }
    Ok(out)
}

/// Whether a loop in `nodes` has its count stepped by the index at level 0.
fn steps_with_head(nodes: &[Node]) -> bool {
    nodes.iter().any(|n| match n {
        Node::Bundle(_) => false,
        Node::Loop(l) => l.step.is_some_and(|s| s.level == 0) || steps_with_head(&l.body),
    })
}

/// The heads a stretch is tested in: each head on its own when the items run in a head loop.
fn each_head(count: u64, symbolic: bool) -> impl Iterator<Item = Option<u64>> {
    (0..count).map(move |h| symbolic.then_some(h))
}

/// One pair: `q[0]` sends, `q[1]` receives.
fn pair(
    mut q: [VecDeque<Item>; 2],
    heads: u64,
    symbolic: bool,
    deadline: Instant,
    (out, mine): (&mut Timing, &mut Vec<Stretch>),
) -> Result<(), String> {
    let mut lengths = Lengths::default();
    let mut tests = 0u64;
    // With a head loop, cycles of one head, from its start (`Timing::heads`).
    let mut at = 0u64;
    while !q[1].is_empty() && !q[0].is_empty() {
        tests += 1;
        if tests > MOST_TESTS || Instant::now() > deadline {
            return Err("past the bound of the timing proof".into());
        }
        if let Some((count, len)) = window(&mut q, &mut lengths, heads, symbolic) {
            out.windows += 1;
            out.aligned += count;
            mine.push(Stretch {
                start: at,
                len,
                count,
            });
            at += len * count;
            continue;
        }
        // The phase: items from both up to the first instant where both are between items.
        let mut take = [1usize; 2];
        let mut ends = [lengths.item(&q[0][0]), lengths.item(&q[1][0])];
        let mut live = [true; 2];
        while live[0] && live[1] && ends[0] != ends[1] {
            let late = usize::from(ends[1] < ends[0]);
            if take[late] < q[late].len() {
                ends[late] += lengths.item(&q[late][take[late]]);
                take[late] += 1;
            } else {
                // Its program ends inside the phase: it idles from there.
                live[late] = false;
            }
        }
        let len = ends[0].max(ends[1]);
        let clash = each_head(heads, symbolic).any(|h| {
            let mut x = [Ext::default(), Ext::default()];
            for (s, ext) in x.iter_mut().enumerate() {
                for it in q[s].iter().take(take[s]) {
                    extents(it, h, ext);
                }
            }
            apart(&x[0], &x[1], len).is_err()
        });
        if !clash {
            out.phases += 1;
            mine.push(Stretch {
                start: at,
                len,
                count: 1,
            });
            at += len;
            for s in 0..2 {
                q[s].drain(..take[s]);
            }
            continue;
        }
        let longest = (0..2)
            .flat_map(|s| q[s].iter().take(take[s]).collect::<Vec<_>>())
            .map(|it| lengths.item(it))
            .max()
            .unwrap_or(0);
        let mut split_any = false;
        for s in 0..2 {
            let mut rebuilt = VecDeque::with_capacity(q[s].len() + 4);
            for (i, it) in q[s].drain(..).enumerate() {
                if i < take[s] && lengths.item(&it) == longest {
                    if let Some(parts) = split(&it) {
                        split_any = true;
                        rebuilt.extend(parts);
                        continue;
                    }
                }
                rebuilt.push_back(it);
            }
            q[s] = rebuilt;
        }
        if !split_any {
            return Err("a word arriving over the ring may meet a local write in one cycle".into());
        }
    }
    // Whatever one PE runs after the other has ended meets nothing of the other's: a sender
    // that has ended sends nothing, and what arrives after the receiver ends meets no read
    // or write of it (what it does to the outputs is for the value proof to see).
    Ok(())
}

/// `Err` when a word `tx` may send lands on a word `rx` may write, or read in a stretch of more
/// than one cycle.
fn apart(tx: &Ext, rx: &Ext, len: u64) -> Result<(), ()> {
    if meet(&tx.sends, &rx.writes) || (len > 1 && meet(&tx.sends, &rx.reads)) {
        return Err(());
    }
    Ok(())
}

/// A run of iterations of one loop on each PE.
fn run_of<'a>(it: &Item<'a>) -> Option<(&'a Loop, Vec<u64>, u64, u64)> {
    match it {
        Item::Node(Node::Loop(l), env) => Some((l, env.clone(), 0, trips(l, env))),
        Item::Iters(l, env, a, b) => Some((l, env.clone(), *a, *b)),
        Item::Node(Node::Bundle(_), _) => None,
    }
}

/// Periods of the wrapped terms at `level` in `nodes`, combined into their least common
/// multiple (1 with none).
fn period(nodes: &[Node], level: usize) -> u64 {
    fn gcd(a: u64, b: u64) -> u64 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    let mut w = 1u64;
    let mut add = |b: &LBundle| {
        for t in b.terms.iter().filter(|t| usize::from(t.level) == level) {
            if t.wrap != 0 {
                let x = u64::from(t.wrap);
                w = w / gcd(w, x) * x;
            }
        }
    };
    fn walk(nodes: &[Node], add: &mut dyn FnMut(&LBundle)) {
        for n in nodes {
            match n {
                Node::Bundle(b) => add(b),
                Node::Loop(l) => walk(&l.body, add),
            }
        }
    }
    walk(nodes, &mut add);
    w
}

/// Residue classes tested for one window at most: a longer period is cut finer instead.
const MOST_CLASSES: u64 = 64;

/// Takes a window of aligned iterations off the fronts of `q` when both are runs of a loop
/// whose iterations last one constant length, the same on both, and every iteration's
/// arrivals are apart from the receiver's same iteration (the module documentation). The
/// iterations taken and their length, or `None` (nothing taken).
fn window(
    q: &mut [VecDeque<Item>; 2],
    lengths: &mut Lengths,
    heads: u64,
    symbolic: bool,
) -> Option<(u64, u64)> {
    let a = run_of(q[0].front()?)?;
    let b = run_of(q[1].front()?)?;
    let per = |lengths: &mut Lengths, (l, env, _, _): &(&Loop, Vec<u64>, u64, u64)| {
        let lin = lengths.body(&l.body, env.len() + 1);
        // An iteration's length must not move with the loop's own index.
        (lin.a.get(env.len()).copied().unwrap_or(0) == 0)
            .then(|| Lengths::at(&lin, env))
            .filter(|&c| c >= 1)
    };
    let len = per(lengths, &a)?;
    if per(lengths, &b)? != len {
        return None;
    }
    let r = (a.3 - a.2).min(b.3 - b.2);
    if r < 2 {
        return None;
    }
    let cycles = u64::try_from(len).ok()?;
    let w = period(&a.0.body, a.1.len()).max(period(&b.0.body, b.1.len()));
    // A class per residue modulo the period; one class when the run is no longer than it.
    if w > MOST_CLASSES {
        return None;
    }
    for c in 0..w.min(r) {
        let last = c + (r - 1 - c) / w * w;
        let clash = each_head(heads, symbolic).any(|h| {
            let (mut tx, mut rx) = (Ext::default(), Ext::default());
            strided_extents(a.0, &a.1, h, (a.2 + c, a.2 + last, w), &mut tx);
            strided_extents(b.0, &b.1, h, (b.2 + c, b.2 + last, w), &mut rx);
            apart(&tx, &rx, cycles).is_err()
        });
        if clash {
            return None;
        }
    }
    for (s, (l, env, from, to)) in [(0, a), (1, b)] {
        q[s].pop_front();
        if from + r < to {
            q[s].push_front(Item::Iters(l, env, from + r, to));
        }
    }
    Some((r, cycles))
}
