//! Realistic layer shapes, each compiled twice: with `softmax = plain` (the paper's formulation:
//! cycles, lower bound, cycles/LB, the best paper algorithm where one applies; lower bounds are
//! those of the per-weight formulation whatever schedule was kept) and with the default
//! `softmax = safe` (cycles, its own lower bound, and cycles against the aim `plain LB + extra
//! max operations / m`, the chosen dataflow, memory per PE, compile time, output size and the
//! largest PE's binary program, as `attnc compile` writes them: rerolled where that is smaller).
//!
//! Run: `cargo bench --bench shapes` (add `-- --quick` for the n = 64 rows only, or `-- --n N`
//! for one sequence length).

use compiler::passes::select::Choice;
use std::time::Instant;

/// Layers above this many necessary operations are left out: their programs run to hundreds of
/// megabytes and the table is about ratios, which the smaller shapes already show.
const MAX_OPS: u64 = 6_000_000;

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    // `-- --n N` runs one sequence length only (to split a long run over several processes).
    let args: Vec<String> = std::env::args().collect();
    let only: Option<u32> = args
        .iter()
        .position(|a| a == "--n")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok());
    let one;
    let ns: &[u32] = if let Some(n) = only {
        one = [n];
        &one
    } else if quick {
        &[64]
    } else {
        &[64, 128, 256]
    };
    println!("| n | d | m | heads | scheme | plain cycles | plain LB | plain/LB | best paper algo | safe cycles | safe LB | safe / (plain LB + max ops/m) | chosen (safe) | max mem words/PE | compile s | output MB | max pe.bin KiB |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut worst_safe: f64 = 0.0;
    let mut log_sum = 0.0;
    let mut count = 0;
    let mut worst_plenty: f64 = 0.0;
    let mut skipped = 0;
    for &n in ns {
        for d in [32u32, 64, 128] {
            for m in [4u32, 6, 8, 12] {
                for heads in [1u32, 4] {
                    for (scheme, extra) in [
                        ("separate", ""),
                        ("shared", "qkv = shared;"),
                        ("causal", "mask = causal;"),
                    ] {
                        let src = format!(
                            "layer t {{ tokens = {n}; dim = {d}; heads = {heads}; {extra} }}"
                        );
                        let parsed = lang::parse(0, &src);
                        let layer = &parsed.layers[0];
                        let plain_layer = lang::Layer {
                            softmax: lang::Softmax::Plain,
                            ..layer.clone()
                        };
                        let causal = scheme == "causal";
                        let (n64, d64, h64) = (u64::from(n), u64::from(d), u64::from(heads));
                        let w = if causal {
                            n64 * (n64 + 1) / 2
                        } else {
                            n64 * n64
                        };
                        let distinct = if scheme == "shared" {
                            n64 * (n64 + 1) / 2
                        } else {
                            w
                        };
                        if h64 * (d64 * distinct + 2 * w + d64 * w) > MAX_OPS {
                            skipped += 1;
                            continue;
                        }
                        let opts = compiler::Options {
                            pes: m,
                            schedule: Choice::Auto,
                            dump_after: None,
                            mem_limit: None,
                            reroll: true,
                        };
                        let plain = compiler::compile(&plain_layer, &opts).expect("compiles");
                        let t = Instant::now();
                        let c = compiler::compile(layer, &opts).expect("compiles");
                        let secs = t.elapsed().as_secs_f64();
                        // What `attnc compile` writes: the rerolled loop programs where they are
                        // smaller, else the flat ones.
                        let (bins, texts): (Vec<usize>, Vec<usize>) = if c.loops.is_empty() {
                            c.programs
                                .iter()
                                .map(|p| {
                                    (isa::encode(p).map_or(0, |b| b.len()), p.to_string().len())
                                })
                                .unzip()
                        } else {
                            c.loops
                                .iter()
                                .map(|p| {
                                    (
                                        isa::encode_looped(p).map_or(0, |b| b.len()),
                                        p.to_text().len(),
                                    )
                                })
                                .unzip()
                        };
                        let max_bin = bins.iter().copied().max().unwrap_or(0);
                        let bytes: usize = bins.iter().sum::<usize>()
                            + texts.iter().sum::<usize>()
                            + c.manifest.to_json().unwrap().len();
                        let man = &c.manifest;
                        let pm = &plain.manifest;
                        // Both lower bounds of the per-weight formulation, whatever was chosen: a
                        // stream manifest states its own (deferred) one, which the table's
                        // columns do not mean.
                        let per_weight = |softmax| {
                            runtime::layer::Shape {
                                heads,
                                tokens: n,
                                dim: d,
                                shared: scheme == "shared",
                                causal,
                                softmax,
                            }
                            .lower_bound_as(m, runtime::layer::Normalisation::PerWeight)
                            .expect("fits")
                        };
                        let plain_lb = per_weight(runtime::layer::Softmax::Plain);
                        let safe_lb = per_weight(runtime::layer::Softmax::Safe);
                        let ratio = pm.cycles as f64 / plain_lb as f64;
                        let aim = plain_lb as f64 + man.ops.phase2_max as f64 / f64::from(m);
                        let safe_ratio = man.cycles as f64 / aim;
                        log_sum += ratio.ln();
                        count += 1;
                        if n >= 4 * m {
                            worst_plenty = worst_plenty.max(ratio);
                            worst_safe = worst_safe.max(safe_ratio);
                        }
                        let paper = pm
                            .selection
                            .candidates
                            .iter()
                            .filter(|c| {
                                !["schedule-rows", "schedule-stream"].contains(&c.schedule.as_str())
                            })
                            .map(|c| c.cycles)
                            .min()
                            .map_or("n/a".to_string(), |c| c.to_string());
                        println!(
                            "| {n} | {d} | {m} | {heads} | {scheme} | {} | {} | {ratio:.4} | {paper} | {} | {} | {safe_ratio:.4} | {} | {} | {secs:.2} | {:.1} | {:.1} |",
                            pm.cycles,
                            plain_lb,
                            man.cycles,
                            safe_lb,
                            man.schedule,
                            man.mem_words.iter().max().unwrap_or(&0),
                            bytes as f64 / 1e6,
                            max_bin as f64 / 1024.0
                        );
                    }
                }
            }
        }
    }
    println!();
    println!(
        "{count} shapes; plain: geometric mean of cycles/LB {:.4}, worst cycles/LB with n >= 4m {worst_plenty:.4}; safe: worst cycles / (plain LB + max ops/m) with n >= 4m {worst_safe:.4}; {skipped} shapes above {MAX_OPS} operations left out",
        (log_sum / f64::from(count)).exp()
    );
}
