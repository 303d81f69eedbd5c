//! Writing an output directory all at once: everything goes into a fresh sibling directory that
//! is renamed into place only when complete, so a failed compile leaves nothing half-written.

use std::fs;
use std::path::{Path, PathBuf};

/// Files to write, relative to the output directory.
pub type Files = Vec<(PathBuf, Vec<u8>)>;

/// Replaces `dir` with exactly `files`. An existing `dir` is replaced only if it is empty or was
/// written by attnc (holds a `manifest.json` at its top or one level down).
pub fn write_atomically(dir: &Path, files: &Files) -> Result<(), String> {
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent).map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    if dir.exists() && !replaceable(dir) {
        return Err(format!(
            "{} exists and is not an attnc output directory; refusing to overwrite it",
            dir.display()
        ));
    }
    let staging = tempfile::Builder::new()
        .prefix(".attnc-out-")
        .tempdir_in(&parent)
        .map_err(|e| {
            format!(
                "cannot create a staging directory in {}: {e}",
                parent.display()
            )
        })?;
    for (rel, bytes) in files {
        let path = staging.path().join(rel);
        if let Some(p) = path.parent() {
            fs::create_dir_all(p).map_err(|e| format!("cannot create {}: {e}", p.display()))?;
        }
        fs::write(&path, bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    let staged = staging.keep();
    if dir.exists() {
        let old = tempfile::Builder::new()
            .prefix(".attnc-old-")
            .tempdir_in(&parent)
            .map_err(|e| format!("cannot create a directory in {}: {e}", parent.display()))?
            .keep();
        fs::remove_dir(&old).ok();
        fs::rename(dir, &old).map_err(|e| format!("cannot move {} aside: {e}", dir.display()))?;
        if let Err(e) = fs::rename(&staged, dir) {
            fs::rename(&old, dir).ok();
            fs::remove_dir_all(&staged).ok();
            return Err(format!(
                "cannot move the output into {}: {e}",
                dir.display()
            ));
        }
        fs::remove_dir_all(&old).ok();
    } else if let Err(e) = fs::rename(&staged, dir) {
        fs::remove_dir_all(&staged).ok();
        return Err(format!(
            "cannot move the output into {}: {e}",
            dir.display()
        ));
    }
    Ok(())
}

fn replaceable(dir: &Path) -> bool {
    let Ok(entries) = fs::read_dir(dir) else {
        return false;
    };
    let entries: Vec<_> = entries.flatten().collect();
    entries.is_empty()
        || dir.join("manifest.json").is_file()
        || entries
            .iter()
            .all(|e| e.path().join("manifest.json").is_file())
}
