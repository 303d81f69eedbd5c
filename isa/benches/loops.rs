//! Speed of the native loop interpreter: `cargo bench -p isa --bench loops`.
//!
//! Each PE computes the scores of its `rows` query rows against `keys` key
//! rows of length `len` (the inner loops of attention), sending each row's
//! last score to the next PE. Prints PE-operations per second for the
//! cycle-by-cycle path and the bulk path, which compute identical results.

use std::time::Instant;

use isa::{
    Acc, AccSrc, Bundle, F32Domain, Field, LBundle, Loop, LoopMachine, LoopProgram, NoObserver,
    Node, Op, Term, Xfer, XferSrc,
};

fn program(pe: u32, pes: u32, rows: u32, keys: u32, len: u32) -> LoopProgram {
    let q = 0;
    let k = rows * len;
    let s = k + keys * len;
    let t = |field, level, stride| Term {
        field,
        level,
        stride,
        wrap: 0,
    };
    let mac = LBundle {
        bundle: Bundle {
            op: Op::mul(q, k, None),
            acc: Acc::Add {
                src: AccSrc::Mem(s),
                dst: Some(s),
            },
            xfer: Xfer::Nop,
        },
        terms: vec![
            t(Field::OpA, 0, len as i32),
            t(Field::OpA, 2, 1),
            t(Field::OpB, 1, len as i32),
            t(Field::OpB, 2, 1),
            t(Field::AccSrc, 0, 1),
            t(Field::AccDst, 0, 1),
        ],
        preds: vec![],
    };
    let send = LBundle {
        bundle: Bundle {
            op: Op::Nop,
            acc: Acc::Nop,
            xfer: Xfer::Send {
                src: XferSrc::Mem(s),
                dst: s + rows,
            },
        },
        terms: vec![t(Field::XferSrc, 0, 1), t(Field::XferDst, 0, 1)],
        preds: vec![],
    };
    LoopProgram {
        pe,
        pes,
        mem_words: s + 2 * rows,
        body: vec![Node::Loop(Loop::new(
            rows,
            vec![
                Node::Loop(Loop::new(
                    keys,
                    vec![Node::Loop(Loop::new(len, vec![Node::Bundle(mac)]))],
                )),
                Node::Bundle(send),
            ],
        ))],
    }
}

fn machine(pes: u32, rows: u32, keys: u32, len: u32) -> LoopMachine<F32Domain> {
    let progs = (0..pes)
        .map(|pe| program(pe, pes, rows, keys, len))
        .collect();
    let mut m = LoopMachine::new(F32Domain, progs).unwrap();
    for pe in 0..pes {
        for a in 0..(rows + keys) * len {
            m.preload(pe, a, 1.0 + (a % 97) as f32 * 1e-3).unwrap();
        }
        for r in 0..rows {
            m.preload(pe, (rows + keys) * len + r, 0.0).unwrap();
        }
    }
    m
}

fn main() {
    for (pes, rows, keys, len) in [
        (16u32, 64u32, 1024u32, 64u32),
        (64, 16, 1024, 128),
        (8, 64, 512, 128),
    ] {
        let mut fast = machine(pes, rows, keys, len);
        let t = Instant::now();
        let stats = fast.run_fast().unwrap();
        let dt = t.elapsed().as_secs_f64();
        let ops: u64 = stats.per_pe.iter().map(|s| s.busy).sum();
        println!(
            "bulk:  {pes} PEs x {} cycles, {ops} PE-ops in {dt:.3} s = {:.3e} PE-ops/s ({} of {} cycles in bulk)",
            stats.cycles,
            ops as f64 / dt,
            fast.bulk_cycles(),
            stats.cycles
        );
        if std::env::var_os("LOOPS_BULK_ONLY").is_some() {
            continue;
        }
        // The cycle-by-cycle path on a prefix (it is far slower).
        let mut slow = machine(pes, rows, keys, len);
        let steps = 200_000u64.min(stats.cycles);
        let t = Instant::now();
        for _ in 0..steps {
            slow.step(&mut NoObserver).unwrap();
        }
        let dt = t.elapsed().as_secs_f64();
        let ops: u64 = slow.stats().per_pe.iter().map(|s| s.busy).sum();
        println!(
            "step:  {pes} PEs x {steps} cycles, {:.3e} PE-ops/s",
            ops as f64 / dt
        );
        let mut slow = machine(pes, rows, keys, len);
        let _ = slow.run(&mut NoObserver);
        let same = (0..pes).all(|pe| {
            (0..rows).all(|r| {
                let a = (rows + keys) * len + rows + r;
                fast.read(pe, a).map(|v| v.to_bits()) == slow.read(pe, a).map(|v| v.to_bits())
            })
        });
        println!("       bulk and step results identical: {same}");
    }
}
