//! The instruction set as plain data.
//!
//! Nothing here checks anything: a [`Program`] may name addresses its PE
//! does not have, or use an acc slot without an op. Those are run-time faults
//! (see [`crate::machine`]) because whether they matter depends on the ring
//! the program is loaded into and on which bundles actually execute.

/// A word address in one PE's local memory.
pub type Addr = u32;

/// Newest version of the text and binary formats. Bumped whenever either changes meaning, so an
/// old tool refuses a new file instead of misreading it. A program is always written in the
/// lowest version that can express it ([`Program::format_version`]), so programs that use only
/// version-1 operations keep their version-1 bytes.
pub const FORMAT_VERSION: u16 = 2;

/// The op-slot operations. Everything else about a kind — its mnemonic, binary code, operand
/// count, immediate and the format that introduced it — is in its row of [`OPS`], from which the
/// assembler, the binary codec, the interpreter and the statistics all derive.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub enum OpKind {
    /// `mem[a] * mem[b]`.
    Mul,
    /// `exp(imm * mem[a])`.
    Exp,
    /// `mem[a] / mem[b]`.
    Div,
    /// `max(mem[a], mem[b])`: the running maximum of a softmax row.
    Max,
    /// `exp(imm * (mem[a] - mem[b]))`: an exponential shifted by a row maximum, so that it
    /// cannot overflow when `mem[b]` is the maximum of the values it is applied to.
    Expd,
}

/// One row of the op table.
#[derive(Clone, Copy, Debug)]
pub struct OpInfo {
    pub kind: OpKind,
    pub mnemonic: &'static str,
    /// The op-kind byte of a binary bundle record (0 is `nop`).
    pub code: u8,
    /// Memory operands read: 1 (`a`) or 2 (`a`, `b`).
    pub reads: u8,
    /// Takes a finite f32 immediate (the scale of an exponential).
    pub imm: bool,
    /// First format version that has this kind.
    pub since: u16,
}

/// The op table, in [`OpKind`] order.
pub static OPS: [OpInfo; 5] = [
    OpInfo {
        kind: OpKind::Mul,
        mnemonic: "mul",
        code: 1,
        reads: 2,
        imm: false,
        since: 1,
    },
    OpInfo {
        kind: OpKind::Exp,
        mnemonic: "exp",
        code: 2,
        reads: 1,
        imm: true,
        since: 1,
    },
    OpInfo {
        kind: OpKind::Div,
        mnemonic: "div",
        code: 3,
        reads: 2,
        imm: false,
        since: 1,
    },
    OpInfo {
        kind: OpKind::Max,
        mnemonic: "max",
        code: 4,
        reads: 2,
        imm: false,
        since: 2,
    },
    OpInfo {
        kind: OpKind::Expd,
        mnemonic: "expd",
        code: 5,
        reads: 2,
        imm: true,
        since: 2,
    },
];

impl OpKind {
    /// Every kind, in table order.
    pub const ALL: [OpKind; 5] = [
        OpKind::Mul,
        OpKind::Exp,
        OpKind::Div,
        OpKind::Max,
        OpKind::Expd,
    ];

    pub fn info(self) -> &'static OpInfo {
        &OPS[self as usize]
    }

    pub fn mnemonic(self) -> &'static str {
        self.info().mnemonic
    }

    /// Position in [`OPS`], for per-kind arrays.
    pub const fn index(self) -> usize {
        self as usize
    }

    pub fn from_mnemonic(m: &str) -> Option<OpKind> {
        OPS.iter().find(|o| o.mnemonic == m).map(|o| o.kind)
    }

    pub fn from_code(code: u8) -> Option<OpKind> {
        OPS.iter().find(|o| o.code == code).map(|o| o.kind)
    }
}

/// An arithmetic operation in the op slot. Fields a kind does not use (per [`OPS`]) are zero:
/// `b` when it reads one operand, `imm` when it takes no immediate. The constructors keep it so.
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct Arith {
    pub kind: OpKind,
    pub a: Addr,
    pub b: Addr,
    pub imm: f32,
    /// Where the result is also stored, besides feeding the acc slot.
    pub dst: Option<Addr>,
}

/// The op slot: the one arithmetic unit of a PE.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Op {
    Nop,
    Arith(Arith),
}

impl Op {
    pub fn mul(a: Addr, b: Addr, dst: Option<Addr>) -> Op {
        Op::binary(OpKind::Mul, a, b, dst)
    }

    pub fn div(a: Addr, b: Addr, dst: Option<Addr>) -> Op {
        Op::binary(OpKind::Div, a, b, dst)
    }

    pub fn max(a: Addr, b: Addr, dst: Option<Addr>) -> Op {
        Op::binary(OpKind::Max, a, b, dst)
    }

    /// `exp(scale * mem[a])`; the scale must be finite for the program to encode.
    pub fn exp(a: Addr, scale: f32, dst: Option<Addr>) -> Op {
        Op::Arith(Arith {
            kind: OpKind::Exp,
            a,
            b: 0,
            imm: scale,
            dst,
        })
    }

    /// `exp(scale * (mem[a] - mem[b]))`.
    pub fn expd(a: Addr, b: Addr, scale: f32, dst: Option<Addr>) -> Op {
        Op::Arith(Arith {
            kind: OpKind::Expd,
            a,
            b,
            imm: scale,
            dst,
        })
    }

    fn binary(kind: OpKind, a: Addr, b: Addr, dst: Option<Addr>) -> Op {
        Op::Arith(Arith {
            kind,
            a,
            b,
            imm: 0.0,
            dst,
        })
    }

    pub fn kind(&self) -> Option<OpKind> {
        match self {
            Op::Nop => None,
            Op::Arith(a) => Some(a.kind),
        }
    }

    pub fn dst(&self) -> Option<Addr> {
        match self {
            Op::Nop => None,
            Op::Arith(a) => a.dst,
        }
    }
}

impl Arith {
    /// The memory operands read, in order (one or two, per the op table).
    pub fn reads(&self) -> impl Iterator<Item = Addr> {
        let two = self.kind.info().reads == 2;
        [Some(self.a), two.then_some(self.b)].into_iter().flatten()
    }
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

impl Program {
    /// The lowest format version that can express this program: the newest `since` of the
    /// operations it uses (1 for none).
    pub fn format_version(&self) -> u16 {
        self.bundles
            .iter()
            .filter_map(|b| b.op.kind())
            .map(|k| k.info().since)
            .max()
            .unwrap_or(1)
    }
}
