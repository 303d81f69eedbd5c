//! Symbolic verifier for attnc's emitted microcode.
//!
//! [`verify`] runs the per-PE programs on the ISA's own interpreter ([`isa::Machine`], driven by
//! [`runtime::exec::execute`], the path `attnc run` uses) over a symbolic domain: every word holds
//! an interned expression over the input elements instead of a number. Products are commutative
//! (operands sorted) and sums are flattened multisets of terms (sorted term lists), so every
//! summation order and every data movement yields the same canonical expression, and nothing else
//! does. At the end each output element's expression id is compared with the attention formula
//! (docs/scheduling.md) built in the same interner:
//!
//! ```text
//! y[h][i][c] = Σ_j  ( exp(s·Σ_c' q[h][i][c']·k[h][j][c']) / Σ_j' exp(s·Σ_c' q[h][i][c']·k[h][j'][c']) ) · v[h][j][c]
//! ```
//!
//! with `j, j' ≤ i` under a causal mask, `s = manifest.layer.scale as f32` (the `exp` immediate
//! must carry exactly these bits) and `q = k = v = x` for a shared layer. Equal ids mean the
//! program computes that function for all inputs (over the reals; f32 rounding differs only by
//! summation order).
//!
//! # Invariants
//!
//! All are checked on every run and every violation is collected (listed up to a cap per
//! invariant, counted in full); see [`Invariant`]:
//!
//! * `manifest` — the layer fields are supported (`qkv` shared/separate, `mask` causal/none,
//!   non-zero sizes), inputs are exactly `x` (shared) or `q`, `k`, `v` (separate), the only
//!   output is `y`, every placement has `heads·tokens·dim` entries inside the ring and memories,
//!   preload copies (manifest format 3) are on inputs only and name an element and a word in
//!   range, and `necessary_ops` and `lower_bound` equal the counts of docs/scheduling.md.
//! * `setup` — the programs are the ones the manifest describes ([`runtime::exec::check_programs`]:
//!   PE numbering, `mem_words`, `cycles` = longest program).
//! * `placement` — no two input words (elements or their preload copies, which hold the same
//!   symbolic input as their element) share a word; no two output elements share a word; every
//!   output word was last written by the programs (not left holding a preload, not unwritten).
//! * `fault` — the machine runs to the end: no read of a never-written word, no address outside a
//!   PE's declared memory (memory use within the declared size), no write conflict, no slot misuse.
//!   The machine stops at the first fault, so at most one is reported and the output checks are
//!   skipped.
//! * `output` — every output element equals the formula above.
//! * `masked` — under a causal mask no `mul`, `exp` or `div` forms an expression that involves a
//!   masked score: a product `q_i[c]·k_j[c]` with `j > i`, a masked score sum or exponential, a
//!   denominator over a whole row, a weight `exp_ij / Z_i` with `j > i`, or anything built from
//!   one of these (taint propagates through every operation and partial sum).
//! * `unnecessary-op` — every `mul`, `exp` and `div` result is a subexpression of some expected
//!   output (this is how an op on wrong operands is located).
//! * `duplicate-op` — no product (phase 1 or phase 3) or quotient is computed twice; for a shared
//!   layer this means each distinct phase-1 product `x_a[c]·x_b[c]` is computed once. An
//!   exponential may be computed once per row whose denominator uses it (twice for `exp(s·x_a·x_b)`,
//!   `a ≠ b`, in a shared unmasked layer, since rows `a` and `b` both need it). One declared
//!   exception: if a shared unmasked layer's manifest claims more phase-1 products than necessary
//!   (`ops.phase1_mac`; the baseline schedule, paper Algorithm 1, does not exploit `q = k`), a
//!   product may be computed once per score that sums it (twice for `a ≠ b`), unless
//!   [`Options::exact_ops`] is set.
//! * `op-count` — executed `mul` (phase 1: product of two inputs; phase 3: the rest), `exp` and
//!   `div` counts equal the necessary counts of docs/scheduling.md per kind (and so their total equals
//!   `manifest.necessary_ops`), and equal the manifest's `ops` claims. Under the exception above
//!   the phase-1 count must equal the claim instead, and [`Report::redundant_ops`] says how many
//!   operations were beyond the necessary.
//! * `lost-value` — a word written by a PE's own op or acc slot is read before it is overwritten
//!   or the run ends, unless it is an output element's final word; and no op or acc result is
//!   dropped on the spot (an op with neither destination nor acc, an acc with neither
//!   destination nor `send acc`).
//! * `unread-transfer` — likewise for a word received over the ring.
//! * `unused-input` — every preloaded input word is read before it is overwritten or the run ends.
//!
//! # Online formulation
//!
//! A manifest with `normalisation: "deferred"` declares a streamed softmax: the
//! specification is `y_i[c] = (Σ_j e_ij·v_j[c]) / Σ_j e_ij` (deferred normalisation, `div` =
//! `heads·tokens·dim`), the interner applies the product rule of shifted exponentials and
//! distributes a sum times one ([`Interner::set_online`]), partial exponentials and terms built
//! against a running maximum count as the way to an output, and the running-maximum copies,
//! rescale factors and rescaled partial sums are counted apart and must equal
//! `ops.online_rescale` exactly (docs/verifier.md). `normalisation: "per-row"` declares the
//! same with the rows of fewer than `dim` unmasked scores dividing each weight instead (`div` =
//! per head `Σ_i min(keys_i, dim)`); the proofs without unrolling do not take it.
//!
//! Affine placements (manifest format 2) are spelt out element by element before anything else.
//!
//! # Loop programs too large to flatten
//!
//! [`verify_with`] takes flat programs; loop programs are flattened first, which bounds what it
//! can prove. [`compact::check_loops`] checks loop programs from their loop structure in closed
//! form, in time that grows with their size, and never reports a proof ([`compact::COVERAGE`]
//! says what it establishes); [`compact::prove_loops`] adds the proof of outputs without
//! unrolling where [`compact::prove`] covers the programs (docs/verifier.md).
//!
//! Each violation names the PE, cycle and bundle text where that makes sense, and the invariant.
//! Wrong outputs show the expected and found expressions abbreviated, descending to the first
//! subexpression where they differ.

pub mod compact;
mod expr;
mod report;
mod spec;
mod sym;

pub use expr::{ExprId, Interner, Style, Tensor};
pub use report::{Invariant, OpTally, Report, Stats, Violation};
pub use spec::{Necessary, Shape};

use expr::FxMap;
use isa::Program;
use runtime::exec::ExecError;
use runtime::manifest::Manifest;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Instant;
use sym::{Origin, Run, Sink, Sym, Watch};

/// How much to report.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Violations listed per invariant (all are counted).
    pub max_per_invariant: usize,
    /// Violations listed in total.
    pub max_listed: usize,
    /// Abbreviation of expressions in messages.
    pub style: Style,
    /// Require exactly the necessary operations even when the manifest declares more (see
    /// `op-count` in the crate documentation).
    pub exact_ops: bool,
    /// Worker threads of the proofs that evaluate PEs apart (the per-PE induction of loop
    /// programs, `compact::induct`): 0 is the machine's available parallelism. The verdict and
    /// the report are the same for any number.
    pub threads: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            max_per_invariant: 10,
            max_listed: 50,
            style: Style::default(),
            exact_ops: false,
            threads: 0,
        }
    }
}

/// Verifies `programs` (one per PE, in PE order) against `manifest` with default options.
pub fn verify(programs: &[Program], manifest: &Manifest) -> Report {
    verify_with(programs, manifest, &Options::default())
}

/// Verifies `programs` against `manifest`. Never panics, whatever the inputs.
pub fn verify_with(programs: &[Program], manifest: &Manifest, opts: &Options) -> Report {
    let start = Instant::now();
    let mut v = Verification {
        sink: Sink::new(opts.max_per_invariant),
        checked: Vec::new(),
        stats: Stats::default(),
        proved: None,
        redundant_ops: 0,
    };
    match expand_layouts(manifest) {
        Ok(Some(explicit)) => v.run(programs, &explicit, opts),
        Ok(None) => v.run(programs, manifest, opts),
        Err(why) => {
            v.check(Invariant::Manifest);
            v.fail(Invariant::Manifest, why);
        }
    }
    v.stats.time = start.elapsed();
    v.finish(opts)
}

/// Whether `m` declares the online formulation of a streamed softmax: deferred normalisation
/// (`y_i[c] = (Σ_j e_ij·v_j[c]) / Σ_j e_ij`, one division per output element) and, for a safe
/// softmax, running row maxima with rescaling of the partial sums. The declaration is the
/// manifest's `normalisation: "deferred"`, or `"per-row"` (the rows with at least `dim` unmasked
/// scores deferred, the others dividing each weight): operation counts cannot tell (with
/// `tokens = dim` and no mask a per-weight and a deferred division count are equal, and a plain
/// stream rescales nothing). It selects the specification, the necessary counts (and so `necessary_ops` and
/// `lower_bound`) and which extra operations are accounted as `ops.online_rescale`; outputs must
/// still equal that specification exactly and every count must equal its claim.
pub fn is_online(m: &Manifest) -> bool {
    !m.normalisation.is_per_weight()
}

/// Largest tensor whose affine placement the verifier spells out element by element; it only
/// runs on layers small enough to unroll, and this keeps a hostile manifest from making it
/// allocate without bound.
const MAX_EXPANDED: usize = 1 << 24;

/// `m` with every affine placement spelt out (one `(pe, addr)` per element), or `None` if it has
/// none. Refuses, rather than computing, a layout that does not cover the layer's tokens (so
/// that locating a token cannot go out of range) or whose addresses leave 32 bits.
fn expand_layouts(m: &Manifest) -> Result<Option<Manifest>, String> {
    let has_layout = m
        .inputs
        .values()
        .chain(m.outputs.values())
        .any(|p| p.layout.is_some());
    if !has_layout {
        return Ok(None);
    }
    let mut out = m.clone();
    let pes = m.pes;
    for (name, p) in out.inputs.iter_mut().chain(out.outputs.iter_mut()) {
        let Some(l) = p.layout else { continue };
        let [h, n, d] = p.shape[..] else {
            return Err(format!(
                "tensor `{name}`: a layout places a [heads, tokens, dim] tensor, the shape is {:?}",
                p.shape
            ));
        };
        if !p.pe.is_empty() || !p.addr.is_empty() {
            return Err(format!(
                "tensor `{name}`: placement gives both a layout and explicit entries"
            ));
        }
        if !l.covers(pes, n as u64) {
            return Err(format!(
                "tensor `{name}`: layout of {} rows per PE on {pes} PEs does not cover {n} tokens",
                l.rows_per_pe
            ));
        }
        let len = h
            .checked_mul(n)
            .and_then(|x| x.checked_mul(d))
            .filter(|&x| x <= MAX_EXPANDED)
            .ok_or_else(|| format!("tensor `{name}` is too large to verify ({h}×{n}×{d})"))?;
        let (mut pe, mut addr) = (Vec::with_capacity(len), Vec::with_capacity(len));
        for hh in 0..h as u32 {
            for t in 0..n as u32 {
                for c in 0..d as u32 {
                    let (q, a) = l.locate(pes, hh, t, c);
                    let a = u32::try_from(a).map_err(|_| {
                        format!("tensor `{name}`: layout places [{hh}][{t}][{c}] beyond 32-bit addresses")
                    })?;
                    pe.push(q);
                    addr.push(a);
                }
            }
        }
        p.pe = pe;
        p.addr = addr;
        p.layout = None;
    }
    Ok(Some(out))
}

struct Verification {
    sink: Sink,
    checked: Vec<Invariant>,
    stats: Stats,
    proved: Option<String>,
    redundant_ops: u64,
}

fn plain(inv: Invariant, message: String) -> Violation {
    Violation {
        invariant: inv,
        pe: None,
        cycle: None,
        instruction: None,
        message,
    }
}

impl Verification {
    fn fail(&mut self, inv: Invariant, message: String) {
        self.sink.report(inv, || plain(inv, message));
    }

    fn check(&mut self, inv: Invariant) {
        if !self.checked.contains(&inv) {
            self.checked.push(inv);
        }
    }

    fn finish(self, opts: &Options) -> Report {
        let mut kept = self.sink.kept;
        let mut violations = Vec::new();
        for inv in Invariant::ALL {
            if let Some(vs) = kept.remove(&inv) {
                violations.extend(vs);
            }
        }
        violations.truncate(opts.max_listed);
        let counts: BTreeMap<Invariant, usize> = self.sink.counts.into_iter().collect();
        let ok = counts.values().all(|&n| n == 0);
        let mut checked = self.checked;
        checked.sort();
        Report {
            proved: if ok { self.proved } else { None },
            violations,
            counts,
            checked,
            stats: self.stats,
            redundant_ops: if ok { self.redundant_ops } else { 0 },
        }
    }

    /// Reads the layer from the manifest, or reports why it cannot.
    fn shape(&mut self, m: &Manifest) -> Option<Shape> {
        self.check(Invariant::Manifest);
        let before = self.sink.total();
        let l = &m.layer;
        let shared = match l.qkv.as_str() {
            "shared" => true,
            "separate" => false,
            other => {
                self.fail(
                    Invariant::Manifest,
                    format!("layer.qkv is `{other}`; expected `shared` or `separate`"),
                );
                false
            }
        };
        let causal = match l.mask.as_str() {
            "causal" => true,
            "none" => false,
            other => {
                self.fail(
                    Invariant::Manifest,
                    format!("layer.mask is `{other}`; expected `causal` or `none`"),
                );
                false
            }
        };
        if l.heads == 0 || l.tokens == 0 || l.dim == 0 {
            self.fail(
                Invariant::Manifest,
                format!(
                    "layer sizes must be positive (heads {}, tokens {}, dim {})",
                    l.heads, l.tokens, l.dim
                ),
            );
        }
        let scale = l.scale as f32;
        if !scale.is_finite() {
            self.fail(
                Invariant::Manifest,
                format!("layer.scale {} is not a finite f32", l.scale),
            );
        }
        let softmax = match l.softmax() {
            Some(s) => s,
            None => {
                self.fail(
                    Invariant::Manifest,
                    format!(
                        "layer.softmax is `{}`; expected `safe` or `plain`",
                        l.softmax
                    ),
                );
                runtime::layer::Softmax::Plain
            }
        };
        // Subtracting the maximum bounds the exponents only when the scale is positive (the
        // layer language allows no other); the proof's claim would be false otherwise.
        if softmax == runtime::layer::Softmax::Safe && scale.is_finite() && scale <= 0.0 {
            self.fail(
                Invariant::Manifest,
                format!(
                    "layer.scale {} is not positive, so the row maximum does not bound a safe softmax's exponents",
                    l.scale
                ),
            );
        }
        let shape = Shape {
            heads: l.heads,
            tokens: l.tokens,
            dim: l.dim,
            shared,
            causal,
            scale,
            softmax,
        };
        let want: &[&str] = if shared { &["x"] } else { &["k", "q", "v"] };
        let have: Vec<&str> = m.inputs.keys().map(String::as_str).collect();
        if have != want {
            self.fail(
                Invariant::Manifest,
                format!(
                    "a {} layer takes inputs {}, the manifest places {}",
                    l.qkv,
                    want.join(", "),
                    if have.is_empty() {
                        "none".to_string()
                    } else {
                        have.join(", ")
                    }
                ),
            );
        }
        let outs: Vec<&str> = m.outputs.keys().map(String::as_str).collect();
        if outs != ["y"] {
            self.fail(
                Invariant::Manifest,
                format!(
                    "the only output must be `y`, the manifest places {}",
                    outs.join(", ")
                ),
            );
        }
        let len = shape.tensor_len();
        let dims = [l.heads as usize, l.tokens as usize, l.dim as usize];
        for (name, p) in m.inputs.iter().chain(&m.outputs) {
            // The flattened proof spells layouts out before it gets here; the compact proof
            // keeps them affine and checks their extent in closed form.
            if let Some(l) = &p.layout {
                if p.shape != dims || !p.pe.is_empty() || !p.addr.is_empty() {
                    self.fail(
                        Invariant::Manifest,
                        format!(
                            "tensor `{name}`: layout of shape {:?} (with {} explicit entries); the layer needs shape {dims:?}",
                            p.shape,
                            p.pe.len()
                        ),
                    );
                } else if let Some(why) = compact::layout_problem(l, m, &shape) {
                    self.fail(Invariant::Manifest, format!("tensor `{name}`: {why}"));
                }
                continue;
            }
            if p.shape != dims || Some(p.pe.len()) != len || Some(p.addr.len()) != len {
                self.fail(
                    Invariant::Manifest,
                    format!(
                        "tensor `{name}`: placement of shape {:?} with {} PEs and {} addresses; the layer needs shape {dims:?}",
                        p.shape,
                        p.pe.len(),
                        p.addr.len()
                    ),
                );
                continue;
            }
            for (i, (&pe, &addr)) in p.pe.iter().zip(&p.addr).enumerate() {
                let words = m.mem_words.get(pe as usize).copied();
                if pe >= m.pes || words.is_none_or(|w| addr >= w) {
                    self.fail(
                        Invariant::Manifest,
                        format!(
                            "tensor `{name}` element {} is placed at PE {pe}, m{addr}, outside the ring or that PE's memory",
                            element_name(&shape, i)
                        ),
                    );
                }
            }
        }
        self.check_copies(m, &shape, len);
        match shape.counting().necessary_as(m.normalisation) {
            None => self.fail(
                Invariant::Manifest,
                "the layer is too large to count its operations".into(),
            ),
            Some(need) => {
                if m.necessary_ops != need.total() {
                    self.fail(
                        Invariant::Manifest,
                        format!(
                            "necessary_ops is {}, but the layer needs {} (phase-1 mul {}, exp {}, div {}, phase-3 mul {}, max {})",
                            m.necessary_ops,
                            need.total(),
                            need.phase1_mul,
                            need.exp,
                            need.div,
                            need.phase3_mul,
                            need.max
                        ),
                    );
                }
                let lb = if m.pes == 0 {
                    None
                } else {
                    Some(need.total().div_ceil(u64::from(m.pes)))
                };
                if lb != Some(m.lower_bound) {
                    self.fail(
                        Invariant::Manifest,
                        format!(
                            "lower_bound is {}, but ceil(necessary ops / PEs) is {}",
                            m.lower_bound,
                            lb.map_or("undefined".into(), |b| b.to_string())
                        ),
                    );
                }
            }
        }
        (self.sink.total() == before).then_some(shape)
    }

    /// Preload copies belong to inputs and name an element and a word in range (the manifest
    /// reader's checks, repeated for manifests built in memory). Words shared with other input
    /// words are the placement check's.
    fn check_copies(&mut self, m: &Manifest, shape: &Shape, len: Option<usize>) {
        for (name, p) in &m.outputs {
            if !p.copies.is_empty() {
                self.fail(
                    Invariant::Manifest,
                    format!("output `{name}` has preload copies; only inputs are preloaded"),
                );
            }
        }
        for (name, p) in &m.inputs {
            for c in &p.copies {
                let words = m.mem_words.get(c.pe as usize).copied();
                let element = len.filter(|&n| c.index < n as u64);
                if element.is_none() || c.pe >= m.pes || words.is_none_or(|w| c.addr >= w) {
                    self.fail(
                        Invariant::Manifest,
                        format!(
                            "tensor `{name}` has a copy of element {} at PE {}, m{}, outside the tensor, the ring or that PE's memory",
                            element.map_or(format!("#{}", c.index), |_| element_name(shape, c.index as usize)),
                            c.pe,
                            c.addr
                        ),
                    );
                }
            }
        }
    }

    fn run(&mut self, programs: &[Program], m: &Manifest, opts: &Options) {
        let Some(shape) = self.shape(m) else { return };
        self.check(Invariant::Setup);
        if let Err(e) = runtime::exec::check_programs(programs, m) {
            self.fail(Invariant::Setup, e.to_string());
            return;
        }
        // The specification grows with the necessary work; a program shorter than that work
        // cannot be correct, and refusing it here keeps a hostile manifest from making the
        // verifier build an enormous specification.
        self.check(Invariant::OpCount);
        let online = is_online(m);
        // Deferred normalisation divides each output element once instead of each weight.
        let need = shape
            .counting()
            .necessary_as(m.normalisation)
            .unwrap_or_default();
        let slots: u64 = programs.iter().map(|p| p.bundles.len() as u64).sum();
        if need.total() > slots {
            self.fail(
                Invariant::OpCount,
                format!(
                    "the layer needs {} operations but the programs have only {slots} bundles",
                    need.total()
                ),
            );
            return;
        }
        // The bound is informational, but a manifest that states one states the bound of its
        // layer and formulation. Checked only now: deriving it takes time in proportion to the
        // tokens, which the programs' length now bounds.
        // A manifest with preload copies states the bound for programs with copies: the one
        // for single placements does not hold for them.
        if let Some(b) = &m.bound {
            let copies = m.inputs.values().any(|p| !p.copies.is_empty());
            if copies && !b.copies {
                self.fail(
                    Invariant::Manifest,
                    "the inputs have preload copies but the bound is the one for single placements"
                        .to_string(),
                );
            }
            let want = shape.counting().bound_for(m.pes, m.normalisation, b.copies);
            if want.as_ref() != Some(b) {
                self.fail(
                    Invariant::Manifest,
                    format!(
                        "bound is {b:?}, but the layer's is {}",
                        want.map_or("undefined".into(), |w| format!("{w:?}"))
                    ),
                );
            }
        }

        self.check(Invariant::Placement);
        let mut inputs_at: FxMap<(u32, u32), String> = FxMap::default();
        for (name, p) in &m.inputs {
            // Each element, then each copy of one: a copy is one more input word.
            let copies = p
                .copies
                .iter()
                .map(|c| (c.index as usize, c.pe, c.addr, " (copy)"));
            let elements = p.pe.iter().zip(&p.addr).enumerate();
            for (i, pe, addr, what) in elements
                .map(|(i, (&pe, &addr))| (i, pe, addr, ""))
                .chain(copies)
            {
                let here = format!("{name}{}{what}", element_name(&shape, i));
                if let Some(prev) = inputs_at.get(&(pe, addr)) {
                    let msg = format!("inputs {prev} and {here} are both placed at m{addr}");
                    self.sink.report(Invariant::Placement, || Violation {
                        pe: Some(pe),
                        ..plain(Invariant::Placement, msg)
                    });
                } else {
                    inputs_at.insert((pe, addr), here);
                }
            }
        }
        let y = &m.outputs["y"];
        let mut outputs_at: FxMap<(u32, u32), usize> = FxMap::default();
        for (i, (&pe, &addr)) in y.pe.iter().zip(&y.addr).enumerate() {
            if let Some(&prev) = outputs_at.get(&(pe, addr)) {
                let msg = format!(
                    "outputs y{} and y{} are both placed at m{addr}",
                    element_name(&shape, prev),
                    element_name(&shape, i)
                );
                self.sink.report(Invariant::Placement, || Violation {
                    pe: Some(pe),
                    ..plain(Invariant::Placement, msg)
                });
            } else {
                outputs_at.insert((pe, addr), i);
            }
        }

        let Some(mut words) = Run::alloc_words(programs) else {
            self.fail(
                Invariant::Setup,
                "a PE's declared memory is too large to allocate".into(),
            );
            return;
        };
        for p in m.inputs.values() {
            for (_, pe, addr) in p.preloads(m.pes) {
                // In range: checked with the manifest above.
                words[pe as usize][addr as usize].origin = Origin::Input;
            }
        }

        // A schedule that does not exploit q = k (the paper's Algorithm 1) computes x_a·x_b for
        // both scores (a, b) and (b, a). That is accepted only when the manifest declares it.
        let per_score_products =
            !opts.exact_ops && shape.shared && !shape.causal && m.ops.phase1_mac > need.phase1_mul;
        let mut ex = Interner::new();
        ex.set_online(online);
        let spec = spec::build(&mut ex, &shape, per_score_products, m.normalisation);
        let style = Style {
            heads: shape.heads > 1,
            ..opts.style
        };
        let sink = std::mem::replace(&mut self.sink, Sink::new(0));
        let state = RefCell::new(Run::new(
            ex,
            style,
            programs,
            words,
            spec.uses,
            spec.row_maxima,
            spec.keys,
            sink,
            inputs_at,
        ));
        for inv in [
            Invariant::Fault,
            Invariant::Masked,
            Invariant::Unnecessary,
            Invariant::Duplicate,
            Invariant::LostValue,
            Invariant::UnreadTransfer,
            Invariant::UnusedInput,
        ] {
            self.check(inv);
        }
        let result = runtime::exec::execute(
            Sym(&state),
            programs.to_vec(),
            m,
            &spec.inputs,
            &mut Watch(&state),
        );
        let mut run = state.into_inner();

        let completed = match result {
            Ok(outcome) => {
                self.stats.cycles = outcome.stats.cycles;
                self.check(Invariant::Output);
                let found = outcome.outputs.get("y").map_or(&[][..], Vec::as_slice);
                for (i, (&want, &got)) in spec.outputs.iter().zip(found).enumerate() {
                    let got = run.ex.canonical(got);
                    if got != want {
                        let (pe, addr) = (y.pe[i], y.addr[i]);
                        let writer = run.writer_text(pe, addr);
                        let (ex, style) = (&run.ex, &run.style);
                        run.sink.report(Invariant::Output, || Violation {
                            pe: Some(pe),
                            cycle: writer.as_ref().map(|w| w.0),
                            instruction: writer.map(|w| w.1),
                            ..plain(
                                Invariant::Output,
                                format!(
                                    "y{} at m{addr} (last written here): {}\n      expected: {}\n      found:    {}",
                                    element_name(&shape, i),
                                    ex.explain(want, got, style),
                                    ex.pretty(want, style),
                                    ex.pretty(got, style)
                                ),
                            )
                        });
                    }
                }
                true
            }
            Err(ExecError::Fault(fault)) => {
                self.stats.cycles = fault.cycle;
                let instruction = sym::bundle_text(programs, fault.pe, fault.cycle)
                    .or_else(|| Some(fault.bundle.to_string()));
                run.sink.report(Invariant::Fault, || Violation {
                    invariant: Invariant::Fault,
                    pe: Some(fault.pe),
                    cycle: Some(fault.cycle),
                    instruction,
                    message: fault.kind.to_string(),
                });
                false
            }
            // The run finished but an output word was never written; the placement check below
            // names every such word.
            Err(ExecError::Unwritten { .. }) => {
                self.stats.cycles = m.cycles;
                true
            }
            Err(e) => {
                run.sink
                    .report(Invariant::Setup, || plain(Invariant::Setup, e.to_string()));
                false
            }
        };

        if completed {
            for (i, (&pe, &addr)) in y.pe.iter().zip(&y.addr).enumerate() {
                let origin = run.words[pe as usize][addr as usize].origin;
                if matches!(origin, Origin::Empty | Origin::Input) {
                    let what = if origin == Origin::Empty {
                        "never written"
                    } else {
                        "still holds a preloaded input"
                    };
                    run.sink.report(Invariant::Placement, || Violation {
                        pe: Some(pe),
                        ..plain(
                            Invariant::Placement,
                            format!("output y{} at m{addr} is {what}", element_name(&shape, i)),
                        )
                    });
                }
            }
            run.leftovers(|pe, addr| outputs_at.contains_key(&(pe, addr)));
            self.count_ops(
                &mut run.sink,
                &run.tally,
                &need,
                m,
                per_score_products,
                online,
            );
        }

        self.stats.ops = run.tally;
        self.stats.expressions = run.ex.len();
        self.stats.sum_terms = run.ex.term_pool_len();
        self.stats.output_elements = spec.outputs.len();
        let max = if need.max > 0 {
            format!(", max {}", need.max)
        } else {
            String::new()
        };
        let work = if online {
            self.redundant_ops = run.tally.total().saturating_sub(need.total());
            let products = if run.tally.phase1_mul > need.phase1_mul {
                format!(
                    ", {} phase-1 products computed once per score (x_a·x_b for both (a, b) and (b, a))",
                    run.tally.phase1_mul - need.phase1_mul
                )
            } else {
                String::new()
            };
            format!(
                "with {} operations: mul {} + {}, exp {}, div {} ({}; the formulation needs {}){max}, and {} running-maximum copies, rescale factors and rescaled partial sums{products}, as the manifest declares",
                run.tally.total(),
                run.tally.phase1_mul,
                run.tally.phase3_mul,
                run.tally.exp,
                run.tally.div,
                if m.normalisation == runtime::layer::Normalisation::PerRow {
                    "per-row normalisation: one per output element in rows of at least dim scores, one per weight in the others"
                } else {
                    "deferred normalisation: one per output element"
                },
                need.total(),
                run.tally.rescale,
            )
        } else if run.tally.total() == need.total() {
            format!(
                "with exactly the {} necessary operations (mul {} + {}, exp {}, div {}{max})",
                need.total(),
                need.phase1_mul,
                need.phase3_mul,
                need.exp,
                need.div
            )
        } else {
            self.redundant_ops = run.tally.total().saturating_sub(need.total());
            format!(
                "with {} operations: the {} necessary (mul {} + {}, exp {}, div {}) and {} redundant phase-1 products the manifest declares (this schedule computes x_a·x_b for both scores (a, b) and (b, a))",
                run.tally.total(),
                need.total(),
                need.phase1_mul,
                need.phase3_mul,
                need.exp,
                need.div,
                self.redundant_ops
            )
        };
        self.sink = run.sink;
        let per_row = m.normalisation == runtime::layer::Normalisation::PerRow;
        let softmax = match (shape.softmax, online) {
            (runtime::layer::Softmax::Safe, true) if per_row => {
                ", softmax = safe, per row: y = Σ (exp(s·(w' − M)) / Σ exp(s·(w' − M)))·v in rows of fewer scores than dim, (Σ exp(s·(w' − M))·v) / Σ exp(s·(w' − M)) in the others, with M exactly each row's maximum"
            }
            (runtime::layer::Softmax::Plain, true) if per_row => {
                ", per row: y = Σ (exp(s·w') / Σ exp(s·w'))·v in rows of fewer scores than dim, (Σ exp(s·w')·v) / Σ exp(s·w') in the others"
            }
            (runtime::layer::Softmax::Safe, false) => {
                ", softmax = safe: exp(s·(w' − M)) with M exactly each row's maximum"
            }
            (runtime::layer::Softmax::Safe, true) => {
                ", softmax = safe, online: y = (Σ exp(s·(w' − M))·v) / Σ exp(s·(w' − M)) with M exactly each row's maximum, every partial sum rescaled to it"
            }
            (runtime::layer::Softmax::Plain, true) => {
                ", online: y = (Σ exp(s·w')·v) / Σ exp(s·w')"
            }
            (runtime::layer::Softmax::Plain, false) => "",
        };
        self.proved = Some(format!(
            "for all inputs, y = attention({}, mask = {}, scale = {:?}{softmax}) for {} head(s) × {} tokens × dim {}, on {} PEs in {} cycles, {work}",
            if shape.shared { "q = k = v = x" } else { "q, k, v" },
            m.layer.mask,
            shape.scale,
            shape.heads,
            shape.tokens,
            shape.dim,
            m.pes,
            m.cycles,
        ));
    }

    fn count_ops(
        &self,
        sink: &mut Sink,
        got: &OpTally,
        need: &Necessary,
        m: &Manifest,
        per_score_products: bool,
        online: bool,
    ) {
        let rows = [
            (
                "phase-1 mul",
                got.phase1_mul,
                need.phase1_mul,
                m.ops.phase1_mac,
            ),
            ("exp", got.exp, need.exp, m.ops.phase2_exp),
            ("max", got.max, need.max, m.ops.phase2_max),
            ("div", got.div, need.div, m.ops.phase2_div),
            (
                "phase-3 mul",
                got.phase3_mul,
                need.phase3_mul,
                m.ops.phase3_mac,
            ),
        ];
        // The online extras have no necessary count of their own (they depend on how the rows
        // are streamed), so the claim is the only measure; any other formulation has none.
        let rescale = (
            "online rescale",
            got.rescale,
            if online { m.ops.online_rescale } else { 0 },
            m.ops.online_rescale,
        );
        for (i, (what, got, need, claim)) in rows.into_iter().chain([rescale]).enumerate() {
            let declared_extra = i == 0 && per_score_products && got == claim && got > need;
            if got != need && !declared_extra {
                sink.report(Invariant::OpCount, || {
                    plain(
                        Invariant::OpCount,
                        format!("executed {got} {what}, the layer needs exactly {need}"),
                    )
                });
            }
            if got != claim {
                sink.report(Invariant::OpCount, || {
                    plain(
                        Invariant::OpCount,
                        format!("executed {got} {what}, the manifest's ops claim {claim}"),
                    )
                });
            }
        }
    }
}

/// `[h][i][c]` of flat index `i` in C order.
fn element_name(shape: &Shape, i: usize) -> String {
    let (n, d) = (shape.tokens as usize, shape.dim as usize);
    if n == 0 || d == 0 {
        return format!("[{i}]");
    }
    format!("[{}][{}][{}]", i / (n * d), i / d % n, i % d)
}
