//! The scheduler registry: every scheduling pass behind one trait, listed once.
//!
//! `--schedule`, its help text, `attnc passes`, `--dump-after`, selection under `auto` and the
//! manifest's `schedule` name all derive from [`SCHEDULERS`], so a new scheduler is one new pass
//! file implementing [`Scheduler`] plus one line in that list.

use crate::passes::select::Refusal;
use crate::passes::{
    schedule_baseline, schedule_causal, schedule_cols, schedule_dag, schedule_rows, schedule_split,
    schedule_symmetric, schedule_wide,
};
use crate::problem::Problem;
use crate::schedule::{RingSchedule, ScheduleError};

/// A scheduling pass.
pub trait Scheduler: Sync {
    /// The `--schedule` value, e.g. `baseline`.
    fn name(&self) -> &'static str;
    /// The pass name (`--dump-after`, the manifest's `schedule`), e.g. `schedule-baseline`.
    fn pass(&self) -> &'static str;
    /// One line for `attnc passes`.
    fn description(&self) -> &'static str;
    /// How the compiler names the choice to a user, e.g. `baseline (paper Algorithm 1)`.
    fn title(&self) -> &'static str;
    /// Why the scheduler cannot take this layer on `pes` PEs, naming the field to blame.
    fn refusal(&self, p: &Problem, pes: u32) -> Option<Refusal>;
    /// Whether `auto` tries it when it applies (a forced choice may still take it).
    fn tried_by_auto(&self, _p: &Problem, _pes: u32) -> bool {
        true
    }
    /// Whether every operation it emits is necessary. A scheduler that recomputes (the paper's
    /// baseline on q = k) declares so, and the verifier then accepts the redundant products the
    /// manifest claims instead of requiring exactly the necessary ones.
    fn necessary_only(&self) -> bool {
        true
    }
    /// Fewer cycles than this its schedule of `p` on `pes` PEs never takes, known without
    /// building it: the layer's lower bound unless the pass can say more cheaply. `compile`
    /// keeps a faster stream without building the candidates whose floor it is below.
    fn floor(&self, p: &Problem, pes: u32) -> u64 {
        p.lower_bound(pes)
    }
    /// Builds the schedule. An error is a bug in the pass, located; the result still goes
    /// through [`crate::validate`] before codegen.
    fn schedule(&self, p: &Problem, pes: u32) -> Result<RingSchedule, Vec<ScheduleError>>;
    /// As [`Scheduler::schedule`], but a pass may stop, and return `None`, as soon as it is sure
    /// its schedule would take more than `limit` cycles (another candidate already has
    /// `limit`). Whatever it returns within the limit is exactly what `schedule` returns.
    fn schedule_within(
        &self,
        p: &Problem,
        pes: u32,
        _limit: usize,
    ) -> Result<Option<RingSchedule>, Vec<ScheduleError>> {
        self.schedule(p, pes).map(Some)
    }
    /// Whether [`Scheduler::schedule_within`] can stop early, so that `compile` gains by
    /// building this pass after the others.
    fn stops_early(&self) -> bool {
        false
    }
}

/// Every scheduler, in preference order: on equal cycles and memory the earlier one is kept.
pub static SCHEDULERS: &[&dyn Scheduler] = &[
    &schedule_causal::Causal,
    &schedule_symmetric::Symmetric,
    &schedule_rows::Rows,
    &schedule_split::Split,
    &schedule_wide::Wide,
    &schedule_cols::Cols,
    &schedule_baseline::Baseline,
    &schedule_dag::Dag,
];

/// The scheduler with `--schedule` name `name`.
pub fn by_name(name: &str) -> Option<&'static dyn Scheduler> {
    SCHEDULERS.iter().copied().find(|s| s.name() == name)
}

/// The scheduler whose pass is named `pass`.
pub fn by_pass(pass: &str) -> Option<&'static dyn Scheduler> {
    SCHEDULERS.iter().copied().find(|s| s.pass() == pass)
}
