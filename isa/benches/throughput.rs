//! Interpreter speed on a large, fully busy ring: `cargo bench -p isa --bench throughput`.

use std::time::Instant;

use isa::{Acc, AccSrc, Bundle, F32Domain, Machine, NoObserver, Op, Program, Xfer, XferSrc};

fn main() {
    for (pes, len) in [(8u32, 1_000_000usize), (64, 200_000)] {
        let mem = 64u32;
        // Every slot busy every cycle: the worst case per bundle.
        let bundles: Vec<Bundle> = (0..len)
            .map(|i| {
                let i = i as u32;
                Bundle {
                    op: Op::mul(i % 32, (i + 1) % 32, Some(32 + i % 16)),
                    acc: Acc::Add {
                        src: AccSrc::Mem(63),
                        dst: Some(48 + i % 8),
                    },
                    xfer: Xfer::Send {
                        src: XferSrc::Acc,
                        dst: 63,
                    },
                }
            })
            .collect();
        let programs = (0..pes)
            .map(|pe| Program {
                pe,
                pes,
                mem_words: mem,
                bundles: bundles.clone(),
            })
            .collect();
        let mut m = Machine::new(F32Domain, programs).unwrap();
        for pe in 0..pes {
            for a in 0..32 {
                m.preload(pe, a, 1.0 + a as f32 * 1e-3).unwrap();
            }
            m.preload(pe, 63, 0.0).unwrap();
        }
        let t = Instant::now();
        let stats = m.run(&mut NoObserver).unwrap();
        let dt = t.elapsed();
        let n = u64::from(pes) * len as u64;
        println!(
            "{pes} PEs x {len} bundles: {dt:?} ({:.1} ns/bundle), utilization {}",
            dt.as_nanos() as f64 / n as f64,
            stats.utilization()
        );
    }
}
