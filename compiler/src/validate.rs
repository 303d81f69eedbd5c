//! `validate`: the contract between scheduling and codegen.
//!
//! [`validate`] runs after every scheduling pass. If it returns `Ok`, codegen can turn the
//! schedule into microcode without failing. It checks, collecting every violation:
//!
//! * the ring has at least one PE and every PE has the same number of cycles;
//! * every value a slot reads or sends is on that PE in that cycle: an input from cycle 0 on
//!   the PE it is preloaded on, a computed value from the cycle after the work that made it,
//!   a received value from the cycle after the send that carried it (a send may also carry the
//!   accumulate result of its own bundle);
//! * every value is produced (an input or the result of some work);
//! * every output is on its PE after the last cycle, and no output element is listed twice;
//! * no send on a one-PE ring (the value is already where it goes);
//! * every work item has a phase it can belong to, and the schedule's operation counts equal
//!   what its slots hold.

use crate::pe_map::PeValMap;
use crate::schedule::{OpCounts, RingSchedule, ScheduleError, Val, ValInfo, Work};
use cranelift_entity::EntityRef;
use rustc_hash::{FxHashMap, FxHashSet};

/// What a valid schedule is, for the passes after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Info {
    pub cycles: usize,
    pub ops: OpCounts,
}

pub fn validate(s: &RingSchedule) -> Result<Info, Vec<ScheduleError>> {
    let mut errors = Vec::new();
    let m = s.pes as usize;
    if m == 0 || s.slots.len() != m {
        return Err(vec![ScheduleError::NoSuchPe { pe: 0, pes: s.pes }]);
    }
    let cycles = s.cycles();
    if s.slots.iter().any(|row| row.len() != cycles) {
        return Err(vec![ScheduleError::Ragged]);
    }
    // Values present on each PE, as of the cycle being checked (a map per PE, see `pe_map`).
    let mut here: PeValMap<()> = PeValMap::new(m, s.vals.len(), ());
    let on = |here: &PeValMap<()>, pe: usize, v: Val| here.get(pe, v).is_some();
    // Per value: produced by some input or work (a slot may name a value beyond `vals`).
    let mut produced: Vec<bool> = vec![false; s.vals.len()];
    let produce = |produced: &mut Vec<bool>, v: Val| {
        if v.index() >= produced.len() {
            produced.resize(v.index() + 1, false);
        }
        produced[v.index()] = true;
    };
    for (val, info) in s.vals.iter() {
        if let ValInfo::Input { pe, .. } = *info {
            if (pe as usize) < m {
                here.insert(pe as usize, val, ());
            } else {
                errors.push(ScheduleError::NoSuchPe { pe, pes: s.pes });
            }
            produce(&mut produced, val);
        }
    }
    let mut found = OpCounts::default();
    let mut arriving: Vec<(usize, Val)> = Vec::new();
    for t in 0..cycles {
        arriving.clear();
        for (pe, row) in s.slots.iter().enumerate() {
            let slot = row[t];
            let missing = |v: Val| ScheduleError::NotPresent {
                pe: pe as u32,
                cycle: t,
                val: v,
            };
            if let Some(work) = slot.work {
                for v in work.reads() {
                    if !on(&here, pe, v) {
                        errors.push(missing(v));
                    }
                }
                match slot.phase {
                    Some(ph) => found.count(ph, work.phase_kind()),
                    None => errors.push(ScheduleError::PhaseMismatch {
                        pe: pe as u32,
                        cycle: t,
                        phase: 0,
                    }),
                }
            }
            if let Some(v) = slot.send {
                let from_acc = slot.work.as_ref().and_then(Work::acc_result) == Some(v);
                if !from_acc && !on(&here, pe, v) {
                    errors.push(missing(v));
                }
                if m == 1 {
                    errors.push(ScheduleError::DoubleBooked {
                        pe: 0,
                        cycle: t,
                        slot: "link (a one-PE ring sends nothing)",
                    });
                }
                arriving.push(((pe + 1) % m, v));
            }
        }
        for (pe, row) in s.slots.iter().enumerate() {
            if let Some(work) = row[t].work {
                for v in work.writes() {
                    here.insert(pe, v, ());
                    produce(&mut produced, v);
                }
            }
        }
        for &(to, v) in &arriving {
            here.insert(to, v, ());
        }
    }
    let mut seen = FxHashSet::default();
    let mut listed: FxHashMap<(u32, u32, u32, u8), ()> = FxHashMap::default();
    for &(element, pe, val) in &s.outputs {
        let key = (element.head, element.row, element.col, element.tensor as u8);
        if listed.insert(key, ()).is_some() {
            errors.push(ScheduleError::Output {
                pe,
                val,
                reason: "the element is listed twice",
            });
        }
        if (pe as usize) >= m {
            errors.push(ScheduleError::NoSuchPe { pe, pes: s.pes });
        } else if !on(&here, pe as usize, val) {
            errors.push(ScheduleError::Output {
                pe,
                val,
                reason: "not on this PE after the last cycle",
            });
        }
        seen.insert(val);
    }
    for v in seen {
        if !produced.get(v.index()).copied().unwrap_or(false) {
            errors.push(ScheduleError::UnknownValue { val: v });
        }
    }
    if found != s.ops {
        errors.push(ScheduleError::Counts {
            claimed: s.ops,
            found,
        });
    }
    if errors.is_empty() {
        Ok(Info { cycles, ops: found })
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Tensor;
    use crate::schedule::{Builder, Element};

    fn x(col: u32) -> Element {
        Element {
            tensor: Tensor::X,
            head: 0,
            row: 0,
            col,
        }
    }

    #[test]
    fn a_read_before_arrival_is_located() {
        let mut b = Builder::new("test", 2);
        let a = b.input(x(0), 0);
        let c = b.input(x(1), 1);
        let out = b.computed();
        // PE 1 multiplies a value that only ever lives on PE 0.
        b.work(
            1,
            0,
            1,
            Work::Mac {
                a,
                b: c,
                acc: None,
                out,
            },
        );
        b.output(x(0), 1, out);
        let s = b.finish().expect("books cleanly");
        let errors = validate(&s).unwrap_err();
        assert_eq!(
            errors,
            vec![ScheduleError::NotPresent {
                pe: 1,
                cycle: 0,
                val: a
            }]
        );
    }

    #[test]
    fn a_sent_value_is_there_one_cycle_later() {
        let mut b = Builder::new("test", 2);
        let a = b.input(x(0), 0);
        let out = b.computed();
        b.send(0, 0, a);
        let work = Work::Mac {
            a,
            b: a,
            acc: None,
            out,
        };
        b.work(1, 1, 1, work);
        b.output(x(0), 1, out);
        let s = b.finish().expect("books cleanly");
        assert_eq!(validate(&s).map(|i| i.cycles), Ok(2));

        // The same work one cycle earlier reads the word while it is still on the link.
        let mut b = Builder::new("test", 2);
        let a = b.input(x(0), 0);
        let out = b.computed();
        b.send(0, 0, a);
        b.work(1, 0, 1, work);
        b.output(x(0), 1, out);
        let errors = validate(&b.finish().unwrap()).unwrap_err();
        assert!(matches!(
            errors[0],
            ScheduleError::NotPresent {
                pe: 1,
                cycle: 0,
                ..
            }
        ));
    }

    #[test]
    fn double_booking_and_wrong_phase_are_errors_not_panics() {
        let mut b = Builder::new("test", 1);
        let a = b.input(x(0), 0);
        let (o1, o2) = (b.computed(), b.computed());
        let mac = |out| Work::Mac {
            a,
            b: a,
            acc: None,
            out,
        };
        b.work(0, 3, 1, mac(o1));
        b.work(0, 3, 3, mac(o2));
        b.work(0, 4, 2, mac(o2));
        let errors = b.finish().unwrap_err();
        assert_eq!(
            errors,
            vec![
                ScheduleError::DoubleBooked {
                    pe: 0,
                    cycle: 3,
                    slot: "op"
                },
                ScheduleError::PhaseMismatch {
                    pe: 0,
                    cycle: 4,
                    phase: 2
                }
            ]
        );
    }

    #[test]
    fn a_missing_output_is_located() {
        let mut b = Builder::new("test", 2);
        let a = b.input(x(0), 0);
        b.output(x(0), 1, a);
        let errors = validate(&b.finish().unwrap()).unwrap_err();
        assert!(matches!(errors[0], ScheduleError::Output { pe: 1, .. }));
    }
}
