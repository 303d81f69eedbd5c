//! The symbolic [`isa::Domain`] and the [`isa::Observer`] that watches memory traffic, sharing one
//! state: the machine drives both, so they see the exact execution the numeric interpreter does.

use crate::expr::{ExprId, FxMap, Interner, Node, Style, MASKED, NEEDED};
use crate::report::{Invariant, OpTally, Violation};
use isa::{Acc, Addr, Domain, Observer, Op, Program, Xfer, XferSrc};
use std::cell::RefCell;

/// What a memory word last received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    Empty,
    Input,
    /// Written by the PE's own op or acc slot.
    Computed,
    /// Arrived over the ring.
    Received,
}

#[derive(Clone, Copy, Debug)]
pub struct Word {
    pub origin: Origin,
    /// Cycle of the last write (meaningless for `Empty` and `Input`). 32 bits keep a word's state
    /// as small as the machine's own word, since both are allocated per declared memory word.
    cycle: u32,
    /// Read since the last write.
    pub read: bool,
}

impl Word {
    pub fn cycle(&self) -> u64 {
        u64::from(self.cycle)
    }

    const EMPTY: Word = Word {
        origin: Origin::Empty,
        cycle: 0,
        read: false,
    };
}

/// Violations, counted per invariant and kept up to a cap so that a badly broken program does
/// not spend its time formatting messages nobody reads.
pub struct Sink {
    cap: usize,
    pub kept: FxMap<Invariant, Vec<Violation>>,
    pub counts: FxMap<Invariant, usize>,
}

impl Sink {
    pub fn new(cap: usize) -> Self {
        Sink {
            cap,
            kept: FxMap::default(),
            counts: FxMap::default(),
        }
    }

    /// Counts a violation of `inv`; `make` runs only if it will be listed.
    pub fn report(&mut self, inv: Invariant, make: impl FnOnce() -> Violation) {
        let n = self.counts.entry(inv).or_default();
        *n += 1;
        if *n <= self.cap {
            self.kept.entry(inv).or_default().push(make());
        }
    }

    pub fn total(&self) -> usize {
        self.counts.values().sum()
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum OpKind {
    Mul,
    Exp,
    Div,
    Max,
    /// Online formulation only: work a streamed softmax does beyond the necessary operations —
    /// a rescale factor `exp(s·(M_old − M_new))`, a partial sum multiplied by one, or a running
    /// maximum copied with `max(a, a)`.
    Rescale(Rescale),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Rescale {
    Factor,
    Product,
    Copy,
}

/// Where an op result was first computed, and how often.
struct Made {
    pe: u32,
    cycle: u64,
    times: u32,
}

pub struct Run<'p> {
    pub ex: Interner,
    pub style: Style,
    programs: &'p [Program],
    /// The PE and cycle of the latest operand read. The machine reads a bundle's operands right
    /// before computing with them, so this names the bundle each domain operation belongs to.
    cur: (u32, u64),
    pub words: Vec<Vec<Word>>,
    pub tally: OpTally,
    made: FxMap<ExprId, Made>,
    uses: FxMap<ExprId, u32>,
    /// Per unmasked score, the row maxima it belongs to (safe softmax; see `spec::Spec`).
    row_maxima: FxMap<ExprId, Vec<ExprId>>,
    /// Online, safe softmax: `(score, row maximum) → (head, key)` (see `spec::Spec`).
    keys: FxMap<(ExprId, ExprId), (u32, u32)>,
    pub sink: Sink,
    /// `x[h][i][c]` by (PE, address), for messages.
    input_names: FxMap<(u32, Addr), String>,
}

impl<'p> Run<'p> {
    #[allow(clippy::too_many_arguments)] // one field each of the run state it assembles
    pub fn new(
        ex: Interner,
        style: Style,
        programs: &'p [Program],
        words: Vec<Vec<Word>>,
        uses: FxMap<ExprId, u32>,
        row_maxima: FxMap<ExprId, Vec<ExprId>>,
        keys: FxMap<(ExprId, ExprId), (u32, u32)>,
        sink: Sink,
        input_names: FxMap<(u32, Addr), String>,
    ) -> Self {
        Run {
            ex,
            style,
            programs,
            cur: (0, 0),
            words,
            tally: OpTally::default(),
            made: FxMap::default(),
            uses,
            row_maxima,
            keys,
            sink,
            input_names,
        }
    }

    /// Memory words per PE, with preloaded inputs marked; `None` if a size cannot be allocated
    /// (the machine would refuse it too).
    pub fn alloc_words(programs: &[Program]) -> Option<Vec<Vec<Word>>> {
        let mut all = Vec::with_capacity(programs.len());
        for p in programs {
            let mut v = Vec::new();
            v.try_reserve_exact(p.mem_words as usize).ok()?;
            v.resize(p.mem_words as usize, Word::EMPTY);
            all.push(v);
        }
        Some(all)
    }

    /// The bundle that produced the value a word holds: its own PE's for a computed word, the
    /// sender's (prefixed with its PE) for a received one.
    pub fn writer_text(&self, pe: u32, addr: Addr) -> Option<(u64, String)> {
        let w = self.words.get(pe as usize)?.get(addr as usize)?;
        match w.origin {
            Origin::Computed => Some((w.cycle(), bundle_text(self.programs, pe, w.cycle())?)),
            Origin::Received => {
                let from = self.predecessor(pe);
                let b = bundle_text(self.programs, from, w.cycle())?;
                Some((w.cycle(), format!("PE {from}: {b}")))
            }
            Origin::Empty | Origin::Input => None,
        }
    }

    fn predecessor(&self, pe: u32) -> u32 {
        if pe == 0 {
            (self.programs.len() as u32).saturating_sub(1)
        } else {
            pe - 1
        }
    }

    pub fn bundle_text(&self, pe: u32, cycle: u64) -> Option<String> {
        bundle_text(self.programs, pe, cycle)
    }

    /// A result that the bundle neither stores nor passes on is lost the moment it is made.
    fn check_result_kept(&mut self, acc: bool) {
        let (pe, cycle) = self.cur;
        let Some(b) = self
            .programs
            .get(pe as usize)
            .and_then(|p| p.bundles.get(usize::try_from(cycle).ok()?))
        else {
            return;
        };
        let lost = if acc {
            matches!(b.acc, Acc::Add { dst: None, .. })
                && !matches!(
                    b.xfer,
                    Xfer::Send {
                        src: XferSrc::Acc,
                        ..
                    }
                )
        } else {
            if b.op == Op::Nop {
                return;
            }
            let op_dst = b.op.dst();
            op_dst.is_none() && matches!(b.acc, Acc::Nop)
        };
        if lost {
            let text = b.to_string();
            let what = if acc {
                "the acc result is neither written nor sent"
            } else {
                "the op result is neither written nor accumulated"
            };
            self.sink.report(Invariant::LostValue, || Violation {
                invariant: Invariant::LostValue,
                pe: Some(pe),
                cycle: Some(cycle),
                instruction: Some(text),
                message: what.to_string(),
            });
        }
    }

    fn op(&mut self, kind: OpKind, id: ExprId) {
        self.check_result_kept(false);
        match kind {
            OpKind::Mul => {
                let phase1 = matches!(self.ex.node(id), Node::Mul(a, b)
                    if matches!(self.ex.node(a), Node::Input { .. })
                        && matches!(self.ex.node(b), Node::Input { .. }));
                if phase1 {
                    self.tally.phase1_mul += 1;
                } else {
                    self.tally.phase3_mul += 1;
                }
            }
            OpKind::Exp => self.tally.exp += 1,
            OpKind::Div => self.tally.div += 1,
            OpKind::Max => self.tally.max += 1,
            OpKind::Rescale(_) => self.tally.rescale += 1,
        }
        let (pe, cycle) = self.cur;
        let flags = self.ex.flags(id);
        // A partial row maximum is not itself part of any output, but it is the necessary way
        // there: accepted (once) when all its arguments are scores of one row.
        let partial_max = kind == OpKind::Max && flags & MASKED == 0 && self.within_a_row(id);
        // A streamed row's exponentials and weighted values are first built with a partial
        // maximum and reach the output only after rescaling; they are the way there too.
        let partial_online = self.ex.is_online()
            && flags & MASKED == 0
            && match kind {
                OpKind::Exp => self.partial_exp(id).is_some(),
                OpKind::Mul => self.partial_term(id),
                OpKind::Rescale(Rescale::Factor) => true,
                OpKind::Rescale(Rescale::Product) => {
                    let terms = match self.ex.node(id) {
                        Node::Sum { .. } => self.ex.sum_terms(id).to_vec(),
                        _ => vec![id],
                    };
                    terms.iter().all(|&t| {
                        self.ex.flags(t) & NEEDED != 0
                            || self.partial_exp(t).is_some()
                            || self.partial_term(t)
                    })
                }
                OpKind::Rescale(Rescale::Copy) => !self.tops_of(id).is_empty(),
                OpKind::Div | OpKind::Max => false,
            };
        let untracked = matches!(kind, OpKind::Rescale(Rescale::Product | Rescale::Copy));
        if untracked && partial_online {
            // A rescaled partial sum or a copied maximum is new work on a value that exists
            // already (and may be rescaled again); how much of it there is, the manifest must
            // declare exactly.
        } else if !untracked && (flags & NEEDED != 0 || partial_max || partial_online) {
            let allowed = self.uses.get(&id).copied().unwrap_or(1);
            let m = self.made.entry(id).or_insert(Made {
                pe,
                cycle,
                times: 0,
            });
            m.times += 1;
            if m.times > allowed {
                let (times, first) = (m.times, (m.pe, m.cycle));
                let (ex, style, programs) = (&self.ex, &self.style, self.programs);
                self.sink.report(Invariant::Duplicate, || Violation {
                    invariant: Invariant::Duplicate,
                    pe: Some(pe),
                    cycle: Some(cycle),
                    instruction: bundle_text(programs, pe, cycle),
                    message: if allowed == 1 {
                        format!(
                            "computes {} again (first computed by PE {}, cycle {})",
                            ex.pretty(id, style),
                            first.0,
                            first.1
                        )
                    } else {
                        format!(
                            "computes {} for the {times}th time, but only {allowed} scores or rows use it",
                            ex.pretty(id, style)
                        )
                    },
                });
            }
        } else {
            let (ex, style, programs) = (&self.ex, &self.style, self.programs);
            let inv = if flags & MASKED != 0 {
                Invariant::Masked
            } else {
                Invariant::Unnecessary
            };
            self.sink.report(inv, || {
                let why = if inv == Invariant::Unnecessary {
                    "which is not part of any output".to_string()
                } else {
                    match masked_origin(ex, id) {
                        o if o == id => "which the causal mask removes".to_string(),
                        o => format!(
                            "which is built from {}, which the causal mask removes",
                            ex.pretty(o, style)
                        ),
                    }
                };
                Violation {
                    invariant: inv,
                    pe: Some(pe),
                    cycle: Some(cycle),
                    instruction: bundle_text(programs, pe, cycle),
                    message: format!("computes {}, {why}", ex.pretty(id, style)),
                }
            });
        }
    }

    /// The arguments of a (partial) maximum: its own for a maximum, itself for anything else.
    fn members(&self, id: ExprId) -> Vec<ExprId> {
        match self.ex.node(id) {
            Node::Max { .. } => self.ex.max_terms(id).to_vec(),
            _ => vec![id],
        }
    }

    /// The rows' maxima whose arguments include every argument of `m`, a partial maximum or a
    /// single unmasked score; empty if `m` is neither.
    pub fn tops_of(&self, m: ExprId) -> Vec<ExprId> {
        let args = self.members(m);
        let Some(first) = args.first() else {
            return Vec::new();
        };
        let Some(rows) = self.row_maxima.get(first) else {
            return Vec::new();
        };
        rows.iter()
            .copied()
            .filter(|&top| {
                let all = self.members(top);
                args.iter().all(|a| all.binary_search(a).is_ok())
            })
            .collect()
    }

    /// Whether `id` is a rescale factor `exp(s·(a − b))`: `a` and `b` partial maxima of one row,
    /// `b` taking strictly more scores than `a` (every score of `a` among them).
    pub fn is_rescale_factor(&self, id: ExprId) -> bool {
        let Node::Expd(a, b, _) = self.ex.node(id) else {
            return false;
        };
        let is_max = |x| matches!(self.ex.node(x), Node::Max { .. });
        if a == b || !is_max(a) || !is_max(b) || self.tops_of(b).is_empty() {
            return false;
        }
        let (ma, mb) = (self.members(a), self.members(b));
        ma.iter().all(|x| mb.binary_search(x).is_ok())
    }

    /// For `exp(s·(S − M'))` with `S` an unmasked score among the arguments of `M'`, a partial
    /// maximum of `S`'s row: the rows' maxima `M'` is part of. `None` for anything else.
    fn partial_exp(&self, id: ExprId) -> Option<(ExprId, Vec<ExprId>)> {
        let Node::Expd(s, m, _) = self.ex.node(id) else {
            return None;
        };
        if matches!(self.ex.node(s), Node::Max { .. }) || self.members(m).binary_search(&s).is_err()
        {
            return None;
        }
        let tops = self.tops_of(m);
        (!tops.is_empty()).then_some((s, tops))
    }

    /// Whether `id` is `e·v[h][j][c]` with `e` a partial exponential of score `S` and `j` the key
    /// of `S` in that row.
    fn partial_term(&self, id: ExprId) -> bool {
        let Node::Mul(a, b) = self.ex.node(id) else {
            return false;
        };
        let (e, v) = if matches!(self.ex.node(a), Node::Expd(..)) {
            (a, b)
        } else {
            (b, a)
        };
        let Some((s, tops)) = self.partial_exp(e) else {
            return false;
        };
        let Node::Input {
            tensor, head, row, ..
        } = self.ex.node(v)
        else {
            return false;
        };
        matches!(tensor, crate::expr::Tensor::V | crate::expr::Tensor::X)
            && tops
                .iter()
                .any(|&top| self.keys.get(&(s, top)) == Some(&(head, row)))
    }

    /// Whether the maximum `id` takes only scores of one row (all of a row's maximum's arguments).
    fn within_a_row(&self, id: ExprId) -> bool {
        let args = self.ex.max_terms(id);
        let Some(first) = args.first() else {
            return false;
        };
        self.row_maxima.get(first).is_some_and(|rows| {
            rows.iter().any(|&top| {
                let all = self.ex.max_terms(top);
                args.iter().all(|a| all.binary_search(a).is_ok())
            })
        })
    }

    /// Reports the value in `w` of PE `pe` being dropped unread at `when` (a cycle and the
    /// bundle that overwrites it, or the end of the run).
    fn dropped(&mut self, pe: u32, addr: Addr, w: Word, when: Option<(u64, Option<String>)>) {
        let fate = match &when {
            Some((c, Some(b))) => format!("is overwritten in cycle {c} by `{b}` before being read"),
            Some((c, None)) => format!("is overwritten in cycle {c} before being read"),
            None => "is never read".to_string(),
        };
        let programs = self.programs;
        match w.origin {
            Origin::Empty => {}
            Origin::Input => self.sink.report(Invariant::UnusedInput, || Violation {
                invariant: Invariant::UnusedInput,
                pe: Some(pe),
                cycle: None,
                instruction: None,
                message: format!(
                    "input {} preloaded at m{addr} {fate}",
                    self.input_names
                        .get(&(pe, addr))
                        .map_or("?", String::as_str)
                ),
            }),
            Origin::Computed => self.sink.report(Invariant::LostValue, || Violation {
                invariant: Invariant::LostValue,
                pe: Some(pe),
                cycle: Some(w.cycle()),
                instruction: bundle_text(programs, pe, w.cycle()),
                message: format!("the value written to m{addr} here {fate}"),
            }),
            Origin::Received => {
                let from = self.predecessor(pe);
                self.sink.report(Invariant::UnreadTransfer, || Violation {
                    invariant: Invariant::UnreadTransfer,
                    pe: Some(pe),
                    cycle: Some(w.cycle()),
                    instruction: bundle_text(programs, from, w.cycle())
                        .map(|b| format!("PE {from}: {b}")),
                    message: format!("the word PE {from} sent to m{addr} in this cycle {fate}"),
                })
            }
        }
    }

    /// End of run: every word still holding an unread value that is not an output is reported.
    pub fn leftovers(&mut self, is_output: impl Fn(u32, Addr) -> bool) {
        for pe in 0..self.words.len() {
            for addr in 0..self.words[pe].len() {
                let w = self.words[pe][addr];
                if w.origin != Origin::Empty && !w.read && !is_output(pe as u32, addr as Addr) {
                    self.dropped(pe as u32, addr as Addr, w, None);
                }
            }
        }
    }
}

/// The innermost masked subexpression of `id` along its masked operands: the masked product,
/// score, denominator or weight that the taint came from.
fn masked_origin(ex: &Interner, mut id: ExprId) -> ExprId {
    let masked = |o: &ExprId| ex.flags(*o) & MASKED != 0;
    loop {
        let next = match ex.node(id) {
            Node::Mul(a, b) | Node::Div(a, b) | Node::Expd(a, b, _) => {
                [a, b].into_iter().find(masked)
            }
            Node::Max { .. } => ex.max_terms(id).iter().copied().find(masked),
            Node::Exp(a, _) => Some(a).filter(masked),
            Node::Sum { .. } => ex.sum_terms(id).iter().copied().find(masked),
            Node::Input { .. } | Node::Chain { .. } => None,
        };
        match next {
            Some(o) => id = o,
            None => return id,
        }
    }
}

pub fn bundle_text(programs: &[Program], pe: u32, cycle: u64) -> Option<String> {
    let b = programs
        .get(pe as usize)?
        .bundles
        .get(usize::try_from(cycle).ok()?)?;
    Some(b.to_string())
}

/// The symbolic domain: every word holds an [`ExprId`].
pub struct Sym<'a, 'p>(pub &'a RefCell<Run<'p>>);

impl Domain for Sym<'_, '_> {
    type Value = ExprId;

    fn op(&mut self, kind: isa::OpKind, a: &ExprId, b: Option<&ExprId>, imm: f32) -> ExprId {
        let mut r = self.0.borrow_mut();
        let online = r.ex.is_online();
        let (id, tally) = match (kind, b) {
            (isa::OpKind::Mul, Some(b)) => {
                let rescale = online && {
                    let (ca, cb) = (r.ex.canonical(*a), r.ex.canonical(*b));
                    r.is_rescale_factor(ca) || r.is_rescale_factor(cb)
                };
                let kind = if rescale {
                    OpKind::Rescale(Rescale::Product)
                } else {
                    OpKind::Mul
                };
                (r.ex.mul(*a, *b), kind)
            }
            (isa::OpKind::Exp, _) => (r.ex.exp(*a, imm), OpKind::Exp),
            (isa::OpKind::Div, Some(b)) => (r.ex.div(*a, *b), OpKind::Div),
            (isa::OpKind::Max, Some(b)) => {
                let copy = online && r.ex.canonical(*a) == r.ex.canonical(*b);
                let kind = if copy {
                    OpKind::Rescale(Rescale::Copy)
                } else {
                    OpKind::Max
                };
                (r.ex.max(*a, *b), kind)
            }
            (isa::OpKind::Expd, Some(b)) => {
                let id = r.ex.expd(*a, *b, imm);
                let kind = if online && r.is_rescale_factor(id) {
                    OpKind::Rescale(Rescale::Factor)
                } else {
                    OpKind::Exp
                };
                (id, kind)
            }
            // The machine passes `b` for exactly the kinds that read two operands.
            (_, None) => (*a, OpKind::Max),
        };
        r.op(tally, id);
        id
    }

    fn add(&mut self, a: &ExprId, b: &ExprId) -> ExprId {
        let mut r = self.0.borrow_mut();
        r.tally.add += 1;
        r.check_result_kept(true);
        r.ex.add(*a, *b)
    }
}

/// Tracks, per word, where its value came from and whether it has been read.
pub struct Watch<'a, 'p>(pub &'a RefCell<Run<'p>>);

impl Observer for Watch<'_, '_> {
    fn on_read(&mut self, pe: u32, cycle: u64, addr: Addr) {
        let mut r = self.0.borrow_mut();
        r.cur = (pe, cycle);
        if let Some(w) = r
            .words
            .get_mut(pe as usize)
            .and_then(|m| m.get_mut(addr as usize))
        {
            w.read = true;
        }
    }

    fn on_write(&mut self, pe: u32, cycle: u64, addr: Addr) {
        let mut r = self.0.borrow_mut();
        // A word is the PE's own result if its bundle names it as op or acc destination; the
        // machine faults on two writes to one word, so otherwise it is the one arriving.
        let own = r
            .programs
            .get(pe as usize)
            .and_then(|p| p.bundles.get(usize::try_from(cycle).ok()?))
            .is_some_and(|b| {
                let op_dst = b.op.dst();
                let acc_dst = match b.acc {
                    Acc::Add { dst, .. } => dst,
                    Acc::Nop => None,
                };
                op_dst == Some(addr) || acc_dst == Some(addr)
            });
        let Some(old) = r
            .words
            .get(pe as usize)
            .and_then(|m| m.get(addr as usize))
            .copied()
        else {
            return;
        };
        if old.origin != Origin::Empty && !old.read {
            let text = r.bundle_text(pe, cycle);
            let text = if own {
                text
            } else {
                let from = r.predecessor(pe);
                bundle_text(r.programs, from, cycle).map(|b| format!("PE {from}: {b}"))
            };
            r.dropped(pe, addr, old, Some((cycle, text)));
        }
        r.words[pe as usize][addr as usize] = Word {
            origin: if own {
                Origin::Computed
            } else {
                Origin::Received
            },
            cycle: u32::try_from(cycle).unwrap_or(u32::MAX),
            read: false,
        };
    }
}
