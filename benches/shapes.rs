//! Realistic layer shapes, each compiled twice: with `softmax = plain` (the paper's formulation:
//! cycles, lower bound, cycles/LB, the best paper algorithm where one applies; lower bounds are
//! those of the per-weight formulation whatever schedule was kept) and with the default
//! `softmax = safe` (cycles, its own lower bound, and cycles against the aim `plain LB + extra
//! max operations / m`, the chosen dataflow, memory per PE, compile time, output size and the
//! largest PE's binary program, as `attnc compile` writes them: rerolled where that is smaller).
//!
//! Run: `cargo bench --bench shapes` (add `-- --quick` for the n = 64 rows only, or `-- --n N`
//! for one sequence length; `--d D`, `--m M`, `--heads H` and `--scheme separate|shared|causal`
//! narrow it likewise, and the summary then counts that slice only). `-- --safe-only` compiles the default formulation only, and then
//! also the shapes above the unrolling limit (only the stream is built for those, in
//! milliseconds). `-- --against FILE` compares the safe cycles with those of a table this bench
//! printed before (any markdown file holding one, such as the README; where several list a
//! shape, the first) and lists every shape that got slower. Shapes are spread over every core;
//! compile seconds are per shape.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod common;

use compiler::passes::select::Choice;
use std::collections::BTreeMap;
use std::time::Instant;

/// Layers above this many necessary operations are left out of the two-formulation table:
/// their unrolled candidates are not built and the plain formulation has no other schedule.
const MAX_OPS: u64 = 6_000_000;

/// What a program file may take, and a compile may last, for a shape to count as compact.
const COMPACT_BYTES: usize = 16 * 1024;
const COMPACT_SECS: f64 = 1.0;

const SCHEMES: [(&str, &str); 3] = [
    ("separate", ""),
    ("shared", "qkv = shared;"),
    ("causal", "mask = causal;"),
];

#[derive(Clone, Copy)]
struct Job {
    n: u32,
    d: u32,
    m: u32,
    heads: u32,
    scheme: usize,
}

impl Job {
    fn name(&self) -> &'static str {
        SCHEMES[self.scheme].0
    }

    fn key(&self) -> String {
        format!(
            "n={} d={} m={} heads={} {}",
            self.n,
            self.d,
            self.m,
            self.heads,
            self.name()
        )
    }

    /// Necessary operations of the per-weight formulation (the unrolling limit's measure).
    fn ops(&self) -> u64 {
        let (n, d, h) = (u64::from(self.n), u64::from(self.d), u64::from(self.heads));
        let w = if self.name() == "causal" {
            n * (n + 1) / 2
        } else {
            n * n
        };
        let distinct = if self.name() == "shared" {
            n * (n + 1) / 2
        } else {
            w
        };
        h * (d * distinct + 2 * w + d * w)
    }

    fn per_weight_lb(&self, softmax: runtime::layer::Softmax) -> u64 {
        runtime::layer::Shape {
            heads: self.heads,
            tokens: self.n,
            dim: self.d,
            shared: self.name() == "shared",
            causal: self.name() == "causal",
            softmax,
        }
        .lower_bound_as(self.m, runtime::layer::Normalisation::PerWeight)
        .expect("fits")
    }
}

/// One shape's measurements.
struct Row {
    /// Plain cycles and the best paper algorithm's (None in `--safe-only`).
    plain: Option<(u64, String)>,
    cycles: u64,
    own_lb: u64,
    phase2_max: u64,
    schedule: String,
    mem_words: u32,
    secs: f64,
    bytes: usize,
    max_bin: usize,
}

fn compile(job: &Job, softmax: lang::Softmax) -> compiler::Compiled {
    let src = format!(
        "layer t {{ tokens = {}; dim = {}; heads = {}; {} }}",
        job.n, job.d, job.heads, SCHEMES[job.scheme].1
    );
    let parsed = lang::parse(0, &src);
    let layer = lang::Layer {
        softmax,
        ..parsed.layers[0].clone()
    };
    let opts = compiler::Options {
        pes: job.m,
        schedule: Choice::Auto,
        dump_after: None,
        mem_limit: None,
        reroll: true,
        single_placement: false,
    };
    compiler::compile(&layer, &opts).expect("compiles")
}

fn measure(job: &Job, plain: bool) -> Row {
    let plain = plain.then(|| {
        let pm = compile(job, lang::Softmax::Plain).manifest;
        let paper = pm
            .selection
            .candidates
            .iter()
            .filter(|c| !["schedule-rows", "schedule-stream"].contains(&c.schedule.as_str()))
            .map(|c| c.cycles)
            .min()
            .map_or("n/a".to_string(), |c| c.to_string());
        (pm.cycles, paper)
    });
    let t = Instant::now();
    let c = compile(job, lang::Softmax::Safe);
    let secs = t.elapsed().as_secs_f64();
    // What `attnc compile` writes: the rerolled loop programs where they are smaller, else the
    // flat ones.
    let (bins, texts): (Vec<usize>, Vec<usize>) = if c.loops.is_empty() {
        c.programs
            .iter()
            .map(|p| (isa::encode(p).map_or(0, |b| b.len()), p.to_string().len()))
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
    let man = &c.manifest;
    Row {
        plain,
        cycles: man.cycles,
        own_lb: man.lower_bound,
        phase2_max: man.ops.phase2_max,
        schedule: man.schedule.clone(),
        mem_words: man.mem_words.iter().copied().max().unwrap_or(0),
        secs,
        bytes: bins.iter().sum::<usize>()
            + texts.iter().sum::<usize>()
            + man.to_json().map_or(0, |j| j.len()),
        max_bin: bins.iter().copied().max().unwrap_or(0),
    }
}

/// Safe cycles per shape from a markdown table this bench printed (either form).
fn previous(path: &str) -> Result<BTreeMap<String, u64>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("--against {path}: {e}"))?;
    let mut out = BTreeMap::new();
    let mut col = None;
    for line in text.lines() {
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        if cells.first() == Some(&"n") && cells.get(4) == Some(&"scheme") {
            col = cells
                .iter()
                .position(|c| *c == "safe cycles")
                .or_else(|| cells.iter().position(|c| *c == "cycles"));
            continue;
        }
        let Some(k) = col else { continue };
        let nums: Option<Vec<u32>> = cells.iter().take(4).map(|c| c.parse().ok()).collect();
        let (Some(nums), Some(scheme), Some(cycles)) = (
            nums,
            cells.get(4),
            cells.get(k).and_then(|c| c.parse::<u64>().ok()),
        ) else {
            continue;
        };
        // The first table that lists a shape wins (the README's newest comes first).
        if nums.len() == 4 {
            out.entry(format!(
                "n={} d={} m={} heads={} {scheme}",
                nums[0], nums[1], nums[2], nums[3]
            ))
            .or_insert(cycles);
        }
    }
    Ok(out)
}

fn main() {
    attnc::alloc::keep_freed_pages();
    let start = Instant::now();
    let args: Vec<String> = std::env::args().collect();
    let flag = |f: &str| args.iter().any(|a| a == f);
    let value = |f: &str| {
        args.iter()
            .position(|a| a == f)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let safe_only = flag("--safe-only");
    // Read before the two-minute run, so that a wrong path is said at once.
    let against = value("--against").map(|path| match previous(&path) {
        Ok(table) => (path, table),
        Err(why) => {
            eprintln!("shapes: {why}");
            std::process::exit(2);
        }
    });
    let ns: Vec<u32> = match value("--n").and_then(|v| v.parse().ok()) {
        Some(n) => vec![n],
        None if flag("--quick") => vec![64],
        None => vec![64, 128, 256],
    };
    // A slice of the table (one ring size, dimension or scheme) is what a change to one schedule
    // needs measured; a value outside the table's is refused rather than measuring nothing.
    let pick = |f: &str, all: &[u32]| -> Vec<u32> {
        match value(f) {
            None => all.to_vec(),
            Some(v) => match v.parse::<u32>() {
                Ok(x) if all.contains(&x) => vec![x],
                _ => {
                    eprintln!("shapes: {f} takes one of {all:?}, not {v}");
                    std::process::exit(2);
                }
            },
        }
    };
    let ds = pick("--d", &[32, 64, 128]);
    let ms = pick("--m", &[4, 6, 8, 12]);
    let hs = pick("--heads", &[1, 4]);
    let schemes: Vec<usize> = match value("--scheme") {
        None => (0..SCHEMES.len()).collect(),
        Some(v) => match SCHEMES.iter().position(|s| s.0 == v) {
            Some(i) => vec![i],
            None => {
                eprintln!("shapes: --scheme takes separate, shared or causal, not {v}");
                std::process::exit(2);
            }
        },
    };
    let mut jobs = Vec::new();
    let mut skipped = 0;
    for &n in &ns {
        for &d in &ds {
            for &m in &ms {
                for &heads in &hs {
                    for &scheme in &schemes {
                        let job = Job {
                            n,
                            d,
                            m,
                            heads,
                            scheme,
                        };
                        if !safe_only && job.ops() > MAX_OPS {
                            skipped += 1;
                            continue;
                        }
                        jobs.push(job);
                    }
                }
            }
        }
    }
    let rows = common::par_map(&jobs, |job| measure(job, !safe_only));
    if safe_only {
        println!("| n | d | m | heads | scheme | cycles | LB | cycles/LB | per-weight LB | cycles / per-weight LB | chosen | max mem words/PE | compile s | output MB | max pe.bin KiB |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    } else {
        println!("| n | d | m | heads | scheme | plain cycles | plain LB | plain/LB | best paper algo | safe cycles | safe LB | safe / (plain LB + max ops/m) | chosen (safe) | max mem words/PE | compile s | output MB | max pe.bin KiB |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    }
    let (mut worst_safe, mut log_sum, mut worst_plenty) = (0f64, 0f64, 0f64);
    let mut chosen: BTreeMap<String, u32> = BTreeMap::new();
    let (mut plenty, mut compact) = (0, 0);
    let mut loose: BTreeMap<(&str, String), Vec<String>> = BTreeMap::new();
    for (job, r) in jobs.iter().zip(&rows) {
        let Job { n, d, m, heads, .. } = *job;
        let scheme = job.name();
        let safe_lb = job.per_weight_lb(runtime::layer::Softmax::Safe);
        *chosen.entry(r.schedule.clone()).or_default() += 1;
        if n >= 4 * m {
            plenty += 1;
            if r.max_bin <= COMPACT_BYTES && r.secs < COMPACT_SECS {
                compact += 1;
            } else {
                loose
                    .entry((scheme, r.schedule.clone()))
                    .or_default()
                    .push(format!("{n}/{d}/{m}/{heads}"));
            }
        }
        let tail = format!(
            "{} | {} | {:.2} | {:.1} | {:.1} |",
            r.schedule,
            r.mem_words,
            r.secs,
            r.bytes as f64 / 1e6,
            r.max_bin as f64 / 1024.0
        );
        match &r.plain {
            None => println!(
                "| {n} | {d} | {m} | {heads} | {scheme} | {} | {} | {:.4} | {safe_lb} | {:.4} | {tail}",
                r.cycles,
                r.own_lb,
                r.cycles as f64 / r.own_lb as f64,
                r.cycles as f64 / safe_lb as f64,
            ),
            Some((plain_cycles, paper)) => {
                let plain_lb = job.per_weight_lb(runtime::layer::Softmax::Plain);
                let ratio = *plain_cycles as f64 / plain_lb as f64;
                let aim = plain_lb as f64 + r.phase2_max as f64 / f64::from(m);
                let safe_ratio = r.cycles as f64 / aim;
                log_sum += ratio.ln();
                if n >= 4 * m {
                    worst_plenty = worst_plenty.max(ratio);
                    worst_safe = worst_safe.max(safe_ratio);
                }
                println!(
                    "| {n} | {d} | {m} | {heads} | {scheme} | {plain_cycles} | {plain_lb} | {ratio:.4} | {paper} | {} | {safe_lb} | {safe_ratio:.4} | {tail}",
                    r.cycles
                );
            }
        }
    }
    println!();
    let count = jobs.len();
    if safe_only {
        println!("{count} shapes (softmax = safe, shapes above {MAX_OPS} operations included)");
    } else {
        println!(
            "{count} shapes; plain: geometric mean of cycles/LB {:.4}, worst cycles/LB with n >= 4m {worst_plenty:.4}; safe: worst cycles / (plain LB + max ops/m) with n >= 4m {worst_safe:.4}; {skipped} shapes above {MAX_OPS} operations left out",
            (log_sum / count as f64).exp()
        );
    }
    let kept: Vec<String> = chosen.iter().map(|(s, k)| format!("{s} {k}")).collect();
    println!("chosen (safe): {}", kept.join(", "));
    println!(
        "compact (every pe.bin <= {} KiB and compiled in under {COMPACT_SECS} s) among the {plenty} shapes with n >= 4m: {compact}",
        COMPACT_BYTES / 1024
    );
    for ((scheme, schedule), which) in &loose {
        println!(
            "  not compact: {} {scheme} kept by {schedule} (n/d/m/heads): {}",
            which.len(),
            which.join(" ")
        );
    }
    if let Some((path, before)) = against {
        let (mut faster, mut same, mut missing) = (0, 0, 0);
        let mut slower = Vec::new();
        for (job, r) in jobs.iter().zip(&rows) {
            match before.get(&job.key()) {
                None => missing += 1,
                Some(&b) if r.cycles < b => faster += 1,
                Some(&b) if r.cycles == b => same += 1,
                Some(&b) => slower.push(format!("{} {b} -> {}", job.key(), r.cycles)),
            }
        }
        println!(
            "against {path}: {faster} faster, {same} equal, {} slower, {missing} not in it",
            slower.len()
        );
        for s in &slower {
            println!("  slower: {s}");
        }
    }
    println!(
        "bench time: {:.0} s on {} threads",
        start.elapsed().as_secs_f64(),
        common::workers()
    );
}
