//! The proof without unrolling of rings of different programs by induction over ring steps
//! (`verifier::compact::induct`): each PE evaluated alone, its receive buffers stated by the
//! ring's contracts at each step's start, its sends discharged against its successor's. On
//! compiled causal streams whose step loops it evaluates symbolically, it proves what the
//! lockstep evaluation proves, with the same operation counts.

use crate::common;

use compiler::passes::select::Choice;
use runtime::manifest::Manifest;

fn compile(src: &str, m: u32) -> (Vec<isa::LoopProgram>, Manifest) {
    let c = common::compile_src(src, m, Choice::Stream);
    (c.loops, c.manifest)
}

fn source(n: u32, d: u32, h: u32) -> String {
    format!("layer l {{ tokens = {n}; dim = {d}; heads = {h}; mask = causal; }}")
}

/// Causal streams with values trailing keys, on rings of 4 and 8 PEs (runs of two and three
/// pairs of steps symbolic): every output row is the specification's, and every operation
/// class is counted as the lockstep evaluation of all PEs counts it; `prove_loops_by_induction`
/// proves them with the counts checked against the layer and the manifest.
#[test]
fn causal_rings_are_proved_by_induction_over_steps() {
    let opts = verifier::Options::default();
    for (n, d, h, m) in [(64, 4, 2, 4), (128, 4, 2, 8), (96, 2, 3, 6)] {
        let src = source(n, d, h);
        let (loops, man) = compile(&src, m);
        let what = format!("{src} on {m} PEs");
        let ev = verifier::compact::induct::evaluate(&loops, &man)
            .unwrap_or_else(|why| panic!("{what}: {why}"));
        assert_eq!(ev.wrong_count, 0, "{what}: {:?}", ev.wrong);
        let lockstep = verifier::compact::ring::evaluate(&loops, &man)
            .unwrap_or_else(|why| panic!("{what}, in lockstep: {why}"));
        assert_eq!(ev.ops, lockstep.ops, "{what}");
        let proof = verifier::compact::prove_loops_by_induction(&loops, &man, &opts);
        assert!(proof.proved(), "{what}: {proof}");
        assert!(
            proof.to_string().contains("by induction"),
            "{what}: {proof}"
        );
    }
}

/// A contract the sends do not meet is not proved: a send of one PE moved by a word, a key
/// block read from the wrong rows (a stride changed), or one step too few.
#[test]
fn a_ring_whose_sends_miss_the_contract_is_not_proved() {
    let opts = verifier::Options::default();
    let (loops, man) = compile(&source(128, 4, 2), 8);
    let mut moved = loops.clone();
    let mut done = false;
    shift_first_send(&mut moved[3].body, &mut done);
    assert!(done, "PE 3 sends nothing");
    let proof = verifier::compact::prove_loops_by_induction(&moved, &man, &opts);
    assert!(!proof.proved(), "{proof}");
}

fn shift_first_send(nodes: &mut [isa::Node], done: &mut bool) {
    for n in nodes {
        if *done {
            return;
        }
        match n {
            isa::Node::Bundle(b) => {
                if let isa::Xfer::Send { dst, .. } = &mut b.bundle.xfer {
                    *dst += 1;
                    *done = true;
                }
            }
            isa::Node::Loop(l) => shift_first_send(&mut l.body, done),
        }
    }
}

/// Small blocks on a ring whose zigzag chunks give the lagged value sends 4 keys on one step
/// and 8 on others (two runs of 4 key rows, stacked 512 words apart in the facts the sends
/// leave). A block once forwarded word `c·keys + b` (column `c`, key `b`) made PE 1 decline on
/// that read; it is now forwarded in the order its products read it (`b·d + c`), and the
/// column loop's writes are shown apart from the other columns' through the rows' common
/// modulus.
#[test]
fn values_forwarded_four_keys_on_some_steps_are_proved() {
    let src = source(256, 128, 2);
    let (loops, man) = compile(&src, 32);
    let proof =
        verifier::compact::prove_loops_by_induction(&loops, &man, &verifier::Options::default());
    assert!(proof.proved(), "{src} on 32 PEs: {proof}");
    assert!(proof.to_string().contains("by induction"), "{proof}");
}

/// GPT-2 small's attention (1 024 tokens, 12 heads of 64, causal) on 64 PEs, proved by
/// induction; run by hand in release (`cargo test --release --test suite verify_induct:: --
/// --ignored`), it reports its time.
#[test]
#[ignore]
fn gpt2_small_on_64_pes_is_proved_by_induction() {
    let (loops, man) = compile(&source(1024, 64, 12), 64);
    let t = std::time::Instant::now();
    let proof =
        verifier::compact::prove_loops_by_induction(&loops, &man, &verifier::Options::default());
    eprintln!("{proof}\n({:?})", t.elapsed());
    assert!(proof.proved(), "{proof}");
}

/// The PEs are evaluated apart, each from a fresh state, so the proof comes to the same on any
/// number of worker threads: the operation counts, the evaluations, the expressions and the
/// report, and on a ring whose sends miss the contract the same failure (the lowest PE's).
#[test]
fn the_induction_comes_to_the_same_on_one_worker_and_on_two() {
    for (n, d, h, m) in [(128, 4, 2, 8), (96, 2, 3, 6)] {
        let src = source(n, d, h);
        let (loops, man) = compile(&src, m);
        let what = format!("{src} on {m} PEs");
        let one = verifier::compact::induct::evaluate_on(&loops, &man, 1)
            .unwrap_or_else(|why| panic!("{what}, one worker: {why}"));
        let two = verifier::compact::induct::evaluate_on(&loops, &man, 2)
            .unwrap_or_else(|why| panic!("{what}, two workers: {why}"));
        assert_eq!(one.wrong_count, 0, "{what}: {:?}", one.wrong);
        assert_eq!(one.ops, two.ops, "{what}");
        assert_eq!(one.evaluations, two.evaluations, "{what}");
        assert_eq!(one.expressions, two.expressions, "{what}");
        assert_eq!(one.wrong, two.wrong, "{what}");
        let report = |threads| {
            let opts = verifier::Options {
                threads,
                ..Default::default()
            };
            let proof = verifier::compact::prove_loops_by_induction(&loops, &man, &opts);
            assert!(proof.proved(), "{what} on {threads} worker(s): {proof}");
            // Everything but the time it took.
            let text = proof.to_string();
            let cut = text.find("time: ").expect("a time line");
            let rest = &text[cut..];
            let after = rest.find(';').expect("the time's end");
            (
                format!("{}{}", &text[..cut], &rest[after..]),
                proof.evaluations,
            )
        };
        assert_eq!(report(1), report(2), "{what}");
    }
    let (loops, man) = compile(&source(128, 4, 2), 8);
    let mut moved = loops.clone();
    let mut done = false;
    shift_first_send(&mut moved[5].body, &mut done);
    assert!(done, "PE 5 sends nothing");
    let one = verifier::compact::induct::evaluate_on(&moved, &man, 1);
    let two = verifier::compact::induct::evaluate_on(&moved, &man, 2);
    let why = one.expect_err("a send moved by a word is proved on one worker");
    assert_eq!(
        Err::<(), _>(why),
        two.map(|_| ()),
        "one worker and two fail differently"
    );
}
