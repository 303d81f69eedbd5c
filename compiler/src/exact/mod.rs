//! Exact schedules by SAT: the fewest cycles any schedule of the machine model can take, with a
//! proof.
//!
//! For a budget of `T` cycles, [`model`] lists the layer's necessary operations, the values they
//! read and make, and the chains of accumulations (partial sums) with the cycle windows critical
//! paths allow; [`encode`] turns that into CNF over "op `o` runs on PE `p` in cycle `t`", "value
//! `v` is in PE `p`'s memory at cycle `t`", "PE `p` sends `v` in cycle `t`" and "chain `x`'s
//! partial sum is on PE `p` at cycle `t`", with one op and one transfer per PE per cycle;
//! CaDiCaL decides it; [`decode`] reads a model back into a [`crate::schedule::RingSchedule`] that
//! the ordinary codegen turns into programs. [`search`] first lets [`improve`] shorten the
//! heuristic schedule by large-neighbourhood search (re-solving windows of it, starting from
//! [`hint`]'s reading of it as op placements), then tries budgets down from the best schedule
//! known (or up from the lower bound, or by bisection) under one deadline: a satisfiable `T`
//! whose `T − 1` is unsatisfiable is optimal. docs/exact.md describes the model, its assumptions,
//! the normal forms and the symmetry breaking.

pub mod decode;
pub mod encode;
pub mod hint;
pub mod improve;
pub mod model;
pub mod search;

pub use search::{
    optimal, problem_of, solve_budget, Attempt, ExactError, Options, Outcome, Source, Strategy,
    Verdict,
};
