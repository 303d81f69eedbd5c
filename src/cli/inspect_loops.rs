//! `attnc inspect` on loop programs too long to flatten: every figure is computed from the loop
//! structure (trip counts, predicates, affine address terms), never by running or expanding
//! the programs, so a real layer's directory is summarised in the time it takes to load it.

use attnc::rundir::Loaded;
use isa::looped::Field;
use isa::{LoopProgram, OpKind};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::Path;

/// Where each written field of each template writes, as address hulls per writer: the op's
/// kind for an op result, `acc` for the accumulator's, and (on the receiving PE) `received`.
fn written_hulls(p: &LoopProgram, into: &mut BTreeMap<String, Vec<(u32, u32)>>, sent: bool) {
    p.for_each_template(|b, bounds| {
        let mut put = |key: String, f: Field| {
            if let Some((lo, hi)) = b.live_hull(f, bounds) {
                // A validated program's addresses are within 32 bits.
                into.entry(key).or_default().push((lo as u32, hi as u32));
            }
        };
        if sent {
            put("received".into(), Field::XferDst);
            return;
        }
        if let Some(k) = b.bundle.op.kind() {
            put(format!("written:{}", k.mnemonic()), Field::OpDst);
        }
        put("written:acc".into(), Field::AccDst);
    });
}

/// The memory map of one PE: inputs and outputs from the manifest's placements, the rest as
/// the hulls of what the programs write there (a strided writer does not fill its hull).
fn memory_map(loaded: &Loaded, pe: usize) -> Vec<(String, Vec<(u32, u32)>)> {
    let m = &loaded.manifest;
    let mut map = Vec::new();
    for (name, p) in &m.inputs {
        map.push((name.clone(), p.pe_ranges(m.pes, pe as u32)));
    }
    let mut written = BTreeMap::new();
    if let Some(p) = loaded.loops.get(pe) {
        written_hulls(p, &mut written, false);
    }
    let prev = if pe == 0 {
        loaded.loops.len() - 1
    } else {
        pe - 1
    };
    if let Some(p) = loaded.loops.get(prev) {
        written_hulls(p, &mut written, true);
    }
    map.extend(
        written
            .into_iter()
            .map(|(k, v)| (k, runtime::manifest::merge_runs(v))),
    );
    for (name, p) in &m.outputs {
        map.push((name.clone(), p.pe_ranges(m.pes, pe as u32)));
    }
    map.retain(|(_, r)| !r.is_empty());
    map
}

fn ranges_json(r: &[(u32, u32)]) -> serde_json::Value {
    json!(r.iter().map(|&(a, b)| [a, b]).collect::<Vec<_>>())
}

/// Prints the summary (text or `json`) of loop programs; `why` says why they were not
/// flattened.
pub fn run(dir: &Path, loaded: &Loaded, json_out: bool, why: &str) -> Result<(), String> {
    let m = &loaded.manifest;
    let n = loaded.loops.len();
    if n == 0 || n != m.pes as usize {
        return Err(format!(
            "{}: {n} loop programs for {} PEs",
            dir.display(),
            m.pes
        ));
    }
    let size = |name: &str| std::fs::metadata(dir.join(name)).ok().map(|md| md.len());
    let sends: Vec<(u64, u64)> = loaded
        .loops
        .iter()
        .map(LoopProgram::acc_and_send_counts)
        .collect();
    let mut rows = Vec::new();
    let mut maps = Vec::with_capacity(n);
    for (pe, p) in loaded.loops.iter().enumerate() {
        let f = m
            .files
            .get(pe as u32)
            .ok_or("the manifest lists fewer files than PEs")?;
        let counts = p.op_counts();
        let ops: serde_json::Map<String, serde_json::Value> = OpKind::ALL
            .iter()
            .map(|k| (k.mnemonic().to_string(), json!(counts[k.index()])))
            .collect();
        let busy: u64 = counts.iter().sum();
        let cycles = p.cycles();
        let map = memory_map(loaded, pe);
        let memory: serde_json::Map<String, serde_json::Value> = map
            .iter()
            .map(|(name, r)| (name.clone(), ranges_json(r)))
            .collect();
        maps.push(map);
        let prev = if pe == 0 { n - 1 } else { pe - 1 };
        rows.push(json!({
            "pe": pe,
            "cycles": cycles,
            "templates": p.bundle_count(),
            "binary_bytes": isa::looped_binary::encoded_len(p),
            "binary_file_bytes": size(&f.binary),
            "text_file_bytes": size(&f.text),
            "ops": ops,
            "busy_cycles": busy,
            "idle_cycles": cycles.saturating_sub(busy),
            "acc_adds": sends[pe].0,
            "link_sent": sends[pe].1,
            "link_received": sends[prev].1,
            "mem_words": m.mem_words[pe],
            "memory": memory,
        }));
    }
    if json_out {
        let mut obj = super::inspect::report_json(m, loaded.source, rows);
        obj.insert("loop_summary".into(), json!(why));
        println!("{}", serde_json::Value::Object(obj));
        return Ok(());
    }
    println!(
        "{}",
        super::inspect::title(m, "loop programs", loaded.source)
    );
    println!("counted from the loop structure without flattening ({why}):");
    let kinds: Vec<&str> = OpKind::ALL.iter().map(|k| k.mnemonic()).collect();
    print!(
        "{:>5} {:>9} {:>9} {:>9} {:>12}",
        "PE", "templates", "bin_B", "text_B", "cycles"
    );
    for k in &kinds {
        print!(" {k:>12}");
    }
    println!(" {:>12} {:>12} {:>12}", "idle", "sent", "recv");
    let num = |v: &serde_json::Value| v.as_u64().map_or("-".into(), |n| n.to_string());
    for r in &rows {
        print!(
            "{:>5} {:>9} {:>9} {:>9} {:>12}",
            num(&r["pe"]),
            num(&r["templates"]),
            num(&r["binary_file_bytes"]),
            num(&r["text_file_bytes"]),
            num(&r["cycles"]),
        );
        for k in &kinds {
            print!(" {:>12}", num(&r["ops"][*k]));
        }
        println!(
            " {:>12} {:>12} {:>12}",
            num(&r["idle_cycles"]),
            num(&r["link_sent"]),
            num(&r["link_received"]),
        );
    }
    println!(
        "memory map (each buffer's words and inclusive word ranges; inputs and y from the manifest, the rest the hull of each writer's addresses, so a buffer's words count what the hull spans):"
    );
    for (pe, map) in maps.iter().enumerate() {
        super::inspect::print_memory_line(pe, m.mem_words[pe], map);
    }
    if !m.buffers.is_empty() {
        let parts: Vec<String> = m
            .buffers
            .iter()
            .map(|b| format!("{} {} words at m{}", b.name, b.words, b.base))
            .collect();
        println!(
            "buffers of every PE, as the compiler laid them out (manifest): {}",
            parts.join("; ")
        );
    }
    Ok(())
}
