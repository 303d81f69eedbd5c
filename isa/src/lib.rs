//! The instruction set of a unidirectional ring of processing elements.
//!
//! Each PE has a private word memory and, every cycle, executes one
//! [`Bundle`]: an arithmetic op, an accumulate that adds the op result to a
//! word, and a transfer of one word to the next PE on the ring. All PEs step
//! in lockstep and the only communication is the ring link, so a program is a
//! fixed schedule with no control flow.
//!
//! The crate provides the instruction types ([`inst`]), a text assembler and
//! disassembler ([`text`]), a canonical binary encoding ([`binary`]) and an
//! interpreter generic over the value domain ([`machine`]). The full
//! specification is in `docs/isa.md`.

pub mod binary;
pub mod inst;
pub mod looped;
pub mod looped_binary;
pub mod looped_exec;
pub mod looped_text;
pub mod machine;
pub mod text;

pub use binary::{decode, encode, DecodeError, EncodeError};
pub use inst::{
    Acc, AccSrc, Addr, Arith, Bundle, Op, OpInfo, OpKind, Program, Xfer, XferSrc, FORMAT_VERSION,
    OPS,
};
pub use looped::{
    Cmp, CountStep, Field, FlattenError, Instances, LBundle, Loop, LoopError, LoopProgram, Node,
    Pred, Slot, Term, LOOP_FORMAT_VERSION, MAX_LOOP_DEPTH,
};
pub use looped_binary::{decode_any, decode_looped, encode_looped, LOOP_BINARY_VERSION};
pub use looped_exec::{LoopLoadError, LoopMachine};
pub use looped_text::{parse_any, parse_looped, AnyProgram};
pub use machine::{
    f32_max, Domain, F32Domain, Fault, FaultKind, LoadError, Machine, NoObserver, Observer,
    PeStats, RunStats,
};
pub use text::{parse, ParseError};
