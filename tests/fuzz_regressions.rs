//! Every input a fuzzing campaign found a failure with (`tests/fuzz_regressions/<target>_*`), run
//! through the property its target checks, so the fix stays fixed (docs/robustness.md).

use std::path::Path;

fn cases(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_regressions");
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{target}_")))
        })
        .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()))
        .collect();
    v.sort();
    v
}

/// The `manifest` target: a manifest that parses and passes `run`'s checks serialises and parses
/// back to itself (a float that did not round-trip through serde_json's default parser changed
/// the layer's scale by one ulp).
#[test]
fn manifest_cases_round_trip() {
    let all = cases("manifest");
    assert!(!all.is_empty());
    for (name, bytes) in all {
        let text = String::from_utf8(bytes).unwrap();
        let m = compiler::manifest::Manifest::from_json(&text)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(attnc::rundir::check_manifest(&m).is_ok(), "{name}");
        let again = compiler::manifest::Manifest::from_json(&m.to_json().unwrap()).unwrap();
        assert_eq!(again, m, "{name}");
        assert_eq!(
            again.layer.scale.to_bits(),
            m.layer.scale.to_bits(),
            "{name}"
        );
    }
}

/// The `npy` target: reading any bytes returns (no panic, and quickly: a header of nested `[`
/// used to send npyz's parser into exponential time, found as a libFuzzer timeout).
#[test]
fn npy_cases_return() {
    let all = cases("npy");
    assert!(!all.is_empty());
    for (name, bytes) in all {
        let r = attnc::npy::read_f32(&bytes, 1 << 20);
        let e = r.err().unwrap_or_else(|| panic!("{name}: accepted"));
        assert!(e.contains("structured dtype"), "{name}: {e}");
    }
}
