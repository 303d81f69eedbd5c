//! `schedule-stream`: a ring-attention schedule emitted directly as format-2
//! loop programs, for layers far too large to unroll.
//!
//! Each PE owns a set of query rows and the k/v rows of the same tokens.
//! Per head, in ring step `s` every PE computes its rows against the k/v block
//! it holds (its own in step 0, its predecessor's `s` steps back later) while
//! the link forwards that block to the next PE: in place without a mask (each
//! word in the cycle of its last read), into the other of two buffers under
//! one. Softmax is streamed: each block's exponentials are added into a
//! running row sum `l` and their weighted values into the output row `y`, and
//! `y` is divided by `l` once at the end (deferred normalisation, `d`
//! divisions per row). Nothing of size n²/m is ever stored.
//!
//! Under a causal mask rows are assigned zigzag: with `C = n / 2m`, PE `p`
//! owns chunks `p` and `2m − 1 − p` of `C` tokens. Then every step costs every
//! PE the same: step 0 is the triangle of its own `2C` rows (local row `ρ`
//! sees local keys `0..=ρ`); in steps `1..=p` the predecessor's block is
//! earlier in the sequence and all `2C` rows see its first chunk; in later
//! steps only the second chunk's `C` rows see all `2C` keys. Both are
//! `2C²` scores, so the PEs stay in lockstep without any padding, which the
//! buffer hand-over relies on.
//!
//! The emitted programs use the plain `exp(s·x)` of the other schedules;
//! there is no rescaling, so the operation count is exactly the necessary
//! count and the schedule meets the lower bound when it applies.

use std::collections::BTreeMap;

use isa::{
    Acc, AccSrc, Addr, Bundle, Cmp, CountStep, Field, LBundle, Loop, LoopProgram, Node, Op, Pred,
    Slot, Term, Xfer, XferSrc,
};

use crate::problem::Problem;

mod carried;
mod cut;
mod lagged;
mod merge;
mod mirrored;
mod once;
mod overlay;
mod paired;
mod uneven;
mod whole;

pub const NAME: &str = "schedule-stream";
pub const DESCRIPTION: &str =
    "ring-attention stream schedule as loop programs (k/v blocks rotate, streamed softmax)";

/// Where element `[h, t, c]` of a tensor lives: on the PE owning token `t` (contiguous, or
/// zigzag under a causal mask), at `base + h·head_stride + local(t)·dim + c` — the manifest's
/// affine layout, so what the generator assumes is what loaders are told.
pub use runtime::manifest::Layout;

/// Where a tensor of the layer lives: an affine [`Layout`], or one `(pe, addr)` per element
/// where the deal is not one (the uneven deal's rows, see [`uneven`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Place {
    Affine(Layout),
    /// Per element of `[heads, tokens, dim]` in C order.
    Listed {
        tokens: u32,
        dim: u32,
        pe: Vec<u32>,
        addr: Vec<u32>,
    },
}

impl Place {
    /// `(pe, addr)` of element `[h, t, c]` on a ring of `pes` PEs.
    pub fn locate(&self, pes: u32, h: u32, t: u32, c: u32) -> (u32, u64) {
        match self {
            Place::Affine(l) => l.locate(pes, h, t, c),
            Place::Listed {
                tokens,
                dim,
                pe,
                addr,
            } => {
                let i = ((h as usize * *tokens as usize) + t as usize) * *dim as usize + c as usize;
                (pe[i], u64::from(addr[i]))
            }
        }
    }
}

/// The emitted layer.
#[derive(Clone, Debug)]
pub struct Stream {
    pub programs: Vec<LoopProgram>,
    /// Input tensor name (`q`, `k`, `v` or `x`) → layout.
    pub inputs: BTreeMap<String, Place>,
    pub output: Place,
    pub cycles: u64,
    /// The plain formulation's operations (what the softmax needs without
    /// the running maximum).
    pub ops: crate::schedule::OpCounts,
    /// Every operation the programs execute, running maxima and rescaling
    /// included: the necessary count of the formulation emitted.
    pub total_ops: u64,
    /// Ring steps the values trail the keys by (0: none, every step rescales).
    pub lag: u32,
    /// Deferred (each output element divided once) or per weight (the whole ring's lag with
    /// fewer keys per row than `d`).
    pub normalisation: runtime::layer::Normalisation,
    /// The memory map every PE shares, buffer by buffer; empty where the maps differ by PE.
    pub buffers: Vec<runtime::manifest::BufferInfo>,
}

impl Stream {
    /// A stream whose rows are whole on their PEs under deferred normalisation (no
    /// rescaling), each PE with a memory map of its own sizes: `scores` scores per layer, each a
    /// product chain of `d` (fewer than `weights` where a score serves two weights), `weights`
    /// weights, each one exponential and one product chain of `d`, and `d` divisions per row
    /// and head; the values trail the keys by `lag` ring steps.
    fn per_pe_deferred(
        programs: Vec<LoopProgram>,
        places: (BTreeMap<String, Place>, Place),
        cycles: u64,
        counts: (u64, u64),
        shape: (u32, u32, u32),
        lag: u32,
    ) -> Stream {
        let norm = runtime::layer::Normalisation::Deferred;
        let divisions = u64::from(shape.0) * u64::from(shape.1) * u64::from(shape.2);
        Self::per_pe(
            programs,
            places,
            cycles,
            counts,
            shape,
            (lag, norm, divisions),
        )
    }

    /// [`Stream::per_pe_deferred`] under any normalisation, with the `divisions` it takes.
    fn per_pe(
        programs: Vec<LoopProgram>,
        (inputs, output): (BTreeMap<String, Place>, Place),
        cycles: u64,
        (scores, weights): (u64, u64),
        (_, d, _): (u32, u32, u32),
        (lag, normalisation, divisions): (u32, runtime::layer::Normalisation, u64),
    ) -> Stream {
        let total_ops = programs
            .iter()
            .map(|p| p.op_counts().iter().sum::<u64>())
            .sum();
        let ops = crate::schedule::OpCounts {
            phase1_mac: scores * u64::from(d),
            phase2_exp: weights,
            phase2_max: 0,
            phase2_div: divisions,
            phase3_mac: weights * u64::from(d),
        };
        Stream {
            programs,
            inputs,
            output,
            cycles,
            ops,
            total_ops,
            lag,
            normalisation,
            buffers: Vec::new(),
        }
    }
}

/// One buffer of a memory map.
fn buffer(name: &str, base: u32, words: u32) -> runtime::manifest::BufferInfo {
    runtime::manifest::BufferInfo {
        name: name.to_string(),
        base,
        words,
    }
}

/// Why the stream schedule does not apply, if it does not.
pub fn unsupported(p: &Problem, pes: u32) -> Option<String> {
    let (n, m) = (p.tokens, pes);
    if p.symmetric != p.shared_values {
        return Some(format!(
            "{NAME} handles q = k = v or three separate inputs, not q = k with separate v"
        ));
    }
    if p.causal {
        let dealt = padded_tokens(n, m);
        let chunk = dealt / (2 * m);
        // Step 0's triangle carries the own block to the next PE on its score loops:
        // `C(2C + 1)·d` iterations for `4C·d` words, enough from `C = 2` on.
        if dealt < 4 * m {
            return Some(format!(
                "{NAME} deals a causal layer to {m} PEs in {} chunks of at least 2 tokens: {n} tokens would be {dealt} dealt in chunks of {chunk}",
                2 * m
            ));
        }
    }
    // Without a mask any count deals: blocks of `⌈n/m⌉` tokens, the last PEs' short or empty.
    None
}

/// What a PE forwards of the block it holds in a ring step.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fwd {
    None,
    /// The whole block (or, in the lagged programs, the whole k or v half of it).
    Full,
    /// Only the first chunk (of the k rows and of the v rows): a hop carrying a block whose
    /// late chunk nobody further on reads.
    Trim,
}

/// What PE `pe` forwards in step `s` of a ring of `m`, `p_live` being the first PE whose late
/// chunk holds a token under a causal mask.
///
/// The block held in step `s` is PE `b`'s, on its way b → … → m − 1 → 0 → … → b − 1. Its late
/// chunk (chunk 2m − 1 − b) is read only by the rows of later chunks, the late chunks of the
/// PEs below `b`; its first chunk by the first chunks of the PEs above `b` and those same late
/// chunks. Where all of those late chunks are padding (`b ≤ p_live`: PE 0's block always), no
/// hop carries the late chunk, so none carries padding, and past PE m − 1 nothing is carried.
/// The ring's last step forwards nothing.
fn hop(pe: u32, m: u32, s: u32, causal: bool, p_live: u32) -> Fwd {
    let b = (pe + m - s % m) % m;
    let unread_beyond = causal && b <= p_live;
    if s + 1 >= m || (unread_beyond && (pe < b || pe + 1 == m)) {
        Fwd::None
    } else if unread_beyond {
        Fwd::Trim
    } else {
        Fwd::Full
    }
}

/// Tokens as the stream deals them: under a causal mask a multiple of `2m`, the tokens past
/// the layer's end being the last chunks' last rows (no real row sees them).
fn padded_tokens(n: u32, m: u32) -> u32 {
    n.div_ceil(2 * m).saturating_mul(2 * m)
}

/// Local rows of PE `pe` that hold tokens of a causal layer dealt as [`padded_tokens`]: the
/// second chunk of PE `p` is chunk `2m − 1 − p`, and only the last chunks can be short.
fn live_rows(n: u32, m: u32, pe: u32) -> u32 {
    let c = padded_tokens(n, m) / (2 * m);
    let start = (2 * m - 1 - pe).saturating_mul(c);
    c + n.saturating_sub(start).min(c)
}

/// An affine address under construction.
#[derive(Clone, Debug, Default)]
struct Ad {
    base: i64,
    terms: Vec<(u8, i32, u32)>,
}

fn ad(base: u32) -> Ad {
    Ad {
        base: i64::from(base),
        terms: Vec::new(),
    }
}

impl Ad {
    fn plus(mut self, k: i64) -> Ad {
        self.base += k;
        self
    }
    /// Adds `stride · i_level` (merging with an existing plain term).
    fn t(mut self, level: u8, stride: i64) -> Ad {
        if stride == 0 {
            return self;
        }
        if let Some(x) = self.terms.iter_mut().find(|x| x.0 == level && x.2 == 0) {
            x.1 += stride as i32;
        } else {
            self.terms.push((level, stride as i32, 0));
        }
        self.terms.retain(|x| x.1 != 0);
        self
    }
    fn wrap(mut self, level: u8, stride: i64, wrap: u32) -> Ad {
        self.terms.push((level, stride as i32, wrap));
        self
    }
}

/// A bundle from addresses; terms and predicates put in canonical order.
struct B {
    op: Op,
    acc: Acc,
    xfer: Xfer,
    fields: Vec<(Field, Ad)>,
    preds: Vec<Pred>,
}

impl B {
    fn new() -> B {
        B {
            op: Op::Nop,
            acc: Acc::Nop,
            xfer: Xfer::Nop,
            fields: Vec::new(),
            preds: Vec::new(),
        }
    }
    fn mul(mut self, a: Ad, b: Ad, dst: Option<Ad>) -> B {
        self.op = Op::mul(0, 0, dst.as_ref().map(|_| 0));
        self.fields.push((Field::OpA, a));
        self.fields.push((Field::OpB, b));
        if let Some(d) = dst {
            self.fields.push((Field::OpDst, d));
        }
        self
    }
    fn div(mut self, a: Ad, b: Ad, dst: Ad) -> B {
        self.op = Op::div(0, 0, Some(0));
        self.fields.push((Field::OpA, a));
        self.fields.push((Field::OpB, b));
        self.fields.push((Field::OpDst, dst));
        self
    }
    fn max(mut self, a: Ad, b: Ad, dst: Ad) -> B {
        self.op = Op::max(0, 0, Some(0));
        self.fields.push((Field::OpA, a));
        self.fields.push((Field::OpB, b));
        self.fields.push((Field::OpDst, dst));
        self
    }
    fn expd(mut self, a: Ad, b: Ad, scale: f32, dst: Ad) -> B {
        self.op = Op::expd(0, 0, scale, Some(0));
        self.fields.push((Field::OpA, a));
        self.fields.push((Field::OpB, b));
        self.fields.push((Field::OpDst, dst));
        self
    }
    fn exp(mut self, a: Ad, scale: f32, dst: Ad) -> B {
        self.op = Op::exp(0, scale, Some(0));
        self.fields.push((Field::OpA, a));
        self.fields.push((Field::OpDst, dst));
        self
    }
    /// `add 0 -> dst` when `src` is `None`.
    fn add(mut self, src: Option<Ad>, dst: Ad) -> B {
        self.acc = Acc::Add {
            src: if src.is_some() {
                AccSrc::Mem(0)
            } else {
                AccSrc::Zero
            },
            dst: Some(0),
        };
        if let Some(s) = src {
            self.fields.push((Field::AccSrc, s));
        }
        self.fields.push((Field::AccDst, dst));
        self
    }
    fn send(mut self, s: Option<&Send>) -> B {
        if let Some(s) = s {
            self.xfer = Xfer::Send {
                src: XferSrc::Mem(0),
                dst: 0,
            };
            self.fields.push((Field::XferSrc, s.src.clone()));
            self.fields.push((Field::XferDst, s.dst.clone()));
            self.preds.extend(s.preds.iter().copied());
        }
        self
    }
    fn build(self) -> Node {
        let mut bundle = Bundle {
            op: self.op,
            acc: self.acc,
            xfer: self.xfer,
        };
        let mut terms = Vec::new();
        for (f, a) in &self.fields {
            isa::looped::set_field(&mut bundle, *f, a.base as Addr);
            for &(level, stride, wrap) in &a.terms {
                terms.push(Term {
                    field: *f,
                    level,
                    stride,
                    wrap,
                });
            }
        }
        terms.sort_by_key(|t| (t.field, t.level));
        let mut preds = self.preds;
        preds.sort();
        preds.dedup();
        Node::Bundle(LBundle {
            bundle,
            terms,
            preds,
        })
    }
}

/// A bundle that does nothing.
fn nop() -> Node {
    B::new().build()
}

/// `count` idle cycles.
fn wait(count: u64) -> Result<Vec<Node>, String> {
    let c = u32::try_from(count).map_err(|_| format!("{NAME}: a wait of {count} cycles"))?;
    Ok(lp(c, vec![nop()]))
}

/// Cycles of a stretch of a head's body: under a loop standing for the head loop, so that
/// stepped counts find the row loop at its level.
fn head_cycles(nodes: &[Node]) -> u64 {
    LoopProgram {
        pe: 0,
        pes: 1,
        mem_words: 0,
        body: lp(1, nodes.to_vec()),
    }
    .cycles()
}

/// Every PE's program from its body of one head: each body padded to the longest (the heads
/// start together, so a block of the next head lands where this one's was read), the head
/// loop around it, memory `words(pe)`, then `finish` (the folding a stream's bodies allow).
fn head_programs(
    bodies: Vec<Vec<Node>>,
    (m, heads): (u32, u32),
    words: impl Fn(usize) -> u32,
    finish: impl Fn(LoopProgram) -> LoopProgram,
) -> Result<Vec<LoopProgram>, String> {
    let ends: Vec<u64> = bodies.iter().map(|b| head_cycles(b)).collect();
    let head = ends.iter().copied().max().unwrap_or(0);
    bodies
        .into_iter()
        .zip(ends)
        .enumerate()
        .map(|(pe, (mut body, e))| {
            body.extend(wait(head - e)?);
            Ok(finish(LoopProgram {
                pe: pe as u32,
                pes: m,
                mem_words: words(pe),
                body: lp(heads, body),
            }))
        })
        .collect()
}

/// A loop; none for a count of 0. A count of 1 still makes a loop so that
/// the levels the bodies refer to stay where the generator put them.
fn lp(count: u32, body: Vec<Node>) -> Vec<Node> {
    if count == 0 {
        Vec::new()
    } else {
        vec![Node::Loop(Loop::new(count, body))]
    }
}

/// A send riding on the score loops: source and destination addresses and
/// the predicates that keep it to the block's words.
#[derive(Clone, Debug)]
struct Send {
    src: Ad,
    dst: Ad,
    preds: Vec<Pred>,
}

/// Memory map of one PE (the same on every PE).
struct Map {
    d: u32,
    /// Query rows per PE.
    rows: u32,
    q: u32,
    /// Own k/v blocks: per head `[k rows][v rows]` (or `[x rows]`).
    kv: u32,
    /// Words of one k/v block (what travels per step).
    block: u32,
    /// Offset of the v rows inside a block.
    v_off: u32,
    y: u32,
    buf: [u32; 2],
    s: u32,
    l: u32,
    /// Running row maxima, two slots of `rows` words (safe softmax): a
    /// round reads the old maximum from one and writes the new one to the
    /// other, so no copy is ever needed.
    mx: u32,
    /// The rescale factor of the current round.
    f: u32,
    words: u32,
}

/// What one call of [`Ctx::block`] computes: `rows` query rows starting at
/// local row `r0` against `keys` keys starting at key row `k0` of the block at
/// `kb` (k rows; v rows at `kb + v_off`).
struct Work {
    r0: u32,
    rows: u32,
    k0: u32,
    keys: u32,
    kb: Ad,
    first: bool,
    /// Words of the block this work's score loops forward, and where.
    send: Option<(Ad, Ad, u32)>,
    /// Safe softmax: base of the max slot holding the old maximum (written
    /// by a first round) and of the one receiving the new maximum.
    slots: Option<(Ad, Ad)>,
    /// A causal triangle: local row `r0 + i` sees `keys + i` keys (stepped loops), and `send`
    /// gives the words each row forwards rather than the whole work's.
    tri: bool,
    /// In-place rotation: the last row forwards every k and v word it reads, in the cycle it
    /// reads it, to the same offset of this block on the next PE (`kb` there).
    forward_to: Option<Ad>,
    /// Keys at or past this stand for tokens past the layer's end (no mask: a padded block):
    /// every slot of their iterations is off, sends included, so no PE reads or forwards them.
    key_limit: Option<u32>,
}

struct Ctx<'a> {
    map: &'a Map,
    scale: f32,
    /// Depth at which the block's loops start (levels below are taken).
    depth: u8,
    /// Head loop level.
    head: u8,
    /// Local rows below this hold tokens; the rest stand for tokens past the layer's end.
    live: u32,
}

impl Ctx<'_> {
    fn block(&self, w: &Work) -> Vec<Node> {
        let m = self.map;
        let d = i64::from(m.d);
        let hd = i64::from(m.rows) * d;
        let lr = self.depth;
        let row_loop = true;
        let (lb, lc) = (lr + 1, lr + 2);
        // Address of local query row `a` (r0 + i_lr).
        let row = |base: Ad, stride: i64| {
            let a = base.plus(i64::from(w.r0) * stride);
            if row_loop {
                a.t(lr, stride)
            } else {
                a
            }
        };
        let q = row(ad(m.q).t(self.head, hd), d);
        let y = row(ad(m.y).t(self.head, hd), d);
        let l = row(ad(m.l), 1);
        let k = w.kb.clone().plus(i64::from(w.k0) * d);
        let v = k.clone().plus(i64::from(m.v_off));
        let s = ad(m.s);
        let key_words = i64::from(w.keys) * d;
        // Loops over the keys: in a triangle their count grows by one per row.
        let klp = |less: u32, body: Vec<Node>| -> Vec<Node> {
            let count = w.keys - less;
            if w.tri && count > 0 {
                vec![Node::Loop(Loop {
                    count,
                    step: Some(CountStep { level: lr, per: 1 }),
                    body,
                })]
            } else {
                lp(count, body)
            }
        };
        // The score loops enumerate (row, key, col) in order; word number
        // `(a − r0)·keys·d + b·d + c` of the block is forwarded in that cycle. In a triangle
        // rows differ in length, so each row forwards the same `words` from its first keys.
        let send_at = |c0: i64, col_level: Option<u8>| {
            w.send.as_ref().map(|(src, dst, words)| {
                if w.tri {
                    let at = |a: &Ad| {
                        let mut x = a.clone().plus(c0).t(lr, i64::from(*words)).t(lb, d);
                        if let Some(cl) = col_level {
                            x = x.t(cl, 1);
                        }
                        x
                    };
                    return Send {
                        src: at(src),
                        dst: at(dst),
                        preds: vec![Pred {
                            slot: Slot::Xfer,
                            level: lb,
                            cmp: Cmp::Lt,
                            value: words / m.d,
                        }],
                    };
                }
                let mut preds = Vec::new();
                let full_rows = i64::from(*words) / key_words;
                let rem = i64::from(*words) % key_words;
                if row_loop {
                    preds.push(Pred {
                        slot: Slot::Xfer,
                        level: lr,
                        cmp: Cmp::Lt,
                        value: (full_rows + i64::from(rem > 0)) as u32,
                    });
                }
                if rem > 0 {
                    // A cut inside a row is only expressible in the first row (predicates are
                    // conjunctions); every caller sends whole rows, or a prefix of a one-row
                    // work, and the tests' bit-exact runs would show a lost word.
                    debug_assert!(!row_loop || full_rows == 0, "partial send in a row loop");
                    preds.push(Pred {
                        slot: Slot::Xfer,
                        level: lb,
                        cmp: Cmp::Lt,
                        value: (rem / d) as u32,
                    });
                }
                let at = |a: &Ad| {
                    let mut x = a.clone().plus(c0);
                    if row_loop {
                        x = x.t(lr, key_words);
                    }
                    x = x.t(lb, d);
                    if let Some(cl) = col_level {
                        x = x.t(cl, 1);
                    }
                    x
                };
                Send {
                    src: at(src),
                    dst: at(dst),
                    preds,
                }
            })
        };
        let mut body = Vec::new();
        // Scores: S[b] = Σ_c q[a][c]·k[b][c].
        // In-place rotation: a word of the block is forwarded by the last row, in the cycle
        // of its last read; the next PE, in lockstep, reads its own copy of that word in the
        // same cycle, before the arriving word is written over it.
        let last_row = |src: Ad| {
            w.forward_to.as_ref().map(|to| {
                // The same offset from `to` as `src` has from `kb`.
                let mut dst = to.clone().plus(src.base - w.kb.base);
                dst.terms
                    .extend(src.terms.iter().filter(|t| !w.kb.terms.contains(t)));
                Send {
                    src,
                    dst,
                    preds: (w.rows > 1)
                        .then_some(Pred {
                            slot: Slot::Xfer,
                            level: lr,
                            cmp: Cmp::Eq,
                            value: w.rows - 1,
                        })
                        .into_iter()
                        .collect(),
                }
            })
        };
        // A shared block's words are read again as values after the scores: only the value
        // loops may forward them.
        let fwd = |src: Ad, spread: Option<Send>| {
            if m.v_off == 0 {
                spread
            } else {
                last_row(src).or(spread)
            }
        };
        let k_at = |c0: i64, col: bool| {
            let a = k.clone().plus(c0).t(lb, d);
            if col {
                a.t(lc, 1)
            } else {
                a
            }
        };
        let mut score = vec![B::new()
            .mul(q.clone(), k_at(0, false), None)
            .add(None, s.clone().t(lb, 1))
            .send(fwd(k_at(0, false), send_at(0, None)).as_ref())
            .build()];
        score.extend(lp(
            m.d - 1,
            vec![B::new()
                .mul(q.clone().plus(1).t(lc, 1), k_at(1, true), None)
                .add(Some(s.clone().t(lb, 1)), s.clone().t(lb, 1))
                .send(fwd(k_at(1, true), send_at(1, Some(lc))).as_ref())
                .build()],
        ));
        let live = w.key_limit.unwrap_or(w.keys);
        let keep = |mut nodes: Vec<Node>, level: u8, less: u32| {
            if live < w.keys {
                mask_keys(&mut nodes, level, live.saturating_sub(less));
            }
            nodes
        };
        body.extend(keep(klp(0, score), lb, 0));
        let e = |off: i64| s.clone().plus(off).t(lb, 1);
        // Safe softmax: the row maximum so far, and for a later round the
        // factor exp(s·(m_old − m_new)) that rescales l and y.
        let mut shift = None;
        if let Some((old, new)) = &w.slots {
            let mo = row(old.clone(), 1);
            let mn = row(new.clone(), 1);
            let f = ad(m.f);
            if w.first {
                if w.keys >= 2 {
                    // With one live key the maximum is of that key alone.
                    let second = if live >= 2 { 1 } else { 0 };
                    body.push(
                        B::new()
                            .max(s.clone(), s.clone().plus(second), mo.clone())
                            .build(),
                    );
                    body.extend(keep(
                        klp(2, vec![B::new().max(mo.clone(), e(2), mo.clone()).build()]),
                        lb,
                        2,
                    ));
                } else {
                    body.push(B::new().max(s.clone(), s.clone(), mo.clone()).build());
                }
                shift = Some(mo);
            } else if live == 0 {
                // A block of padding only: the maximum moves to the new slot unchanged and
                // nothing is rescaled; the rescaling's cycles stay, so the PEs keep in step.
                body.push(B::new().max(mo.clone(), mo, mn.clone()).build());
                body.extend(keep(
                    lp(
                        w.keys - 1,
                        vec![B::new().max(mn.clone(), e(1), mn.clone()).build()],
                    ),
                    lb,
                    1,
                ));
                body.push(B::new().build());
                body.push(B::new().build());
                body.extend(lp(m.d, vec![B::new().build()]));
                shift = Some(mn);
            } else {
                body.push(B::new().max(mo.clone(), s.clone(), mn.clone()).build());
                body.extend(keep(
                    lp(
                        w.keys - 1,
                        vec![B::new().max(mn.clone(), e(1), mn.clone()).build()],
                    ),
                    lb,
                    1,
                ));
                body.push(B::new().expd(mo, mn.clone(), self.scale, f.clone()).build());
                body.push(B::new().mul(l.clone(), f.clone(), Some(l.clone())).build());
                let yc = y.clone().t(lb, 1);
                body.extend(lp(m.d, vec![B::new().mul(yc.clone(), f, Some(yc)).build()]));
                shift = Some(mn);
            }
        }
        // Exponentials, summed into l[a].
        let ex = |x: Ad| match &shift {
            Some(mx) => B::new().expd(x.clone(), mx.clone(), self.scale, x),
            None => B::new().exp(x.clone(), self.scale, x),
        };
        if w.first {
            body.push(ex(s.clone()).add(None, l.clone()).build());
            body.extend(keep(
                klp(1, vec![ex(e(1)).add(Some(l.clone()), l.clone()).build()]),
                lb,
                1,
            ));
        } else {
            body.extend(keep(
                lp(
                    w.keys,
                    vec![ex(e(0)).add(Some(l.clone()), l.clone()).build()],
                ),
                lb,
                0,
            ));
        }
        // Weighted values: y[a][c] += Σ_b e[b]·v[b][c]; columns outside,
        // keys inside, so each y word is one running sum.
        let (lc2, lb2) = (lb, lb + 1);
        let yc = y.clone().t(lc2, 1);
        let vv = |off: i64| v.clone().plus(off * d).t(lc2, 1).t(lb2, d);
        let ee = |off: i64| s.clone().plus(off).t(lb2, 1);
        let mut pv = Vec::new();
        if w.first {
            pv.push(
                B::new()
                    .mul(s.clone(), v.clone().t(lc2, 1), None)
                    .add(None, yc.clone())
                    .send(last_row(v.clone().t(lc2, 1)).as_ref())
                    .build(),
            );
            pv.extend(keep(
                klp(
                    1,
                    vec![B::new()
                        .mul(ee(1), vv(1), None)
                        .add(Some(yc.clone()), yc.clone())
                        .send(last_row(vv(1)).as_ref())
                        .build()],
                ),
                lb2,
                1,
            ));
        } else {
            pv.extend(keep(
                lp(
                    w.keys,
                    vec![B::new()
                        .mul(ee(0), vv(0), None)
                        .add(Some(yc.clone()), yc.clone())
                        .send(last_row(vv(0)).as_ref())
                        .build()],
                ),
                lb2,
                0,
            ));
        }
        body.extend(lp(m.d, pv));
        let mut nodes = lp(w.rows, body);
        mask_rows(&mut nodes, lr, w.r0, w.rows, self.live);
        if w.first && live == 0 {
            // The PE's own block is padding only, and so are its rows: nothing to compute or
            // forward (the first key's bundles stand outside the masked key loops).
            mask_keys(&mut nodes, lb, 0);
        }
        nodes
    }
}

/// How far a causal safe layer's values may trail its keys ([`lagged`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Lag {
    /// The largest lag whose working set fits `limit` words per PE (by default the PE's share
    /// of inputs and outputs plus 5 % and 4096 words); none if no lag fits.
    Fit(Option<u32>),
    /// Exactly `g` ring steps: an even divisor of the ring.
    Steps(u32),
    /// Values with their keys: every step rescales.
    Off,
    /// The whole ring (no rescaling), each weight divided by its row's sum before the values
    /// instead of each output element after them: fewer divisions where rows have fewer keys
    /// than `d` (or, under a causal mask, `n + 1 < 2d`). One group holds the whole ring, so
    /// the ring need not be even.
    PerWeight,
}

/// Builds the stream schedule; `safe` subtracts a running row maximum
/// (online softmax with rescaling) instead of exponentiating raw scores.
pub fn run(p: &Problem, pes: u32, safe: bool) -> Result<Stream, String> {
    run_with(p, pes, safe, Lag::Fit(None))
}

/// Whether one division per weight takes fewer divisions than one per output element: rows
/// see fewer keys than `d` (without a mask), or the `n(n + 1)/2` weights of a causal head are
/// fewer than its `n·d` output elements.
pub fn per_weight_pays(p: &Problem) -> bool {
    if p.causal {
        u64::from(p.tokens) + 1 < 2 * u64::from(p.dim)
    } else {
        p.tokens < p.dim
    }
}

/// Words per PE the stream may use without a `--mem` limit: its share of the layer's inputs
/// and outputs, 5 % more, and 4096 words of working set.
pub fn allowance(p: &Problem, pes: u32) -> u64 {
    let tensors: u64 = if p.symmetric { 2 } else { 4 };
    let share =
        tensors * u64::from(p.heads) * u64::from(p.tokens) / u64::from(pes) * u64::from(p.dim);
    share + share / 20 + 4096
}

/// Lagged programs: their own k/v and output bases, the lag, and whether each weight is
/// divided.
struct Lagged {
    programs: Vec<LoopProgram>,
    kv: u32,
    y: u32,
    buffers: Vec<runtime::manifest::BufferInfo>,
    g: u32,
    per_weight: bool,
}

/// The lagged programs, if `lag` asks for them and they apply.
fn lagged_programs(
    p: &Problem,
    pes: u32,
    safe: bool,
    lag: Lag,
    live: &dyn Fn(u32) -> u32,
) -> Result<Option<Lagged>, String> {
    // Without a mask every row sees every key, so a padded block's missing keys would need
    // masking that the lagged programs do not do: tokens must divide the ring there.
    let even = p.causal || live(pes - 1) == p.tokens / pes;
    if !(even && !p.symmetric && safe && pes >= 2) {
        let what = match lag {
            Lag::Steps(g) => format!("a lag of {g} steps"),
            Lag::PerWeight => "one division per weight".to_string(),
            Lag::Fit(_) | Lag::Off => return Ok(None),
        };
        return Err(format!(
            "{NAME}: {what} applies to layers with separate q/k/v and safe softmax on 2 or more PEs, without a mask only where the tokens divide the ring"
        ));
    }
    // The first PE whose second chunk holds a token (every first chunk is whole).
    let chunk = p.tokens / pes / 2;
    let p_live = (0..pes).find(|&q| live(q) > chunk).unwrap_or(pes);
    let build_as = |g: u32, per_weight: bool| -> Option<Lagged> {
        let map = lagged::LMap::with_norm(p, pes, g, per_weight)?;
        let programs = (0..pes)
            .map(|pe| lagged::program(&map, pe, pes, p.heads, p.scale as f32, live(pe), p_live))
            .collect::<Option<Vec<_>>>()?;
        Some(Lagged {
            programs,
            kv: map.kv,
            y: map.y,
            buffers: map.buffers(p.heads),
            g,
            per_weight,
        })
    };
    let build = |g: u32| build_as(g, false);
    match lag {
        Lag::Off => Ok(None),
        Lag::PerWeight => build_as(pes, true).map(Some).ok_or_else(|| {
            format!("{NAME}: one division per weight needs the whole ring's lag, which this layer's rows and addresses on {pes} PEs do not fit")
        }),
        Lag::Steps(g) => {
            if g < 2 || !g.is_multiple_of(2) || !pes.is_multiple_of(g) {
                return Err(format!(
                    "{NAME}: a lag must be an even divisor of the ring's {pes} PEs ({g} is not)"
                ));
            }
            build(g).map(Some).ok_or_else(|| {
                format!("{NAME}: a lag of {g} steps does not fit this layer's rows or addresses")
            })
        }
        Lag::Fit(limit) => {
            let budget = limit.map_or_else(|| allowance(p, pes), u64::from);
            Ok(lagged::lags(pes)
                .filter(|&g| {
                    lagged::LMap::new(p, pes, g).is_some_and(|m| u64::from(m.words) <= budget)
                })
                .find_map(build))
        }
    }
}

/// The uneven deal alone (separate q, k, v, no mask, safe softmax, a ring that does not
/// divide the tokens), whatever the padded deal would take.
pub fn run_uneven(p: &Problem, pes: u32) -> Result<Stream, String> {
    uneven::run(p, pes, None)
}

/// Whole rows alone (separate q, k, v, causal mask, safe softmax, a ring that does not deal
/// the tokens in `2m` equal chunks), whatever the padded deal would take.
pub fn run_whole(p: &Problem, pes: u32) -> Result<Stream, String> {
    whole::run(p, pes, None)
}

/// [`run_whole`] under one normalisation: deferred, per weight (each weight divided by its
/// row's sum instead of each output element), or per row (whichever divides fewer times).
pub fn run_whole_as(
    p: &Problem,
    pes: u32,
    norm: runtime::layer::Normalisation,
) -> Result<Stream, String> {
    whole::run_as(p, pes, norm)
}

/// [`run_whole_as`] with rows passed on to the next PE to even out the PEs' ends (an error
/// where that does not shorten the layer).
pub fn run_whole_passed_as(
    p: &Problem,
    pes: u32,
    norm: runtime::layer::Normalisation,
) -> Result<Stream, String> {
    whole::run_passed_as(p, pes, norm)
}

pub use whole::{Pass as WholePass, Timing as WholeTiming};

/// [`run_whole_as`] with rows passed on as `pass` says (an error where that does not shorten
/// the layer), each ring step starting once its block is whole or once each word it reads is
/// there.
pub fn run_whole_timed(
    p: &Problem,
    pes: u32,
    norm: runtime::layer::Normalisation,
    pass: WholePass,
    timing: WholeTiming,
) -> Result<Stream, String> {
    whole::run_timed_as(p, pes, norm, pass, timing)
}

/// Mirrored scores alone (q = k = v, no mask, safe softmax, a ring that does not divide the
/// tokens): rows dealt whole, each score computed once and its mirror carried home.
pub fn run_mirrored(p: &Problem, pes: u32) -> Result<Stream, String> {
    mirrored::run(p, pes, None)
}

pub use mirrored::Timing as MirroredTiming;

/// [`run_mirrored`] with the forwarding `timing` says: on the step, relayed, or the faster.
pub fn run_mirrored_timed(p: &Problem, pes: u32, timing: MirroredTiming) -> Result<Stream, String> {
    mirrored::run_timed(p, pes, None, timing)
}

/// Whether a shared layer without a mask computes each score block once for both of its uses
/// ([`paired`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Pairing {
    /// Where it applies, fits the memory and takes fewer cycles.
    Auto,
    /// Wherever it applies and fits the memory (an error otherwise).
    On,
    /// Never: every score is computed by the row that uses it.
    Off,
}

/// [`run`] with the lag chosen by `lag`.
pub fn run_with(p: &Problem, pes: u32, safe: bool, lag: Lag) -> Result<Stream, String> {
    run_pairing(p, pes, safe, lag, Pairing::Auto)
}

/// The carried stream alone ([`carried`]): every score computed once and its mirror carried
/// home with its block, each row's softmax local, no rescaling; `per_weight` divides each
/// weight by its row's sum instead of each output element. Whatever words it takes.
pub fn run_carried(p: &Problem, pes: u32, per_weight: bool) -> Result<Stream, String> {
    if !(p.symmetric && p.shared_values && !p.causal && p.safe()) {
        return Err(format!(
            "{NAME}: carried scores apply to shared layers without a mask under the safe softmax"
        ));
    }
    if let Some(why) = carried::unsupported(p.tokens, p.dim, pes) {
        return Err(format!("{NAME}: carried scores need {why}"));
    }
    carried::stream(p, pes, u64::MAX, per_weight)
        .ok_or_else(|| format!("{NAME}: the layer does not fit in 32-bit addresses"))
}

/// [`run_with`], pairing the scores of a shared layer as `pairing` says.
pub fn run_pairing(
    p: &Problem,
    pes: u32,
    safe: bool,
    lag: Lag,
    pairing: Pairing,
) -> Result<Stream, String> {
    let other = run_pairing_online(p, pes, safe, lag, pairing);
    // A shared layer whose mirrored scores are carried home needs no rescaling at all
    // ([`carried`]); where it fits it competes on cycles, and it is the one division per weight
    // a shared layer has.
    let carried = match (lag, pairing) {
        (_, Pairing::On | Pairing::Off) => None,
        (Lag::Fit(limit), _) if safe => {
            let budget = limit.map_or_else(|| allowance(p, pes), u64::from);
            carried::stream(p, pes, budget, false)
        }
        (Lag::PerWeight, _) if safe => carried::stream(p, pes, u64::MAX, true),
        _ => None,
    };
    // On a ring that does not divide the tokens the carried programs do not apply; rows dealt
    // whole in uneven counts carry the mirrors home instead ([`mirrored`]), kept only where they
    // take fewer cycles than every other stream.
    let mirrored = match (lag, pairing) {
        (Lag::Fit(limit), Pairing::Auto) if safe && mirrored::unsupported(p, pes).is_none() => {
            let budget = limit.map_or_else(|| allowance(p, pes), u64::from);
            mirrored::run(p, pes, Some(budget)).ok()
        }
        _ => None,
    };
    let best = match (other, carried) {
        (Ok(o), Some(c)) if c.cycles < o.cycles => Ok(c),
        (Err(_), Some(c)) => Ok(c),
        (other, _) => other,
    };
    match (best, mirrored) {
        (Ok(o), Some(w)) if w.cycles < o.cycles => Ok(w),
        (Err(_), Some(w)) => Ok(w),
        (best, _) => best,
    }
}

/// [`run_pairing`] without the carried variant: the paired stream's running states, or every
/// row computing its own scores.
fn run_pairing_online(
    p: &Problem,
    pes: u32,
    safe: bool,
    lag: Lag,
    pairing: Pairing,
) -> Result<Stream, String> {
    let plain = run_separately(p, pes, safe, lag)?;
    // A ring that does not divide the tokens: the uneven deal has no padding, and where it
    // fits the memory (`--mem`, or the default allowance: it keeps a head's every k/v row and
    // a score row per row) and takes fewer cycles it replaces the padded one.
    if let Lag::Fit(limit) = lag {
        if safe && uneven::unsupported(p, pes).is_none() {
            let budget = limit.map_or_else(|| allowance(p, pes), u64::from);
            if let Ok(u) = uneven::run(p, pes, Some(budget)) {
                if u.cycles < plain.cycles {
                    return Ok(u);
                }
            }
        }
    }
    // Under a causal mask the same holds for whole rows dealt over periods of `2m`: no
    // padding, every k/v row of a head kept and a score row per row.
    if let Lag::Fit(limit) = lag {
        if safe && whole::unsupported(p, pes).is_none() {
            let budget = limit.map_or_else(|| allowance(p, pes), u64::from);
            if let Ok(w) = whole::run(p, pes, Some(budget)) {
                if w.cycles < plain.cycles {
                    return Ok(w);
                }
            }
        }
    }
    let applies = p.symmetric && !p.causal && safe && paired::applies(p.tokens, pes);
    let rows = p.tokens.div_ceil(pes);
    let last_live = p.tokens.saturating_sub((pes - 1).saturating_mul(rows));
    let budget = match lag {
        Lag::Fit(Some(limit)) => u64::from(limit),
        _ => allowance(p, pes),
    };
    let map = if applies && pairing != Pairing::Off {
        // Own buffers where they fit, else the regions of heads not running.
        [false, true].into_iter().find_map(|reuse| {
            paired::PMap::new(rows, p.dim, p.heads, reuse).filter(|m| u64::from(m.words) <= budget)
        })
    } else {
        None
    };
    // A PE whose program cannot be built (a wait that does not fit a loop count) leaves the
    // layer to the unpaired stream, like a layout that does not fit.
    let programs: Option<Vec<LoopProgram>> = map.as_ref().and_then(|map| {
        (0..pes)
            .map(|pe| paired::program(map, pe, pes, p.heads, p.scale as f32, last_live))
            .collect()
    });
    let (Some(map), Some(programs)) = (map, programs) else {
        return match pairing {
            Pairing::On => Err(format!(
                "{NAME}: paired scores apply to safe shared layers without a mask, in blocks of at least 4 tokens (a padded last block keeps half its tokens and two more) on 3 PEs or more, within the memory budget"
            )),
            _ => Ok(plain),
        };
    };
    let cycles = programs.iter().map(LoopProgram::cycles).max().unwrap_or(0);
    if pairing == Pairing::Auto && cycles >= plain.cycles {
        return Ok(plain);
    }
    let total_ops: u64 = programs
        .iter()
        .map(|p| p.op_counts().iter().sum::<u64>())
        .sum();
    let mut ops = plain.ops;
    ops.phase1_mac = paired::products_per_head(p.tokens, p.dim, pes) * u64::from(p.heads);
    let lay = |base: u32| {
        Place::Affine(Layout {
            order: runtime::manifest::RowOrder::Contiguous,
            rows_per_pe: rows,
            base,
            head_stride: rows * p.dim,
            row_stride: p.dim,
        })
    };
    Ok(Stream {
        programs,
        inputs: BTreeMap::from([("x".to_string(), lay(map.x))]),
        output: lay(map.y),
        cycles,
        ops,
        total_ops,
        buffers: map.buffers(),
        ..plain
    })
}

/// The stream in which every row computes its own scores.
fn run_separately(p: &Problem, pes: u32, safe: bool, lag: Lag) -> Result<Stream, String> {
    if let Some(why) = unsupported(p, pes) {
        return Err(why);
    }
    // Under a causal mask the generators see the padded layer; rows past the end are masked.
    let dealt = Problem {
        tokens: if p.causal {
            padded_tokens(p.tokens, pes)
        } else {
            p.tokens.div_ceil(pes).saturating_mul(pes)
        },
        ..*p
    };
    let live = |pe: u32| {
        if p.causal {
            live_rows(p.tokens, pes, pe)
        } else {
            // Contiguous: only the last PE's last rows can be past the end.
            let r = dealt.tokens / pes;
            p.tokens.saturating_sub(pe * r).min(r)
        }
    };
    let lagged = lagged_programs(&dealt, pes, safe, lag, &live)?;
    let lag_steps = lagged.as_ref().map_or(0, |l| l.g);
    let per_weight = lagged.as_ref().is_some_and(|l| l.per_weight);
    let (n, d, heads, m) = (dealt.tokens, p.dim, p.heads, pes);
    let shared = p.symmetric;
    let causal = p.causal;
    let rows = n / m;
    let hd = rows * d;
    let block = if shared { hd } else { 2 * hd };
    let too_big = || format!("{NAME}: the layer does not fit in 32-bit addresses");
    let q = 0u32;
    let kv = if shared {
        q
    } else {
        heads.checked_mul(hd).ok_or_else(too_big)?
    };
    let y = kv
        .checked_add(heads.checked_mul(block).ok_or_else(too_big)?)
        .ok_or_else(too_big)?;
    let buf0 = y.checked_add(heads * hd).ok_or_else(too_big)?;
    // Without a mask blocks rotate in place: a separate layer's own k/v region is the buffer,
    // a shared one (whose x rows are also its queries) needs one. The causal steps differ
    // between PEs, so a block is read at different times and needs two.
    // Under a causal mask a separate layer's own k/v region, dead after step 0, is one of the
    // two buffers; a shared layer's own rows are its queries too, so it has both.
    let buffers_held = match (causal, shared) {
        (true, true) => 2,
        (true, false) | (false, true) => 1,
        (false, false) => 0,
    };
    // buf[1] receives the blocks of odd steps; buf[0] those of even steps of a shared causal
    // layer, or the rotating block of a shared layer without a mask.
    let buf1 = if causal && shared { buf0 + block } else { buf0 };
    let s = buf0 + buffers_held * block;
    let l = s + rows;
    let mx = l + rows;
    let f = mx + 2 * rows;
    let map = Map {
        d,
        rows,
        q,
        kv,
        block,
        v_off: if shared { 0 } else { hd },
        y,
        buf: [buf0, buf1],
        s,
        l,
        mx,
        f,
        words: if safe { f + 1 } else { l + rows },
    };
    let scale = p.scale as f32;
    let (programs, kv, y, buffers) = lagged
        .map(|l| (l.programs, l.kv, l.y, l.buffers))
        .unwrap_or_else(|| {
            let lives: Vec<u32> = (0..m).map(live).collect();
            let programs = (0..m)
                .map(|pe| program(&map, pe, m, heads, causal, scale, safe, &lives))
                .collect();
            let mut buffers = vec![buffer(if shared { "x" } else { "q" }, q, heads * hd)];
            if !shared {
                buffers.push(buffer("k/v", kv, heads * block));
            }
            buffers.push(buffer("y", y, heads * hd));
            if buffers_held > 0 {
                buffers.push(buffer("visiting blocks", buf0, buffers_held * block));
            }
            buffers.push(buffer("scores", map.s, rows));
            buffers.push(buffer("row sums", map.l, rows));
            if safe {
                buffers.push(buffer("row maxima", map.mx, 2 * rows));
                buffers.push(buffer("rescale factor", map.f, 1));
            }
            (programs, kv, y, buffers)
        });
    // Static: every PE's length follows from its loops; they are equal by
    // construction, which the tests check.
    let cycles = programs.iter().map(LoopProgram::cycles).max().unwrap_or(0);
    let total_ops: u64 = programs
        .iter()
        .map(|p| p.op_counts().iter().sum::<u64>())
        .sum();
    // The layer's own counts, not the padded ones.
    let n = p.tokens;
    let weights = if causal {
        u64::from(n) * (u64::from(n) + 1) / 2
    } else {
        u64::from(n) * u64::from(n)
    } * u64::from(heads);
    let ops = crate::schedule::OpCounts {
        phase1_mac: weights * u64::from(d),
        phase2_exp: weights,
        // The plain count: no maxima (the safe ones are in `total_ops`).
        phase2_max: 0,
        phase2_div: if per_weight {
            weights
        } else {
            u64::from(n) * u64::from(d) * u64::from(heads)
        },
        phase3_mac: weights * u64::from(d),
    };
    let lay = |base: u32, head_stride: u32| {
        Place::Affine(Layout {
            order: if causal {
                runtime::manifest::RowOrder::Zigzag
            } else {
                runtime::manifest::RowOrder::Contiguous
            },
            rows_per_pe: rows,
            base,
            head_stride,
            row_stride: d,
        })
    };
    let mut inputs = BTreeMap::new();
    if shared {
        inputs.insert("x".to_string(), lay(q, hd));
    } else {
        inputs.insert("q".to_string(), lay(q, hd));
        inputs.insert("k".to_string(), lay(kv, block));
        inputs.insert("v".to_string(), lay(kv + hd, block));
    }
    Ok(Stream {
        programs,
        inputs,
        output: lay(y, hd),
        cycles,
        ops,
        total_ops,
        lag: lag_steps,
        normalisation: if per_weight {
            runtime::layer::Normalisation::PerWeight
        } else {
            runtime::layer::Normalisation::Deferred
        },
        buffers,
    })
}

#[allow(clippy::too_many_arguments)] // the layer's facts, each a plain value
fn program(
    map: &Map,
    pe: u32,
    m: u32,
    heads: u32,
    causal: bool,
    scale: f32,
    safe: bool,
    lives: &[u32],
) -> LoopProgram {
    // Rows of PE `b` that hold tokens: without a mask also the keys of its block.
    let live_of = |b: u32| lives.get(b as usize).copied().unwrap_or(0);
    let live = live_of(pe);
    // Steps before this forward their block: a block forwarded in step `s` is held by the
    // next PEs in steps `s + 1, …`, up to the ring's last, and must reach one that computes
    // with it. Without a mask, the PEs right after this one may hold padding only (`dead`
    // of them), which only pass blocks on.
    let dead = if causal {
        0
    } else {
        (1..m).take_while(|j| live_of((pe + j) % m) == 0).count() as u32
    };
    let fwd_end = (m - 1).saturating_sub(dead);
    let d = i64::from(map.d);
    let block = i64::from(map.block);
    let ctx = |depth: u8| Ctx {
        map,
        scale,
        depth,
        head: 0,
        live,
    };
    let own = ad(map.kv).t(0, block);
    // Under a causal mask the block of step s ≥ 1 is in buf[1] for odd s and for even s in
    // the PE's own k/v region (free after step 0) or, shared, in buf[0]. The own region moves
    // with the head, so the step loops go two steps at a time and each step of a pair has
    // fixed buffers.
    let buf_of = |step: u32| {
        if !step.is_multiple_of(2) {
            ad(map.buf[1])
        } else if map.v_off == 0 {
            ad(map.buf[0])
        } else {
            own.clone()
        }
    };
    // Without a mask, where the blocks rotate in place from step 1 on.
    let rotating = if causal || map.v_off != 0 {
        own.clone()
    } else {
        ad(map.buf[0])
    };
    let rows_i = i64::from(map.rows);
    let slot0 = safe.then(|| (ad(map.mx), ad(map.mx)));
    let mut head = Vec::new();
    // Under a causal mask PE 0's block holds the earliest and the latest tokens, and every other
    // PE sees only its first chunk (PE p > 0 is later than chunk 0 and earlier than chunk
    // 2m − 1). So the block's second chunk is never read away from PE 0, and every hop of PE 0's
    // block (PE p's send in step p, p < m − 1) carries only the first chunk; likewise the blocks
    // of the next PEs where the late chunks past them are padding ([`hop`]).
    let c = map.rows / 2;
    let cd = c * map.d;
    let last_hop_ranges: Vec<(u32, u32)> = if map.v_off == 0 {
        vec![(0, cd)]
    } else {
        vec![(0, cd), (map.v_off, cd)]
    };
    let p_live = (0..m).find(|&q| live_of(q) > c).unwrap_or(m);
    let fwd_at = |s: u32| hop(pe, m, s, causal, p_live);
    // Step 0.
    if causal {
        let ranges = match fwd_at(0) {
            Fwd::None => Vec::new(),
            Fwd::Trim => last_hop_ranges.clone(),
            Fwd::Full => vec![(0, map.block)],
        };
        match triangle(&ctx(1), map, &ranges, &own, slot0.as_ref()) {
            Some(nodes) => head.extend(nodes),
            None => head.extend(unrolled_triangle(
                &ctx(1),
                map,
                ranges,
                &own,
                slot0.as_ref(),
            )),
        }
    } else {
        head.extend(ctx(1).block(&Work {
            r0: 0,
            rows: map.rows,
            k0: 0,
            keys: map.rows,
            kb: own.clone(),
            first: true,
            send: None,
            slots: slot0.clone(),
            tri: false,
            forward_to: (fwd_end > 0).then(|| rotating.clone()),
            key_limit: (live < map.rows).then_some(live),
        }));
    }
    // Later steps. Without a mask: all rows against the whole block. With
    // one: steps 1..=pe take all rows against the block's first chunk, later
    // steps the second chunk's rows against both chunks, as two rounds of
    // one chunk each so that both kinds of step cost the same (rescaling
    // included) and the PEs stay in lockstep.
    struct Phase {
        first: u32,
        count: u32,
        r0: u32,
        rows: u32,
        /// (first key, keys, which round) per round.
        rounds: Vec<(u32, u32)>,
    }
    let mut phases = Vec::new();
    if causal {
        phases.push(Phase {
            first: 1,
            count: pe,
            r0: 0,
            rows: 2 * c,
            rounds: vec![(0, c)],
        });
        phases.push(Phase {
            first: pe + 1,
            count: m - 1 - pe,
            r0: c,
            rows: c,
            rounds: vec![(0, c), (c, c)],
        });
    } else {
        phases.push(Phase {
            first: 1,
            count: m - 1,
            r0: 0,
            rows: map.rows,
            rounds: vec![(0, map.rows)],
        });
    }
    // One step's work, `s` being `first` plus the index of the loop at level 1 times `every`.
    let step = |ph: &Phase,
                first: u32,
                every: u32,
                count: u32,
                key_limit: Option<u32>,
                fwd: Fwd|
     -> Vec<Node> {
        let (kb, dst) = if causal {
            (buf_of(first), buf_of(first + 1))
        } else {
            (rotating.clone(), rotating.clone())
        };
        // Step `first + every·i` forwards unless it is the last that reaches a reader (under
        // a causal mask the run's steps all forward alike, `fwd`).
        let (forwards, stop) = if causal {
            (fwd != Fwd::None, count)
        } else {
            (
                first < fwd_end,
                fwd_end.saturating_sub(first).div_ceil(every),
            )
        };
        let preds: Vec<Pred> = if forwards && stop < count {
            vec![Pred {
                slot: Slot::Xfer,
                level: 1,
                cmp: Cmp::Lt,
                value: stop,
            }]
        } else {
            Vec::new()
        };
        // Step s writes the new row maximum to slot s % 2 and reads the old one from the
        // other (step 0 only writes slot 0).
        let slot = |s: u32| {
            let at = ad(map.mx + (s % 2) * map.rows);
            if every % 2 == 1 && count > 1 {
                // Consecutive steps alternate.
                let stride = if s.is_multiple_of(2) { rows_i } else { -rows_i };
                at.wrap(1, stride, 2)
            } else {
                at
            }
        };
        let n_rounds = ph.rounds.len() as u32;
        let per_round = map.block / n_rounds;
        let mut inner = Vec::new();
        if fwd == Fwd::Trim {
            // Only steps that see the block's first chunk alone are trimmed ([`hop`]).
            debug_assert_eq!(ph.rounds.len(), 1, "a trimmed step of the second kind");
            // One row group per range: each group's score loops carry one contiguous piece.
            let groups = last_hop_ranges.len() as u32;
            let rows = ph.rows / groups;
            for (g, &(offset, len)) in last_hop_ranges.iter().enumerate() {
                let off = i64::from(offset);
                inner.extend(ctx(2).block(&Work {
                    r0: ph.r0 + g as u32 * rows,
                    rows,
                    k0: 0,
                    keys: c,
                    kb: kb.clone(),
                    first: false,
                    send: Some((kb.clone().plus(off), dst.clone().plus(off), len)),
                    slots: safe.then(|| (slot(first + 1), slot(first))),
                    tri: false,
                    forward_to: None,
                    key_limit: None,
                }));
            }
            return inner;
        }
        if n_rounds == 1 {
            let (k0, keys) = ph.rounds[0];
            inner.extend(ctx(2).block(&Work {
                r0: ph.r0,
                rows: ph.rows,
                k0,
                keys,
                kb: kb.clone(),
                first: false,
                send: (forwards && causal).then(|| (kb.clone(), dst.clone(), per_round)),
                slots: safe.then(|| (slot(first + 1), slot(first))),
                tri: false,
                forward_to: (forwards && !causal).then(|| rotating.clone()),
                key_limit,
            }));
        } else {
            // Equal rounds of `keys` keys as one loop at level 2 over the round `j`: keys,
            // the forwarded piece and the max slots move with `j`. Rounds swap the slots back
            // and forth, so the step leaves the maximum where it found it.
            let (_, keys) = ph.rounds[0];
            let kd = i64::from(keys) * d;
            let piece = i64::from(per_round);
            let cur = i64::from(map.mx + ((ph.first + 1) % 2) * map.rows);
            let other = i64::from(map.mx + (ph.first % 2) * map.rows);
            let alternating = |a: i64, b: i64| ad(a as u32).wrap(2, b - a, 2);
            inner.extend(lp(
                n_rounds,
                ctx(3).block(&Work {
                    r0: ph.r0,
                    rows: ph.rows,
                    k0: 0,
                    keys,
                    kb: kb.clone().t(2, kd),
                    first: false,
                    send: (forwards && causal)
                        .then(|| (kb.clone().t(2, piece), dst.clone().t(2, piece), per_round)),
                    slots: safe.then(|| (alternating(cur, other), alternating(other, cur))),
                    tri: false,
                    forward_to: None,
                    key_limit: None,
                }),
            ));
        }
        if !preds.is_empty() {
            add_xfer_preds(&mut inner, &preds);
        }
        inner
    };
    for ph in &phases {
        if ph.count == 0 {
            continue;
        }
        if !causal {
            // Step `s` holds PE `(pe − s) mod m`'s block; the padded blocks (the last PEs',
            // short or empty) take runs of steps of their own, their missing keys masked.
            let limit = |s: u32| {
                let b = (pe + m - s % m) % m;
                let l = live_of(b);
                (l < map.rows).then_some(l)
            };
            let mut first = ph.first;
            let end = ph.first + ph.count;
            while first < end {
                let mut count = 1;
                while first + count < end && limit(first + count) == limit(first) {
                    count += 1;
                }
                let mut nodes = step(ph, first, 1, count, limit(first), Fwd::Full);
                if limit(first) == Some(0) && first + count == end {
                    // Padding-only blocks to the ring's end: their maxima would be copied
                    // for steps that never come.
                    drop_copies(&mut nodes);
                }
                head.extend(lp(count, nodes));
                first += count;
            }
            continue;
        }
        // Runs of steps that forward alike; each as pairs of steps, then the odd one out.
        let end = ph.first + ph.count;
        let mut first = ph.first;
        while first < end {
            let fwd = fwd_at(first);
            let mut count = 1;
            while first + count < end && fwd_at(first + count) == fwd {
                count += 1;
            }
            let pairs = count / 2;
            if pairs > 0 {
                let mut body = step(ph, first, 2, pairs, None, fwd);
                body.extend(step(ph, first + 1, 2, pairs, None, fwd));
                head.extend(lp(pairs, body));
            }
            if count % 2 == 1 {
                let last = first + count - 1;
                head.extend(lp(1, step(ph, last, 1, 1, None, fwd)));
            }
            first += count;
        }
    }
    head.extend(normalise(map.y, map.l, map.rows, map.d, live));
    LoopProgram {
        pe,
        pes: m,
        mem_words: map.words,
        body: lp(heads, head),
    }
}

/// The step-0 triangle of a causal PE (local row `r` sees keys `0..=r`) as stepped loops, its
/// own block forwarded to `buf[1]` of the next PE on the way: rows 0 and 1 alone (a stepped
/// max loop needs 3 keys), then per range of words one loop whose every row forwards
/// [`TRI_KEYS`] keys' worth, a row for the remainder, and the rows left without a send. The
/// program's size no longer grows with the rows; `None` if the rows cannot carry the block.
fn triangle(
    ctx: &Ctx,
    map: &Map,
    ranges: &[(u32, u32)],
    own: &Ad,
    slots: Option<&(Ad, Ad)>,
) -> Option<Vec<Node>> {
    let segments: Vec<_> = tri_segments(ranges, map.d, map.rows)?
        .into_iter()
        .map(|(row, count, piece)| {
            let send = piece.map(|(at, words)| {
                let at = i64::from(at);
                (own.clone().plus(at), ad(map.buf[1]).plus(at), words)
            });
            (row, count, send)
        })
        .collect();
    let mut nodes = Vec::new();
    for r in 0..2 {
        nodes.extend(ctx.block(&Work {
            r0: r,
            rows: 1,
            k0: 0,
            keys: r + 1,
            kb: own.clone(),
            first: true,
            send: None,
            slots: slots.cloned(),
            tri: false,
            forward_to: None,
            key_limit: None,
        }));
    }
    for (r0, count, send) in segments {
        nodes.extend(ctx.block(&Work {
            r0,
            rows: count,
            k0: 0,
            keys: r0 + 1,
            kb: own.clone(),
            first: true,
            send,
            slots: slots.cloned(),
            // One row needs no step (and a step it never takes would be a field that means
            // nothing).
            tri: count > 1,
            forward_to: None,
            key_limit: None,
        }));
    }
    Some(nodes)
}

/// Keys' worth of words each sending row of a [`triangle`] forwards: every stepped row has at
/// least 3 keys.
const TRI_KEYS: u32 = 3;

/// Words `(offset, count)` of a block one row forwards.
type Piece = (u32, u32);

/// How a causal step-0 triangle of `rows` rows forwards the block's word `ranges` in equal
/// pieces: `(first row, rows, piece)` runs, a piece being `(offset, words)` forwarded by each row
/// of the run from its first [`TRI_KEYS`] keys; rows 0 and 1 (too short for a stepped maximum
/// loop) are not in it. `None` if the rows cannot carry the ranges so.
fn tri_segments(
    ranges: &[(u32, u32)],
    d: u32,
    rows: u32,
) -> Option<Vec<(u32, u32, Option<Piece>)>> {
    let per_row = TRI_KEYS * d;
    let mut segments = Vec::new();
    let mut row = 2;
    for &(offset, len) in ranges {
        let (full, rem) = (len / per_row, len % per_row);
        for (count, words, skip) in [
            (full, per_row, 0),
            (u32::from(rem > 0), rem, full * per_row),
        ] {
            if count > 0 {
                segments.push((row, count, Some((offset + skip, words))));
                row += count;
            }
        }
    }
    if row > rows {
        return None;
    }
    if row < rows {
        segments.push((row, rows - row, None));
    }
    Some(segments)
}

/// The ranges dealt to a triangle's rows one by one, for rings whose rows are too few for
/// [`tri_segments`]: row `r` forwards as much of what is pending as its `(r + 1)·d` score
/// cycles allow, one contiguous `(offset, words)` piece; and whether every word was dealt.
fn tri_rows(ranges: &[(u32, u32)], d: u32, rows: u32) -> (Vec<Option<Piece>>, bool) {
    let mut pending: std::collections::VecDeque<(u32, u32)> = ranges.iter().copied().collect();
    let pieces = (0..rows)
        .map(|r| {
            let room = (r + 1) * d;
            pending.pop_front().map(|(offset, len)| {
                let take = room.min(len);
                if take < len {
                    pending.push_front((offset + take, len - take));
                }
                (offset, take)
            })
        })
        .collect();
    (pieces, pending.is_empty())
}

/// The triangle one loop nest per row, for rings whose rows are too few to carry the block in
/// equal pieces: each row forwards as much of the pending ranges as its score loops allow.
fn unrolled_triangle(
    ctx: &Ctx,
    map: &Map,
    ranges: Vec<(u32, u32)>,
    own: &Ad,
    slots: Option<&(Ad, Ad)>,
) -> Vec<Node> {
    let mut head = Vec::new();
    let (pieces, _) = tri_rows(&ranges, map.d, map.rows);
    for (r, piece) in (0..map.rows).zip(pieces) {
        let keys = r + 1;
        let send = piece.map(|(offset, take)| {
            let at = i64::from(offset);
            (own.clone().plus(at), ad(map.buf[1]).plus(at), take)
        });
        head.extend(ctx.block(&Work {
            r0: r,
            rows: 1,
            k0: 0,
            keys,
            kb: own.clone(),
            first: true,
            send,
            slots: slots.cloned(),
            tri: false,
            forward_to: None,
            key_limit: None,
        }));
    }
    head
}

fn add_xfer_preds(nodes: &mut [Node], preds: &[Pred]) {
    for n in nodes {
        match n {
            Node::Loop(l) => add_xfer_preds(&mut l.body, preds),
            Node::Bundle(b) => {
                if b.bundle.xfer != Xfer::Nop {
                    b.preds.extend(preds.iter().copied());
                    b.preds.sort();
                    b.preds.dedup();
                }
            }
        }
    }
}

/// The deferred normalisation `y[r][c] /= l[r]` of the live rows, in the head loop.
fn normalise(y: u32, l: u32, rows: u32, d: u32, live: u32) -> Vec<Node> {
    let di = i64::from(d);
    let yy = ad(y).t(0, i64::from(rows) * di).t(1, di).t(2, 1);
    let mut nodes = lp(
        rows,
        lp(d, vec![B::new().div(yy.clone(), ad(l).t(1, 1), yy).build()]),
    );
    mask_rows(&mut nodes, 1, 0, rows, live);
    nodes
}

/// Turns off the op and acc slots of every bundle in `nodes` (a loop over `rows` local rows
/// `r0 + i_level`) for the rows at or past `live`, which stand for tokens past the layer's end
/// (a ring-size multiple of tokens padded at the end, so that under a causal mask no real row
/// sees them). Their cycles stay, so every PE keeps the same timing, and so do their sends,
/// which carry blocks whatever row they ride on.
fn mask_rows(nodes: &mut [Node], level: u8, r0: u32, rows: u32, live: u32) {
    if live >= r0.saturating_add(rows) {
        return;
    }
    for n in nodes {
        match n {
            Node::Loop(l) => mask_rows(&mut l.body, level, r0, rows, live),
            Node::Bundle(b) => {
                if live <= r0 {
                    b.bundle.op = Op::Nop;
                    b.bundle.acc = Acc::Nop;
                    b.terms
                        .retain(|t| matches!(t.field, Field::XferSrc | Field::XferDst));
                    b.preds.retain(|p| p.slot == Slot::Xfer);
                } else {
                    guard(b, &[Slot::Op, Slot::Acc], level, live - r0);
                }
            }
        }
    }
}

/// Turns every running-maximum copy (`max a, a`) in `nodes` into a no-op, keeping its cycle.
fn drop_copies(nodes: &mut [Node]) {
    for n in nodes {
        match n {
            Node::Loop(l) => drop_copies(&mut l.body),
            Node::Bundle(b) => {
                if let Op::Arith(a) = b.bundle.op {
                    let a_terms: Vec<_> =
                        b.terms.iter().filter(|t| t.field == Field::OpA).collect();
                    let b_terms: Vec<_> =
                        b.terms.iter().filter(|t| t.field == Field::OpB).collect();
                    let same = a.kind == isa::OpKind::Max
                        && a.b == a.a
                        && a_terms.len() == b_terms.len()
                        && a_terms.iter().zip(&b_terms).all(|(x, y)| {
                            (x.level, x.stride, x.wrap) == (y.level, y.stride, y.wrap)
                        });
                    if same {
                        b.bundle.op = Op::Nop;
                        b.terms
                            .retain(|t| !matches!(t.field, Field::OpA | Field::OpB | Field::OpDst));
                        b.preds.retain(|p| p.slot != Slot::Op);
                    }
                }
            }
        }
    }
}

/// Turns off every slot of the bundles in `nodes` (inside a loop over keys at `level`) in the
/// iterations at or past `keep`: keys past the layer's end, which nothing may compute with or
/// forward. `keep = 0` leaves no-ops.
fn mask_keys(nodes: &mut [Node], level: u8, keep: u32) {
    for n in nodes {
        match n {
            Node::Loop(l) => mask_keys(&mut l.body, level, keep),
            Node::Bundle(b) => {
                if keep == 0 {
                    b.bundle = Bundle {
                        op: Op::Nop,
                        acc: Acc::Nop,
                        xfer: Xfer::Nop,
                    };
                    b.terms.clear();
                    b.preds.clear();
                    continue;
                }
                guard(b, &Slot::ALL, level, keep);
            }
        }
    }
}

/// Predicates `slots` of `b` (those it uses) on `i_level < keep`.
fn guard(b: &mut LBundle, slots: &[Slot], level: u8, keep: u32) {
    for &slot in slots {
        let used = match slot {
            Slot::Op => b.bundle.op != Op::Nop,
            Slot::Acc => b.bundle.acc != Acc::Nop,
            Slot::Xfer => b.bundle.xfer != Xfer::Nop,
        };
        if used {
            b.preds.push(Pred {
                slot,
                level,
                cmp: Cmp::Lt,
                value: keep,
            });
        }
    }
    b.preds.sort();
    b.preds.dedup();
}
