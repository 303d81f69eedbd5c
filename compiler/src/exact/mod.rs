//! Exact schedules by SAT (placeholder).
