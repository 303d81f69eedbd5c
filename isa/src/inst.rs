//! The instruction set as plain data.
//!
//! Nothing here checks anything: a [`Program`] may name addresses its PE
//! does not have, or use an acc slot without an op. Those are run-time faults
//! (see [`crate::machine`]) because whether they matter depends on the ring
//! the program is loaded into and on which bundles actually execute.

/// A word address in one PE's local memory.
pub type Addr = u32;

/// Version of both the text and the binary format. Bumped whenever either
/// changes meaning, so an old tool refuses a new file instead of misreading it.
pub const FORMAT_VERSION: u16 = 1;

/// The op slot: the one arithmetic unit of a PE.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Op {
    Nop,
    /// `mem[a] * mem[b]`.
    Mul {
        a: Addr,
        b: Addr,
        dst: Option<Addr>,
    },
    /// `exp(scale * mem[a])`. The scale is an immediate so that a scaled
    /// exponential costs one op; it must be finite.
    Exp {
        a: Addr,
        scale: f32,
        dst: Option<Addr>,
    },
    /// `mem[a] / mem[b]`.
    Div {
        a: Addr,
        b: Addr,
        dst: Option<Addr>,
    },
}

/// Where the accumulator's addend comes from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum AccSrc {
    Mem(Addr),
    /// Start a fresh sum: the acc result is the op result itself.
    Zero,
}

/// The acc slot: adds the op result of the same bundle to an addend.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Acc {
    Nop,
    Add { src: AccSrc, dst: Option<Addr> },
}

/// What a send puts on the ring link.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum XferSrc {
    Mem(Addr),
    /// The acc result of the same bundle, so a partial sum can move on in
    /// the cycle it is produced without a round trip through memory.
    Acc,
}

/// The xfer slot: one word to the next PE on the ring.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Xfer {
    Nop,
    /// `dst` is an address in the *receiving* PE's memory.
    Send {
        src: XferSrc,
        dst: Addr,
    },
}

/// Everything one PE does in one cycle.
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct Bundle {
    pub op: Op,
    pub acc: Acc,
    pub xfer: Xfer,
}

impl Bundle {
    pub const NOP: Bundle = Bundle {
        op: Op::Nop,
        acc: Acc::Nop,
        xfer: Xfer::Nop,
    };
}

impl Default for Bundle {
    fn default() -> Self {
        Bundle::NOP
    }
}

/// The microcode of one PE. A ring is loaded with one program per PE; the
/// header fields let each program be stored and checked on its own.
#[derive(Clone, PartialEq, Debug)]
pub struct Program {
    /// Index of the PE this program is for, in `0..pes`.
    pub pe: u32,
    /// Number of PEs in the ring the program was compiled for.
    pub pes: u32,
    /// Size of this PE's local memory in words.
    pub mem_words: u32,
    /// Bundle `i` executes in cycle `i`.
    pub bundles: Vec<Bundle>,
}
