//! Loading an emitted directory from its files and running it, with every size checked before
//! it is trusted. The files come through [`DirFiles`], so the directory may be on disk (the CLI)
//! or in memory (tests, fuzz targets).

use crate::limits::{MAX_MANIFEST_BYTES, MAX_PES, MAX_PROGRAM_BYTES, MAX_RUN_WORDS};
use isa::Program;
use runtime::manifest::{Manifest, ProgramKind};
use std::borrow::Cow;
use std::collections::BTreeMap;

/// Largest total size of the program files of one directory: twice the binary encoding of the
/// largest layer attnc compiles, so a manifest cannot make `run` read terabytes by naming many
/// large files.
pub const MAX_TOTAL_PROGRAM_BYTES: u64 = 4 << 30;

/// Most bundles, summed over PEs, that loading flattens loop programs into for the tools that
/// work cycle by cycle (trace, show, the symbolic verifier).
pub const MAX_FLATTENED_BUNDLES: u64 = 8_000_000;

/// Read access to the files of one output directory.
pub trait DirFiles {
    /// Size in bytes of `name`, or `None` when it is absent (or not a regular file).
    fn size(&self, name: &str) -> Option<u64>;
    /// The contents of `name`.
    fn read(&self, name: &str) -> Result<Vec<u8>, String>;
    /// How to name `name` in messages.
    fn display(&self, name: &str) -> String;
}

/// An in-memory directory.
impl DirFiles for BTreeMap<String, Vec<u8>> {
    fn size(&self, name: &str) -> Option<u64> {
        self.get(name).map(|b| b.len() as u64)
    }
    fn read(&self, name: &str) -> Result<Vec<u8>, String> {
        self.get(name)
            .cloned()
            .ok_or_else(|| format!("{name}: no such file"))
    }
    fn display(&self, name: &str) -> String {
        name.to_string()
    }
}

pub struct Loaded {
    pub manifest: Manifest,
    /// The flat programs of the files; empty when they hold loop programs (see
    /// [`Loaded::flat`]).
    pub programs: Vec<Program>,
    /// The loop programs, when the manifest says the files hold them; empty otherwise.
    pub loops: Vec<isa::LoopProgram>,
    /// `"binary"` or `"text"`: which files the programs came from.
    pub source: &'static str,
}

impl Loaded {
    /// The flat programs with a manifest whose placements are per element: what the tools that
    /// work cycle by cycle (verifier, trace, show, inspect) take. Loop programs qualify when
    /// they were small enough to flatten on loading.
    ///
    /// Loop programs are flattened here, on demand: `run` executes them natively and never
    /// needs the flat form, which takes tens of bytes per bundle.
    pub fn flat(&self) -> Result<(Cow<'_, [Program]>, Cow<'_, Manifest>), String> {
        if self.loops.is_empty() {
            return Ok((Cow::Borrowed(&self.programs), Cow::Borrowed(&self.manifest)));
        }
        let total: u64 = self.loops.iter().map(|p| p.cycles()).sum();
        if total > MAX_FLATTENED_BUNDLES {
            return Err(format!(
                "the loop programs stand for {total} bundles, more than the {MAX_FLATTENED_BUNDLES} attnc flattens for cycle-by-cycle tools"
            ));
        }
        let programs = self
            .loops
            .iter()
            .map(|p| {
                p.flatten(MAX_FLATTENED_BUNDLES)
                    .map_err(|e| format!("PE {}: {e}", p.pe))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut m = self.manifest.clone();
        for p in m.inputs.values_mut().chain(m.outputs.values_mut()) {
            *p = p.expanded(self.manifest.pes);
        }
        Ok((Cow::Owned(programs), Cow::Owned(m)))
    }
}

/// Reads and checks the manifest and one program per PE (binary preferred, text when any binary
/// is missing).
pub fn load(files: &impl DirFiles) -> Result<Loaded, String> {
    let mname = "manifest.json";
    let mshow = files.display(mname);
    let size = files
        .size(mname)
        .ok_or_else(|| format!("cannot read {mshow}: no such file"))?;
    if size > MAX_MANIFEST_BYTES {
        return Err(format!(
            "{mshow}: {size} bytes, more than the {MAX_MANIFEST_BYTES} a manifest may have"
        ));
    }
    let text =
        String::from_utf8(files.read(mname)?).map_err(|_| format!("{mshow}: not UTF-8 text"))?;
    let manifest = Manifest::from_json(&text).map_err(|e| format!("{mshow}: {e}"))?;
    check_manifest(&manifest).map_err(|e| format!("{mshow}: {e}"))?;

    let listed = manifest.files.list(manifest.pes);
    let all_binary = listed.iter().all(|f| files.size(&f.binary).is_some());
    // Sizes first: nothing is read unless the whole set fits the limits and, for binaries, has
    // exactly the length the manifest's cycle count implies.
    let mut total: u64 = 0;
    for f in &listed {
        let name = if all_binary { &f.binary } else { &f.text };
        let show = files.display(name);
        let size = files
            .size(name)
            .ok_or_else(|| format!("cannot read {show}: no such file"))?;
        if size > MAX_PROGRAM_BYTES {
            return Err(format!(
                "{show}: {size} bytes, more than the {MAX_PROGRAM_BYTES} a program file may have"
            ));
        }
        if all_binary && manifest.programs == ProgramKind::Flat {
            // One record size per format version; the decoder then checks the version itself.
            let sizes = [isa::binary::BUNDLE_BYTES, isa::binary::BUNDLE_BYTES_V2]
                .map(|record| binary_size(manifest.cycles, record));
            if !sizes.contains(&Some(size)) {
                return Err(format!(
                    "{show}: {size} bytes, but a program of {} cycles takes {} (truncated or altered file?)",
                    manifest.cycles,
                    sizes[0].map_or("more than can be counted".to_string(), |w| {
                        let v2 = sizes[1].map_or(String::new(), |v| format!(" or {v}"));
                        format!("{w}{v2}")
                    })
                ));
            }
        }
        total = total.saturating_add(size);
        if total > MAX_TOTAL_PROGRAM_BYTES {
            return Err(format!(
                "the program files add up to more than {MAX_TOTAL_PROGRAM_BYTES} bytes"
            ));
        }
    }
    if manifest.programs == ProgramKind::Loops {
        let mut loops = Vec::with_capacity(listed.len());
        for f in &listed {
            let name = if all_binary { &f.binary } else { &f.text };
            let show = files.display(name);
            let bytes = files.read(name)?;
            let program = if all_binary {
                isa::decode_looped(&bytes).map_err(|e| format!("{show}: {e}"))?
            } else {
                let text =
                    String::from_utf8(bytes).map_err(|_| format!("{show}: not UTF-8 text"))?;
                isa::parse_looped(&text).map_err(|e| format!("{show}: {e}"))?
            };
            program
                .validate()
                .map_err(|e| format!("{show}: invalid loop program: {e}"))?;
            loops.push(program);
        }
        runtime::exec::check_loop_programs(&loops, &manifest).map_err(|e| e.to_string())?;
        return Ok(Loaded {
            manifest,
            programs: Vec::new(),
            loops,
            source: if all_binary { "binary" } else { "text" },
        });
    }
    let mut programs = Vec::with_capacity(listed.len());
    for f in &listed {
        let name = if all_binary { &f.binary } else { &f.text };
        let show = files.display(name);
        let bytes = files.read(name)?;
        let program = if all_binary {
            isa::decode(&bytes).map_err(|e| format!("{show}: {e}"))?
        } else {
            let text = String::from_utf8(bytes).map_err(|_| format!("{show}: not UTF-8 text"))?;
            isa::parse(&text).map_err(|e| format!("{show}: {e}"))?
        };
        // attnc pads every PE to the full length, so a short program is a cut-off file.
        if program.bundles.len() as u64 != manifest.cycles {
            return Err(format!(
                "{show}: {} bundles, but the manifest says the program runs {} cycles (truncated file?)",
                program.bundles.len(),
                manifest.cycles
            ));
        }
        programs.push(program);
    }
    runtime::exec::check_programs(&programs, &manifest).map_err(|e| e.to_string())?;
    Ok(Loaded {
        manifest,
        programs,
        loops: Vec::new(),
        source: if all_binary { "binary" } else { "text" },
    })
}

fn binary_size(cycles: u64, record: usize) -> Option<u64> {
    let header = isa::binary::HEADER_BYTES as u64 + isa::binary::CHECKSUM_BYTES as u64;
    cycles.checked_mul(record as u64)?.checked_add(header)
}

/// The necessary operations of the layer a manifest describes (saturating: a manifest claiming
/// an absurd layer gets a count no program can hold).
pub fn necessary_ops(m: &Manifest) -> u64 {
    let shape = runtime::layer::Shape {
        heads: m.layer.heads,
        tokens: m.layer.tokens,
        dim: m.layer.dim,
        shared: m.layer.qkv == "shared",
        causal: m.layer.mask == "causal",
        softmax: m.layer.softmax().unwrap_or_default(),
    };
    shape
        .necessary_as(m.normalisation)
        .map_or(u64::MAX, |n| n.total())
}

/// What `run` needs beyond the manifest's own validation, before any program is read: sizes
/// within the language's limits, the input tensors the layer's `qkv` implies, and programs long
/// enough to do the layer's work. The last ties the reference's cost (about the layer's
/// operation count) to the program files actually present, so a small directory cannot claim a
/// huge layer and send `run` into minutes of reference arithmetic.
pub fn check_manifest(m: &Manifest) -> Result<(), String> {
    let l = &m.layer;
    if m.pes > MAX_PES {
        return Err(format!("pes {} exceeds the maximum of {MAX_PES}", m.pes));
    }
    for (what, v, max) in [
        ("tokens", l.tokens, lang::check::MAX_TOKENS),
        ("dim", l.dim, lang::check::MAX_DIM),
        ("heads", l.heads, lang::check::MAX_HEADS),
    ] {
        if v == 0 || u64::from(v) > max {
            return Err(format!("layer {what} = {v} is outside 1..={max}"));
        }
    }
    let want: &[&str] = if l.qkv == "shared" {
        &["x"]
    } else {
        &["k", "q", "v"]
    };
    let have: Vec<&str> = m.inputs.keys().map(String::as_str).collect();
    if have != want {
        return Err(format!(
            "a layer with qkv = {} takes inputs {want:?}, the manifest places {have:?}",
            l.qkv
        ));
    }
    let outs: Vec<&str> = m.outputs.keys().map(String::as_str).collect();
    if outs != ["y"] {
        return Err(format!(
            "the layer has one output, y; the manifest places {outs:?}"
        ));
    }
    let ops = necessary_ops(m);
    let slots = m.cycles.saturating_mul(u64::from(m.pes));
    if ops > slots {
        return Err(format!(
            "the layer needs {ops} operations but {} PEs × {} cycles leave room for only {slots}; the manifest does not describe these programs",
            m.pes, m.cycles
        ));
    }
    // Every memory word a program uses is preloaded or written by a bundle (at most one op
    // result, one accumulator result and one incoming transfer per cycle).
    let preloaded: u64 = m
        .inputs
        .values()
        .map(|p| p.len() as u64 + p.copies.len() as u64)
        .sum();
    let words: u64 = m.mem_words.iter().map(|&w| u64::from(w)).sum();
    if words > MAX_RUN_WORDS {
        return Err(format!(
            "mem_words add up to {words} words, more than the {MAX_RUN_WORDS} attnc loads"
        ));
    }
    let bound = preloaded.saturating_add(slots.saturating_mul(3));
    if words > bound {
        return Err(format!(
            "mem_words add up to {words}, more than these programs can use ({bound})"
        ));
    }
    Ok(())
}

/// How a result compares with the reference under `|y - ref| <= atol + rtol·max|ref|`: the rule
/// of `numpy.allclose` with the relative part taken from the largest reference element rather
/// than each element's own. An output is a weighted average of values, so its f32 rounding error
/// scales with the values' magnitude; an element that cancels to near zero carries the same
/// absolute error as its large neighbours, and a per-element relative tolerance would reject it.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// Largest `|y - ref|` (infinite when some element is NaN or infinite).
    pub max_abs_err: f64,
    /// The first element, in C order, outside the tolerance, with its value and the reference.
    pub worst: Option<(usize, f32, f64)>,
}

impl Comparison {
    pub fn pass(&self) -> bool {
        self.worst.is_none()
    }
}

pub fn compare(got: &[f32], want: &[f64], atol: f64, rtol: f64) -> Comparison {
    let mut max_abs_err = 0.0f64;
    let mut worst = None;
    let scale = want.iter().fold(0.0f64, |m, w| m.max(w.abs()));
    let bound = atol + rtol * scale;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let e = (f64::from(g) - w).abs();
        let e = if e.is_nan() { f64::INFINITY } else { e };
        max_abs_err = max_abs_err.max(e);
        // Written so that a NaN anywhere (or a NaN bound) counts as outside.
        let inside = matches!(
            e.partial_cmp(&bound),
            Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal)
        );
        if !inside && worst.is_none() {
            worst = Some((i, g, w));
        }
    }
    if got.len() != want.len() && worst.is_none() {
        worst = Some((got.len().min(want.len()), f32::NAN, f64::NAN));
        max_abs_err = f64::INFINITY;
    }
    Comparison { max_abs_err, worst }
}

/// Checks a tolerance given on the command line: a finite, non-negative number.
pub fn parse_tolerance(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("expected a number, got `{s}`"))?;
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(format!("expected a finite, non-negative number, got `{s}`"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allclose_rule() {
        // |1000.0001 - 1000| = 1e-4 > atol 1e-5 but within rtol·1000 = 1e-2.
        assert!(compare(&[1000.0001], &[1000.0], 1e-5, 1e-5).pass());
        assert!(!compare(&[1.001], &[1.0], 1e-4, 1e-5).pass());
        // The relative part comes from the largest element: an element that cancelled to near
        // zero beside large ones gets the same allowance.
        assert!(compare(&[1000.0, 0.005], &[1000.0, 0.0], 1e-4, 1e-5).pass());
        assert!(!compare(&[1000.0, 0.02], &[1000.0, 0.0], 1e-4, 1e-5).pass());
        let c = compare(&[0.0, f32::NAN], &[0.0, 1.0], 1e-4, 1e-5);
        assert_eq!(c.worst.map(|w| w.0), Some(1));
        assert!(c.max_abs_err.is_infinite());
    }

    #[test]
    fn tolerances() {
        assert_eq!(parse_tolerance("1e-3"), Ok(1e-3));
        for bad in ["nan", "inf", "-1e-4", "x", "-inf"] {
            assert!(parse_tolerance(bad).is_err(), "{bad}");
        }
    }
}
