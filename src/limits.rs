//! Limits decided before any memory is reserved. docs/robustness.md lists them with the reasons.

/// Largest ring `--pes` accepts. Rings of a thousand PEs and more are in scope; beyond this the
/// per-PE tables alone outgrow any layer attnc can compile.
pub const MAX_PES: u32 = 65_536;

/// Largest `optimal --time-limit`, in seconds (about 11.6 days): far beyond any useful search,
/// and small enough that adding it to the current time can never overflow.
pub const MAX_TIME_LIMIT_SECS: f64 = 1_000_000.0;

/// Largest `manifest.json` `run` and `verify` read. The largest layer attnc compiles has a
/// manifest of a few MB; placement arrays of a full-size layer stay far below this.
pub const MAX_MANIFEST_BYTES: u64 = 256 << 20;

/// Largest program file (`pe<N>.bin` or `pe<N>.s`) `run` and `verify` read. A PE of the largest
/// layer attnc compiles runs a few million bundles: about 100 MB of binary, 200 MB of text.
pub const MAX_PROGRAM_BYTES: u64 = 1 << 30;

/// Largest total memory, in words summed over the PEs, of a directory `run` and `verify` load.
/// Loop programs make the files' size independent of the memory they declare, so this is what
/// bounds the interpreter's allocation (8 bytes a word: 2 GiB). The largest layer of the
/// models benchmark (8192 tokens on 1024 PEs) declares about 138M words.
pub const MAX_RUN_WORDS: u64 = 1 << 28;

/// Default `run --max-pe-cycles`: PEs × cycles `run` executes without being told more is
/// meant. A loop program of a few hundred bytes can stand for years of cycles; at the native
/// interpreter's few 10⁷ PE-operations per second this is a few minutes.
pub const DEFAULT_MAX_PE_CYCLES: u64 = 10_000_000_000;

/// Largest `.npy` header accepted (numpy itself reads at most 10000 bytes by default).
pub const MAX_NPY_HEADER_BYTES: u64 = 1 << 16;

/// The necessary operations of a layer (docs/scheduling.md), saturating on absurd sizes.
pub fn necessary_ops(layer: &lang::Layer) -> u64 {
    let shape = runtime::layer::Shape {
        heads: layer.heads,
        tokens: layer.tokens,
        dim: layer.dim,
        shared: layer.qkv == lang::Qkv::Shared,
        causal: layer.mask == lang::Mask::Causal,
        softmax: match layer.softmax {
            lang::Softmax::Safe => runtime::layer::Softmax::Safe,
            lang::Softmax::Plain => runtime::layer::Softmax::Plain,
        },
    };
    shape.necessary().map_or(u64::MAX, |n| n.total())
}

/// The attention weights of a layer (heads × unmasked score entries).
pub fn attention_weights(layer: &lang::Layer) -> u64 {
    let n = u64::from(layer.tokens);
    let per_head = if layer.mask == lang::Mask::Causal {
        n * (n + 1) / 2
    } else {
        n * n
    };
    u64::from(layer.heads) * per_head
}

/// The PEs a layer's work can occupy: one per necessary operation. The split dataflow gives a
/// PE work without a weight of its own (a share of a score's `d` products, a softmax, a column
/// of the weighted sum), so a ring may have more PEs than weights; a PE beyond one per operation
/// could only pass values on.
pub fn usable_pes(layer: &lang::Layer) -> u64 {
    necessary_ops(layer).max(1)
}

/// Rings of up to this many PEs are compiled whatever the layer: an array is as large as it is,
/// and a short prompt on it must still compile, the PEs its work cannot occupy idling or passing
/// values on. Above it a ring may have at most one PE per necessary operation, which is what
/// bounds compile memory for tiny layers on huge rings: the schedulers' tables grow with the
/// square of the ring (a one-token layer took 0.13 GB on 1 024 PEs, 1.8 GB on 4 096 and was
/// killed past 23 GB on 65 536), while layers that need 1 024 PEs' worth of operations were
/// already accepted there at the same cost.
pub const ANY_LAYER_PES: u32 = 1024;

/// The most PEs `compile` accepts for `layer`: [`ANY_LAYER_PES`], or one per necessary
/// operation where that is more. Compile time stays bounded because every scheduler tries a
/// bounded number of layouts (the row dataflow's count of working PEs is searched exhaustively
/// only up to 64 PEs, on a geometric ladder above).
pub fn max_pes(layer: &lang::Layer) -> u64 {
    usable_pes(layer).max(u64::from(ANY_LAYER_PES))
}

/// Refuses a ring larger than `compile` takes for the layer ([`max_pes`]), before any
/// scheduling starts.
pub fn check_ring(layer: &lang::Layer, pes: u32) -> Result<(), String> {
    let rule = format!(
        "and a ring of more than {ANY_LAYER_PES} PEs may have at most one PE per necessary operation"
    );
    refuse_above(layer, pes, max_pes(layer), &rule)
}

/// Refuses a ring with more PEs than the layer has necessary operations, for the exact search:
/// its model grows with the ring, and a PE that can hold no operation only lengthens paths.
pub fn check_exact_ring(layer: &lang::Layer, pes: u32) -> Result<(), String> {
    let most = usable_pes(layer);
    let rule = format!(
        "so at most {most} PEs can hold any of its work; the others would only pass values on"
    );
    refuse_above(layer, pes, most, &rule)
}

fn refuse_above(layer: &lang::Layer, pes: u32, most: u64, rule: &str) -> Result<(), String> {
    if u64::from(pes) <= most {
        return Ok(());
    }
    Err(format!(
        "--pes {pes} is more than this layer can use: layer `{}` has {} necessary operations, {rule} (use --pes {most} or fewer, or a larger layer)",
        layer.name,
        usable_pes(layer)
    ))
}
