//! `manifest.json`: what a larger toolchain needs to load and run the emitted programs.
//!
//! Versioned by [`FORMAT_VERSION`]; readers refuse other versions. Placement arrays are flat in C
//! order over `shape`, so element `[h][i][c]` of a tensor is at index `(h·tokens + i)·dim + c`.

use crate::schedule::OpCounts;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const FORMAT: &str = "attnc-manifest";
pub const FORMAT_VERSION: u32 = 1;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    pub format_version: u32,
    pub layer: LayerInfo,
    pub pes: u32,
    pub cycles: u64,
    pub lower_bound: u64,
    pub schedule: String,
    /// Which schedules were considered and why this one was chosen.
    pub selection: Selection,
    pub necessary_ops: u64,
    pub ops: OpCountsInfo,
    /// Memory words used by each PE's program.
    pub mem_words: Vec<u32>,
    pub files: Vec<PeFiles>,
    pub inputs: BTreeMap<String, Placement>,
    pub outputs: BTreeMap<String, Placement>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Selection {
    pub chosen: String,
    pub reason: String,
    pub candidates: Vec<CandidateInfo>,
}

/// One schedule the compiler built for this layer, with its exact cycle count.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CandidateInfo {
    pub schedule: String,
    pub cycles: u64,
    pub max_mem_words: u32,
    /// Within the `--mem` limit (always true without one).
    pub fits: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerInfo {
    pub name: String,
    pub tokens: u32,
    pub dim: u32,
    pub heads: u32,
    /// `"shared"` or `"separate"`.
    pub qkv: String,
    /// `"causal"` or `"none"`.
    pub mask: String,
    pub scale: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpCountsInfo {
    pub phase1_mac: u64,
    pub phase2_exp: u64,
    pub phase2_div: u64,
    pub phase3_mac: u64,
}

impl From<OpCounts> for OpCountsInfo {
    fn from(o: OpCounts) -> Self {
        OpCountsInfo {
            phase1_mac: o.phase1_mac,
            phase2_exp: o.phase2_exp,
            phase2_div: o.phase2_div,
            phase3_mac: o.phase3_mac,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeFiles {
    pub pe: u32,
    pub text: String,
    pub binary: String,
}

/// Where every element of one tensor lives.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    pub shape: Vec<usize>,
    pub pe: Vec<u32>,
    pub addr: Vec<u32>,
}

/// A manifest that cannot be trusted.
#[derive(Clone, Debug, PartialEq)]
pub struct ManifestError(pub String);

impl std::fmt::Display for ManifestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl Manifest {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a manifest always serialises")
    }

    /// Parses and checks a manifest: version, sizes and every placement entry in range.
    pub fn from_json(text: &str) -> Result<Manifest, ManifestError> {
        // Check the version before the full shape so an old or future file gets the right message.
        let raw: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| ManifestError(format!("not valid JSON: {e}")))?;
        match raw.get("format").and_then(|f| f.as_str()) {
            Some(FORMAT) => {}
            _ => {
                return Err(ManifestError(format!(
                    "not an {FORMAT} file (missing \"format\": \"{FORMAT}\")"
                )))
            }
        }
        match raw.get("format_version").and_then(|v| v.as_u64()) {
            Some(v) if v == u64::from(FORMAT_VERSION) => {}
            Some(v) => {
                return Err(ManifestError(format!(
                    "manifest format version {v} is not supported (this attnc reads version {FORMAT_VERSION})"
                )))
            }
            None => return Err(ManifestError("missing \"format_version\"".into())),
        }
        let m: Manifest = serde_json::from_value(raw)
            .map_err(|e| ManifestError(format!("malformed manifest: {e}")))?;
        m.validate()?;
        Ok(m)
    }

    fn validate(&self) -> Result<(), ManifestError> {
        let err = |s: String| Err(ManifestError(s));
        if self.pes == 0 {
            return err("pes is 0".into());
        }
        if self.mem_words.len() != self.pes as usize || self.files.len() != self.pes as usize {
            return err(format!(
                "expected {} entries in mem_words and files",
                self.pes
            ));
        }
        for (i, f) in self.files.iter().enumerate() {
            if f.pe as usize != i || !safe_name(&f.text) || !safe_name(&f.binary) {
                return err(format!("bad file entry for PE {i}"));
            }
        }
        if !["shared", "separate"].contains(&self.layer.qkv.as_str()) {
            return err(format!(
                "layer qkv is \"{}\", expected \"shared\" or \"separate\"",
                self.layer.qkv
            ));
        }
        if !["causal", "none"].contains(&self.layer.mask.as_str()) {
            return err(format!(
                "layer mask is \"{}\", expected \"causal\" or \"none\"",
                self.layer.mask
            ));
        }
        let scale32 = self.layer.scale as f32;
        if !(self.layer.scale > 0.0 && scale32.is_finite() && scale32 > 0.0) {
            return err(format!(
                "layer scale {} is not a positive number finite as a 32-bit float",
                self.layer.scale
            ));
        }
        let (h, n, d) = (
            self.layer.heads as usize,
            self.layer.tokens as usize,
            self.layer.dim as usize,
        );
        // Checked: a hostile manifest's sizes may multiply past usize.
        let Some(len) = h.checked_mul(n).and_then(|hn| hn.checked_mul(d)) else {
            return err(format!(
                "layer heads·tokens·dim = {h}·{n}·{d} is too large to count"
            ));
        };
        for (name, p) in self.inputs.iter().chain(&self.outputs) {
            if p.shape != [h, n, d] {
                return err(format!(
                    "tensor {name}: shape {:?} does not match the layer",
                    p.shape
                ));
            }
            if p.pe.len() != len || p.addr.len() != len {
                return err(format!("tensor {name}: placement needs {len} entries"));
            }
            for (&pe, &addr) in p.pe.iter().zip(&p.addr) {
                if pe >= self.pes || addr >= self.mem_words[pe as usize] {
                    return err(format!(
                        "tensor {name}: placement (PE {pe}, m{addr}) out of range"
                    ));
                }
            }
        }
        if !self.outputs.contains_key("y") {
            return err("no placement for output y".into());
        }
        Ok(())
    }
}

/// File names in a manifest must stay inside the output directory.
fn safe_name(s: &str) -> bool {
    !s.is_empty() && !s.contains(['/', '\\']) && s != "." && s != ".."
}
