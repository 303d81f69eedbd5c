//! Inconsistent or hostile programs and manifests give violations, never a panic.

use crate::verifier_common as common;

use common::{build, source};
use compiler::passes::select::Choice;
use verifier::{verify, Invariant};

fn base() -> compiler::Compiled {
    build(&source(4, 4, 1, false, true), 2, Choice::Auto).unwrap()
}

fn rejected_for(programs: &[isa::Program], m: &compiler::manifest::Manifest, inv: Invariant) {
    let r = verify(programs, m);
    assert!(!r.is_ok());
    assert!(
        r.counts.get(&inv).copied().unwrap_or(0) > 0,
        "expected a {inv} violation:\n{r}"
    );
    let _ = r.to_string();
    let _ = r.to_json();
}

#[test]
fn malformed_manifests_and_programs() {
    let c = base();
    let (p, m) = (&c.programs, &c.manifest);

    rejected_for(&[], m, Invariant::Setup);
    let mut reversed = p.clone();
    reversed.reverse();
    rejected_for(&reversed, m, Invariant::Setup);

    let mut m2 = m.clone();
    m2.pes = 0;
    rejected_for(p, &m2, Invariant::Manifest);

    let mut m2 = m.clone();
    m2.mem_words.clear();
    rejected_for(p, &m2, Invariant::Manifest);

    let mut m2 = m.clone();
    m2.inputs.get_mut("q").unwrap().addr.pop();
    rejected_for(p, &m2, Invariant::Manifest);

    let mut m2 = m.clone();
    m2.outputs.clear();
    rejected_for(p, &m2, Invariant::Manifest);

    let mut m2 = m.clone();
    m2.layer.tokens = u32::MAX;
    m2.layer.dim = u32::MAX;
    m2.layer.heads = u32::MAX;
    rejected_for(p, &m2, Invariant::Manifest);

    let mut m2 = m.clone();
    m2.layer.scale = f64::INFINITY;
    rejected_for(p, &m2, Invariant::Manifest);

    let mut m2 = m.clone();
    m2.layer.qkv = "weird".into();
    rejected_for(p, &m2, Invariant::Manifest);

    let mut m2 = m.clone();
    m2.necessary_ops += 1;
    rejected_for(p, &m2, Invariant::Manifest);

    let mut m2 = m.clone();
    m2.ops.phase2_exp += 1;
    rejected_for(p, &m2, Invariant::OpCount);

    // Two inputs in one word, two outputs in one word.
    let mut m2 = m.clone();
    let q = m2.inputs.get_mut("q").unwrap();
    q.pe[1] = q.pe[0];
    q.addr[1] = q.addr[0];
    rejected_for(p, &m2, Invariant::Placement);
    let mut m2 = m.clone();
    let y = m2.outputs.get_mut("y").unwrap();
    y.pe[1] = y.pe[0];
    y.addr[1] = y.addr[0];
    rejected_for(p, &m2, Invariant::Placement);

    // An output read from an input word.
    let mut m2 = m.clone();
    let (qp, qa) = (m2.inputs["q"].pe[0], m2.inputs["q"].addr[0]);
    let y = m2.outputs.get_mut("y").unwrap();
    y.pe[0] = qp;
    y.addr[0] = qa;
    rejected_for(p, &m2, Invariant::Placement);

    // Programs far too short for the work, with a manifest that agrees on the cycle count.
    let mut short = p.clone();
    for prog in &mut short {
        prog.bundles.truncate(3);
    }
    let mut m2 = m.clone();
    m2.cycles = 3;
    rejected_for(&short, &m2, Invariant::OpCount);
}

#[test]
fn faults_are_located() {
    let c = base();
    let mut p = c.programs.clone();
    // Read a word nobody wrote, in the first bundle of PE 1.
    p[1].bundles[0].op = isa::Op::mul(p[1].mem_words - 1, p[1].mem_words - 1, None);
    let r = verify(&p, &c.manifest);
    let v = r
        .violations
        .iter()
        .find(|v| v.invariant == Invariant::Fault)
        .unwrap_or_else(|| panic!("no fault reported:\n{r}"));
    assert_eq!((v.pe, v.cycle), (Some(1), Some(0)), "{r}");
    assert!(v.instruction.as_deref().unwrap().starts_with("mul"), "{r}");
    assert!(v.message.contains("uninitialized"), "{r}");

    // An address past the declared memory.
    let mut p = c.programs.clone();
    p[0].bundles[2].op = isa::Op::exp(p[0].mem_words + 5, 1.0, None);
    let r = verify(&p, &c.manifest);
    assert!(r.counts.contains_key(&Invariant::Fault), "{r}");
}

#[test]
fn wrong_outputs_show_expected_and_found() {
    let c = build(&source(3, 3, 1, false, false), 3, Choice::Auto).unwrap();
    let mut m = c.manifest.clone();
    // Swap where two output elements are read from: both are then wrong.
    let y = m.outputs.get_mut("y").unwrap();
    y.pe.swap(0, 4);
    y.addr.swap(0, 4);
    let r = verify(&c.programs, &m);
    let outs: Vec<_> = r
        .violations
        .iter()
        .filter(|v| v.invariant == Invariant::Output)
        .collect();
    assert_eq!(outs.len(), 2, "{r}");
    assert!(outs[0].message.contains("expected:"), "{r}");
    assert!(outs[0].message.contains("found:"), "{r}");
    assert!(outs[0].message.contains('Σ'), "{r}");
}

#[test]
fn masked_work_is_named() {
    // The same shape without and with a causal mask: the unmasked program computes every score,
    // so run against the causal manifest its extra work must be reported as masked.
    let full = build(&source(3, 3, 1, false, false), 3, Choice::Named("baseline")).unwrap();
    let causal = build(&source(3, 3, 1, false, true), 3, Choice::Named("baseline")).unwrap();
    let mut m = full.manifest.clone();
    m.layer.mask = "causal".into();
    m.necessary_ops = causal.manifest.necessary_ops;
    m.lower_bound = causal.manifest.lower_bound;
    m.bound = causal.manifest.bound;
    let r = verify(&full.programs, &m);
    assert!(
        r.counts.get(&Invariant::Masked).copied().unwrap_or(0) > 0,
        "{r}"
    );
    let v = r
        .violations
        .iter()
        .find(|v| v.invariant == Invariant::Masked)
        .unwrap();
    assert!(v.pe.is_some() && v.cycle.is_some() && v.instruction.is_some());
    assert!(v.message.contains("mask"), "{r}");
}

#[test]
fn a_stated_bound_must_be_the_layers() {
    let c = base();
    let (p, m) = (&c.programs, &c.manifest);
    assert!(verify(p, m).is_ok());
    let b = m.bound.expect("compile states the bound");
    // A larger critical path (and value to match) is a claim about another layer or ring.
    let mut m2 = m.clone();
    let claimed = b.value + 5;
    m2.bound = Some(runtime::bound::Bound {
        value: claimed,
        critical_path: claimed,
        ..b
    });
    rejected_for(p, &m2, Invariant::Manifest);
    // No bound at all is an older manifest, and still proved.
    let mut m3 = m.clone();
    m3.bound = None;
    assert!(verify(p, &m3).is_ok());
}

/// Programs of [`base`] moved to read one input element from a preload copy at a word of its
/// own instead of from its placement, with the manifest that lists the copy. The element is
/// one its PE reads more than once, so its placement is still read. Returns the copy too.
fn reading_a_copy() -> (
    Vec<isa::Program>,
    compiler::manifest::Manifest,
    compiler::manifest::PreloadCopy,
) {
    let c = base();
    let (mut p, mut m) = (c.programs.clone(), c.manifest.clone());
    let q = &m.inputs["q"];
    let element = |pe: u32, a: u32| (0..q.len()).find(|&i| q.locate(m.pes, i) == (pe, a));
    let reads = |pe: usize, a: u32| -> usize {
        p[pe]
            .bundles
            .iter()
            .map(|b| match b.op {
                isa::Op::Arith(x) => x.reads().filter(|&r| r == a).count(),
                isa::Op::Nop => 0,
            })
            .sum()
    };
    let (pe, cycle, index) = (0..p.len())
        .flat_map(|pe| (0..p[pe].bundles.len()).map(move |t| (pe, t)))
        .find_map(|(pe, t)| {
            let isa::Op::Arith(x) = p[pe].bundles[t].op else {
                return None;
            };
            let i = element(pe as u32, x.a)?;
            (reads(pe, x.a) > 1).then_some((pe, t, i))
        })
        .expect("a q element read twice on one PE");
    let copy = compiler::manifest::PreloadCopy {
        index: index as u64,
        pe: pe as u32,
        addr: p[pe].mem_words,
    };
    p[pe].mem_words += 1;
    m.mem_words[pe] += 1;
    m.format_version = compiler::manifest::COPIES_FORMAT_VERSION;
    m.inputs.get_mut("q").unwrap().copies.push(copy);
    if let isa::Op::Arith(x) = &mut p[pe].bundles[cycle].op {
        x.a = copy.addr;
    }
    (p, m, copy)
}

#[test]
fn a_program_reading_a_preload_copy_verifies_like_one_reading_the_element() {
    let (p, m, _) = reading_a_copy();
    let r = verify(&p, &m);
    assert!(r.is_ok() && r.proved.is_some(), "{r}");
    // The manifest as written and read back is the same one.
    let back = compiler::manifest::Manifest::from_json(&m.to_json().unwrap()).unwrap();
    assert!(verify(&p, &back).is_ok());
    // Without the copy the word is read before anything wrote it.
    let mut bare = m.clone();
    bare.inputs.get_mut("q").unwrap().copies.clear();
    rejected_for(&p, &bare, Invariant::Fault);
}

#[test]
fn a_preload_copy_on_another_input_word_or_out_of_range_is_refused() {
    let (p, m, copy) = reading_a_copy();
    // Onto another input's word on that PE: the programs' reads are as before, only the copy's
    // word clashes.
    let (kp, ka) = m.inputs["k"]
        .pe
        .iter()
        .zip(&m.inputs["k"].addr)
        .find(|(&pe, _)| pe == copy.pe)
        .map(|(&pe, &a)| (pe, a))
        .expect("a k element on the copy's PE");
    let mut clash = m.clone();
    clash.inputs.get_mut("q").unwrap().copies[0].addr = ka;
    let r = verify(&p, &clash);
    assert!(
        r.violations
            .iter()
            .any(|v| v.invariant == Invariant::Placement
                && v.pe == Some(kp)
                && v.message.contains("(copy)")),
        "no placement violation naming the copy:\n{r}"
    );
    // An element past the tensor, a PE past the ring.
    let mut far = m.clone();
    far.inputs.get_mut("q").unwrap().copies[0].index = 1 << 40;
    rejected_for(&p, &far, Invariant::Manifest);
    let mut far = m.clone();
    far.inputs.get_mut("q").unwrap().copies[0].pe = m.pes;
    rejected_for(&p, &far, Invariant::Manifest);
    // A copy nobody reads is a preloaded input word left unused.
    let (mut p2, mut unread) = (p.clone(), m.clone());
    let pe = copy.pe as usize;
    let spare = compiler::manifest::PreloadCopy {
        addr: p2[pe].mem_words,
        ..copy
    };
    p2[pe].mem_words += 1;
    unread.mem_words[pe] += 1;
    unread.inputs.get_mut("q").unwrap().copies.push(spare);
    rejected_for(&p2, &unread, Invariant::UnusedInput);
    // Copies on the output.
    let mut out = m.clone();
    out.outputs.get_mut("y").unwrap().copies.push(copy);
    rejected_for(&p, &out, Invariant::Manifest);
}
