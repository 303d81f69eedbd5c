//! Writing an output directory all at once: everything goes into a fresh sibling directory that
//! is renamed into place only when complete, so a failed compile leaves nothing half-written.
//!
//! attnc only ever removes or replaces what it can prove it wrote:
//! * the target is replaced only if it is empty or is an attnc output directory (see [`owned`]);
//! * sibling staging entries (`.attnc-out-<pid>-*`, `.attnc-old-<pid>-*`) left by a process that
//!   was killed are removed by the next write in the same place, but only when the pid in the
//!   name is no longer running and the entry holds nothing attnc would not have written.

use compiler::manifest::Manifest;
use std::fs;
use std::path::{Path, PathBuf};

/// Files to write, relative to the output directory.
pub type Files = Vec<(PathBuf, Vec<u8>)>;

const STAGING_PREFIX: &str = ".attnc-out-";
const OLD_PREFIX: &str = ".attnc-old-";

/// Largest manifest the ownership check reads, so that checking never loads an arbitrary huge
/// file; the manifests of the largest layers attnc compiles are far smaller.
const MAX_OWNED_MANIFEST_BYTES: u64 = 1 << 30;

/// Replaces `dir` with exactly `files`. An existing `dir` is replaced only if attnc can prove it
/// wrote it ([`check_target`]).
pub fn write_atomically(dir: &Path, files: &Files) -> Result<(), String> {
    let (parent, _) = split_target(dir)?;
    fs::create_dir_all(&parent).map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    clean_stale(&parent);
    let existed = check_target(dir)?;
    let staging = tempfile::Builder::new()
        .prefix(&format!("{STAGING_PREFIX}{}-", std::process::id()))
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
    // From here on the staging directory is removed by hand on failure (or by the next run if
    // this process is killed).
    let staged = staging.keep();
    let fail = |msg: String| {
        fs::remove_dir_all(&staged).ok();
        Err(msg)
    };
    if existed {
        // Checked again right before the move: a file may have been added meanwhile.
        if let Err(e) = check_target(dir) {
            return fail(e);
        }
        let old = parent.join(format!(
            "{OLD_PREFIX}{}-{}",
            std::process::id(),
            unique_suffix()
        ));
        if let Err(e) = fs::rename(dir, &old) {
            return fail(format!("cannot move {} aside: {e}", dir.display()));
        }
        if let Err(e) = fs::rename(&staged, dir) {
            fs::rename(&old, dir).ok();
            return fail(format!(
                "cannot move the output into {}: {e}",
                dir.display()
            ));
        }
        // Checked once more: a file written into the directory after the check above moved
        // aside with it and must not be deleted.
        if owned(&old, true).is_ok() {
            fs::remove_dir_all(&old).ok();
        } else {
            eprintln!(
                "warning: {} changed while being replaced; its previous contents are kept in {}",
                dir.display(),
                old.display()
            );
        }
    } else if let Err(e) = fs::rename(&staged, dir) {
        return fail(format!(
            "cannot move the output into {}: {e}",
            dir.display()
        ));
    }
    Ok(())
}

/// The directory the target lives in and the target's own name. Paths without a last name
/// (`.`, `..`, `/`, `dir/..`) are refused: replacing the directory a path walks through (often
/// the current one) is never what was meant.
pub fn split_target(dir: &Path) -> Result<(PathBuf, String), String> {
    let Some(name) = dir.file_name() else {
        return Err(format!(
            "-o {}: the output must be a directory name attnc can create or replace (for example `-o out`), not `.`, `..` or `/`",
            dir.display()
        ));
    };
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((parent, name.to_string_lossy().into_owned()))
}

/// Checks that `dir` may be written: it is absent (`Ok(false)`), or it is a directory attnc
/// wrote, or an empty one (`Ok(true)`). Otherwise the error names what is in the way.
pub fn check_target(dir: &Path) -> Result<bool, String> {
    split_target(dir)?;
    let meta = match fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(format!("cannot inspect {}: {e}", dir.display())),
    };
    if meta.file_type().is_symlink() {
        return Err(format!(
            "{} is a symbolic link; refusing to replace it (attnc replaces only directories it wrote)",
            dir.display()
        ));
    }
    if !meta.is_dir() {
        return Err(format!(
            "{} exists and is not a directory; refusing to replace it",
            dir.display()
        ));
    }
    owned(dir, true).map_err(|why| {
        format!(
            "{} exists and is not an attnc output directory ({why}); refusing to overwrite it — remove it yourself or choose another -o",
            dir.display()
        )
    })?;
    Ok(true)
}

/// Whether `dir` holds only what attnc writes: nothing; or a `manifest.json` that parses as an
/// attnc manifest plus exactly the program files it names; or (at the top level only) per-layer
/// subdirectories that each qualify. The error says what does not fit.
fn owned(dir: &Path, top: bool) -> Result<(), String> {
    let entries = list(dir)?;
    if entries.is_empty() {
        return Ok(());
    }
    let has_manifest = entries.iter().any(|(n, _)| n == "manifest.json");
    if !has_manifest {
        if !top {
            return Err(format!("{} has no manifest.json", dir.display()));
        }
        for (name, kind) in &entries {
            if *kind != Kind::Dir {
                return Err(format!(
                    "it holds `{name}`, and no manifest.json of attnc's"
                ));
            }
            owned(&dir.join(name), false)?;
        }
        return Ok(());
    }
    let mpath = dir.join("manifest.json");
    let manifest = read_manifest(&mpath)?;
    let written: std::collections::HashSet<String> = manifest
        .files
        .list(manifest.pes)
        .into_iter()
        .flat_map(|f| [f.text, f.binary])
        .collect();
    for (name, kind) in &entries {
        let listed = name == "manifest.json" || written.contains(name.as_str());
        if !listed || *kind != Kind::File {
            return Err(format!(
                "it holds `{}`, which attnc did not write",
                dir.join(name).display()
            ));
        }
    }
    Ok(())
}

fn read_manifest(path: &Path) -> Result<Manifest, String> {
    let size = fs::symlink_metadata(path)
        .map_err(|e| format!("cannot inspect {}: {e}", path.display()))?
        .len();
    if size > MAX_OWNED_MANIFEST_BYTES {
        return Err(format!("{} is too large to be attnc's", path.display()));
    }
    let bytes = fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| format!("{} is not an attnc manifest (not UTF-8)", path.display()))?;
    Manifest::from_json(text)
        .map_err(|e| format!("{} is not an attnc manifest: {e}", path.display()))
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Kind {
    File,
    Dir,
    Other,
}

/// The entries of `dir` with their kind (symbolic links are `Other`, never followed).
fn list(dir: &Path) -> Result<Vec<(String, Kind)>, String> {
    let rd = fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let mut out = Vec::new();
    for e in rd {
        let e = e.map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        let kind = match e.file_type() {
            Ok(t) if t.is_file() => Kind::File,
            Ok(t) if t.is_dir() => Kind::Dir,
            _ => Kind::Other,
        };
        out.push((e.file_name().to_string_lossy().into_owned(), kind));
    }
    out.sort();
    Ok(out)
}

/// Removes staging entries in `parent` left by attnc processes that no longer run. Anything that
/// does not look exactly like attnc's own is left alone; failures are ignored because cleaning is
/// a courtesy, not part of the write.
pub fn clean_stale(parent: &Path) {
    let Ok(rd) = fs::read_dir(parent) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = staging_pid(&name) else {
            continue;
        };
        if pid == std::process::id() || process_alive(pid) {
            continue;
        }
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        let path = e.path();
        if is_dir && only_attnc_files(&path, 0) {
            fs::remove_dir_all(&path).ok();
        }
    }
}

/// The pid in a staging name `.attnc-out-<pid>-<suffix>` or `.attnc-old-<pid>-<suffix>`.
pub fn staging_pid(name: &str) -> Option<u32> {
    let rest = name
        .strip_prefix(STAGING_PREFIX)
        .or_else(|| name.strip_prefix(OLD_PREFIX))?;
    let (pid, suffix) = rest.split_once('-')?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) || suffix.is_empty() {
        return None;
    }
    pid.parse().ok()
}

/// A staging directory may be cut off anywhere, so its files are checked by name only:
/// `pe<N>.s`, `pe<N>.bin`, `manifest.json`, and one level of per-layer subdirectories.
fn only_attnc_files(dir: &Path, depth: u32) -> bool {
    let Ok(entries) = list(dir) else {
        return false;
    };
    entries.iter().all(|(name, kind)| match kind {
        Kind::File => attnc_file_name(name),
        Kind::Dir => depth == 0 && only_attnc_files(&dir.join(name), depth + 1),
        Kind::Other => false,
    })
}

/// `manifest.json`, `pe<N>.s` or `pe<N>.bin`.
pub fn attnc_file_name(name: &str) -> bool {
    if name == "manifest.json" {
        return true;
    }
    let Some(rest) = name.strip_prefix("pe") else {
        return false;
    };
    let Some(num) = rest
        .strip_suffix(".s")
        .or_else(|| rest.strip_suffix(".bin"))
    else {
        return false;
    };
    !num.is_empty() && num.len() <= 10 && num.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(unix)]
fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 performs only the existence and permission check; nothing is sent.
    let r = unsafe { libc::kill(pid, 0) };
    // EPERM means the process exists but belongs to someone else: still alive.
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(not(unix))]
fn process_alive(_pid: u32) -> bool {
    // Without a portable liveness check, assume it runs: leaving an entry is safe, deleting a
    // running process's staging directory is not.
    true
}

fn unique_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{nanos:x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_names() {
        assert_eq!(staging_pid(".attnc-out-123-abc"), Some(123));
        assert_eq!(staging_pid(".attnc-old-9-x"), Some(9));
        assert_eq!(staging_pid(".attnc-out-abc"), None);
        assert_eq!(staging_pid(".attnc-out-12-"), None);
        assert_eq!(staging_pid(".attnc-out--x"), None);
        assert_eq!(staging_pid("attnc-out-1-x"), None);
    }

    #[test]
    fn file_names() {
        for ok in ["manifest.json", "pe0.s", "pe12.bin"] {
            assert!(attnc_file_name(ok), "{ok}");
        }
        for bad in [
            "pe.s",
            "pe1.txt",
            "notes.txt",
            "pe1.s.bak",
            "manifest.json~",
            "pex.bin",
        ] {
            assert!(!attnc_file_name(bad), "{bad}");
        }
    }
}
