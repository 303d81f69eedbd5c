//! `attnc inspect DIR`: per-PE program size, work by phase, link traffic and memory map.

use super::load;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use timeline::{tag_bit, Class, PeSummary, Tag};

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// Directory written by `attnc compile`
    pub dir: PathBuf,
    /// Print one JSON object instead of text
    #[arg(long)]
    pub json: bool,
    /// With loop programs, summarise them from their loop structure (ops by kind, sends,
    /// address hulls) without flattening; the default for programs too long to flatten
    #[arg(long)]
    pub loops: bool,
}

/// Buffers found by lineage, in the order they are listed: (tag, name).
const LINEAGE_BUFFERS: [(Tag, &str); 7] = [
    (Tag::Input, "input_copies"),
    (Tag::Score, "scores"),
    (Tag::Exp, "exp"),
    (Tag::ExpSum, "sums"),
    (Tag::Weight, "weights"),
    (Tag::Out, "av_partials"),
    (Tag::Mixed, "other"),
];

/// Sorted addresses as inclusive `[first, last]` runs.
fn ranges(addrs: impl IntoIterator<Item = u32>) -> Vec<(u32, u32)> {
    let mut v: Vec<u32> = addrs.into_iter().collect();
    v.sort_unstable();
    v.dedup();
    let mut out: Vec<(u32, u32)> = Vec::new();
    for a in v {
        match out.last_mut() {
            Some((_, hi)) if *hi + 1 == a => *hi = a,
            _ => out.push((a, a)),
        }
    }
    out
}

fn ranges_text(r: &[(u32, u32)]) -> String {
    r.iter()
        .map(|&(a, b)| {
            if a == b {
                format!("m{a}")
            } else {
                format!("m{a}-m{b}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The memory map of one PE: buffer name → address runs. Inputs and `y` come from the manifest
/// placement; intermediate buffers from the lineage of the words written (an address reused
/// for several buffers over the run is listed under each).
fn memory_map(
    pe: u32,
    m: &compiler::manifest::Manifest,
    sum: &PeSummary,
) -> Vec<(String, Vec<(u32, u32)>)> {
    let mut map = Vec::new();
    let placed = |tensors: &BTreeMap<String, compiler::manifest::Placement>,
                  map: &mut Vec<(String, Vec<(u32, u32)>)>| {
        for (name, p) in tensors {
            // An input's preload copies are words of that input too.
            let copies = p.copies.iter().map(|c| (c.pe, c.addr));
            let addrs =
                p.pe.iter()
                    .copied()
                    .zip(p.addr.iter().copied())
                    .chain(copies)
                    .filter(|&(q, _)| q == pe)
                    .map(|(_, a)| a);
            let r = ranges(addrs);
            if !r.is_empty() {
                map.push((name.clone(), r));
            }
        }
    };
    placed(&m.inputs, &mut map);
    for (tag, name) in LINEAGE_BUFFERS {
        let r = ranges(
            sum.written
                .iter()
                .enumerate()
                .filter(|(_, &bits)| bits & tag_bit(tag) != 0)
                .map(|(a, _)| a as u32),
        );
        if !r.is_empty() {
            map.push((name.to_string(), r));
        }
    }
    placed(&m.outputs, &mut map);
    map
}

const PHASES: [Class; 4] = [Class::Qk, Class::Softmax, Class::Av, Class::Other];

pub fn run(args: &InspectArgs) -> Result<(), String> {
    let loaded = load::load_dir(&args.dir)?;
    if args.loops {
        if loaded.loops.is_empty() {
            return Err(format!(
                "{}: --loops needs loop programs; these are flat (one bundle per cycle)",
                args.dir.display()
            ));
        }
        return super::inspect_loops::run(&args.dir, &loaded, args.json, "asked with --loops");
    }
    let (programs, m) = match loaded.flat() {
        Ok(flat) => flat,
        // Too long to flatten: what the loop structure says without running it.
        Err(why) if !loaded.loops.is_empty() => {
            return super::inspect_loops::run(&args.dir, &loaded, args.json, &why);
        }
        Err(e) => return Err(format!("{}: {e}", args.dir.display())),
    };
    let m = &*m;
    let bar = super::progress::Progress::bar(m.cycles, "cycles", args.json);
    let walk = timeline::walk(&programs, m, |t, _| {
        if t.is_multiple_of(4096) {
            bar.set_position(t);
        }
    })
    .map_err(|e| format!("{}: {e}", args.dir.display()))?;
    drop(bar);
    let size = |name: &str| {
        std::fs::metadata(args.dir.join(name))
            .ok()
            .map(|md| md.len())
    };
    let mut rows = Vec::new();
    for (pe, sum) in walk.per_pe.iter().enumerate() {
        let f = m
            .files
            .get(pe as u32)
            .ok_or("the manifest lists fewer files than PEs")?;
        let ops: serde_json::Map<String, serde_json::Value> = PHASES
            .iter()
            .map(|c| (c.key().to_string(), json!(sum.op[*c as usize])))
            .collect();
        let link: serde_json::Map<String, serde_json::Value> = Class::ALL[1..]
            .iter()
            .map(|c| (c.key().to_string(), json!(sum.link[*c as usize])))
            .collect();
        let memory: serde_json::Map<String, serde_json::Value> = memory_map(pe as u32, m, sum)
            .into_iter()
            .map(|(name, r)| {
                (
                    name,
                    json!(r.iter().map(|&(a, b)| [a, b]).collect::<Vec<_>>()),
                )
            })
            .collect();
        let written = sum.written.iter().filter(|&&b| b != 0).count();
        rows.push(json!({
            "pe": pe,
            "bundles": sum.bundles,
            // What the program encodes to as loaded (loops when the files hold loop programs),
            // and what its flattening would take.
            "binary_bytes": loaded.loops.get(pe).map_or_else(
                || programs.get(pe).map_or(0, isa::binary::encoded_len),
                isa::looped_binary::encoded_len,
            ),
            "flat_binary_bytes": programs.get(pe).map_or(0, isa::binary::encoded_len),
            "binary_file_bytes": size(&f.binary),
            "text_file_bytes": size(&f.text),
            "ops": ops,
            "busy_cycles": walk.cycles - sum.op[Class::Idle as usize],
            "idle_cycles": sum.op[Class::Idle as usize],
            "acc_adds": walk.cycles - sum.acc[Class::Idle as usize],
            "link_sent": sum.sent,
            "link_received": sum.received,
            "link_sent_by_phase": link,
            "mem_words": m.mem_words[pe],
            "words_written": written,
            "memory": memory,
        }));
    }
    if args.json {
        println!(
            "{}",
            serde_json::Value::Object(report_json(m, loaded.source, rows))
        );
        return Ok(());
    }
    println!("{}", title(m, "programs", loaded.source));
    println!(
        "{:>5} {:>8} {:>9} {:>9} {:>8} {:>8} {:>8} {:>6} {:>8} {:>8} {:>8}",
        "PE", "bundles", "bin_B", "text_B", "QKt", "softmax", "V", "other", "idle", "sent", "recv"
    );
    let num = |v: &serde_json::Value| v.as_u64().map_or("-".into(), |n| n.to_string());
    for r in &rows {
        println!(
            "{:>5} {:>8} {:>9} {:>9} {:>8} {:>8} {:>8} {:>6} {:>8} {:>8} {:>8}",
            num(&r["pe"]),
            num(&r["bundles"]),
            num(&r["binary_file_bytes"]),
            num(&r["text_file_bytes"]),
            num(&r["ops"]["qk"]),
            num(&r["ops"]["softmax"]),
            num(&r["ops"]["av"]),
            num(&r["ops"]["other"]),
            num(&r["idle_cycles"]),
            num(&r["link_sent"]),
            num(&r["link_received"]),
        );
    }
    println!(
        "memory map (each buffer's words and inclusive word ranges; q/k/v/x and y from the manifest, the rest by lineage):"
    );
    for (pe, sum) in walk.per_pe.iter().enumerate() {
        print_memory_line(pe, m.mem_words[pe], &memory_map(pe as u32, m, sum));
    }
    Ok(())
}

/// The `--json` report: the layer's figures and one object per PE.
pub(super) fn report_json(
    m: &compiler::manifest::Manifest,
    source: &str,
    rows: Vec<serde_json::Value>,
) -> serde_json::Map<String, serde_json::Value> {
    [
        ("layer", json!(m.layer.name)),
        ("schedule", json!(m.schedule)),
        ("pes", json!(m.pes)),
        ("cycles", json!(m.cycles)),
        ("lower_bound", json!(m.lower_bound)),
        ("program_source", json!(source)),
        ("per_pe", json!(rows)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The text report's first line; `what` names the programs (`programs`, `loop programs`).
pub(super) fn title(m: &compiler::manifest::Manifest, what: &str, source: &str) -> String {
    format!(
        "layer {}: {} PEs, {} cycles (lower bound {}), {}, {what} from {source}",
        m.layer.name, m.pes, m.cycles, m.lower_bound, m.schedule
    )
}

/// One PE's line of the text memory map.
pub(super) fn print_memory_line(pe: usize, words: u32, map: &[(String, Vec<(u32, u32)>)]) {
    let parts: Vec<String> = map
        .iter()
        .map(|(name, r)| {
            let size: u64 = r.iter().map(|&(a, b)| u64::from(b - a) + 1).sum();
            format!("{name} ({size} words) {}", ranges_text(r))
        })
        .collect();
    println!("  PE {pe} ({words} words): {}", parts.join("; "));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_runs() {
        assert_eq!(ranges([5, 1, 2, 3, 9, 8]), vec![(1, 3), (5, 5), (8, 9)]);
        assert_eq!(ranges_text(&[(1, 3), (5, 5)]), "m1-m3,m5");
        assert!(ranges([]).is_empty());
    }
}
