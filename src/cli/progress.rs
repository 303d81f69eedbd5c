//! Progress display for long work: drawn on a terminal only, so pipes, files, `--json` output
//! and the tests that read the binary's output see nothing of it.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::Duration;

/// A bar or spinner that is a no-op unless both stdout and stderr are terminals and the command
/// was not asked for JSON (a tool reading stdout must not get escape codes mixed in).
pub struct Progress(Option<ProgressBar>);

fn wanted(json: bool) -> bool {
    !json && std::io::stdout().is_terminal() && std::io::stderr().is_terminal()
}

impl Progress {
    /// A bar over `len` steps of `unit` (e.g. cycles).
    pub fn bar(len: u64, unit: &str, json: bool) -> Progress {
        if !wanted(json) {
            return Progress(None);
        }
        let pb = ProgressBar::new(len);
        let template =
            format!("{{msg}} [{{bar:40}}] {{pos}}/{{len}} {unit} ({{elapsed}}, eta {{eta}})");
        if let Ok(style) = ProgressStyle::with_template(&template) {
            pb.set_style(style.progress_chars("=> "));
        }
        Progress(Some(pb))
    }

    /// A spinner with elapsed time, ticking on its own while the caller blocks in a library call.
    pub fn spinner(msg: &str, json: bool) -> Progress {
        if !wanted(json) {
            return Progress(None);
        }
        let pb = ProgressBar::new_spinner();
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
            pb.set_style(style);
        }
        pb.set_message(msg.to_string());
        pb.enable_steady_tick(Duration::from_millis(120));
        Progress(Some(pb))
    }

    pub fn is_active(&self) -> bool {
        self.0.is_some()
    }

    pub fn set_message(&self, msg: String) {
        if let Some(pb) = &self.0 {
            pb.set_message(msg);
        }
    }

    pub fn set_position(&self, pos: u64) {
        if let Some(pb) = &self.0 {
            pb.set_position(pos);
        }
    }
}

impl Drop for Progress {
    // The bar disappears when the work ends, so the command's own report reads as without it.
    fn drop(&mut self) {
        if let Some(pb) = &self.0 {
            pb.finish_and_clear();
        }
    }
}

/// Moves a bar along the cycles of a run; set on the first write of each 4096th cycle, which
/// costs one comparison per write.
pub struct CycleObserver<'a> {
    pub progress: &'a Progress,
    pub last: u64,
}

impl isa::Observer for CycleObserver<'_> {
    fn on_write(&mut self, _pe: u32, cycle: u64, _addr: isa::Addr) {
        if cycle != self.last {
            self.last = cycle;
            if cycle.is_multiple_of(4096) {
                self.progress.set_position(cycle);
            }
        }
    }
}
