//! The whole `run` path on a mutated output directory: a real compiled directory (kept small so
//! each execution is fast) has its files edited by the fuzzer, then is loaded, checked, run in
//! the interpreter against random inputs and compared with the reference, as `attnc run` does.
//!
//! Input layout: byte 0 picks the file, bytes 1..3 an offset into it, byte 3 the edit (low two
//! bits: overwrite, insert, truncate, replace the whole file; bit 2: leave a binary's checksum
//! stale; bit 3: start from the loop-program directory of the stream schedule instead of the flat
//! one), the rest is the new content.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// A loop-program directory: 8 tokens on 2 PEs with the stream schedule.
fn base_loops() -> &'static BTreeMap<String, Vec<u8>> {
    static DIR: OnceLock<BTreeMap<String, Vec<u8>>> = OnceLock::new();
    DIR.get_or_init(|| {
        let src = "layer f { tokens = 8; dim = 2; heads = 1; mask = causal; }";
        let layer = lang::parse(0, src).layers.remove(0);
        let c = compiler::compile(
            &layer,
            &compiler::Options {
                pes: 2,
                schedule: compiler::passes::select::Choice::Stream,
                ..Default::default()
            },
        )
        .expect("compiles");
        let mut dir = BTreeMap::new();
        for p in &c.loops {
            dir.insert(format!("pe{}.s", p.pe), p.to_text().into_bytes());
            dir.insert(format!("pe{}.bin", p.pe), isa::encode_looped(p).expect("encodes"));
        }
        dir.insert("manifest.json".into(), c.manifest.to_json().unwrap().into_bytes());
        dir
    })
}

fn base() -> &'static BTreeMap<String, Vec<u8>> {
    static DIR: OnceLock<BTreeMap<String, Vec<u8>>> = OnceLock::new();
    DIR.get_or_init(|| {
        let src = "layer f { tokens = 3; dim = 2; heads = 1; qkv = shared; mask = causal; }";
        let layer = lang::parse(0, src).layers.remove(0);
        let c = compiler::compile(
            &layer,
            &compiler::Options {
                pes: 2,
                ..Default::default()
            },
        )
        .expect("compiles");
        let mut dir = BTreeMap::new();
        for p in &c.programs {
            dir.insert(format!("pe{}.s", p.pe), p.to_string().into_bytes());
            dir.insert(format!("pe{}.bin", p.pe), isa::encode(p).expect("encodes"));
        }
        dir.insert("manifest.json".into(), c.manifest.to_json().unwrap().into_bytes());
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let mut dir = if data[3] & 8 == 0 {
        base().clone()
    } else {
        base_loops().clone()
    };
    let names: Vec<String> = dir.keys().cloned().collect();
    let name = &names[data[0] as usize % names.len()];
    let file = dir.get_mut(name).expect("listed");
    let at = u16::from_le_bytes([data[1], data[2]]) as usize % (file.len() + 1);
    let new = &data[4..];
    match data[3] % 4 {
        0 => {
            let end = (at + new.len()).min(file.len());
            file.splice(at..end, new.iter().copied());
        }
        1 => {
            file.splice(at..at, new.iter().copied());
        }
        2 => file.truncate(at),
        _ => *file = new.to_vec(),
    }
    // Usually keep the checksum valid, so edits reach the bundles and the run itself.
    if data[3] & 4 == 0 && name.ends_with(".bin") && file.len() >= 4 {
        let body = file.len() - 4;
        let crc = crc32fast::hash(&file[..body]);
        file[body..].copy_from_slice(&crc.to_le_bytes());
    }
    // Sometimes drop the binaries so the text programs are used.
    if data[0] >= 128 {
        dir.retain(|k, _| !k.ends_with(".bin"));
    }
    let Ok(loaded) = attnc::rundir::load(&dir) else {
        return;
    };
    let m = &loaded.manifest;
    // `run` refuses more than --max-pe-cycles; a fuzz execution must stay short.
    if m.cycles.saturating_mul(u64::from(m.pes)) > 1_000_000 {
        return;
    }
    let inputs = compiler::exec::random_inputs(m, 0);
    let outcome = if loaded.loops.is_empty() {
        compiler::exec::execute(
            isa::F32Domain,
            loaded.programs,
            m,
            &inputs,
            &mut isa::NoObserver,
        )
    } else {
        compiler::exec::execute_loops(loaded.loops, m, &inputs).map(|(o, _)| o)
    };
    let Ok(outcome) = outcome else {
        return;
    };
    let reference = compiler::exec::reference_output(m, &inputs).expect("checked inputs");
    let _ = attnc::rundir::compare(&outcome.outputs["y"], &reference, 1e-4, 1e-5);
});
