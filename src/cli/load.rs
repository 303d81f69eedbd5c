//! Reading an emitted directory back: manifest plus one program per PE, binary preferred.

use compiler::manifest::Manifest;
use isa::Program;
use std::fs;
use std::path::Path;

pub struct Loaded {
    pub manifest: Manifest,
    pub programs: Vec<Program>,
    /// `"binary"` or `"text"`: which files the programs came from.
    pub source: &'static str,
}

pub fn load_dir(dir: &Path) -> Result<Loaded, String> {
    if !dir.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    let mpath = dir.join("manifest.json");
    let text = fs::read(&mpath).map_err(|e| format!("cannot read {}: {e}", mpath.display()))?;
    let text =
        String::from_utf8(text).map_err(|_| format!("{}: not UTF-8 text", mpath.display()))?;
    let manifest = Manifest::from_json(&text).map_err(|e| format!("{}: {e}", mpath.display()))?;
    let all_binary = manifest.files.iter().all(|f| dir.join(&f.binary).is_file());
    let mut programs = Vec::with_capacity(manifest.files.len());
    for f in &manifest.files {
        let program = if all_binary {
            let path = dir.join(&f.binary);
            let bytes =
                fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            isa::decode(&bytes).map_err(|e| format!("{}: {e}", path.display()))?
        } else {
            let path = dir.join(&f.text);
            let bytes =
                fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            let text = String::from_utf8(bytes)
                .map_err(|_| format!("{}: not UTF-8 text", path.display()))?;
            isa::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?
        };
        // attnc pads every PE to the full length, so a short program is a cut-off file.
        if program.bundles.len() as u64 != manifest.cycles {
            let name = if all_binary { &f.binary } else { &f.text };
            return Err(format!(
                "{}: {} bundles, but the manifest says the program runs {} cycles (truncated file?)",
                dir.join(name).display(),
                program.bundles.len(),
                manifest.cycles
            ));
        }
        programs.push(program);
    }
    compiler::exec::check_programs(&programs, &manifest)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(Loaded {
        manifest,
        programs,
        source: if all_binary { "binary" } else { "text" },
    })
}
