//! The proof without unrolling of rings of different programs by induction over ring steps
//! (`verifier::compact::induct`): each PE evaluated alone, its receive buffers stated by the
//! ring's contracts at each step's start, its sends discharged against its successor's.

use compiler::passes::select::Choice;
use runtime::manifest::Manifest;

fn compile(src: &str, m: u32, schedule: Choice) -> (Vec<isa::LoopProgram>, Manifest) {
    let parsed = lang::parse(0, src);
    let c = compiler::compile(
        &parsed.layers[0],
        &compiler::Options {
            pes: m,
            schedule,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("{src} on {m} PEs: {e:?}"));
    (c.loops, c.manifest)
}

fn source(n: u32, d: u32, h: u32, mask: &str) -> String {
    format!("layer l {{ tokens = {n}; dim = {d}; heads = {h}; mask = {mask}; }}")
}

#[test]
#[ignore]
fn explore() {
    let spec = std::env::var("INDUCT").unwrap_or_else(|_| "64,4,2,4".into());
    let v: Vec<u32> = spec.split(',').map(|x| x.parse().unwrap()).collect();
    let (loops, man) = compile(&source(v[0], v[1], v[2], "causal"), v[3], Choice::Stream);
    let t = std::time::Instant::now();
    let r = verifier::compact::induct::evaluate(&loops, &man);
    match r {
        Ok(ev) => println!(
            "ok: wrong {} {:?}, evaluations {}, {:?}",
            ev.wrong_count,
            ev.wrong,
            ev.evaluations,
            t.elapsed()
        ),
        Err(why) => println!("declined after {:?}: {why}", t.elapsed()),
    }
}
