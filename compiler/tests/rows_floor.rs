//! The row dataflow's floor, counted from its cut without scheduling: never above the cycles
//! of the schedule it then builds, and equal to the operations its busiest PE is given there
//! wherever it claims more than the lower bound (so it is the count it says it is), q = k
//! without a mask (each pair computed by one of its holders) included.

use compiler::passes::schedule_rows;
use compiler::problem::Problem;
use runtime::layer::Softmax;

fn problem(n: u32, d: u32, h: u32, shared: bool, causal: bool, softmax: Softmax) -> Problem {
    Problem::attention(n, d, h, shared, causal, softmax)
}

#[test]
fn floor_is_the_busiest_pes_work_and_never_above_the_schedule() -> Result<(), String> {
    let mut counted = 0;
    let mut layers = 0;
    // q = k without a mask: the count follows which holder computes each pair.
    let (mut paired, mut paired_counted) = (0, 0);
    for (n, d, h) in [
        (16, 8, 1),
        (20, 6, 2),
        (24, 16, 1),
        (30, 5, 1),
        (33, 12, 3),
        (40, 8, 1),
    ] {
        for m in [3, 4, 5, 6, 7, 8, 12] {
            for (shared, causal) in [(false, false), (false, true), (true, true), (true, false)] {
                for softmax in [Softmax::Safe, Softmax::Plain] {
                    let p = problem(n, d, h, shared, causal, softmax);
                    let what = format!("{p:?} on {m} PEs");
                    let floor = schedule_rows::floor(&p, m);
                    let s = schedule_rows::run(&p, m).map_err(|e| format!("{what}: {e:?}"))?;
                    layers += 1;
                    paired += usize::from(shared && !causal);
                    assert!(
                        floor <= s.cycles() as u64,
                        "{what}: floor {floor} above the schedule's {} cycles",
                        s.cycles()
                    );
                    assert!(floor >= p.lower_bound(m), "{what}: floor below the bound");
                    if floor > p.lower_bound(m) {
                        counted += 1;
                        paired_counted += usize::from(shared && !causal);
                        let busiest = s
                            .slots
                            .iter()
                            .map(|pe| pe.iter().filter(|slot| slot.work.is_some()).count())
                            .max()
                            .unwrap_or(0) as u64;
                        assert_eq!(floor, busiest, "{what}: the busiest PE's operations");
                    }
                }
            }
        }
    }
    // The grid must exercise the count, not only fall back to the bound.
    assert!(
        counted * 3 >= layers,
        "only {counted} of {layers} layers had a floor above the bound"
    );
    assert!(
        paired_counted * 3 >= paired,
        "only {paired_counted} of {paired} q = k layers without a mask had a floor above the bound"
    );
    Ok(())
}

/// Where the whole ring also pairs by start times (q = k, several heads, 32 PEs or more), the
/// floor is the smallest of the pairings' busiest PEs: still never above the schedule kept.
#[test]
fn floor_never_above_the_schedule_where_pairs_go_by_start_times() -> Result<(), String> {
    for (n, d, h, m) in [
        (32, 8, 4, 64),
        (16, 8, 4, 64),
        (32, 8, 2, 32),
        (32, 64, 4, 64),
    ] {
        let p = problem(n, d, h, true, false, Softmax::Safe);
        let what = format!("{p:?} on {m} PEs");
        let floor = schedule_rows::floor(&p, m);
        let s = schedule_rows::run(&p, m).map_err(|e| format!("{what}: {e:?}"))?;
        assert!(floor >= p.lower_bound(m), "{what}: floor below the bound");
        assert!(
            floor <= s.cycles() as u64,
            "{what}: floor {floor} above the schedule's {} cycles",
            s.cycles()
        );
    }
    Ok(())
}
