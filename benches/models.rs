//! Real layers at real scale, through what `attnc compile` and `attnc run` do:
//! `cargo bench --bench models` prints the README table.
//!
//! Each layer is compiled in a child process (the bench re-runs itself) so that the peak RSS
//! reported is that layer's compile alone. `LB` is the manifest's: the necessary operations of the
//! formulation the programs use (safe softmax, deferred normalisation) over m; the per-weight
//! column compares with the lower bound of the unrolled schedules' formulation. Layers marked
//! to run are loaded back from their files and run natively against the f64 reference.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::Command;
use std::time::Instant;

use isa::encode_looped;
use std::collections::BTreeMap;

struct Model {
    name: &'static str,
    n: u32,
    d: u32,
    h: u32,
    causal: bool,
    m: u32,
    run: bool,
}

const MODELS: [Model; 9] = [
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
        run: true,
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
    // Tokens that do not divide the ring: the last chunk (or block) is padded.
    Model {
        name: "GPT-2 small, 1000 tokens",
        n: 1000,
        d: 64,
        h: 12,
        causal: true,
        m: 16,
        run: true,
    },
    Model {
        name: "BERT-base, 500 tokens",
        n: 500,
        d: 64,
        h: 12,
        causal: false,
        m: 8,
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

fn one(i: usize) {
    let md = &MODELS[i];
    let src = format!(
        "layer l {{ tokens = {}; dim = {}; heads = {}; mask = {}; }}",
        md.n,
        md.d,
        md.h,
        if md.causal { "causal" } else { "none" }
    );
    let parsed = lang::parse(0, &src);
    let layer = &parsed.layers[0];
    // What `attnc compile` does: compile (auto picks the stream schedule for these sizes) and
    // encode every file it writes.
    let t = Instant::now();
    let c = compiler::compile(
        layer,
        &compiler::Options {
            pes: md.m,
            ..Default::default()
        },
    )
    .expect("compiles");
    let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for p in &c.loops {
        files.insert(
            format!("pe{}.bin", p.pe),
            encode_looped(p).expect("encodes"),
        );
        files.insert(format!("pe{}.s", p.pe), p.to_text().into_bytes());
    }
    let manifest_json = c.manifest.to_json().unwrap();
    files.insert("manifest.json".into(), manifest_json.clone().into_bytes());
    let compile_s = t.elapsed().as_secs_f64();
    let rss = peak_rss_mb();
    let m = &c.manifest;
    let max_bin = c
        .loops
        .iter()
        .map(|p| files[&format!("pe{}.bin", p.pe)].len())
        .max()
        .unwrap_or(0);
    let mem = m.mem_words.iter().copied().max().unwrap_or(0);
    let share = 4 * u64::from(md.h) * u64::from(md.n / md.m) * u64::from(md.d);
    let mem_bound = 1.05 * share as f64 + 4096.0;
    // What `attnc verify` does: loop programs are proved through their flattened form up to a
    // limit these layers exceed, above it without unrolling where that proof applies.
    let bundles: u64 = c.loops.iter().map(|p| p.cycles()).sum();
    let verify = if bundles <= attnc::rundir::MAX_FLATTENED_BUNDLES {
        let t = Instant::now();
        let loaded = attnc::rundir::load(&files).expect("loads");
        let (programs, manifest) = loaded.flat().expect("small enough");
        let ok = verifier::verify(&programs, &manifest).is_ok();
        format!(
            "{} in {:.1} s",
            if ok { "proved" } else { "NOT proved" },
            t.elapsed().as_secs_f64()
        )
    } else {
        // Above the flattening limit `attnc verify` proves without unrolling where it can.
        let t = Instant::now();
        let loaded = attnc::rundir::load(&files).expect("loads");
        let p = verifier::compact::prove_loops(
            &loaded.loops,
            &loaded.manifest,
            &verifier::Options::default(),
        );
        if p.proved() {
            format!(
                "proved without unrolling in {:.1} s",
                t.elapsed().as_secs_f64()
            )
        } else {
            format!("not proved ({bundles} bundles to flatten; checked without unrolling)")
        }
    };
    let mut run = "not run".to_string();
    if md.run {
        // What `attnc run` does: load the files back, run natively, compare.
        let t = Instant::now();
        let loaded = attnc::rundir::load(&files).expect("loads");
        let inputs = runtime::exec::random_inputs(&loaded.manifest, 7);
        let (out, bulk) =
            runtime::exec::execute_loops(loaded.loops, &loaded.manifest, &inputs).expect("runs");
        let run_s = t.elapsed().as_secs_f64();
        let want = runtime::exec::reference_output(&loaded.manifest, &inputs).expect("reference");
        let cmp = attnc::rundir::compare(&out.outputs["y"], &want, 1e-4, 1e-5);
        let ops: u64 = out.stats.per_pe.iter().map(|s| s.total_ops()).sum();
        assert_eq!(out.stats.cycles, m.cycles);
        run = format!(
            "{run_s:.1} s, {:.2e} PE-ops/s, {:.0}% bulk, max abs err {:.1e}{}",
            ops as f64 / run_s,
            100.0 * bulk as f64 / out.stats.cycles as f64,
            cmp.max_abs_err,
            if cmp.pass() { "" } else { " FAIL" }
        );
    }
    println!(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {:.4} | {:.4} | {} | {} | {} ({:.2}× bound) | {:.3} | {:.0} | {} | {} |",
        md.name,
        md.n,
        md.d,
        md.h,
        if md.causal { "causal" } else { "none" },
        md.m,
        m.cycles,
        m.lower_bound,
        m.cycles as f64 / m.lower_bound as f64,
        m.cycles as f64 / plain_lb(md) as f64,
        max_bin,
        manifest_json.len(),
        mem,
        f64::from(mem) / mem_bound,
        compile_s,
        rss,
        verify,
        run
    );
}

/// The lower bound of the per-weight formulation the unrolled schedules use, for comparison.
fn plain_lb(md: &Model) -> u64 {
    runtime::layer::Shape {
        heads: md.h,
        tokens: md.n,
        dim: md.d,
        shared: false,
        causal: md.causal,
        softmax: runtime::layer::Softmax::Safe,
    }
    .lower_bound(md.m)
    .unwrap_or(u64::MAX)
}

fn main() {
    attnc::alloc::keep_freed_pages();
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--one") {
        one(args[i + 1].parse().expect("index"));
        return;
    }
    println!("| layer | n | d | heads | mask | m | cycles | LB | cycles/LB | cycles/LB (per-weight) | max pe bytes | manifest bytes | mem words/PE | compile s | peak RSS MB | verify | run |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
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
