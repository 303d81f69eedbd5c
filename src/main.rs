//! `attnc`: compile attention layers to microcode for a ring of PEs, and run that microcode.

mod cli;

// The allocator the proofs want (src/alloc.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "attnc",
    version,
    about = "Compile attention layers to per-PE microcode for a unidirectional ring, and run it",
    after_help = "`attnc FILE --pes M -o DIR` is short for `attnc compile FILE --pes M -o DIR`."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Compile a layer description into one microcode file per PE plus manifest.json
    Compile(cli::compile::CompileArgs),
    /// Execute an emitted directory in the cycle-level interpreter and check it against the reference
    Run(cli::run::RunArgs),
    /// Prove an emitted directory correct for all inputs by symbolic execution
    Verify(cli::verify::VerifyArgs),
    /// Search for a provably optimal schedule with a SAT solver (small layers)
    Optimal(cli::optimal::OptimalArgs),
    /// Per-PE summary of an emitted directory: program size, work by phase, link traffic, memory map
    Inspect(cli::inspect::InspectArgs),
    /// Draw a PE × time utilisation picture (SVG) of an emitted directory, coloured by phase
    Show(cli::show::ShowArgs),
    /// List the compiler's passes (names for --dump-after)
    Passes,
}

const SUBCOMMANDS: [&str; 8] = [
    "compile", "run", "verify", "optimal", "inspect", "show", "passes", "help",
];

fn main() -> ExitCode {
    // Printing into a closed pipe (`attnc verify DIR | head -1`) ends the process quietly, as
    // for any Unix filter, instead of panicking in `println!`.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of a signal before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    attnc::alloc::keep_freed_pages();
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // `attnc FILE ...` means `attnc compile FILE ...`.
    if let Some(first) = args.get(1).and_then(|a| a.to_str()) {
        if !first.starts_with('-') && !SUBCOMMANDS.contains(&first) {
            args.insert(1, "compile".into());
        }
    }
    let cli = Cli::parse_from(args);
    let result = match &cli.cmd {
        Cmd::Compile(a) => cli::compile::run(a),
        Cmd::Run(a) => cli::run::run(a),
        Cmd::Verify(a) => cli::verify::run(a),
        Cmd::Optimal(a) => cli::optimal::run(a),
        Cmd::Inspect(a) => cli::inspect::run(a),
        Cmd::Show(a) => cli::show::run(a),
        Cmd::Passes => {
            for (name, desc) in compiler::passes::list() {
                println!("{name:20} {desc}");
            }
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("error: {msg}");
            ExitCode::FAILURE
        }
    }
}
