//! The compiler's passes, one file each, in pipeline order.

pub mod analyze;
pub mod codegen;
pub mod lower;
pub mod schedule_baseline;
pub mod schedule_causal;
pub mod schedule_rows;
pub mod schedule_stream;
pub mod schedule_symmetric;
pub mod select;

/// `(name, description)` of every pass, in pipeline order; the names `--dump-after` accepts.
pub const PASSES: [(&str, &str); 8] = [
    (lower::NAME, lower::DESCRIPTION),
    (analyze::NAME, analyze::DESCRIPTION),
    (select::NAME, select::DESCRIPTION),
    (schedule_baseline::NAME, schedule_baseline::DESCRIPTION),
    (schedule_symmetric::NAME, schedule_symmetric::DESCRIPTION),
    (schedule_causal::NAME, schedule_causal::DESCRIPTION),
    (schedule_rows::NAME, schedule_rows::DESCRIPTION),
    (codegen::NAME, codegen::DESCRIPTION),
];
