//! `manifest.json`: what a larger toolchain needs to load and run the emitted programs.
//!
//! Versioned by [`FORMAT_VERSION`]; readers refuse other versions. Placement arrays are flat in C
//! order over `shape`, so element `[h][i][c]` of a tensor is at index `(h·tokens + i)·dim + c`.

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
    /// `"safe"` or `"plain"` (see [`crate::layer::Softmax`]). Written only for `safe`, so a
    /// plain layer's manifest is the one attnc wrote before the field existed, and a manifest
    /// without it (any older one) reads as plain.
    #[serde(default = "plain", skip_serializing_if = "is_plain")]
    pub softmax: String,
}

fn plain() -> String {
    crate::layer::Softmax::Plain.name().into()
}

fn is_plain(s: &str) -> bool {
    s == crate::layer::Softmax::Plain.name()
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl LayerInfo {
    /// The formulation, or `None` for a name this reader does not know (refused on read).
    pub fn softmax(&self) -> Option<crate::layer::Softmax> {
        crate::layer::Softmax::from_name(&self.softmax)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpCountsInfo {
    pub phase1_mac: u64,
    pub phase2_exp: u64,
    pub phase2_div: u64,
    pub phase3_mac: u64,
    /// Row maxima of a safe softmax; absent (0) for a plain one.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub phase2_max: u64,
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
        if self.layer.softmax().is_none() {
            return err(format!(
                "layer.softmax is \"{}\"; expected \"safe\" or \"plain\"",
                self.layer.softmax
            ));
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
        let (h, n, d) = (
            self.layer.heads as usize,
            self.layer.tokens as usize,
            self.layer.dim as usize,
        );
        for (name, p) in self.inputs.iter().chain(&self.outputs) {
            if p.shape != [h, n, d] {
                return err(format!(
                    "tensor {name}: shape {:?} does not match the layer",
                    p.shape
                ));
            }
            let len = h * n * d;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(softmax: &str, max_ops: u64) -> Manifest {
        let place = || Placement {
            shape: vec![1, 1, 1],
            pe: vec![0],
            addr: vec![0],
        };
        Manifest {
            format: FORMAT.into(),
            format_version: FORMAT_VERSION,
            layer: LayerInfo {
                name: "l".into(),
                tokens: 1,
                dim: 1,
                heads: 1,
                qkv: "shared".into(),
                mask: "none".into(),
                scale: 1.0,
                softmax: softmax.into(),
            },
            pes: 1,
            cycles: 1,
            lower_bound: 1,
            schedule: "s".into(),
            selection: Selection {
                chosen: "s".into(),
                reason: "r".into(),
                candidates: Vec::new(),
            },
            necessary_ops: 4,
            ops: OpCountsInfo {
                phase1_mac: 1,
                phase2_exp: 1,
                phase2_div: 1,
                phase3_mac: 1,
                phase2_max: max_ops,
            },
            mem_words: vec![1],
            files: vec![PeFiles {
                pe: 0,
                text: "pe0.s".into(),
                binary: "pe0.bin".into(),
            }],
            inputs: [("x".to_string(), place())].into(),
            outputs: [("y".to_string(), place())].into(),
        }
    }

    #[test]
    fn plain_is_written_as_before_and_an_absent_field_reads_as_plain() {
        let json = manifest("plain", 0).to_json();
        assert!(!json.contains("softmax"), "{json}");
        assert!(!json.contains("phase2_max"), "{json}");
        let back = Manifest::from_json(&json).unwrap();
        assert_eq!(back.layer.softmax(), Some(crate::layer::Softmax::Plain));
        assert_eq!(back.ops.phase2_max, 0);
    }

    #[test]
    fn safe_is_recorded_and_round_trips() {
        let json = manifest("safe", 3).to_json();
        assert!(json.contains("\"softmax\": \"safe\""), "{json}");
        assert!(json.contains("\"phase2_max\": 3"), "{json}");
        let back = Manifest::from_json(&json).unwrap();
        assert_eq!(back, manifest("safe", 3));
    }

    #[test]
    fn unknown_formulation_and_unknown_fields_are_refused() {
        let json = manifest("safe", 0)
            .to_json()
            .replace("\"safe\"", "\"fast\"");
        let e = Manifest::from_json(&json).unwrap_err();
        assert!(e.0.contains("layer.softmax is \"fast\""), "{e}");
        let json = manifest("safe", 0)
            .to_json()
            .replace("\"softmax\"", "\"softmax\": \"safe\", \"online\"");
        let e = Manifest::from_json(&json).unwrap_err();
        assert!(e.0.contains("unknown field"), "{e}");
    }
}
