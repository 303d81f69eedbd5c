//! The compiler's passes, one file each, in pipeline order.

pub mod analyze;
pub mod codegen;
pub mod lower;
pub mod reroll;
pub mod schedule_baseline;
pub mod schedule_causal;
pub mod schedule_cols;
pub mod schedule_dag;
pub mod schedule_rows;
pub mod schedule_split;
pub mod schedule_stream;
pub mod schedule_symmetric;
pub mod schedule_wide;
pub mod select;

/// `(name, description)` of every pass, in pipeline order; the names `--dump-after` accepts.
/// The scheduling passes come from the registry ([`crate::scheduler::SCHEDULERS`]).
pub fn list() -> Vec<(&'static str, &'static str)> {
    let mut v = vec![
        (lower::NAME, lower::DESCRIPTION),
        (analyze::NAME, analyze::DESCRIPTION),
        (select::NAME, select::DESCRIPTION),
    ];
    v.extend(
        crate::scheduler::SCHEDULERS
            .iter()
            .map(|s| (s.pass(), s.description())),
    );
    v.push((schedule_stream::NAME, schedule_stream::DESCRIPTION));
    v.push((codegen::NAME, codegen::DESCRIPTION));
    v.push((reroll::NAME, reroll::DESCRIPTION));
    v
}
