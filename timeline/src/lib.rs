//! What every PE of an emitted ring program does in every cycle, classified by attention phase.
//!
//! [`walk`] runs the programs once over [`lineage::LineageDomain`] (through the same
//! [`isa::Machine`] as the numeric interpreter), reports each cycle's slot activity to a callback
//! and returns per-PE totals and a memory map. [`Grid`] bins that activity into a bounded number of
//! PE rows × time columns, which is what keeps traces and pictures small for any layer.
//!
//! ```
//! let layer = &lang::parse(0, "layer t { tokens = 4; dim = 4; }").layers[0];
//! let opts = compiler::Options { pes: 2, ..Default::default() };
//! let c = compiler::compile(layer, &opts).unwrap();
//! let mut grid = timeline::Grid::new(2, c.manifest.cycles, 2, 10, 3);
//! let walk = timeline::walk(&c.programs, &c.manifest, |t, slots| grid.add(t, slots)).unwrap();
//! // Every op the compiler counted as phase-1 MAC is a QKᵀ op by lineage.
//! let qk: u64 = walk.per_pe.iter().map(|p| p.op[timeline::Class::Qk as usize]).sum();
//! assert_eq!(qk, c.manifest.ops.phase1_mac);
//! ```

pub mod lineage;

pub use lineage::{Class, Tag};

use isa::{Acc, AccSrc, Addr, Machine, Observer, Op, Program, Xfer, XferSrc};
use runtime::manifest::Manifest;

/// Slots of a bundle in the order used by every per-slot array here.
pub const SLOTS: [&str; 3] = ["op", "acc", "link"];

/// Totals for one PE over the whole run.
#[derive(Clone, Debug, Default)]
pub struct PeSummary {
    pub bundles: u64,
    /// Op-slot cycles by [`Class`] (index with `Class as usize`); `op[Idle]` is idle cycles.
    pub op: [u64; Class::COUNT],
    /// Acc-slot cycles by class (the class of the op it adds).
    pub acc: [u64; Class::COUNT],
    /// Link-slot cycles by the class of the word sent.
    pub link: [u64; Class::COUNT],
    /// Words this PE sent to the next PE.
    pub sent: u64,
    /// Words this PE received from the previous PE.
    pub received: u64,
    /// Per address, a bit set of the [`Tag`]s ever written there (bit `tag as u8`); preloaded
    /// inputs are not writes.
    pub written: Vec<u8>,
}

/// The result of [`walk`].
#[derive(Clone, Debug)]
pub struct Walk {
    pub cycles: u64,
    pub per_pe: Vec<PeSummary>,
}

/// Bit of `tag` in [`PeSummary::written`].
pub fn tag_bit(tag: Tag) -> u8 {
    1 << (tag as u8)
}

/// Every tag, in bit order.
pub const TAGS: [Tag; 7] = [
    Tag::Input,
    Tag::Score,
    Tag::Exp,
    Tag::ExpSum,
    Tag::Weight,
    Tag::Out,
    Tag::Mixed,
];

/// Collects the (pe, addr) of every write in one cycle, to look their new tags up afterwards.
#[derive(Default)]
struct Writes(Vec<(u32, Addr)>);

impl Observer for Writes {
    fn on_write(&mut self, pe: u32, _cycle: u64, addr: Addr) {
        self.0.push((pe, addr));
    }
}

/// Runs `programs` (checked against `manifest` as `attnc run` checks them) over lineage tags,
/// calling `on_cycle(t, slots)` once per cycle with each PE's `[op, acc, link]` class.
pub fn walk(
    programs: &[Program],
    manifest: &Manifest,
    mut on_cycle: impl FnMut(u64, &[[Class; 3]]),
) -> Result<Walk, String> {
    runtime::exec::check_programs(programs, manifest).map_err(|e| e.to_string())?;
    let pes = programs.len();
    let mut m =
        Machine::new(lineage::LineageDomain, programs.to_vec()).map_err(|e| e.to_string())?;
    for (name, p) in &manifest.inputs {
        // Every element and every preload copy of one.
        for (_, pe, addr) in p.preloads(manifest.pes) {
            m.preload(pe, addr, Tag::Input)
                .map_err(|e| format!("preloading `{name}`: {e}"))?;
        }
    }
    let mut per_pe: Vec<PeSummary> = programs
        .iter()
        .map(|p| PeSummary {
            bundles: p.bundles.len() as u64,
            written: vec![0; p.mem_words as usize],
            ..Default::default()
        })
        .collect();
    let cycles = manifest.cycles;
    let mut slots = vec![[Class::Idle; 3]; pes];
    let mut writes = Writes::default();
    for t in 0..cycles {
        for (p, prog) in programs.iter().enumerate() {
            let b = prog
                .bundles
                .get(t as usize)
                .copied()
                .unwrap_or(isa::Bundle::NOP);
            slots[p] = classify(&m, p as u32, &b);
        }
        writes.0.clear();
        m.step(&mut writes).map_err(|f| f.to_string())?;
        for &(pe, addr) in &writes.0 {
            if let (Some(tag), Some(bits)) = (
                m.read(pe, addr),
                per_pe[pe as usize].written.get_mut(addr as usize),
            ) {
                *bits |= tag_bit(*tag);
            }
        }
        for (p, s) in slots.iter().enumerate() {
            let sum = &mut per_pe[p];
            sum.op[s[0] as usize] += 1;
            sum.acc[s[1] as usize] += 1;
            sum.link[s[2] as usize] += 1;
            if s[2] != Class::Idle {
                sum.sent += 1;
                per_pe[(p + 1) % pes].received += 1;
            }
        }
        on_cycle(t, &slots);
    }
    Ok(Walk { cycles, per_pe })
}

/// The classes of one bundle's three slots, from the tags in memory at the start of the cycle.
/// A read of an uninitialised word is left to the machine to report as a fault.
fn classify(m: &Machine<lineage::LineageDomain>, pe: u32, b: &isa::Bundle) -> [Class; 3] {
    let tag = |a: Addr| m.read(pe, a).copied().unwrap_or(Tag::Mixed);
    let operands: Vec<Tag> = match b.op {
        Op::Nop => vec![],
        Op::Arith(x) => x.reads().map(tag).collect(),
    };
    let (op_class, result) = lineage::op_result(b.op.kind(), &operands);
    let (acc_class, acc_tag) = match b.acc {
        Acc::Nop => (Class::Idle, None),
        Acc::Add { src, .. } => {
            let addend = match src {
                AccSrc::Mem(s) => Some(tag(s)),
                AccSrc::Zero => None,
            };
            (op_class, Some(lineage::acc_result(addend, result)))
        }
    };
    let link = match b.xfer {
        Xfer::Nop => Class::Idle,
        Xfer::Send {
            src: XferSrc::Mem(s),
            ..
        } => tag(s).class(),
        Xfer::Send {
            src: XferSrc::Acc, ..
        } => acc_tag.unwrap_or(Tag::Mixed).class(),
    };
    [op_class, acc_class, link]
}

/// Activity binned into at most `max_pe_bins` rows of consecutive PEs and `max_time_bins`
/// columns of consecutive cycles, counting slot-cycles per class in each cell.
#[derive(Clone, Debug)]
pub struct Grid {
    pub pes: u32,
    pub cycles: u64,
    /// PEs per row (the last row may hold fewer).
    pub pes_per_bin: u32,
    /// Cycles per column (the last column may hold fewer).
    pub width: u64,
    pub pe_bins: usize,
    pub time_bins: usize,
    /// How many slots per PE are recorded: 1 (op only) or 3 (op, acc, link).
    pub slots: usize,
    counts: Vec<[u32; Class::COUNT]>,
}

impl Grid {
    pub fn new(
        pes: u32,
        cycles: u64,
        max_pe_bins: usize,
        max_time_bins: usize,
        slots: usize,
    ) -> Grid {
        let pes_per_bin = pes.max(1).div_ceil(max_pe_bins.max(1) as u32);
        let pe_bins = pes.max(1).div_ceil(pes_per_bin) as usize;
        let width = cycles.max(1).div_ceil(max_time_bins.max(1) as u64);
        let time_bins = cycles.div_ceil(width) as usize;
        let slots = slots.clamp(1, 3);
        Grid {
            pes,
            cycles,
            pes_per_bin,
            width,
            pe_bins,
            time_bins,
            slots,
            counts: vec![[0; Class::COUNT]; pe_bins * slots * time_bins],
        }
    }

    fn index(&self, pe_bin: usize, slot: usize, time_bin: usize) -> usize {
        (pe_bin * self.slots + slot) * self.time_bins + time_bin
    }

    /// Records cycle `t`; `slots` is indexed by PE, as [`walk`] reports it.
    pub fn add(&mut self, t: u64, slots: &[[Class; 3]]) {
        let tb = (t / self.width) as usize;
        if tb >= self.time_bins {
            return;
        }
        for (pe, s) in slots.iter().enumerate() {
            let pb = pe / self.pes_per_bin as usize;
            for (slot, class) in s.iter().enumerate().take(self.slots) {
                let i = self.index(pb, slot, tb);
                self.counts[i][*class as usize] += 1;
            }
        }
    }

    /// Slot-cycles per class in one cell.
    pub fn cell(&self, pe_bin: usize, slot: usize, time_bin: usize) -> &[u32; Class::COUNT] {
        &self.counts[self.index(pe_bin, slot, time_bin)]
    }

    /// The cycles `[start, end)` of a column.
    pub fn time_range(&self, time_bin: usize) -> (u64, u64) {
        let start = time_bin as u64 * self.width;
        (start, (start + self.width).min(self.cycles))
    }

    /// The PEs `[start, end)` of a row.
    pub fn pe_range(&self, pe_bin: usize) -> (u32, u32) {
        let start = pe_bin as u32 * self.pes_per_bin;
        (start, (start + self.pes_per_bin).min(self.pes))
    }
}

/// The class with the most slot-cycles in `counts`; ties go to the busy class, then to the
/// earlier phase, so a half-busy cell never looks idle.
pub fn dominant(counts: &[u32; Class::COUNT]) -> Class {
    let mut best = Class::Idle;
    for c in Class::ALL {
        let (n, b) = (counts[c as usize], counts[best as usize]);
        if n > b || (n == b && n > 0 && best == Class::Idle) {
            best = c;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_bins_cover_every_cycle_once() {
        let mut g = Grid::new(5, 23, 2, 4, 3);
        assert_eq!(
            (g.pes_per_bin, g.pe_bins, g.width, g.time_bins),
            (3, 2, 6, 4)
        );
        let slots = vec![[Class::Qk, Class::Idle, Class::Input]; 5];
        for t in 0..23 {
            g.add(t, &slots);
        }
        let total: u32 = (0..g.pe_bins)
            .flat_map(|r| (0..g.time_bins).map(move |c| (r, c)))
            .map(|(r, c)| g.cell(r, 0, c).iter().sum::<u32>())
            .sum();
        assert_eq!(total, 5 * 23);
        assert_eq!(g.time_range(3), (18, 23));
        assert_eq!(g.pe_range(1), (3, 5));
        assert_eq!(g.cell(1, 2, 3)[Class::Input as usize], 2 * 5);
    }

    #[test]
    fn dominant_prefers_work_on_ties() {
        let mut c = [0; Class::COUNT];
        c[Class::Idle as usize] = 2;
        c[Class::Av as usize] = 2;
        assert_eq!(dominant(&c), Class::Av);
        assert_eq!(dominant(&[0; Class::COUNT]), Class::Idle);
    }
}
