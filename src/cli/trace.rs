//! `attnc run DIR --trace FILE.json`: the run as Chrome trace-event JSON (Perfetto,
//! chrome://tracing). Layout and aggregation are described in docs/timelines.md.

use super::progress::Progress;
use compiler::manifest::Manifest;
use isa::Program;
use serde_json::json;
use std::io::Write;
use std::path::Path;
use timeline::{Class, Grid};

/// Upper bound on slice events (idle ones included). With metadata and counters a trace stays
/// well under 50 MB: an aggregated slice is at most ~200 bytes, a counter ~100.
pub const MAX_SLICES: usize = 150_000;
/// Fewest time bins per track before PEs are grouped too (only for rings of thousands of PEs).
const MIN_TIME_BINS: usize = 16;

/// What was written, for the caller's report.
pub struct TraceSummary {
    pub events: usize,
    pub bytes: u64,
    /// Cycles per slice bin: 1 means every cycle is shown exactly.
    pub cycles_per_bin: u64,
    pub pes_per_process: u32,
}

/// Chrome's reserved colour names; Perfetto ignores them and colours by slice name, which is the
/// phase, so both viewers colour by phase.
fn cname(c: Class) -> &'static str {
    match c {
        Class::Idle => "grey",
        Class::Qk => "rail_response",
        Class::Softmax => "thread_state_iowait",
        Class::Av => "good",
        Class::Input => "rail_load",
        Class::Other => "terrible",
    }
}

/// Bins so the trace respects [`MAX_SLICES`]; `cycles_per_bin` forces a coarser bin width.
pub fn grid_for(pes: u32, cycles: u64, cycles_per_bin: Option<u64>) -> Grid {
    let pe_bins = (pes as usize).min(MAX_SLICES / (3 * MIN_TIME_BINS));
    let pes_per_bin = pes.max(1).div_ceil(pe_bins.max(1) as u32);
    let rows = pes.max(1).div_ceil(pes_per_bin) as usize;
    let mut time_bins = (MAX_SLICES / (3 * rows)).max(1);
    if let Some(w) = cycles_per_bin {
        time_bins = time_bins.min(cycles.div_ceil(w.max(1)) as usize);
    }
    Grid::new(pes, cycles, pe_bins, time_bins, 3)
}

pub fn write(
    path: &Path,
    programs: &[Program],
    manifest: &Manifest,
    cycles_per_bin: Option<u64>,
    quiet: bool,
) -> Result<TraceSummary, String> {
    let mut grid = grid_for(manifest.pes, manifest.cycles, cycles_per_bin);
    let bar = Progress::bar(manifest.cycles, "cycles (trace)", quiet);
    timeline::walk(programs, manifest, |t, slots| {
        grid.add(t, slots);
        if t.is_multiple_of(4096) {
            bar.set_position(t);
        }
    })?;
    drop(bar);
    let events = events(&grid, manifest);
    let file =
        std::fs::File::create(path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    let io = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    out.write_all(b"{\"traceEvents\":[\n").map_err(io)?;
    for (i, e) in events.iter().enumerate() {
        if i > 0 {
            out.write_all(b",\n").map_err(io)?;
        }
        serde_json::to_writer(&mut out, e).map_err(|e| e.to_string())?;
    }
    let other = json!({
        "layer": manifest.layer.name,
        "schedule": manifest.schedule,
        "pes": manifest.pes,
        "cycles": manifest.cycles,
        "lower_bound": manifest.lower_bound,
        "time_unit": "1 us = 1 cycle",
        "cycles_per_bin": grid.width,
        "pes_per_process": grid.pes_per_bin,
    });
    write!(
        out,
        "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{other}}}\n"
    )
    .map_err(io)?;
    let file = out.into_inner().map_err(|e| io(e.into_error()))?;
    let bytes = file.metadata().map(|m| m.len()).unwrap_or(0);
    Ok(TraceSummary {
        events: events.len(),
        bytes,
        cycles_per_bin: grid.width,
        pes_per_process: grid.pes_per_bin,
    })
}

/// Every event of the trace, in the order written.
fn events(g: &Grid, m: &Manifest) -> Vec<serde_json::Value> {
    let mut ev = Vec::new();
    for row in 0..g.pe_bins {
        let (lo, hi) = g.pe_range(row);
        let name = if hi - lo == 1 {
            format!("PE {lo}")
        } else {
            format!("PEs {lo}-{}", hi - 1)
        };
        let pid = row;
        ev.push(json!({"ph":"M","name":"process_name","pid":pid,"args":{"name":name}}));
        ev.push(json!({"ph":"M","name":"process_sort_index","pid":pid,"args":{"sort_index":row}}));
        for (tid, slot) in timeline::SLOTS.iter().enumerate() {
            ev.push(
                json!({"ph":"M","name":"thread_name","pid":pid,"tid":tid,"args":{"name":slot}}),
            );
            ev.push(json!({"ph":"M","name":"thread_sort_index","pid":pid,"tid":tid,"args":{"sort_index":tid}}));
        }
    }
    let exact = g.width == 1 && g.pes_per_bin == 1;
    for row in 0..g.pe_bins {
        for slot in 0..3 {
            slices(g, row, slot, exact, &mut ev);
        }
        counters(g, row, m.pes, &mut ev);
    }
    ev
}

/// One track: consecutive bins with the same dominant class merge into one slice. Aggregated
/// slices carry the exact slot-cycles per class in `args`, so no count is lost to binning.
fn slices(g: &Grid, row: usize, slot: usize, exact: bool, ev: &mut Vec<serde_json::Value>) {
    let mut run: Option<(Class, u64, [u64; Class::COUNT])> = None;
    let flush = |run: &Option<(Class, u64, [u64; Class::COUNT])>, end: u64, ev: &mut Vec<_>| {
        let Some((class, start, counts)) = run else {
            return;
        };
        let mut e = json!({
            "ph": "X", "name": class.label(), "cat": class.key(), "pid": row, "tid": slot,
            "ts": start, "dur": end - start, "cname": cname(*class),
        });
        if !exact {
            let args: serde_json::Map<String, serde_json::Value> = Class::ALL
                .iter()
                .filter(|c| counts[**c as usize] > 0)
                .map(|c| (c.key().to_string(), json!(counts[*c as usize])))
                .collect();
            e["args"] = serde_json::Value::Object(args);
        }
        ev.push(e);
    };
    for tb in 0..g.time_bins {
        let cell = g.cell(row, slot, tb);
        let class = timeline::dominant(cell);
        let (start, _) = g.time_range(tb);
        match &mut run {
            Some((c, _, counts)) if *c == class => {
                for (acc, n) in counts.iter_mut().zip(cell) {
                    *acc += u64::from(*n);
                }
            }
            _ => {
                flush(&run, start, ev);
                run = Some((class, start, cell.map(u64::from)));
            }
        }
    }
    flush(&run, g.cycles, ev);
}

/// Link words per cycle sent by and arriving at this row's PEs, one sample per bin where the
/// value changes (a counter holds its value until the next sample).
fn counters(g: &Grid, row: usize, pes: u32, ev: &mut Vec<serde_json::Value>) {
    let (lo, hi) = g.pe_range(row);
    // Words arrive from the PE before `lo`, which may sit in another row.
    let prev_pe = (lo + pes - 1) % pes;
    let prev_row = (prev_pe / g.pes_per_bin) as usize;
    let n_pes = f64::from(hi - lo);
    let mut last: Option<(f64, Option<f64>)> = None;
    for tb in 0..g.time_bins {
        let (start, end) = g.time_range(tb);
        let busy = |r: usize| {
            let c = g.cell(r, 2, tb);
            u64::from(c.iter().sum::<u32>() - c[Class::Idle as usize])
        };
        let sent = busy(row);
        let len = (end - start) as f64 * n_pes;
        // Arrivals are exact only per PE: a group of PEs receives from a PE outside it.
        let received = (g.pes_per_bin == 1).then(|| busy(prev_row) as f64 / len);
        let v = (sent as f64 / len, received);
        if last != Some(v) {
            let mut args = json!({ "sent": v.0 });
            if let Some(r) = v.1 {
                args["received"] = json!(r);
            }
            ev.push(json!({"ph":"C","name":"link words/cycle","pid":row,"ts":start,"args":args}));
            last = Some(v);
        }
    }
}
