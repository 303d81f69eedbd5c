//! attnc's runtime side: everything needed to load, run and check an emitted directory, and
//! nothing of how it was compiled.
//!
//! * [`manifest`] — the `manifest.json` format (a loading contract, versioned, validated on read).
//! * [`exec`] — loading programs into [`isa::Machine`] per the manifest, running them over any
//!   value domain, reading the outputs; seeded random inputs; comparing with the reference.
//! * [`reference`](mod@reference) — naive f64 attention, written independently of every scheduler.
//! * [`bound`] — a lower bound on cycles from the critical path and the links, beside [`layer`]'s
//!   count of operations.
//! * [`layer`] — the necessary operation counts and the lower bound, shared by the compiler,
//!   the manifest checks and the verifier.
//!
//! The symbolic verifier depends on this crate and on `isa` only, never on the compiler it checks.

pub mod bound;
pub mod exec;
pub mod layer;
pub mod manifest;
pub mod reference;
