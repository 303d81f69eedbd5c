//! Loading emitted programs into the ISA's machine per the manifest, running them, and reading the
//! outputs back. Generic over the value domain, so numbers and symbolic values take the same path.

use crate::manifest::Manifest;
use isa::{Domain, Machine, Observer, Program, RunStats};
use std::collections::BTreeMap;

/// Why a directory could not be run. Faults stay typed so a checker (the verifier) can locate
/// them without parsing text.
#[derive(Debug, Clone, PartialEq)]
pub enum ExecError {
    /// The programs are not the ones the manifest describes.
    Setup(SetupError),
    /// An input tensor is unknown, missing or of the wrong size.
    Input(String),
    /// The machine refused the programs or a preload.
    Load(isa::LoadError),
    /// The loop machine refused the loop programs.
    LoopLoad(isa::LoopLoadError),
    /// Preloading an element of `tensor` failed.
    Preload {
        tensor: String,
        error: isa::LoadError,
    },
    /// The machine faulted while running.
    Fault(isa::Fault),
    /// The run finished but an output word was never written.
    Unwritten {
        tensor: String,
        index: usize,
        pe: u32,
        addr: u32,
    },
}

/// A mismatch between the programs and the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetupError {
    ProgramCount {
        manifest: u32,
        given: usize,
    },
    Identity {
        index: usize,
        pe: u32,
        pes: u32,
        manifest_pes: u32,
    },
    MemWords {
        pe: usize,
        program: u32,
        manifest: u32,
    },
    Cycles {
        manifest: u64,
        longest: u64,
    },
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SetupError::ProgramCount { manifest, given } => write!(
                f,
                "manifest says {manifest} PEs but {given} programs were given"
            ),
            SetupError::Identity {
                index,
                pe,
                pes,
                manifest_pes,
            } => write!(
                f,
                "program {index} says it is PE {pe} of {pes}, the manifest expects PE {index} of {manifest_pes}"
            ),
            SetupError::MemWords {
                pe,
                program,
                manifest,
            } => write!(
                f,
                "PE {pe}: program declares {program} memory words, the manifest {manifest}"
            ),
            SetupError::Cycles { manifest, longest } => write!(
                f,
                "manifest says {manifest} cycles but the longest program has {longest} bundles"
            ),
        }
    }
}

impl std::fmt::Display for ExecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExecError::Setup(e) => write!(f, "{e}"),
            ExecError::Input(s) => f.write_str(s),
            ExecError::Load(e) => write!(f, "{e}"),
            ExecError::LoopLoad(e) => write!(f, "{e}"),
            ExecError::Preload { tensor, error } => write!(f, "preloading `{tensor}`: {error}"),
            ExecError::Fault(e) => write!(f, "{e}"),
            ExecError::Unwritten {
                tensor,
                index,
                pe,
                addr,
            } => write!(
                f,
                "output `{tensor}` element {index} (PE {pe}, m{addr}) was never written"
            ),
        }
    }
}

impl std::error::Error for ExecError {}

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
    check_programs(&programs, manifest).map_err(ExecError::Setup)?;
    check_input_names(manifest, inputs)?;
    let mut machine = Machine::new(domain, programs).map_err(ExecError::Load)?;
    preload_all(manifest, inputs, |pe, addr, v| machine.preload(pe, addr, v))?;
    let stats = machine.run(observer).map_err(ExecError::Fault)?;
    let outputs = read_all(manifest, |pe, addr| machine.read(pe, addr).cloned())?;
    Ok(Outcome { outputs, stats })
}

/// [`execute`] for loop programs on `f32`, executed natively (in bulk where the loop machine
/// can prove the result equal to cycle-by-cycle execution). Returns the outcome and the number
/// of cycles run in bulk.
pub fn execute_loops(
    programs: Vec<isa::LoopProgram>,
    manifest: &Manifest,
    inputs: &BTreeMap<String, Vec<f32>>,
) -> Result<(Outcome<f32>, u64), ExecError> {
    check_loop_programs(&programs, manifest).map_err(ExecError::Setup)?;
    check_input_names(manifest, inputs)?;
    let mut machine =
        isa::LoopMachine::new(isa::F32Domain, programs).map_err(ExecError::LoopLoad)?;
    preload_all(manifest, inputs, |pe, addr, v| machine.preload(pe, addr, v))?;
    let stats = machine.run_fast().map_err(ExecError::Fault)?;
    let outputs = read_all(manifest, |pe, addr| machine.read(pe, addr).copied())?;
    Ok((Outcome { outputs, stats }, machine.bulk_cycles()))
}

fn check_input_names<V>(
    manifest: &Manifest,
    inputs: &BTreeMap<String, Vec<V>>,
) -> Result<(), ExecError> {
    for name in inputs.keys() {
        if !manifest.inputs.contains_key(name) {
            return Err(ExecError::Input(format!(
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
    Ok(())
}

fn preload_all<V: Clone>(
    manifest: &Manifest,
    inputs: &BTreeMap<String, Vec<V>>,
    mut preload: impl FnMut(u32, u32, V) -> Result<(), isa::LoadError>,
) -> Result<(), ExecError> {
    for (name, placement) in &manifest.inputs {
        let values = inputs
            .get(name)
            .ok_or_else(|| ExecError::Input(format!("missing input `{name}`")))?;
        if values.len() != placement.len() {
            return Err(ExecError::Input(format!(
                "input `{name}` has {} elements, the layer needs {}",
                values.len(),
                placement.len()
            )));
        }
        // Every element at its placement, then every copy of one (the same value again).
        for (i, pe, addr) in placement.preloads(manifest.pes) {
            let v = usize::try_from(i)
                .ok()
                .and_then(|i| values.get(i))
                .ok_or_else(|| {
                    ExecError::Input(format!(
                        "input `{name}` has a preload copy of element {i}, past its {} elements",
                        values.len()
                    ))
                })?;
            preload(pe, addr, v.clone()).map_err(|error| ExecError::Preload {
                tensor: name.clone(),
                error,
            })?;
        }
    }
    Ok(())
}

fn read_all<V>(
    manifest: &Manifest,
    read: impl Fn(u32, u32) -> Option<V>,
) -> Result<BTreeMap<String, Vec<V>>, ExecError> {
    let mut outputs = BTreeMap::new();
    for (name, placement) in &manifest.outputs {
        let mut vals = Vec::with_capacity(placement.len());
        for i in 0..placement.len() {
            let (pe, addr) = placement.locate(manifest.pes, i);
            let v = read(pe, addr).ok_or_else(|| ExecError::Unwritten {
                tensor: name.clone(),
                index: i,
                pe,
                addr,
            })?;
            vals.push(v);
        }
        outputs.insert(name.clone(), vals);
    }
    Ok(outputs)
}

/// The loop programs must be the ones the manifest describes (cycles from the loop structure).
pub fn check_loop_programs(
    programs: &[isa::LoopProgram],
    manifest: &Manifest,
) -> Result<(), SetupError> {
    check_identity(
        programs.iter().map(|p| (p.pe, p.pes, p.mem_words)),
        programs.len(),
        manifest,
    )?;
    let longest = programs.iter().map(|p| p.cycles()).max().unwrap_or(0);
    if longest != manifest.cycles {
        return Err(SetupError::Cycles {
            manifest: manifest.cycles,
            longest,
        });
    }
    Ok(())
}

fn check_identity(
    ids: impl Iterator<Item = (u32, u32, u32)>,
    count: usize,
    manifest: &Manifest,
) -> Result<(), SetupError> {
    if count != manifest.pes as usize {
        return Err(SetupError::ProgramCount {
            manifest: manifest.pes,
            given: count,
        });
    }
    for (i, (pe, pes, mem_words)) in ids.enumerate() {
        if pe as usize != i || pes != manifest.pes {
            return Err(SetupError::Identity {
                index: i,
                pe,
                pes,
                manifest_pes: manifest.pes,
            });
        }
        let declared = manifest.mem_words.get(i).copied().unwrap_or(0);
        if mem_words != declared {
            return Err(SetupError::MemWords {
                pe: i,
                program: mem_words,
                manifest: declared,
            });
        }
    }
    Ok(())
}

/// The programs must be the ones the manifest describes.
pub fn check_programs(programs: &[Program], manifest: &Manifest) -> Result<(), SetupError> {
    check_identity(
        programs.iter().map(|p| (p.pe, p.pes, p.mem_words)),
        programs.len(),
        manifest,
    )?;
    let longest = programs.iter().map(|p| p.bundles.len()).max().unwrap_or(0) as u64;
    if longest != manifest.cycles {
        return Err(SetupError::Cycles {
            manifest: manifest.cycles,
            longest,
        });
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
            let vals = (0..p.len())
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

#[cfg(test)]
mod tests {
    use super::*;
    use isa::{Bundle, F32Domain, NoObserver, Op};

    /// Two PEs, one element `x` at (PE 0, m0) and, with `copy`, also at (PE 1, m0); `y` at
    /// (PE 1, m1). Read as a file is read, so the manifest is checked too.
    fn manifest(copy: bool) -> Manifest {
        let copies = if copy {
            serde_json::json!([{ "index": 0, "pe": 1, "addr": 0 }])
        } else {
            serde_json::json!([])
        };
        let json = serde_json::json!({
            "format": crate::manifest::FORMAT,
            "format_version": crate::manifest::COPIES_FORMAT_VERSION,
            "layer": { "name": "l", "tokens": 1, "dim": 1, "heads": 1, "qkv": "shared",
                       "mask": "none", "scale": 1.0 },
            "pes": 2, "cycles": 1, "lower_bound": 2, "schedule": "s",
            "selection": { "chosen": "s", "reason": "r", "candidates": [] },
            "necessary_ops": 4,
            "ops": { "phase1_mac": 1, "phase2_exp": 1, "phase2_div": 1, "phase3_mac": 1 },
            "mem_words": [2, 2],
            "files": [ { "pe": 0, "text": "pe0.s", "binary": "pe0.bin" },
                       { "pe": 1, "text": "pe1.s", "binary": "pe1.bin" } ],
            "inputs": { "x": { "shape": [1, 1, 1], "pe": [0], "addr": [0], "copies": copies } },
            "outputs": { "y": { "shape": [1, 1, 1], "pe": [1], "addr": [1] } },
        });
        Manifest::from_json(&json.to_string()).unwrap()
    }

    /// PE 1 squares its m0 into m1; PE 0 does nothing.
    fn programs() -> Vec<Program> {
        (0..2)
            .map(|pe| Program {
                pe,
                pes: 2,
                mem_words: 2,
                bundles: vec![Bundle {
                    op: if pe == 1 {
                        Op::mul(0, 0, Some(1))
                    } else {
                        Op::Nop
                    },
                    ..Bundle::NOP
                }],
            })
            .collect()
    }

    #[test]
    fn copies_are_preloaded_with_their_element() {
        let inputs: BTreeMap<String, Vec<f32>> = [("x".to_string(), vec![3.0])].into();
        let out = execute(
            F32Domain,
            programs(),
            &manifest(true),
            &inputs,
            &mut NoObserver,
        )
        .unwrap();
        assert_eq!(out.outputs["y"], vec![9.0]);
        // Without the copy PE 1 reads a word nothing wrote.
        let e = execute(
            F32Domain,
            programs(),
            &manifest(false),
            &inputs,
            &mut NoObserver,
        )
        .err()
        .unwrap();
        assert!(matches!(e, ExecError::Fault(_)), "{e}");
    }

    #[test]
    fn a_copy_of_an_element_the_input_lacks_is_an_error_not_a_panic() {
        // Built in memory, past the reader's checks.
        let mut m = manifest(true);
        m.inputs.get_mut("x").unwrap().copies[0].index = 5;
        let inputs: BTreeMap<String, Vec<f32>> = [("x".to_string(), vec![3.0])].into();
        let e = execute(F32Domain, programs(), &m, &inputs, &mut NoObserver)
            .err()
            .unwrap();
        assert!(matches!(e, ExecError::Input(_)), "{e}");
    }
}
