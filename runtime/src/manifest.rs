//! `manifest.json`: what a larger toolchain needs to load and run the emitted programs.
//!
//! Versioned: [`FORMAT_VERSION`] (one placement entry per element), [`LAYOUT_FORMAT_VERSION`]
//! (placements may be affine [`Layout`]s, programs may be loop programs) or
//! [`COPIES_FORMAT_VERSION`] (input elements may also be preloaded at further words, their
//! [`PreloadCopy`]s); a manifest is written at the lowest version that expresses it and readers
//! refuse other versions. Placement arrays are flat in C order over `shape`, so element
//! `[h][i][c]` of a tensor is at index `(h·tokens + i)·dim + c`.

use crate::bound::Bound;
use crate::layer::Normalisation;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

pub const FORMAT: &str = "attnc-manifest";
pub const FORMAT_VERSION: u32 = 1;
/// The version that adds affine layouts and loop programs.
pub const LAYOUT_FORMAT_VERSION: u32 = 2;
/// The version that adds preload copies ([`Placement::copies`]).
pub const COPIES_FORMAT_VERSION: u32 = 3;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    pub format_version: u32,
    pub layer: LayerInfo,
    pub pes: u32,
    pub cycles: u64,
    pub lower_bound: u64,
    /// The cycle bound with its critical-path and link parts (`crate::bound`). Absent in
    /// manifests written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound: Option<Bound>,
    pub schedule: String,
    /// Which schedules were considered and why this one was chosen.
    pub selection: Selection,
    pub necessary_ops: u64,
    /// How the programs normalise; `necessary_ops` and `lower_bound` count that formulation's
    /// divisions. Absent for per-weight (every manifest before the field existed).
    #[serde(default, skip_serializing_if = "Normalisation::is_per_weight")]
    pub normalisation: Normalisation,
    pub ops: OpCountsInfo,
    /// Memory words used by each PE's program.
    pub mem_words: Vec<u32>,
    /// The memory map every PE shares, buffer by buffer, where the schedule lays out every PE's
    /// memory alike (the stream schedule); absent otherwise. Informational: the placements and
    /// `mem_words` are what a loader needs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub buffers: Vec<BufferInfo>,
    /// What the program files hold; absent in version 1 (always flat bundle lists).
    #[serde(default, skip_serializing_if = "ProgramKind::is_flat")]
    pub programs: ProgramKind,
    pub files: Files,
    pub inputs: BTreeMap<String, Placement>,
    pub outputs: BTreeMap<String, Placement>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Selection {
    pub chosen: String,
    pub reason: String,
    pub candidates: Vec<CandidateInfo>,
    /// Schedules whose build stopped once they were sure to take more cycles than a candidate
    /// built before them: never chosen, so never finished.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stopped: Vec<StoppedInfo>,
}

/// A schedule abandoned while it was built: it would take more than `above` cycles.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoppedInfo {
    pub schedule: String,
    pub above: u64,
}

/// One schedule the compiler built for this layer, with its exact cycle count.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CandidateInfo {
    pub schedule: String,
    pub cycles: u64,
    pub max_mem_words: u32,
    /// Within the `--mem` limit (always true without one).
    pub fits: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerInfo {
    pub name: String,
    pub tokens: u32,
    pub dim: u32,
    pub heads: u32,
    /// `"shared"` or `"separate"`.
    pub qkv: String,
    /// `"causal"` or `"none"`.
    pub mask: String,
    pub scale: f64,
    /// `"safe"` or `"plain"` (see [`crate::layer::Softmax`]). Written only for `safe`, so a
    /// plain layer's manifest is the one attnc wrote before the field existed, and a manifest
    /// without it (any older one) reads as plain.
    #[serde(default = "plain", skip_serializing_if = "is_plain")]
    pub softmax: String,
}

fn plain() -> String {
    crate::layer::Softmax::Plain.name().into()
}

fn is_plain(s: &str) -> bool {
    s == crate::layer::Softmax::Plain.name()
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl LayerInfo {
    /// The formulation, or `None` for a name this reader does not know (refused on read).
    pub fn softmax(&self) -> Option<crate::layer::Softmax> {
        crate::layer::Softmax::from_name(&self.softmax)
    }
}

/// One buffer of a PE's memory map: `words` words from `base`. Buffers may share words where
/// their contents are never needed at once (the map says which in `name`'s documentation).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BufferInfo {
    pub name: String,
    pub base: u32,
    pub words: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpCountsInfo {
    pub phase1_mac: u64,
    pub phase2_exp: u64,
    pub phase2_div: u64,
    pub phase3_mac: u64,
    /// Row maxima of a safe softmax; absent (0) for a plain one.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub phase2_max: u64,
    /// Operations a streamed (online) softmax executes beyond the formulation's necessary ones:
    /// running-maximum updates and the rescaling of partial sums. Absent (0) for the others.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub online_rescale: u64,
}

impl OpCountsInfo {
    pub fn total(&self) -> u64 {
        self.phase1_mac
            + self.phase2_exp
            + self.phase2_div
            + self.phase3_mac
            + self.phase2_max
            + self.online_rescale
    }
}

/// The form of the program files.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProgramKind {
    /// One bundle per cycle (ISA formats 1 and 2).
    #[default]
    Flat,
    /// Loop programs (ISA format 3).
    Loops,
}

impl ProgramKind {
    fn is_flat(&self) -> bool {
        *self == ProgramKind::Flat
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeFiles {
    pub pe: u32,
    pub text: String,
    pub binary: String,
}

/// What stands for the PE's decimal number in a [`Files::Pattern`].
pub const PE_PLACEHOLDER: &str = "{pe}";

/// The program files' names: one entry per PE, or (from [`LAYOUT_FORMAT_VERSION`]) one pair of
/// patterns in which [`PE_PLACEHOLDER`] stands for the PE's number. A thousand-PE ring's list
/// alone would be most of the manifest, so the loop-program layers write the pattern.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Files {
    List(Vec<PeFiles>),
    Pattern(FilePattern),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilePattern {
    pub text: String,
    pub binary: String,
}

impl FilePattern {
    /// attnc's own names: `pe<i>.s` and `pe<i>.bin`.
    pub fn standard() -> FilePattern {
        FilePattern {
            text: format!("pe{PE_PLACEHOLDER}.s"),
            binary: format!("pe{PE_PLACEHOLDER}.bin"),
        }
    }

    pub fn expand(&self, pe: u32) -> PeFiles {
        let n = pe.to_string();
        PeFiles {
            pe,
            text: self.text.replace(PE_PLACEHOLDER, &n),
            binary: self.binary.replace(PE_PLACEHOLDER, &n),
        }
    }

    /// Why the pattern does not give one plain file name per PE and role, if it does not. (A
    /// text name of one PE may still equal a binary name of another, e.g. `a{pe}` and `a1{pe}`;
    /// a loader reads all binaries or all texts, so that never mixes roles.)
    fn problem(&self) -> Option<String> {
        for (what, p) in [("text", &self.text), ("binary", &self.binary)] {
            if p.matches(PE_PLACEHOLDER).count() != 1 {
                return Some(format!(
                    "files.{what} must hold \"{PE_PLACEHOLDER}\" exactly once"
                ));
            }
            if !safe_name(&p.replace(PE_PLACEHOLDER, "0")) {
                return Some(format!("files.{what} is not a plain file name"));
            }
        }
        // Equal patterns would give one file both roles.
        (self.text == self.binary).then(|| "files.text and files.binary are the same".into())
    }
}

impl Files {
    /// PE `pe`'s entry; `None` past the end of a list.
    pub fn get(&self, pe: u32) -> Option<PeFiles> {
        match self {
            Files::List(l) => l.get(pe as usize).cloned(),
            Files::Pattern(p) => Some(p.expand(pe)),
        }
    }

    /// Every PE's entry, in PE order.
    pub fn list(&self, pes: u32) -> Vec<PeFiles> {
        match self {
            Files::List(l) => l.clone(),
            Files::Pattern(p) => (0..pes).map(|pe| p.expand(pe)).collect(),
        }
    }
}

/// Where every element of one tensor lives: either one `(pe, addr)` entry per element, or (from
/// [`LAYOUT_FORMAT_VERSION`]) an affine [`Layout`] with both arrays empty.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    pub shape: Vec<usize>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pe: Vec<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addr: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<Layout>,
    /// Inputs only (from [`COPIES_FORMAT_VERSION`]): further places some elements are preloaded,
    /// besides the one the arrays or the layout give. A loader writes each element there and at
    /// every copy of it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copies: Vec<PreloadCopy>,
}

/// One more place an input element is preloaded: the element at flat index `index` (C order
/// over the placement's `shape`) is also written at `addr` on PE `pe`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreloadCopy {
    pub index: u64,
    pub pe: u32,
    pub addr: u32,
}

/// How tokens are dealt to PEs by a [`Layout`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RowOrder {
    /// PE `p` owns tokens `p·R ..< (p+1)·R`, local row `t − p·R`.
    Contiguous,
    /// With `C = R/2`: PE `p` owns the token chunks `p` and `2m−1−p` of `C` tokens each, the
    /// first as local rows `0..<C`, the second as `C..<2C` (balances a causal mask).
    Zigzag,
}

/// An affine placement of a `[heads, tokens, dim]` tensor: token `t` is owned by one PE as its
/// local row `r` (by [`RowOrder`]), and element `[h, t, c]` lives on that PE at
/// `base + h·head_stride + r·row_stride + c`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layout {
    pub order: RowOrder,
    pub rows_per_pe: u32,
    pub base: u32,
    pub head_stride: u32,
    pub row_stride: u32,
}

impl Layout {
    /// `(pe, local row)` of token `t` on a ring of `pes` PEs.
    pub fn owner(&self, pes: u32, t: u32) -> (u32, u32) {
        match self.order {
            RowOrder::Contiguous => (t / self.rows_per_pe, t % self.rows_per_pe),
            RowOrder::Zigzag => {
                let c = self.rows_per_pe / 2;
                let chunk = t / c;
                if chunk < pes {
                    (chunk, t % c)
                } else {
                    (2 * pes - 1 - chunk, c + t % c)
                }
            }
        }
    }

    /// The tokens PE `pe` owns among the first `tokens`, each with its local row (the inverse
    /// of [`Layout::owner`]).
    pub fn tokens_of(&self, pes: u32, pe: u32, tokens: u32) -> Vec<(u32, u32)> {
        let r = self.rows_per_pe;
        let run = |first: u32, len: u32, row0: u32| {
            (0..len)
                .map(move |i| (first.saturating_add(i), row0 + i))
                .filter(|&(t, _)| t < tokens)
        };
        match self.order {
            RowOrder::Contiguous => run(pe.saturating_mul(r), r, 0).collect(),
            RowOrder::Zigzag => {
                let c = r / 2;
                let back = (2 * pes - 1 - pe).saturating_mul(c);
                run(pe.saturating_mul(c), c, 0)
                    .chain(run(back, c, c))
                    .collect()
            }
        }
    }

    /// `(pe, addr)` of element `[h, t, c]`, in 64 bits (checked against 32 by validation).
    pub fn locate(&self, pes: u32, h: u32, t: u32, c: u32) -> (u32, u64) {
        let (pe, r) = self.owner(pes, t);
        let addr = u64::from(self.base)
            + u64::from(h) * u64::from(self.head_stride)
            + u64::from(r) * u64::from(self.row_stride)
            + u64::from(c);
        (pe, addr)
    }

    /// Whether every one of `tokens` tokens has an owner and a local row: `rows_per_pe · pes`
    /// is exactly `tokens`, or a little more with only the end short. The missing tokens are the
    /// top local rows of their owners, which hold nothing. A little more: either the last PE's
    /// rows only (contiguous, fewer than `rows_per_pe` more) or the last chunk only (zigzag, at
    /// most a chunk more), or the rows are the fewest that deal the tokens (fewer than `pes`
    /// more, contiguous; fewer than `2·pes`, zigzag), so some PEs' last rows or chunks, or
    /// the last PEs, may hold nothing.
    pub fn covers(&self, pes: u32, tokens: u64) -> bool {
        let r = u64::from(self.rows_per_pe);
        let (per, short) = match self.order {
            RowOrder::Contiguous => (1, r.saturating_sub(1)),
            RowOrder::Zigzag => (2, r / 2),
        };
        let dealt = r * u64::from(pes);
        let fewest = dealt - tokens.min(dealt) < per * u64::from(pes);
        r > 0 && r.is_multiple_of(per) && dealt >= tokens && (dealt - tokens <= short || fewest)
    }

    /// Why the layout cannot place a `[heads, tokens, dim]` tensor on `pes` PEs with `mem`
    /// words each, one element per word, if it cannot.
    fn check(&self, pes: u32, heads: u32, tokens: u32, dim: u32, mem: &[u32]) -> Option<String> {
        let r = u64::from(self.rows_per_pe);
        let per = match self.order {
            RowOrder::Contiguous => 1,
            RowOrder::Zigzag => 2,
        };
        if !self.covers(pes, u64::from(tokens)) {
            return Some(format!(
                "{} rows per PE on {pes} PEs do not cover {tokens} tokens{}",
                self.rows_per_pe,
                if per == 2 {
                    " (zigzag needs an even count)"
                } else {
                    ""
                }
            ));
        }
        // One element per word: columns fit in a row, rows in a head.
        let row_span = (r - 1) * u64::from(self.row_stride) + u64::from(dim);
        if u64::from(self.row_stride) < u64::from(dim)
            || (heads > 1 && u64::from(self.head_stride) < row_span)
        {
            return Some("rows or heads overlap (a stride smaller than what it steps over)".into());
        }
        let last =
            u64::from(self.base) + u64::from(heads - 1) * u64::from(self.head_stride) + row_span;
        // Every PE owns the same number of rows, so every PE's highest address is `last − 1`.
        if let Some((pe, &words)) = mem.iter().enumerate().find(|(_, &w)| u64::from(w) < last) {
            return Some(format!(
                "reaches address {} on PE {pe}, which has {words} words",
                last - 1
            ));
        }
        None
    }
}

impl Placement {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `(pe, addr)` of the element at flat index `i` (C order over `shape`), `i < len()`.
    pub fn locate(&self, pes: u32, i: usize) -> (u32, u32) {
        match &self.layout {
            None => (self.pe[i], self.addr[i]),
            Some(l) => {
                let (n, d) = (self.shape[1], self.shape[2]);
                let (h, t, c) = (i / (n * d), i / d % n, i % d);
                let (pe, addr) = l.locate(pes, h as u32, t as u32, c as u32);
                // Validation bounded every address by a PE's u32 word count.
                (pe, addr as u32)
            }
        }
    }

    /// Every word the tensor is preloaded at, as `(flat index, pe, addr)`: each element's
    /// placement in C order, then every copy. Indices are as the manifest gives them (validation
    /// bounds a copy's by `len()`).
    pub fn preloads(&self, pes: u32) -> impl Iterator<Item = (u64, u32, u32)> + '_ {
        (0..self.len())
            .map(move |i| {
                let (pe, addr) = self.locate(pes, i);
                (i as u64, pe, addr)
            })
            .chain(self.copies.iter().map(|c| (c.index, c.pe, c.addr)))
    }

    /// The addresses PE `pe` holds elements (or copies of elements) at, as sorted inclusive runs
    /// `(first, last)`, without listing the elements one by one where the placement is a layout.
    pub fn pe_ranges(&self, pes: u32, pe: u32) -> Vec<(u32, u32)> {
        let mut runs = self.primary_runs(pes, pe);
        runs.extend(
            self.copies
                .iter()
                .filter(|c| c.pe == pe)
                .map(|c| (c.addr, c.addr)),
        );
        merge_runs(runs)
    }

    /// The unmerged runs of addresses PE `pe` holds elements at by the arrays or the layout
    /// (copies left out).
    fn primary_runs(&self, pes: u32, pe: u32) -> Vec<(u32, u32)> {
        match (&self.layout, self.shape.as_slice()) {
            (Some(l), &[heads, tokens, dim]) if dim > 0 => {
                let owned = l.tokens_of(pes, pe, tokens as u32);
                (0..heads as u64)
                    .flat_map(|h| {
                        owned.iter().map(move |&(_, r)| {
                            let a = u64::from(l.base)
                                + h * u64::from(l.head_stride)
                                + u64::from(r) * u64::from(l.row_stride);
                            // Validation bounded every address by a PE's u32 word count.
                            (a as u32, (a + dim as u64 - 1) as u32)
                        })
                    })
                    .collect()
            }
            (Some(_), _) => Vec::new(),
            (None, _) => self
                .pe
                .iter()
                .zip(&self.addr)
                .filter(|(&q, _)| q == pe)
                .map(|(_, &a)| (a, a))
                .collect(),
        }
    }

    /// The explicit form: one entry per element, copies kept (for tools that need the arrays;
    /// bounded by the caller, since a real layer's tensor has millions of elements).
    pub fn expanded(&self, pes: u32) -> Placement {
        let (pe, addr) = (0..self.len()).map(|i| self.locate(pes, i)).unzip();
        Placement {
            shape: self.shape.clone(),
            pe,
            addr,
            layout: None,
            copies: self.copies.clone(),
        }
    }
}

/// Inclusive address runs `(first, last)`, sorted, with runs that touch or overlap merged.
pub fn merge_runs(mut runs: Vec<(u32, u32)>) -> Vec<(u32, u32)> {
    runs.sort_unstable();
    let mut out: Vec<(u32, u32)> = Vec::with_capacity(runs.len());
    for (a, b) in runs {
        match out.last_mut() {
            Some((_, hi)) if u64::from(*hi) + 1 >= u64::from(a) => *hi = (*hi).max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// A manifest that cannot be trusted.
#[derive(Clone, Debug, PartialEq)]
pub struct ManifestError(pub String);

impl std::fmt::Display for ManifestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl Manifest {
    /// The file's text. serde_json refuses only maps with non-string keys and failing
    /// `Serialize` impls, neither of which a manifest has; the error is passed on regardless.
    pub fn to_json(&self) -> Result<String, ManifestError> {
        serde_json::to_string_pretty(self)
            .map_err(|e| ManifestError(format!("cannot serialise the manifest: {e}")))
    }

    /// Parses and checks a manifest: version, sizes and every placement entry in range.
    pub fn from_json(text: &str) -> Result<Manifest, ManifestError> {
        // Check the version before the full shape so an old or future file gets the right message.
        let raw: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| ManifestError(format!("not valid JSON: {e}")))?;
        match raw.get("format").and_then(|f| f.as_str()) {
            Some(FORMAT) => {}
            _ => {
                return Err(ManifestError(format!(
                    "not an {FORMAT} file (missing \"format\": \"{FORMAT}\")"
                )))
            }
        }
        match raw.get("format_version").and_then(|v| v.as_u64()) {
            Some(v)
                if [FORMAT_VERSION, LAYOUT_FORMAT_VERSION, COPIES_FORMAT_VERSION]
                    .iter()
                    .any(|&k| v == u64::from(k)) => {}
            Some(v) => {
                return Err(ManifestError(format!(
                    "manifest format version {v} is not supported (this attnc reads versions {FORMAT_VERSION}, {LAYOUT_FORMAT_VERSION} and {COPIES_FORMAT_VERSION})"
                )))
            }
            None => return Err(ManifestError("missing \"format_version\"".into())),
        }
        let m: Manifest = serde_json::from_value(raw)
            .map_err(|e| ManifestError(format!("malformed manifest: {e}")))?;
        m.validate()?;
        Ok(m)
    }

    fn validate(&self) -> Result<(), ManifestError> {
        let err = |s: String| Err(ManifestError(s));
        if self.pes == 0 {
            return err("pes is 0".into());
        }
        if self.programs != ProgramKind::Flat && self.format_version < LAYOUT_FORMAT_VERSION {
            return err(format!(
                "loop programs need format_version {LAYOUT_FORMAT_VERSION}"
            ));
        }
        if self.layer.softmax().is_none() {
            return err(format!(
                "layer.softmax is \"{}\"; expected \"safe\" or \"plain\"",
                self.layer.softmax
            ));
        }
        if self.mem_words.len() != self.pes as usize {
            return err(format!("expected {} entries in mem_words", self.pes));
        }
        match &self.files {
            Files::List(list) => {
                if list.len() != self.pes as usize {
                    return err(format!("expected {} entries in files", self.pes));
                }
                for (i, f) in list.iter().enumerate() {
                    if f.pe as usize != i || !safe_name(&f.text) || !safe_name(&f.binary) {
                        return err(format!("bad file entry for PE {i}"));
                    }
                }
            }
            Files::Pattern(p) => {
                if self.format_version < LAYOUT_FORMAT_VERSION {
                    return err(format!(
                        "a files pattern needs format_version {LAYOUT_FORMAT_VERSION}"
                    ));
                }
                if let Some(why) = p.problem() {
                    return err(why);
                }
            }
        }
        if !["shared", "separate"].contains(&self.layer.qkv.as_str()) {
            return err(format!(
                "layer qkv is \"{}\", expected \"shared\" or \"separate\"",
                self.layer.qkv
            ));
        }
        if !["causal", "none"].contains(&self.layer.mask.as_str()) {
            return err(format!(
                "layer mask is \"{}\", expected \"causal\" or \"none\"",
                self.layer.mask
            ));
        }
        let scale32 = self.layer.scale as f32;
        if !(self.layer.scale > 0.0 && scale32.is_finite() && scale32 > 0.0) {
            return err(format!(
                "layer scale {} is not a positive number finite as a 32-bit float",
                self.layer.scale
            ));
        }
        let (h, n, d) = (
            self.layer.heads as usize,
            self.layer.tokens as usize,
            self.layer.dim as usize,
        );
        // Checked: a hostile manifest's sizes may multiply past usize.
        let Some(len) = h.checked_mul(n).and_then(|hn| hn.checked_mul(d)) else {
            return err(format!(
                "layer heads·tokens·dim = {h}·{n}·{d} is too large to count"
            ));
        };
        for (name, p) in self.inputs.iter().chain(&self.outputs) {
            if p.shape != [h, n, d] {
                return err(format!(
                    "tensor {name}: shape {:?} does not match the layer",
                    p.shape
                ));
            }
            if let Some(l) = &p.layout {
                if self.format_version < LAYOUT_FORMAT_VERSION {
                    return err(format!(
                        "tensor {name}: a layout needs format_version {LAYOUT_FORMAT_VERSION}"
                    ));
                }
                if !p.pe.is_empty() || !p.addr.is_empty() {
                    return err(format!(
                        "tensor {name}: both a layout and per-element entries"
                    ));
                }
                if let Some(why) = l.check(
                    self.pes,
                    self.layer.heads,
                    self.layer.tokens,
                    self.layer.dim,
                    &self.mem_words,
                ) {
                    return err(format!("tensor {name}: layout {why}"));
                }
                continue;
            }
            if p.pe.len() != len || p.addr.len() != len {
                return err(format!("tensor {name}: placement needs {len} entries"));
            }
            for (&pe, &addr) in p.pe.iter().zip(&p.addr) {
                if pe >= self.pes || addr >= self.mem_words[pe as usize] {
                    return err(format!(
                        "tensor {name}: placement (PE {pe}, m{addr}) out of range"
                    ));
                }
            }
        }
        if let Some(why) = self.copies_problem() {
            return err(why);
        }
        if !self.outputs.contains_key("y") {
            return err("no placement for output y".into());
        }
        if let Some(b) = &self.bound {
            let parts = b.lower_bound.max(b.critical_path).max(b.link);
            if b.value != parts || b.lower_bound != self.lower_bound {
                return err(format!(
                    "bound.value {} is not the largest of its parts ({parts}), or bound.lower_bound {} is not lower_bound {}",
                    b.value, b.lower_bound, self.lower_bound
                ));
            }
        }
        Ok(())
    }
}

/// Where a copy stands in messages: the tensor, the element and the copy's word.
fn copy_text(name: &str, c: &PreloadCopy) -> String {
    format!(
        "tensor {name}: copy of element {} at (PE {}, m{})",
        c.index, c.pe, c.addr
    )
}

impl Manifest {
    /// Why the preload copies cannot be loaded as they stand, if they cannot: they need
    /// [`COPIES_FORMAT_VERSION`], belong to inputs only, name an element and a word in range,
    /// and take words no other input word (an element or a copy, of any input) takes. Called
    /// once every placement is known to be in range.
    fn copies_problem(&self) -> Option<String> {
        if let Some((name, _)) = self.outputs.iter().find(|(_, p)| !p.copies.is_empty()) {
            return Some(format!(
                "tensor {name}: preload copies are for inputs only, {name} is an output"
            ));
        }
        let mut taken: HashMap<(u32, u32), (&str, u64)> = HashMap::new();
        for (name, p) in &self.inputs {
            if !p.copies.is_empty() && self.format_version < COPIES_FORMAT_VERSION {
                return Some(format!(
                    "tensor {name}: preload copies need format_version {COPIES_FORMAT_VERSION}"
                ));
            }
            for c in &p.copies {
                let at = copy_text(name, c);
                let words = self.mem_words.get(c.pe as usize).copied().unwrap_or(0);
                if c.index >= p.len() as u64 || c.pe >= self.pes || c.addr >= words {
                    return Some(format!(
                        "{at} out of range ({} elements, {} PEs, {words} words on that PE)",
                        p.len(),
                        self.pes
                    ));
                }
                if p.locate(self.pes, c.index as usize) == (c.pe, c.addr) {
                    return Some(format!("{at} is where the element itself is placed"));
                }
                if let Some((other, i)) = taken.insert((c.pe, c.addr), (name, c.index)) {
                    return Some(format!(
                        "{at} shares the word with a copy of tensor {other} element {i}"
                    ));
                }
            }
        }
        self.copy_on_element(&taken)
    }

    /// The first copy (of `copies`, by word) that takes a word holding an element of an input.
    /// Per-element placements are scanned once; a layout is asked only about the PEs that hold
    /// copies, so a large layout is not listed element by element.
    fn copy_on_element(&self, copies: &HashMap<(u32, u32), (&str, u64)>) -> Option<String> {
        if copies.is_empty() {
            return None;
        }
        let clash = |(pe, addr): (u32, u32), name: &str| {
            copies.get(&(pe, addr)).map(|&(owner, index)| {
                let c = PreloadCopy { index, pe, addr };
                format!(
                    "{} shares the word with an element of tensor {name}",
                    copy_text(owner, &c)
                )
            })
        };
        let mut by_pe: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for &(pe, addr) in copies.keys() {
            by_pe.entry(pe).or_default().push(addr);
        }
        // Sorted, so that of several clashes the same one is reported every time.
        by_pe.values_mut().for_each(|a| a.sort_unstable());
        for (name, p) in &self.inputs {
            if p.layout.is_none() {
                let mut words = p.pe.iter().copied().zip(p.addr.iter().copied());
                if let Some(why) = words.find_map(|w| clash(w, name)) {
                    return Some(why);
                }
                continue;
            }
            for (&pe, addrs) in &by_pe {
                let runs = merge_runs(p.primary_runs(self.pes, pe));
                for &a in addrs {
                    // The last run starting at or before `a` is the only one that can hold it.
                    let k = runs.partition_point(|&(first, _)| first <= a);
                    if k > 0 && runs[k - 1].1 >= a {
                        return clash((pe, a), name);
                    }
                }
            }
        }
        None
    }
}

/// File names in a manifest must stay inside the output directory.
fn safe_name(s: &str) -> bool {
    !s.is_empty() && !s.contains(['/', '\\']) && s != "." && s != ".."
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(softmax: &str, max_ops: u64) -> Manifest {
        let place = || Placement {
            shape: vec![1, 1, 1],
            pe: vec![0],
            addr: vec![0],
            layout: None,
            copies: Vec::new(),
        };
        Manifest {
            format: FORMAT.into(),
            format_version: FORMAT_VERSION,
            layer: LayerInfo {
                name: "l".into(),
                tokens: 1,
                dim: 1,
                heads: 1,
                qkv: "shared".into(),
                mask: "none".into(),
                scale: 1.0,
                softmax: softmax.into(),
            },
            pes: 1,
            cycles: 1,
            lower_bound: 1,
            bound: None,
            schedule: "s".into(),
            selection: Selection {
                chosen: "s".into(),
                reason: "r".into(),
                candidates: Vec::new(),
                stopped: Vec::new(),
            },
            necessary_ops: 4,
            normalisation: Normalisation::PerWeight,
            ops: OpCountsInfo {
                phase1_mac: 1,
                phase2_exp: 1,
                phase2_div: 1,
                phase3_mac: 1,
                phase2_max: max_ops,
                online_rescale: 0,
            },
            mem_words: vec![1],
            buffers: Vec::new(),
            programs: ProgramKind::Flat,
            files: Files::List(vec![PeFiles {
                pe: 0,
                text: "pe0.s".into(),
                binary: "pe0.bin".into(),
            }]),
            inputs: [("x".to_string(), place())].into(),
            outputs: [("y".to_string(), place())].into(),
        }
    }

    #[test]
    fn plain_is_written_as_before_and_an_absent_field_reads_as_plain() {
        let json = manifest("plain", 0).to_json().unwrap();
        assert!(!json.contains("softmax"), "{json}");
        assert!(!json.contains("phase2_max"), "{json}");
        let back = Manifest::from_json(&json).unwrap();
        assert_eq!(back.layer.softmax(), Some(crate::layer::Softmax::Plain));
        assert_eq!(back.ops.phase2_max, 0);
    }

    #[test]
    fn safe_is_recorded_and_round_trips() {
        let json = manifest("safe", 3).to_json().unwrap();
        assert!(json.contains("\"softmax\": \"safe\""), "{json}");
        assert!(json.contains("\"phase2_max\": 3"), "{json}");
        let back = Manifest::from_json(&json).unwrap();
        assert_eq!(back, manifest("safe", 3));
    }

    #[test]
    fn unknown_formulation_and_unknown_fields_are_refused() {
        let json = manifest("safe", 0)
            .to_json()
            .unwrap()
            .replace("\"safe\"", "\"fast\"");
        let e = Manifest::from_json(&json).unwrap_err();
        assert!(e.0.contains("layer.softmax is \"fast\""), "{e}");
        let json = manifest("safe", 0)
            .to_json()
            .unwrap()
            .replace("\"softmax\"", "\"softmax\": \"safe\", \"online\"");
        let e = Manifest::from_json(&json).unwrap_err();
        assert!(e.0.contains("unknown field"), "{e}");
    }

    #[test]
    fn a_files_pattern_names_every_pe_and_needs_version_2() {
        let mut m = manifest("safe", 0);
        m.format_version = LAYOUT_FORMAT_VERSION;
        m.pes = 3;
        m.mem_words = vec![1; 3];
        m.files = Files::Pattern(FilePattern::standard());
        let json = m.to_json().unwrap();
        let back = Manifest::from_json(&json).unwrap();
        let names: Vec<String> = back.files.list(3).into_iter().map(|f| f.binary).collect();
        assert_eq!(names, ["pe0.bin", "pe1.bin", "pe2.bin"]);
        assert_eq!(back.files.get(2).unwrap().text, "pe2.s");

        let refused = |json: String, why: &str| {
            let e = Manifest::from_json(&json).unwrap_err();
            assert!(e.0.contains(why), "{e}");
        };
        refused(
            json.replace("\"format_version\": 2", "\"format_version\": 1"),
            "needs format_version 2",
        );
        refused(json.replace("pe{pe}.bin", "pe.bin"), "exactly once");
        refused(json.replace("pe{pe}.bin", "pe{pe}{pe}.bin"), "exactly once");
        refused(
            json.replace("pe{pe}.bin", "../pe{pe}.bin"),
            "not a plain file name",
        );
        refused(json.replace("pe{pe}.bin", "pe{pe}.s"), "the same");
    }

    #[test]
    fn bound_is_optional_and_checked_against_its_parts() {
        // Manifests written before the bound existed load unchanged.
        let json = manifest("plain", 0).to_json().unwrap();
        assert!(!json.contains("\"bound\""), "{json}");
        let mut m = manifest("plain", 0);
        m.bound = Some(Bound {
            value: 9,
            lower_bound: 1,
            critical_path: 9,
            link: 1,
            copies: false,
        });
        let json = m.to_json().unwrap();
        assert!(json.contains("\"critical_path\": 9"), "{json}");
        assert_eq!(Manifest::from_json(&json).unwrap(), m);
        // A value that is not the largest part, or a lower bound that differs, is refused.
        let e = Manifest::from_json(&json.replace("\"value\": 9", "\"value\": 8")).unwrap_err();
        assert!(e.0.contains("bound.value"), "{e}");
        let e = Manifest::from_json(&json.replace(
            "\"lower_bound\": 1,\n    \"critical",
            "\"lower_bound\": 2,\n    \"critical",
        ))
        .unwrap_err();
        assert!(e.0.contains("bound.lower_bound"), "{e}");
    }

    #[test]
    fn pe_ranges_of_a_layout_are_those_of_its_expanded_form() {
        // Per PE, the runs a layout gives without listing elements must be exactly those the
        // element-by-element form gives, padding (tokens missing at the end) included.
        for (order, rows, pes, tokens) in [
            (RowOrder::Contiguous, 3, 4, 12),
            (RowOrder::Contiguous, 3, 4, 10),
            (RowOrder::Contiguous, 2, 5, 7),
            (RowOrder::Zigzag, 4, 3, 12),
            (RowOrder::Zigzag, 4, 3, 11),
            (RowOrder::Zigzag, 2, 4, 7),
        ] {
            for (heads, dim, head_stride, row_stride) in [(1, 2, 0, 2), (2, 3, 40, 5), (3, 1, 7, 1)]
            {
                let layout = Layout {
                    order,
                    rows_per_pe: rows,
                    base: 3,
                    head_stride: if heads == 1 { 0 } else { head_stride },
                    row_stride,
                };
                let p = Placement {
                    shape: vec![heads, tokens, dim],
                    pe: Vec::new(),
                    addr: Vec::new(),
                    layout: Some(layout),
                    copies: Vec::new(),
                };
                let flat = p.expanded(pes);
                for pe in 0..pes {
                    let mut want: Vec<u32> = flat
                        .pe
                        .iter()
                        .zip(&flat.addr)
                        .filter(|(&q, _)| q == pe)
                        .map(|(_, &a)| a)
                        .collect();
                    want.sort_unstable();
                    let got: Vec<u32> = p
                        .pe_ranges(pes, pe)
                        .into_iter()
                        .flat_map(|(a, b)| a..=b)
                        .collect();
                    assert_eq!(
                        got, want,
                        "{order:?} rows {rows} pes {pes} tokens {tokens} heads {heads} pe {pe}"
                    );
                    assert_eq!(flat.pe_ranges(pes, pe), p.pe_ranges(pes, pe));
                }
            }
        }
    }

    /// Version 3, two words per PE on two PEs, `x` element 0 at (0, m0) with a copy at (1, m1).
    fn with_copy() -> Manifest {
        let mut m = manifest("plain", 0);
        m.format_version = COPIES_FORMAT_VERSION;
        m.pes = 2;
        m.mem_words = vec![2, 2];
        m.files = Files::List(
            (0..2)
                .map(|pe| PeFiles {
                    pe,
                    text: format!("pe{pe}.s"),
                    binary: format!("pe{pe}.bin"),
                })
                .collect(),
        );
        m.outputs.get_mut("y").unwrap().addr = vec![1];
        m.inputs.get_mut("x").unwrap().copies = vec![PreloadCopy {
            index: 0,
            pe: 1,
            addr: 1,
        }];
        m
    }

    fn refused_with(m: &Manifest, why: &str) {
        let e = Manifest::from_json(&m.to_json().unwrap()).unwrap_err();
        assert!(e.0.contains(why), "expected {why:?}: {e}");
    }

    #[test]
    fn copies_round_trip_at_version_3_and_are_absent_otherwise() {
        let m = with_copy();
        let json = m.to_json().unwrap();
        assert!(json.contains("\"copies\""), "{json}");
        assert!(json.contains("\"format_version\": 3"), "{json}");
        assert_eq!(Manifest::from_json(&json).unwrap(), m);
        // Without copies nothing new is written, so older readers see what they always saw.
        let json = manifest("plain", 0).to_json().unwrap();
        assert!(!json.contains("copies"), "{json}");
        // Version 3 is read without copies too, and a later one is not read at all.
        let mut v3 = manifest("plain", 0);
        v3.format_version = COPIES_FORMAT_VERSION;
        assert!(Manifest::from_json(&v3.to_json().unwrap()).is_ok());
        v3.format_version = COPIES_FORMAT_VERSION + 1;
        refused_with(&v3, "is not supported");
    }

    #[test]
    fn copies_need_version_3() {
        for v in [FORMAT_VERSION, LAYOUT_FORMAT_VERSION] {
            let mut m = with_copy();
            m.format_version = v;
            refused_with(&m, "preload copies need format_version 3");
        }
    }

    /// A change to a copy and what the refusal must name.
    type CopyEdit = (fn(&mut PreloadCopy), &'static str);

    #[test]
    fn copies_out_of_range_are_refused() {
        let edits: [CopyEdit; 3] = [
            (|c| c.index = 1, "element 1"),
            (|c| c.pe = 2, "(PE 2, m1)"),
            (|c| c.addr = 2, "(PE 1, m2)"),
        ];
        for (edit, what) in edits {
            let mut m = with_copy();
            edit(&mut m.inputs.get_mut("x").unwrap().copies[0]);
            let e = Manifest::from_json(&m.to_json().unwrap()).unwrap_err();
            assert!(e.0.contains("out of range") && e.0.contains(what), "{e}");
        }
    }

    #[test]
    fn copies_on_an_output_are_refused() {
        let mut m = with_copy();
        m.outputs.get_mut("y").unwrap().copies = vec![PreloadCopy {
            index: 0,
            pe: 1,
            addr: 0,
        }];
        refused_with(&m, "for inputs only");
    }

    #[test]
    fn a_copy_may_not_share_a_word_with_another_input_word() {
        let copy = |pe, addr| PreloadCopy { index: 0, pe, addr };
        // On its own element's placement.
        let mut m = with_copy();
        m.inputs.get_mut("x").unwrap().copies = vec![copy(0, 0)];
        refused_with(&m, "where the element itself is placed");
        // On another copy, of the same tensor or of another one.
        let mut m = with_copy();
        m.inputs.get_mut("x").unwrap().copies.push(copy(1, 1));
        refused_with(&m, "shares the word with a copy of tensor x element 0");
        let mut m = with_copy();
        let mut k = m.inputs["x"].clone();
        k.addr = vec![1];
        m.inputs.insert("k".into(), k);
        refused_with(&m, "shares the word with a copy of tensor");
        // On another tensor's element, placed element by element or by a layout.
        let mut m = with_copy();
        let mut k = m.inputs["x"].clone();
        (k.pe, k.addr, k.copies) = (vec![1], vec![1], Vec::new());
        m.inputs.insert("k".into(), k);
        refused_with(
            &m,
            "copy of element 0 at (PE 1, m1) shares the word with an element of tensor k",
        );
        // A layout is asked about the copies' PEs only: its one element is on PE 0 at `base`.
        let mut m = with_copy();
        m.mem_words = vec![3, 3];
        m.inputs.get_mut("x").unwrap().copies = vec![copy(0, 1)];
        (
            m.outputs.get_mut("y").unwrap().pe,
            m.outputs.get_mut("y").unwrap().addr,
        ) = (vec![1], vec![0]);
        let layout = |base| Layout {
            order: RowOrder::Contiguous,
            rows_per_pe: 1,
            base,
            head_stride: 0,
            row_stride: 1,
        };
        let k = |base| Placement {
            shape: vec![1, 1, 1],
            pe: Vec::new(),
            addr: Vec::new(),
            layout: Some(layout(base)),
            copies: Vec::new(),
        };
        m.inputs.insert("k".into(), k(2));
        assert!(Manifest::from_json(&m.to_json().unwrap()).is_ok());
        m.inputs.insert("k".into(), k(1));
        refused_with(
            &m,
            "copy of element 0 at (PE 0, m1) shares the word with an element of tensor k",
        );
    }

    #[test]
    fn copies_are_listed_with_their_pe_and_kept_when_expanded() {
        let m = with_copy();
        let x = &m.inputs["x"];
        assert_eq!(x.pe_ranges(2, 0), vec![(0, 0)]);
        assert_eq!(x.pe_ranges(2, 1), vec![(1, 1)]);
        assert_eq!(x.expanded(2).copies, x.copies);
        let words: Vec<(u64, u32, u32)> = x.preloads(2).collect();
        assert_eq!(words, vec![(0, 0, 0), (0, 1, 1)]);
    }

    #[test]
    fn runs_merge_when_they_touch_or_overlap() {
        assert_eq!(
            merge_runs(vec![(5, 9), (0, 2), (3, 4), (8, 12), (20, 20)]),
            vec![(0, 12), (20, 20)]
        );
        assert!(merge_runs(Vec::new()).is_empty());
    }
}
