//! Dot products in bulk: the stretch `mul m[a + sa·t], m[b + sb·t] | add mS -> mS`, optionally
//! with a send of a word that neither operand nor the sum touches, is a chain of dependent f32
//! additions whose latency, not its arithmetic, bounds it. Independent chains (of other PEs,
//! or of other iterations of a loop whose iterations the planner showed independent) run
//! interleaved, step `t` of each before step `t + 1` of any, so the latency of one chain hides
//! behind the others while each chain adds its products in its own order: the sums are
//! bit-identical to cycle-by-cycle execution.

use super::defer::Sink;
use super::{fx, get, Plan, Prog, FRESH_SUM};
use crate::inst::{Arith, Op, OpKind, Xfer, XferSrc};

/// Chains run interleaved at most: enough independent additions in flight to cover an f32
/// add's latency, few enough that every running sum stays in a register.
pub(super) const DOT_GROUP: usize = 8;

/// A plan that is a dot product into a register word: its operand progressions, the running
/// sum's word, and a send of a memory word alongside (source, destination).
#[derive(Clone, Copy, Debug)]
pub(super) struct Dot {
    pub(super) a: Prog,
    pub(super) b: Prog,
    pub(super) s: usize,
    pub(super) send: Option<(Prog, Prog)>,
    /// The first product is the sum (the plan's `fresh_sum`): no word `s` is read.
    pub(super) zero: bool,
}

impl Dot {
    /// The running sum before the first product.
    fn start(&self, mem: &[Option<f32>]) -> f32 {
        if self.zero {
            FRESH_SUM
        } else {
            get(mem, self.s)
        }
    }

    /// The dot product `r` repetitions on, each moving field `k` by `shift[k]`.
    pub(super) fn moved(&self, shift: &[i64; 7], r: i64) -> Dot {
        let by = |pr: Prog, k: usize| Prog {
            addr: pr.addr + shift[k] * r,
            stride: pr.stride,
        };
        Dot {
            a: by(self.a, fx::OP_A),
            b: by(self.b, fx::OP_B),
            s: (self.s as i64 + shift[fx::ACC_SRC] * r) as usize,
            send: self
                .send
                .map(|(src, dst)| (by(src, fx::XFER_SRC), by(dst, fx::XFER_DST))),
            zero: self.zero,
        }
    }
}

/// One chain to run: the PE, its successor (the send's receiver), the dot product and its
/// length in steps.
pub(super) type Chain = (usize, usize, Dot, u32);

pub(super) fn dot_of(plan: &Plan) -> Option<Dot> {
    let pr = plan.progs;
    let Op::Arith(Arith {
        kind: OpKind::Mul,
        dst: None,
        ..
    }) = plan.bundle.op
    else {
        return None;
    };
    if !plan.register {
        return None;
    }
    let send = match plan.bundle.xfer {
        Xfer::Nop => None,
        Xfer::Send {
            src: XferSrc::Mem(_),
            ..
        } => Some((pr[fx::XFER_SRC]?, pr[fx::XFER_DST]?)),
        Xfer::Send {
            src: XferSrc::Acc, ..
        } => return None,
    };
    let s = pr[fx::ACC_SRC]?.at(0);
    // A chain stores its sum before its sends read their words, so a send that reads the
    // sum's word in some step would carry the final sum instead of that step's running value.
    if send.is_some_and(|(src, _)| reaches(src, s)) {
        return None;
    }
    Some(Dot {
        a: pr[fx::OP_A]?,
        b: pr[fx::OP_B]?,
        s,
        send,
        zero: plan.fresh_sum,
    })
}

/// Whether `pr` is at `word` in some step `t ≥ 0`.
fn reaches(pr: Prog, word: usize) -> bool {
    let gap = word as i64 - pr.addr;
    match pr.stride {
        0 => gap == 0,
        k => gap % k == 0 && gap / k >= 0,
    }
}

/// Runs one chain on its own: nothing to go side by side with, so each product is added as
/// it is formed.
pub(super) fn run_chain(mems: &mut [Vec<Option<f32>>], sink: &mut Sink, (p, next, d, w): Chain) {
    let mem = &mems[p];
    let mut sum = d.start(mem);
    for t in 0..i64::from(w) {
        sum += get(mem, d.a.at(t)) * get(mem, d.b.at(t));
    }
    finish(mems, sink, p, next, &d, sum, w as usize);
}

/// Stores a chain's sum and performs its sends, in step order.
fn finish(
    mems: &mut [Vec<Option<f32>>],
    sink: &mut Sink,
    p: usize,
    next: usize,
    d: &Dot,
    sum: f32,
    w: usize,
) {
    mems[p][d.s] = Some(sum);
    if let Some((src, dst)) = d.send {
        for t in 0..w as i64 {
            let v = get(&mems[p], src.at(t));
            sink.put(mems, next, dst.at(t), v);
        }
    }
}

/// Runs every chain in the order given, consecutive chains of one length in groups of
/// [`DOT_GROUP`] (a PE's chains come together, so its sends keep their order; sorting by
/// length instead would cost more than the few partial groups it saves). The caller guarantees that no chain
/// reads or writes a word another chain writes, sends excepted, whose order is kept per PE.
/// Returns the steps that ran side by side with other chains.
pub(super) fn run_chains(mems: &mut [Vec<Option<f32>>], sink: &mut Sink, chains: &[Chain]) -> u64 {
    let mut side = 0;
    let mut prods = [[0f32; DOT_GROUP]; BLOCK];
    for run in chains.chunk_by(|x, y| x.3 == y.3) {
        for group in run.chunks(DOT_GROUP) {
            match group {
                [one] => run_chain(mems, sink, *one),
                _ => {
                    dot_group(mems, sink, group, run[0].3 as usize, &mut prods);
                    side += group.len() as u64 * u64::from(run[0].3);
                }
            }
        }
    }
    side
}

/// Steps whose products are formed at a time before they are added up.
const BLOCK: usize = 64;

/// Runs up to [`DOT_GROUP`] chains of `w` steps each, then their sends in the given order.
/// Each block of steps first forms every chain's products (independent multiplications), then
/// adds them row by row: lane `j` of a row belongs to chain `j`, so the additions of all chains
/// go side by side (one vector addition per step) while each chain's stay in its own order.
/// Rust never fuses a multiplication into an addition, so forming the product first rounds
/// exactly as `sum + a·b` does.
fn dot_group(
    mems: &mut [Vec<Option<f32>>],
    sink: &mut Sink,
    group: &[Chain],
    w: usize,
    prods: &mut [[f32; DOT_GROUP]; BLOCK],
) {
    let mut regs = [0f32; DOT_GROUP];
    for (j, &(p, _, d, _)) in group.iter().enumerate() {
        regs[j] = d.start(&mems[p]);
    }
    let mut t0 = 0;
    while t0 < w {
        let tn = (w - t0).min(BLOCK);
        for (j, &(p, _, d, _)) in group.iter().enumerate() {
            let mem = &mems[p];
            if d.a.stride == 1 && d.b.stride == 1 {
                let (a, b) = (d.a.at(t0 as i64), d.b.at(t0 as i64));
                let rows = prods[..tn].iter_mut();
                for ((row, x), y) in rows.zip(&mem[a..a + tn]).zip(&mem[b..b + tn]) {
                    row[j] = x.unwrap_or(0.0) * y.unwrap_or(0.0);
                }
            } else {
                for (t, row) in prods[..tn].iter_mut().enumerate() {
                    let at = (t0 + t) as i64;
                    row[j] = get(mem, d.a.at(at)) * get(mem, d.b.at(at));
                }
            }
        }
        // Lanes past the group hold stale products; their sums are never stored.
        for row in &prods[..tn] {
            for j in 0..DOT_GROUP {
                regs[j] += row[j];
            }
        }
        t0 += tn;
    }
    for (j, &(p, next, d, _)) in group.iter().enumerate() {
        finish(mems, sink, p, next, &d, regs[j], w);
    }
}
