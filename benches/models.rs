//! Real layers at real scale through the stream schedule:
//! `cargo bench --bench models` prints the README table.
//!
//! Each layer is built in a child process (the bench re-runs itself) so that
//! the peak RSS reported is that layer's compile alone. Cycles come from the
//! loop structure; the LB columns are ceil(ops / m) for the plain necessary
//! count and for the count of the safe (online-softmax) formulation emitted.
//! Layers small enough are also run natively (bulk interpreter) against the
//! f64 reference.

use std::process::Command;
use std::time::Instant;

use compiler::passes::schedule_stream;
use compiler::problem::Problem;
use isa::{encode_looped, F32Domain, LoopMachine};
use runtime::reference::{attention, RefLayer};

struct Model {
    name: &'static str,
    n: u32,
    d: u32,
    h: u32,
    causal: bool,
    m: u32,
    run: bool,
}

const MODELS: [Model; 7] = [
    Model {
        name: "BERT-base",
        n: 512,
        d: 64,
        h: 12,
        causal: false,
        m: 8,
        run: true,
    },
    Model {
        name: "GPT-2 small",
        n: 1024,
        d: 64,
        h: 12,
        causal: true,
        m: 16,
        run: true,
    },
    Model {
        name: "GPT-2 small",
        n: 1024,
        d: 64,
        h: 12,
        causal: true,
        m: 64,
        run: false,
    },
    Model {
        name: "Llama-2-7B",
        n: 4096,
        d: 128,
        h: 32,
        causal: true,
        m: 64,
        run: false,
    },
    Model {
        name: "Llama-2-7B",
        n: 4096,
        d: 128,
        h: 32,
        causal: true,
        m: 256,
        run: false,
    },
    Model {
        name: "8k context",
        n: 8192,
        d: 128,
        h: 32,
        causal: true,
        m: 1024,
        run: false,
    },
    Model {
        name: "GPT-2 small, 1 head",
        n: 1024,
        d: 64,
        h: 1,
        causal: true,
        m: 16,
        run: true,
    },
];

fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn data(len: usize, seed: u64) -> Vec<f32> {
    // Standard-normal-ish (sum of uniforms), deterministic.
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut u = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..len)
        .map(|_| (0..4).map(|_| u()).sum::<f32>() * 1.732 - 3.464)
        .collect()
}

fn one(i: usize) {
    let md = &MODELS[i];
    let p = Problem {
        tokens: md.n,
        dim: md.d,
        heads: md.h,
        scale: 1.0 / f64::from(md.d).sqrt(),
        symmetric: false,
        shared_values: false,
        causal: md.causal,
        softmax: runtime::layer::Softmax::Safe,
    };
    let t = Instant::now();
    let st = schedule_stream::run(&p, md.m, true).expect("stream schedule applies");
    let bins: Vec<Vec<u8>> = st.programs.iter().map(encode_looped).collect();
    let compile_s = t.elapsed().as_secs_f64();
    let rss = peak_rss_mb();
    let lb_plain = p.lower_bound(md.m);
    let lb_form = st.total_ops.div_ceil(u64::from(md.m));
    let max_bin = bins.iter().map(Vec::len).max().unwrap_or(0);
    let mem = st.programs.iter().map(|p| p.mem_words).max().unwrap_or(0);
    let share = 4 * u64::from(md.h) * u64::from(md.n / md.m) * u64::from(md.d);
    let mem_bound = 1.05 * share as f64 + 4096.0;
    let mut run = "not run".to_string();
    if md.run {
        let len = (md.h * md.n * md.d) as usize;
        let (q, k, v) = (data(len, 1), data(len, 2), data(len, 3));
        let t = Instant::now();
        let mut mach = LoopMachine::new(F32Domain, st.programs.clone()).expect("load");
        for (name, x) in [("q", &q), ("k", &k), ("v", &v)] {
            let lay = st.inputs[name];
            for h in 0..md.h {
                for tok in 0..md.n {
                    for c in 0..md.d {
                        let (pe, a) = lay.locate(md.m, h, tok, c);
                        mach.preload(pe, a, x[((h * md.n + tok) * md.d + c) as usize])
                            .expect("preload");
                    }
                }
            }
        }
        let stats = mach.run_fast().expect("runs without fault");
        let run_s = t.elapsed().as_secs_f64();
        let ops: u64 = stats.per_pe.iter().map(|s| s.total_ops()).sum();
        let want = attention(
            &RefLayer {
                heads: md.h as usize,
                tokens: md.n as usize,
                dim: md.d as usize,
                scale: p.scale,
                causal: md.causal,
            },
            &q,
            &k,
            &v,
        );
        let mut err = 0f64;
        for h in 0..md.h {
            for tok in 0..md.n {
                for c in 0..md.d {
                    let (pe, a) = st.output.locate(md.m, h, tok, c);
                    let got = mach.read(pe, a).copied().unwrap_or(f32::NAN);
                    let w = want[((h * md.n + tok) * md.d + c) as usize];
                    err = err.max((f64::from(got) - w).abs());
                }
            }
        }
        assert_eq!(stats.cycles, st.cycles);
        run = format!(
            "{run_s:.1} s, {:.2e} PE-ops/s, {:.0}% bulk, max abs err {err:.1e}",
            ops as f64 / run_s,
            100.0 * mach.bulk_cycles() as f64 / stats.cycles as f64
        );
    }
    println!(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {:.4} | {:.4} | {} | {} ({:.2}× bound) | {:.3} | {:.0} | {} |",
        md.name,
        md.n,
        md.d,
        md.h,
        if md.causal { "causal" } else { "none" },
        md.m,
        st.cycles,
        lb_plain,
        st.cycles as f64 / lb_form as f64,
        st.cycles as f64 / lb_plain as f64,
        max_bin,
        mem,
        f64::from(mem) / mem_bound,
        compile_s,
        rss,
        run
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--one") {
        one(args[i + 1].parse().expect("index"));
        return;
    }
    println!("| layer | n | d | heads | mask | m | cycles | LB (plain) | cycles/LB (formulation) | cycles/LB (plain) | max pe bytes | mem words/PE | compile s | peak RSS MB | run |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let exe = std::env::current_exe().expect("own path");
    for (i, model) in MODELS.iter().enumerate() {
        let out = Command::new(&exe)
            .args(["--one", &i.to_string()])
            .output()
            .expect("child runs");
        print!("{}", String::from_utf8_lossy(&out.stdout));
        if !out.status.success() {
            println!(
                "| {} | failed: {} |",
                model.name,
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            );
        }
    }
}
