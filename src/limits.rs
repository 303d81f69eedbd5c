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

/// The most PEs `compile` and `optimal` accept for `layer`: one per necessary operation. The split
/// dataflow gives a PE work without a weight of its own (a share of a score's `d` products, a
/// softmax, a column of the weighted sum), so a ring may have more PEs than weights; a PE beyond
/// one per operation could only pass values on. Compile time stays bounded because every
/// scheduler tries a bounded number of layouts (the row dataflow's count of working PEs is searched
/// exhaustively only up to 64 PEs, on a geometric ladder above).
pub fn usable_pes(layer: &lang::Layer) -> u64 {
    necessary_ops(layer).max(1)
}

/// Refuses a ring larger than the layer can use, before any scheduling starts.
pub fn check_ring(layer: &lang::Layer, pes: u32) -> Result<(), String> {
    let most = usable_pes(layer);
    if u64::from(pes) <= most {
        return Ok(());
    }
    Err(format!(
        "--pes {pes} is more than this layer can use: layer `{}` has {most} necessary operations, so at most {most} PEs can hold any of its work; the others would only pass values on (use --pes {most} or fewer, or a larger layer)",
        layer.name
    ))
}
