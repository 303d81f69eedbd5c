//! Helpers shared by the end-to-end tests.

#![allow(dead_code)]

use compiler::passes::select::Choice;
use compiler::{compile, Compiled, Options};

/// Builds the DSL text of one layer, in the paper's formulation (`softmax = plain`), which every
/// schedule implements; tests/softmax.rs covers the safe one.
pub fn layer_src(n: u32, d: u32, heads: u32, shared: bool, causal: bool) -> String {
    format!(
        "layer t {{ tokens = {n}; dim = {d}; heads = {heads}; qkv = {}; mask = {}; softmax = plain; }}",
        if shared { "shared" } else { "separate" },
        if causal { "causal" } else { "none" }
    )
}

pub fn parse_one(src: &str) -> lang::Layer {
    let parsed = lang::parse(0, src);
    assert!(
        !lang::has_errors(&parsed.diagnostics),
        "{}",
        lang::render("t.attn", src, &parsed.diagnostics)
    );
    assert_eq!(parsed.layers.len(), 1);
    parsed.layers.into_iter().next().unwrap()
}

/// The PE of every word an input preloads: each element's placement, then each preload copy.
pub fn preload_pes(
    place: &compiler::manifest::Placement,
    pes: u32,
) -> impl Iterator<Item = u32> + '_ {
    (0..place.len())
        .map(move |i| place.locate(pes, i).0)
        .chain(place.copies.iter().map(|c| c.pe))
}

/// Whether the sampled grids run in full: `ATTNC_FULL_GRIDS=1`.
pub fn full_grids() -> bool {
    std::env::var_os("ATTNC_FULL_GRIDS").is_some_and(|v| v == "1")
}

/// About one in `every` of `items` (at least one): those at `start`, `start + every`, … counted
/// round the list, so that successive calls with successive starts cover all of them; every item
/// under `ATTNC_FULL_GRIDS=1`. The largest correctness grids pick their innermost choices (head
/// dims, head counts) through it, so that the default run (CI's) stays short while every token
/// count and ring of the grid is still compiled, proved and run.
pub fn pick<T: Copy>(items: &[T], every: usize, start: usize) -> Vec<T> {
    if full_grids() || items.is_empty() {
        return items.to_vec();
    }
    let len = items.len();
    (0..len.div_ceil(every.max(1)))
        .map(|j| items[(start + every * j) % len])
        .collect()
}

pub fn compile_src(src: &str, pes: u32, schedule: Choice) -> Compiled {
    compile_placed(src, pes, schedule, false)
}

/// [`compile_src`] with every input element on one PE (`--single-placement`): for tests about
/// the layouts of that model.
pub fn compile_single(src: &str, pes: u32, schedule: Choice) -> Compiled {
    compile_placed(src, pes, schedule, true)
}

fn compile_placed(src: &str, pes: u32, schedule: Choice, single_placement: bool) -> Compiled {
    let layer = parse_one(src);
    let opts = Options {
        pes,
        schedule,
        dump_after: None,
        mem_limit: None,
        reroll: false,
        single_placement,
    };
    compile(&layer, &opts).unwrap_or_else(|e| panic!("compile failed: {e}"))
}

/// What running the emitted programs gave.
pub struct RunResult {
    pub cycles: u64,
    pub max_abs_err: f64,
    pub stats: isa::RunStats,
    /// The proof's statement (`None`: not proved).
    pub proved: Option<String>,
    /// Operations beyond the necessary ones the proof accepted as declared.
    pub redundant_ops: u64,
}

/// Runs the programs as a loader would see them on disk: every program goes through its binary
/// encoding and its text assembly before execution.
pub fn run_emitted(c: &Compiled, seed: u64) -> RunResult {
    // The stream schedule emits loop programs only; these layers are small enough to flatten.
    let flattened: Vec<isa::Program>;
    let emitted = if c.programs.is_empty() {
        flattened = c
            .loops
            .iter()
            .map(|l| l.flatten(u64::MAX).expect("flattens"))
            .collect();
        &flattened
    } else {
        &c.programs
    };
    let programs: Vec<isa::Program> = emitted
        .iter()
        .map(|p| {
            let from_bin = isa::decode(&isa::encode(p).unwrap()).expect("binary round trip");
            let text = from_bin.to_string();
            isa::parse(&text).expect("text round trip")
        })
        .collect();
    let manifest = compiler::manifest::Manifest::from_json(&c.manifest.to_json().unwrap())
        .expect("manifest round trip");
    // Every program the tests compile is also proved correct for all inputs.
    let opts = verifier::Options {
        exact_ops: c.scheduler.is_some_and(|s| s.necessary_only()),
        ..Default::default()
    };
    let report = verifier::verify_with(&programs, &manifest, &opts);
    assert!(report.is_ok(), "verification failed:\n{report}");
    let inputs = compiler::exec::random_inputs(&manifest, seed);
    let out = compiler::exec::execute(
        isa::F32Domain,
        programs,
        &manifest,
        &inputs,
        &mut isa::NoObserver,
    )
    .unwrap_or_else(|e| panic!("execution failed: {e}"));
    let want = compiler::exec::reference_output(&manifest, &inputs).unwrap();
    check_rerolled(c, &manifest, &inputs, &out);
    RunResult {
        cycles: out.stats.cycles,
        max_abs_err: compiler::exec::max_abs_err(&out.outputs["y"], &want),
        stats: out.stats,
        proved: report.proved,
        redundant_ops: report.redundant_ops,
    }
}

/// [`run_emitted`], then what every schedule must show: outputs within `tol` of the f64
/// reference, the manifest's cycle count exactly, and no fewer cycles than the bound it states.
pub fn run_within(c: &Compiled, seed: u64, tol: f64, what: &str) -> RunResult {
    let r = run_emitted(c, seed);
    assert!(
        r.max_abs_err <= tol,
        "{what}: max_abs_err {}",
        r.max_abs_err
    );
    assert_eq!(r.cycles, c.manifest.cycles, "{what}");
    let bound = c.manifest.bound.expect("every compile states its bound");
    assert!(r.cycles >= bound.value, "{what}: below {bound:?}");
    r
}

/// The rerolled form of the programs (what `attnc compile` writes when it is smaller), however
/// the compile was asked: its binary and text forms round-trip, it flattens to the flat programs
/// bundle for bundle (so the proof above covers it), and the loop machine runs it natively to
/// the same cycle count and bit-identical outputs. A stream compile has only its loop
/// programs: those are what runs natively against their flattening.
fn check_rerolled(
    c: &Compiled,
    manifest: &compiler::manifest::Manifest,
    inputs: &std::collections::BTreeMap<String, Vec<f32>>,
    flat: &compiler::exec::Outcome<f32>,
) {
    let loops: Vec<isa::LoopProgram> = if c.programs.is_empty() {
        c.loops.clone()
    } else {
        c.programs
            .iter()
            .map(|p| {
                let l = compiler::passes::reroll::run(p);
                let bin = isa::encode_looped(&l).expect("encodes");
                let back = isa::decode_looped(&bin).expect("binary round trip");
                let back = isa::parse_looped(&back.to_text()).expect("text round trip");
                assert_eq!(back, l, "PE {}: loop program round trip", p.pe);
                assert_eq!(
                    &l.flatten(u64::MAX).expect("flattens"),
                    p,
                    "PE {}: reroll not exact",
                    p.pe
                );
                l
            })
            .collect()
    };
    let mut m = manifest.clone();
    m.format_version = m
        .format_version
        .max(compiler::manifest::LAYOUT_FORMAT_VERSION);
    m.programs = compiler::manifest::ProgramKind::Loops;
    let m = compiler::manifest::Manifest::from_json(&m.to_json().unwrap())
        .expect("a manifest of rerolled programs validates");
    let (out, _) = compiler::exec::execute_loops(loops, &m, inputs)
        .unwrap_or_else(|e| panic!("rerolled execution failed: {e}"));
    assert_eq!(out.stats.cycles, flat.stats.cycles, "rerolled cycles");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&out.outputs["y"]),
        bits(&flat.outputs["y"]),
        "rerolled outputs"
    );
}

pub fn divisors(n: u32) -> Vec<u32> {
    (1..=n).filter(|m| n.is_multiple_of(*m)).collect()
}

/// The DSL text of one layer in the default (safe) formulation, `scheme` one of `separate`,
/// `shared` (q = k = v) or `causal`.
pub fn scheme_src(n: u32, d: u32, heads: u32, scheme: &str) -> String {
    let (shared, causal) = match scheme {
        "shared" => (true, false),
        "causal" => (false, true),
        _ => (false, false),
    };
    layer_src(n, d, heads, shared, causal).replace(" softmax = plain;", "")
}
