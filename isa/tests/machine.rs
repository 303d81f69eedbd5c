//! The interpreter: ring data flow checked by hand, every fault kind, and
//! loading rules.

use isa::{
    parse, Addr, Bundle, F32Domain, FaultKind, LoadError, Machine, NoObserver, Observer, Op,
    OpKind, Program, RunStats,
};

fn prog(pe: u32, pes: u32, mem: u32, body: &str) -> Program {
    parse(&format!(
        ".format 1\n.pe {pe}\n.pes {pes}\n.mem {mem}\n{body}"
    ))
    .unwrap()
}

fn machine(progs: Vec<Program>, preload: &[(u32, Addr, f32)]) -> Machine<F32Domain> {
    let mut m = Machine::new(F32Domain, progs).unwrap();
    for &(pe, addr, word) in preload {
        m.preload(pe, addr, word).unwrap();
    }
    m
}

#[derive(Default)]
struct Counts {
    reads: Vec<(u32, u64, Addr)>,
    writes: Vec<(u32, u64, Addr)>,
    sends: Vec<(u32, u64)>,
}

impl Observer for Counts {
    fn on_read(&mut self, pe: u32, cycle: u64, addr: Addr) {
        self.reads.push((pe, cycle, addr));
    }
    fn on_write(&mut self, pe: u32, cycle: u64, addr: Addr) {
        self.writes.push((pe, cycle, addr));
    }
    fn on_send(&mut self, pe: u32, cycle: u64) {
        self.sends.push((pe, cycle));
    }
}

/// Two sums of products circulate around a 2-PE ring, each picking up one
/// product per PE per cycle:
///   sum A starts on PE 0: 1*2 (PE 0) + 9*10 (PE 1) + 5*6 (PE 0) = 122, ends in PE 0 m11
///   sum B starts on PE 1: 7*8 (PE 1) + 3*4 (PE 0) + 11*12 (PE 1) = 200, ends in PE 1 m11
/// m10 is the ring inbox; after cycle 1 it holds the partial of the sum that
/// finishes there: PE 0 gets A = 2 + 90 = 92, PE 1 gets B = 56 + 12 = 68.
#[test]
fn partial_sums_travel_around_the_ring() {
    let body = "mul m0, m1 | add 0 | send acc -> m10\n\
                mul m2, m3 | add m10 | send acc -> m10\n\
                mul m4, m5 | add m10 -> m11\n";
    let mut pre = Vec::new();
    for (pe, base) in [(0u32, 1.0f32), (1, 7.0)] {
        for i in 0..6 {
            pre.push((pe, i, base + i as f32));
        }
    }
    let mut m = machine(vec![prog(1, 2, 12, body), prog(0, 2, 12, body)], &pre);
    let mut obs = Counts::default();
    let stats = m.run(&mut obs).unwrap();

    assert_eq!(m.read(0, 11), Some(&122.0));
    assert_eq!(m.read(1, 11), Some(&200.0));
    assert_eq!(m.read(0, 10), Some(&92.0));
    assert_eq!(m.read(1, 10), Some(&68.0));
    assert_eq!(m.read(0, 6), None);
    assert_eq!(m.read(0, 12), None);
    assert_eq!(m.read(2, 0), None);

    assert_eq!(stats.cycles, 3);
    for s in &stats.per_pe {
        assert_eq!(
            (
                s.count(OpKind::Mul),
                s.count(OpKind::Exp),
                s.count(OpKind::Div),
                s.add,
                s.send,
                s.busy
            ),
            (3, 0, 0, 3, 2, 3)
        );
    }
    assert_eq!(stats.utilization(), 1.0);
    assert_eq!(m.cycle(), 3);
    assert!(!m.step(&mut NoObserver).unwrap());

    // Reads in operand order, per PE, per cycle.
    let pe0: Vec<_> = obs
        .reads
        .iter()
        .filter(|r| r.0 == 0)
        .map(|r| (r.1, r.2))
        .collect();
    assert_eq!(
        pe0,
        [
            (0, 0),
            (0, 1),
            (1, 2),
            (1, 3),
            (1, 10),
            (2, 4),
            (2, 5),
            (2, 10)
        ]
    );
    // Writes land at commit, under the PE whose memory changes.
    assert_eq!(
        obs.writes,
        [
            (0, 0, 10),
            (1, 0, 10),
            (0, 1, 10),
            (1, 1, 10),
            (0, 2, 11),
            (1, 2, 11)
        ]
    );
    assert_eq!(obs.sends, [(0, 0), (1, 0), (0, 1), (1, 1)]);
}

/// The same pattern on a larger ring against a direct computation: with
/// `pes` PEs and `pes` cycles, sum j (started on PE j) collects product
/// `a[(j + t) % pes][t] * b` for t in 0..pes and ends on PE (j + pes - 1) % pes.
#[test]
fn ring_of_five_matches_direct_computation() {
    let pes = 5u32;
    let mut progs = Vec::new();
    let mut pre = Vec::new();
    for pe in 0..pes {
        let mut body = String::new();
        for t in 0..pes {
            let a = 1 + t;
            let acc = if t == 0 { "add 0" } else { "add m0" };
            if t + 1 == pes {
                body += &format!("mul m{a}, m20 | {acc} -> m9\n");
            } else {
                body += &format!("mul m{a}, m20 | {acc} | send acc -> m0\n");
            }
            pre.push((pe, a, (pe * 10 + t) as f32));
        }
        pre.push((pe, 20, 0.5));
        progs.push(prog(pe, pes, 21, &body));
    }
    let mut m = machine(progs, &pre);
    m.run(&mut NoObserver).unwrap();
    for j in 0..pes {
        let want: f32 = (0..pes)
            .map(|t| (((j + t) % pes) * 10 + t) as f32 * 0.5)
            .sum();
        let end = (j + pes - 1) % pes;
        assert_eq!(m.read(end, 9), Some(&want), "sum {j}");
    }
}

#[test]
fn exp_div_and_a_single_pe_sending_to_itself() {
    // m0 = 2, m1 = 8.
    let p = prog(
        0,
        1,
        8,
        "exp m0, 0.5 -> m2 | add m1 -> m3 | send m1 -> m4\n\
         div m1, m0 -> m5 | add 0 | send acc -> m6\n\
         nop\n",
    );
    let mut m = machine(vec![p], &[(0, 0, 2.0), (0, 1, 8.0)]);
    let stats = m.run(&mut NoObserver).unwrap();
    let e = (0.5f32 * 2.0).exp();
    assert_eq!(m.read(0, 2), Some(&e));
    assert_eq!(m.read(0, 3), Some(&(8.0 + e)));
    assert_eq!(m.read(0, 4), Some(&8.0));
    assert_eq!(m.read(0, 5), Some(&4.0));
    assert_eq!(m.read(0, 6), Some(&4.0));
    assert_eq!(stats.cycles, 3);
    let s = stats.per_pe[0];
    assert_eq!(
        (
            s.count(OpKind::Exp),
            s.count(OpKind::Div),
            s.add,
            s.send,
            s.busy
        ),
        (1, 1, 2, 2, 2)
    );
    assert!((stats.utilization() - 2.0 / 3.0).abs() < 1e-12);
}

#[test]
fn reads_see_the_start_of_the_cycle() {
    // Both PEs swap m0 through the ring while overwriting it locally; every
    // read must see the old value.
    let body = "mul m0, m1 -> m0 | nop | send m0 -> m2\n";
    let mut m = machine(
        vec![prog(0, 2, 3, body), prog(1, 2, 3, body)],
        &[(0, 0, 3.0), (0, 1, 10.0), (1, 0, 5.0), (1, 1, 100.0)],
    );
    m.run(&mut NoObserver).unwrap();
    assert_eq!(m.read(0, 0), Some(&30.0));
    assert_eq!(m.read(1, 0), Some(&500.0));
    assert_eq!(m.read(0, 2), Some(&5.0));
    assert_eq!(m.read(1, 2), Some(&3.0));
}

#[test]
fn shorter_programs_go_idle() {
    let mut m = machine(
        vec![
            prog(
                0,
                2,
                4,
                "mul m0, m0 -> m1\nmul m0, m1 -> m2\nmul m2, m2 -> m3\n",
            ),
            prog(1, 2, 4, "nop | nop | send m0 -> m0\n"),
        ],
        &[(0, 0, 2.0), (1, 0, 7.0)],
    );
    assert_eq!(m.total_cycles(), 3);
    let stats = m.run(&mut NoObserver).unwrap();
    assert_eq!(stats.cycles, 3);
    // PE 1's send replaced PE 0's m0 (2) by 7 at the end of cycle 0:
    // m1 = 2 * 2, m2 = 7 * 4, m3 = 28 * 28.
    assert_eq!(m.read(0, 3), Some(&784.0));
    assert_eq!(stats.per_pe[1].busy, 0);
    assert_eq!(stats.per_pe[1].send, 1);
}

fn fault_of(
    progs: Vec<Program>,
    pre: &[(u32, Addr, f32)],
) -> (Machine<F32Domain>, String, FaultKind) {
    let mut m = machine(progs, pre);
    let f = m.run(&mut NoObserver).unwrap_err();
    let (msg, kind) = (f.to_string(), f.kind);
    (m, msg, kind)
}

#[test]
fn read_uninitialized() {
    let (_, msg, kind) = fault_of(
        vec![prog(0, 1, 4, "nop\nmul m0, m1 | add m2\n")],
        &[(0, 0, 1.0), (0, 1, 1.0)],
    );
    assert_eq!(kind, FaultKind::ReadUninitialized { addr: 2 });
    assert_eq!(
        msg,
        "PE 0, cycle 1 (bundle 1: mul m0, m1 | add m2): read of uninitialized word m2"
    );
}

#[test]
fn operand_out_of_range() {
    let (_, msg, kind) = fault_of(vec![prog(0, 1, 4, "exp m4, 1.0\n")], &[]);
    assert_eq!(kind, FaultKind::AddrOutOfRange { addr: 4 });
    assert_eq!(
        msg,
        "PE 0, cycle 0 (bundle 0: exp m4, 1.0): address m4 is out of range"
    );
}

#[test]
fn destination_out_of_range() {
    let (_, msg, _) = fault_of(vec![prog(0, 1, 4, "div m0, m0 -> m9\n")], &[(0, 0, 1.0)]);
    assert_eq!(
        msg,
        "PE 0, cycle 0 (bundle 0: div m0, m0 -> m9): address m9 is out of range"
    );
}

#[test]
fn send_destination_is_checked_against_the_receiver() {
    // m8 exists on the sender but not on the smaller receiver.
    let (m, msg, kind) = fault_of(
        vec![
            prog(
                0,
                2,
                16,
                "nop | nop | send m0 -> m3\nnop | nop | send m0 -> m8\n",
            ),
            prog(1, 2, 4, ""),
        ],
        &[(0, 0, 1.0)],
    );
    assert_eq!(kind, FaultKind::AddrOutOfRange { addr: 8 });
    assert_eq!(
        msg,
        "PE 0, cycle 1 (bundle 1: nop | nop | send m0 -> m8): address m8 is out of range"
    );
    assert_eq!(m.read(1, 3), Some(&1.0));
    assert_eq!(m.cycle(), 1);
}

#[test]
fn local_write_conflict() {
    let (_, msg, kind) = fault_of(
        vec![prog(0, 1, 4, "mul m0, m0 -> m1 | add 0 -> m1\n")],
        &[(0, 0, 1.0)],
    );
    assert_eq!(kind, FaultKind::WriteConflict { addr: 1 });
    assert_eq!(
        msg,
        "PE 0, cycle 0 (bundle 0: mul m0, m0 -> m1 | add 0 -> m1): two writes to m1 in one cycle"
    );
}

#[test]
fn ring_write_conflict_is_blamed_on_the_receiver() {
    let (m, msg, kind) = fault_of(
        vec![
            prog(0, 2, 4, "nop | nop | send m0 -> m2\n"),
            prog(1, 2, 4, "mul m0, m0 -> m2\n"),
        ],
        &[(0, 0, 1.0), (1, 0, 3.0)],
    );
    assert_eq!(kind, FaultKind::WriteConflict { addr: 2 });
    assert_eq!(
        msg,
        "PE 1, cycle 0 (bundle 0: mul m0, m0 -> m2): two writes to m2 in one cycle"
    );
    // The faulting cycle committed nothing.
    assert_eq!(m.read(1, 2), None);
}

#[test]
fn acc_without_op() {
    let (_, msg, kind) = fault_of(vec![prog(0, 1, 4, "nop | add 0 -> m1\n")], &[]);
    assert_eq!(kind, FaultKind::AccWithoutOp);
    assert_eq!(
        msg,
        "PE 0, cycle 0 (bundle 0: nop | add 0 -> m1): acc slot used without an op (the acc adds the op result)"
    );
}

#[test]
fn send_acc_without_acc() {
    let (_, msg, kind) = fault_of(
        vec![prog(0, 1, 4, "mul m0, m0 | nop | send acc -> m1\n")],
        &[(0, 0, 1.0)],
    );
    assert_eq!(kind, FaultKind::SendAccWithoutAcc);
    assert_eq!(
        msg,
        "PE 0, cycle 0 (bundle 0: mul m0, m0 | nop | send acc -> m1): send acc without an acc in the same bundle"
    );
}

#[test]
fn a_fault_stops_the_machine_for_good() {
    let mut m = machine(
        vec![prog(
            0,
            1,
            4,
            "mul m0, m0 -> m1\nmul m3, m0\nmul m0, m0 -> m2\n",
        )],
        &[(0, 0, 2.0)],
    );
    assert!(m.step(&mut NoObserver).unwrap());
    let f = m.step(&mut NoObserver).unwrap_err();
    assert_eq!(f.cycle, 1);
    assert_eq!(f.bundle_index, 1);
    assert_eq!(f.bundle.op, Op::mul(3, 0, None));
    assert_eq!(m.step(&mut NoObserver).unwrap_err(), f);
    assert_eq!(m.fault(), Some(&f));
    assert_eq!(m.read(0, 1), Some(&4.0));
    assert_eq!(m.read(0, 2), None);
    assert_eq!(m.preload(0, 3, 1.0), Err(LoadError::AlreadyStarted));
    let RunStats { cycles, per_pe } = m.stats();
    assert_eq!((cycles, per_pe[0].count(OpKind::Mul)), (1, 1));
}

#[test]
fn loading_rules() {
    let p = |pe, pes| prog(pe, pes, 4, "nop\n");
    let new = |ps: Vec<Program>| Machine::new(F32Domain, ps).err();
    assert_eq!(new(vec![]), Some(LoadError::NoPrograms));
    assert_eq!(
        new(vec![p(0, 2), p(1, 3)]),
        Some(LoadError::PesMismatch {
            pe: 1,
            pes: 3,
            expected: 2
        })
    );
    assert_eq!(
        new(vec![p(2, 2)]),
        Some(LoadError::PeOutOfRange { pe: 2, pes: 2 })
    );
    assert_eq!(
        new(vec![p(1, 2), p(1, 2)]),
        Some(LoadError::DuplicatePe { pe: 1 })
    );
    assert_eq!(
        new(vec![p(1, 3), p(0, 3)]),
        Some(LoadError::MissingPe { pe: 2 })
    );
    assert_eq!(
        new(vec![p(2, 3), p(0, 3)]),
        Some(LoadError::MissingPe { pe: 1 })
    );
    assert_eq!(
        new(vec![p(0, 0)]),
        Some(LoadError::PeOutOfRange { pe: 0, pes: 0 })
    );
    assert_eq!(
        new(vec![p(0, u32::MAX)]),
        Some(LoadError::MissingPe { pe: 1 })
    );

    let mut m = Machine::new(F32Domain, vec![p(1, 2), p(0, 2)]).unwrap();
    assert_eq!(m.pes(), 2);
    assert_eq!(
        m.preload(0, 4, 1.0),
        Err(LoadError::AddrOutOfRange {
            pe: 0,
            addr: 4,
            mem_words: 4
        })
    );
    assert_eq!(
        m.preload(2, 0, 1.0),
        Err(LoadError::NoSuchPe { pe: 2, pes: 2 })
    );
    assert_eq!(
        m.preload(0, 4, 1.0).unwrap_err().to_string(),
        "preload to m4 of PE 0, which has 4 words"
    );
    m.preload(1, 3, 1.0).unwrap();
}

#[test]
fn empty_programs_run_zero_cycles() {
    let mut m = machine(vec![prog(0, 1, 0, "")], &[]);
    let stats = m.run(&mut NoObserver).unwrap();
    assert_eq!(stats.cycles, 0);
    assert_eq!(stats.utilization(), 0.0);
    assert_eq!(Bundle::NOP.to_string(), "nop");
}

/// `max` and `expd` as docs/isa.md defines them: a shifted exponential stays finite where the
/// plain one overflows, and the maximum takes the first operand on ties and skips a NaN.
#[test]
fn max_and_shifted_exp() {
    let p = parse(
        ".format 2\n.pe 0\n.pes 1\n.mem 8\n\
         max m0, m1 -> m2\n\
         expd m0, m2, 0.5 -> m3 | add 0 -> m4\n\
         expd m1, m2, 0.5 | add m4 -> m4\n\
         exp m0, 0.5 -> m5\n\
         max m6, m0 -> m7\n",
    )
    .unwrap();
    // Scores far beyond exp's f32 range.
    let mut m = machine(vec![p], &[(0, 0, 400.0), (0, 1, 398.0), (0, 6, f32::NAN)]);
    let stats = m.run(&mut NoObserver).unwrap();
    assert_eq!(m.read(0, 2), Some(&400.0));
    assert_eq!(m.read(0, 3), Some(&1.0));
    let want = 1.0 + (-1.0f64).exp();
    assert!((f64::from(*m.read(0, 4).unwrap()) - want).abs() < 1e-6);
    assert_eq!(m.read(0, 5), Some(&f32::INFINITY));
    assert_eq!(m.read(0, 7), Some(&400.0));
    assert_eq!(
        (
            stats.per_pe[0].count(OpKind::Max),
            stats.per_pe[0].count(OpKind::Expd)
        ),
        (2, 2)
    );
    assert_eq!(isa::f32_max(-0.0, 0.0).to_bits(), (-0.0f32).to_bits());
    assert_eq!(isa::f32_max(1.0, f32::NAN), 1.0);
}
