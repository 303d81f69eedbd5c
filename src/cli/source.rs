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
        Some(m) => Ok(m),
    }
}

/// `pe<N>.s`, `pe<N>.bin` and `manifest.json` under `sub`, appended to `files`.
pub fn push_program_files(
    files: &mut Files,
    sub: &Path,
    programs: &[isa::Program],
    manifest: &Manifest,
) {
    for p in programs {
        files.push((
            sub.join(format!("pe{}.s", p.pe)),
            p.to_string().into_bytes(),
        ));
        files.push((sub.join(format!("pe{}.bin", p.pe)), isa::encode(p)));
    }
    files.push((sub.join("manifest.json"), manifest.to_json().into_bytes()));
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
