//! Loading emitted programs into the ISA's machine per the manifest, running them, and reading the
//! outputs back. Generic over the value domain, so numbers and symbolic values take the same path.

use crate::manifest::Manifest;
use isa::{Domain, Machine, Observer, Program, RunStats};
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq)]
pub struct ExecError(pub String);

impl std::fmt::Display for ExecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The outputs of one run, flat in the manifest's C order, and the machine's statistics.
pub struct Outcome<V> {
    pub outputs: BTreeMap<String, Vec<V>>,
    pub stats: RunStats,
}

/// Preloads `inputs` (one flat array per input tensor the manifest names), runs to the end and
/// reads every output element from where the manifest says it is.
pub fn execute<D: Domain>(
    domain: D,
    programs: Vec<Program>,
    manifest: &Manifest,
    inputs: &BTreeMap<String, Vec<D::Value>>,
    observer: &mut impl Observer,
) -> Result<Outcome<D::Value>, ExecError> {
    check_programs(&programs, manifest)?;
    for name in inputs.keys() {
        if !manifest.inputs.contains_key(name) {
            return Err(ExecError(format!(
                "this layer takes no input named `{name}` (it takes: {})",
                manifest
                    .inputs
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    let mut machine = Machine::new(domain, programs).map_err(|e| ExecError(e.to_string()))?;
    for (name, placement) in &manifest.inputs {
        let values = inputs
            .get(name)
            .ok_or_else(|| ExecError(format!("missing input `{name}`")))?;
        if values.len() != placement.pe.len() {
            return Err(ExecError(format!(
                "input `{name}` has {} elements, the layer needs {}",
                values.len(),
                placement.pe.len()
            )));
        }
        for ((&pe, &addr), v) in placement.pe.iter().zip(&placement.addr).zip(values) {
            machine
                .preload(pe, addr, v.clone())
                .map_err(|e| ExecError(format!("preloading `{name}`: {e}")))?;
        }
    }
    let stats = machine
        .run(observer)
        .map_err(|f| ExecError(f.to_string()))?;
    let mut outputs = BTreeMap::new();
    for (name, placement) in &manifest.outputs {
        let mut vals = Vec::with_capacity(placement.pe.len());
        for (i, (&pe, &addr)) in placement.pe.iter().zip(&placement.addr).enumerate() {
            let v = machine.read(pe, addr).ok_or_else(|| {
                ExecError(format!(
                    "output `{name}` element {i} (PE {pe}, m{addr}) was never written"
                ))
            })?;
            vals.push(v.clone());
        }
        outputs.insert(name.clone(), vals);
    }
    Ok(Outcome { outputs, stats })
}

/// The programs must be the ones the manifest describes.
pub fn check_programs(programs: &[Program], manifest: &Manifest) -> Result<(), ExecError> {
    if programs.len() != manifest.pes as usize {
        return Err(ExecError(format!(
            "manifest says {} PEs but {} programs were given",
            manifest.pes,
            programs.len()
        )));
    }
    for (i, p) in programs.iter().enumerate() {
        if p.pe as usize != i || p.pes != manifest.pes {
            return Err(ExecError(format!(
                "program {i} says it is PE {} of {}, the manifest expects PE {i} of {}",
                p.pe, p.pes, manifest.pes
            )));
        }
        if p.mem_words != manifest.mem_words[i] {
            return Err(ExecError(format!(
                "PE {i}: program declares {} memory words, the manifest {}",
                p.mem_words, manifest.mem_words[i]
            )));
        }
    }
    let longest = programs.iter().map(|p| p.bundles.len()).max().unwrap_or(0) as u64;
    if longest != manifest.cycles {
        return Err(ExecError(format!(
            "manifest says {} cycles but the longest program has {longest} bundles",
            manifest.cycles
        )));
    }
    Ok(())
}

/// Seeded standard-normal inputs for every input tensor the manifest names.
pub fn random_inputs(manifest: &Manifest, seed: u64) -> BTreeMap<String, Vec<f32>> {
    use rand::SeedableRng;
    use rand_distr::{Distribution, StandardNormal};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    manifest
        .inputs
        .iter()
        .map(|(name, p)| {
            let vals = (0..p.pe.len())
                .map(|_| StandardNormal.sample(&mut rng))
                .collect();
            (name.clone(), vals)
        })
        .collect()
}

/// The reference output `y` for `inputs` under the manifest's layer.
pub fn reference_output(
    manifest: &Manifest,
    inputs: &BTreeMap<String, Vec<f32>>,
) -> Option<Vec<f64>> {
    let l = &manifest.layer;
    let layer = crate::reference::RefLayer {
        heads: l.heads as usize,
        tokens: l.tokens as usize,
        dim: l.dim as usize,
        scale: l.scale,
        causal: l.mask == "causal",
    };
    let get = |a: &str, b: &str| inputs.get(a).or_else(|| inputs.get(b));
    let q = get("q", "x")?;
    let k = get("k", "x")?;
    let v = get("v", "x")?;
    Some(crate::reference::attention(&layer, q, k, v))
}

/// Largest absolute difference between an f32 result and the f64 reference.
pub fn max_abs_err(got: &[f32], want: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - w).abs())
        .fold(
            0.0,
            |m, e| if e.is_nan() { f64::INFINITY } else { m.max(e) },
        )
}
