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

pub use attnc::limits::{check_exact_ring, check_ring};

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
