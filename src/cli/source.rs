//! What `compile` and `optimal` share at the edge: reading and parsing the layer file, checking
//! the ring size, and turning programs and a manifest into the files of an output directory.

use super::outdir::Files;
use compiler::manifest::Manifest;
use std::path::{Path, PathBuf};

/// A parsed layer file.
pub struct Source {
    /// The file as given on the command line, for messages.
    pub name: String,
    pub text: String,
    pub layers: Vec<lang::Layer>,
}

/// Reads and parses `file`, printing every diagnostic to stderr; keeps only the layer named
/// `wanted` when given.
pub fn read_layers(file: &Path, wanted: Option<&str>) -> Result<Source, String> {
    let bytes = std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let name = file.display().to_string();
    let parsed = lang::parse_bytes(0, &bytes);
    let text = String::from_utf8_lossy(&bytes).into_owned();
    if !parsed.diagnostics.is_empty() {
        eprint!("{}", lang::render(&name, &text, &parsed.diagnostics));
    }
    if lang::has_errors(&parsed.diagnostics) {
        return Err(format!("{name}: could not compile due to the errors above"));
    }
    let mut layers = parsed.layers;
    if let Some(wanted) = wanted {
        layers.retain(|l| l.name == wanted);
        if layers.is_empty() {
            return Err(format!("{name}: no layer named `{wanted}`"));
        }
    }
    Ok(Source { name, text, layers })
}

/// The `--pes` argument, which clap leaves optional so that its absence gets our message.
pub fn ring_size(pes: Option<u32>) -> Result<u32, String> {
    match pes {
        None => Err("missing --pes M (the number of PEs in the ring)".into()),
        Some(0) => Err("--pes must be at least 1".into()),
        Some(m) if m > attnc::limits::MAX_PES => Err(format!(
            "--pes {m} exceeds the maximum ring size, {}",
            attnc::limits::MAX_PES
        )),
        Some(m) => Ok(m),
    }
}

/// The necessary operations of a layer (docs/scheduling.md), saturating on absurd sizes.
pub fn necessary_ops(layer: &lang::Layer) -> u64 {
    let shape = runtime::layer::Shape {
        heads: layer.heads,
        tokens: layer.tokens,
        dim: layer.dim,
        shared: layer.qkv == lang::Qkv::Shared,
        causal: layer.mask == lang::Mask::Causal,
        softmax: match layer.softmax {
            lang::Softmax::Safe => runtime::layer::Softmax::Safe,
            lang::Softmax::Plain => runtime::layer::Softmax::Plain,
        },
    };
    shape.necessary().map_or(u64::MAX, |n| n.total())
}

/// The most PEs `compile` and `optimal` accept for `layer`: one per necessary operation. The split
/// dataflow gives a PE work without a weight of its own (a share of a score's `d` products, a
/// softmax, a column of the weighted sum), so a ring may have more PEs than weights; a PE beyond
/// one per operation could only pass values on. Compile time stays bounded because every
/// scheduler tries a bounded number of layouts (the row dataflow's count of working PEs is searched
/// exhaustively only up to 64 PEs, on a geometric ladder above).
pub fn usable_pes(layer: &lang::Layer) -> u64 {
    necessary_ops(layer).max(1)
}

/// Refuses a ring larger than the layer can use, before any scheduling starts.
pub fn check_ring(layer: &lang::Layer, pes: u32) -> Result<(), String> {
    let most = usable_pes(layer);
    if u64::from(pes) <= most {
        return Ok(());
    }
    Err(format!(
        "--pes {pes} is more than this layer can use: layer `{}` has {most} necessary operations, so at most {most} PEs can hold any of its work; the others would only pass values on (use --pes {most} or fewer, or a larger layer)",
        layer.name
    ))
}

/// `pe<N>.s`, `pe<N>.bin` and `manifest.json` under `sub`, appended to `files`.
pub fn push_program_files(
    files: &mut Files,
    sub: &Path,
    programs: &[isa::Program],
    manifest: &Manifest,
) -> Result<(), String> {
    for p in programs {
        files.push((
            sub.join(format!("pe{}.s", p.pe)),
            p.to_string().into_bytes(),
        ));
        let bin = isa::encode(p).map_err(|e| format!("PE {}: {e}", p.pe))?;
        files.push((sub.join(format!("pe{}.bin", p.pe)), bin));
    }
    let json = manifest.to_json().map_err(|e| e.to_string())?;
    files.push((sub.join("manifest.json"), json.into_bytes()));
    Ok(())
}

/// Like [`push_program_files`] for loop programs (ISA format 3).
pub fn push_loop_files(
    files: &mut Files,
    sub: &Path,
    programs: &[isa::LoopProgram],
    manifest: &Manifest,
) -> Result<(), String> {
    for p in programs {
        files.push((sub.join(format!("pe{}.s", p.pe)), p.to_text().into_bytes()));
        let bin = isa::encode_looped(p).map_err(|e| format!("PE {}: {e}", p.pe))?;
        files.push((sub.join(format!("pe{}.bin", p.pe)), bin));
    }
    let json = manifest.to_json().map_err(|e| e.to_string())?;
    files.push((sub.join("manifest.json"), json.into_bytes()));
    Ok(())
}

/// Most bundles, summed over PEs, that verification flattens loop programs into: the symbolic
/// verifier runs one bundle at a time, so this bounds its time and memory like the operation
/// limit bounds an unrolled compile's.
pub const MAX_VERIFY_FLAT_BUNDLES: u64 = 8_000_000;

/// The flat programs loop programs stand for, for the verifier; refuses when they would exceed
/// [`MAX_VERIFY_FLAT_BUNDLES`].
pub fn flatten_for_proof(programs: &[isa::LoopProgram]) -> Result<Vec<isa::Program>, String> {
    let total: u64 = programs.iter().map(|p| p.cycles()).sum();
    if total > MAX_VERIFY_FLAT_BUNDLES {
        return Err(format!(
            "the loop programs stand for {total} bundles; the verifier proves loop programs by flattening them and takes at most {MAX_VERIFY_FLAT_BUNDLES}"
        ));
    }
    programs
        .iter()
        .map(|p| {
            p.flatten(MAX_VERIFY_FLAT_BUNDLES)
                .map_err(|e| format!("PE {}: {e}", p.pe))
        })
        .collect()
}

/// Proves the programs with the symbolic verifier. With `exact_ops` (the scheduler declares it
/// computes only necessary operations) the programs must run exactly the necessary operations;
/// otherwise the redundant products the manifest declares are accepted.
pub fn verify(
    programs: &[isa::Program],
    manifest: &Manifest,
    layer: &str,
    exact_ops: bool,
) -> Result<(), String> {
    let opts = verifier::Options {
        exact_ops,
        ..Default::default()
    };
    let report = verifier::verify_with(programs, manifest, &opts);
    if report.is_ok() {
        Ok(())
    } else {
        Err(format!(
            "internal compiler error: the emitted programs for `{layer}` failed verification (nothing written):\n{report}"
        ))
    }
}

/// The directory a layer's files go to: the output directory itself, or a subdirectory named
/// after the layer when the file holds several.
pub fn layer_subdir(several: bool, layer: &str) -> PathBuf {
    if several {
        PathBuf::from(layer)
    } else {
        PathBuf::new()
    }
}
