//! What every decoded or parsed loop program must satisfy.

/// Programs longer than this are not flattened (the property is checked on the short ones).
const FLATTEN_LIMIT: u64 = 20_000;

pub fn check(p: &isa::LoopProgram) {
    let text = p.to_text();
    assert_eq!(
        &isa::parse_looped(&text).expect("printed text parses"),
        p,
        "text round trip"
    );
    let bin = isa::encode_looped(p).expect("encodes");
    assert_eq!(&isa::decode_looped(&bin).expect("encoding decodes"), p);
    let cycles = p.validate().expect("a loaded program is valid");
    assert_eq!(p.cycles(), cycles);
    if cycles <= FLATTEN_LIMIT {
        let flat = p.flatten(FLATTEN_LIMIT).expect("flattens");
        assert_eq!(flat.bundles.len() as u64, cycles, "static length");
        let mut ops = [0u64; isa::OPS.len()];
        for b in &flat.bundles {
            if let Some(k) = b.op.kind() {
                ops[k.index()] += 1;
            }
        }
        assert_eq!(p.op_counts(), ops, "static op counts");
    }
}
