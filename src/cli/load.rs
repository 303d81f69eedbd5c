//! Reading an emitted directory back from disk: the checks and decoding are in
//! [`attnc::rundir`]; this is only the file access.

pub use attnc::rundir::Loaded;
use attnc::rundir::{self, DirFiles};
use std::fs;
use std::path::{Path, PathBuf};

struct Disk(PathBuf);

impl DirFiles for Disk {
    fn size(&self, name: &str) -> Option<u64> {
        fs::metadata(self.0.join(name))
            .ok()
            .filter(|m| m.is_file())
            .map(|m| m.len())
    }
    fn read(&self, name: &str) -> Result<Vec<u8>, String> {
        let path = self.0.join(name);
        fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))
    }
    fn display(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }
}

pub fn load_dir(dir: &Path) -> Result<Loaded, String> {
    if !dir.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    rundir::load(&Disk(dir.to_path_buf())).map_err(|e| {
        // Errors about the set of programs as a whole name the directory.
        if e.contains(&dir.display().to_string()) {
            e
        } else {
            format!("{}: {e}", dir.display())
        }
    })
}
