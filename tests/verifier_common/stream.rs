//! The manifest of a stream schedule's programs, as `compile` is to write it: format 2, loop
//! programs, affine placements, and the operations beyond the necessary ones declared as
//! `ops.online_rescale`.

#![allow(dead_code)]

use compiler::passes::schedule_stream::{Layout, Stream};
use compiler::problem::Problem;
use runtime::manifest::{
    self, LayerInfo, Manifest, OpCountsInfo, PeFiles, Placement, ProgramKind, RowOrder, Selection,
};
use std::collections::BTreeMap;

/// schedule_stream's row layout as a manifest layout.
pub fn layout(l: &Layout) -> manifest::Layout {
    manifest::Layout {
        order: if l.zigzag {
            RowOrder::Zigzag
        } else {
            RowOrder::Contiguous
        },
        rows_per_pe: l.rows,
        base: l.base,
        head_stride: l.head_stride,
        row_stride: l.dim,
    }
}

/// The manifest describing `st`, built by `schedule_stream::run(p, pes, _)`.
pub fn stream_manifest(p: &Problem, pes: u32, st: &Stream) -> Manifest {
    let shape = runtime::layer::Shape {
        heads: p.heads,
        tokens: p.tokens,
        dim: p.dim,
        shared: p.symmetric,
        causal: p.causal,
        softmax: p.softmax,
    };
    let need = shape.necessary().unwrap_or_default();
    let placement = |l: &Layout| Placement {
        shape: vec![p.heads as usize, p.tokens as usize, p.dim as usize],
        pe: Vec::new(),
        addr: Vec::new(),
        layout: Some(layout(l)),
    };
    let mut ops = OpCountsInfo {
        phase1_mac: st.ops.phase1_mac,
        phase2_exp: st.ops.phase2_exp,
        phase2_div: st.ops.phase2_div,
        phase3_mac: st.ops.phase3_mac,
        // The stream's own counts are the plain formulation's; a safe row still takes exactly
        // the necessary maxima, and everything else it executes is rescaling.
        phase2_max: need.max,
        online_rescale: 0,
    };
    ops.online_rescale = st.total_ops.saturating_sub(ops.total());
    let name = compiler::passes::schedule_stream::NAME;
    Manifest {
        format: manifest::FORMAT.into(),
        format_version: manifest::LAYOUT_FORMAT_VERSION,
        layer: LayerInfo {
            name: "stream".into(),
            tokens: p.tokens,
            dim: p.dim,
            heads: p.heads,
            qkv: if p.symmetric { "shared" } else { "separate" }.into(),
            mask: if p.causal { "causal" } else { "none" }.into(),
            scale: p.scale,
            softmax: p.softmax.name().into(),
        },
        pes,
        cycles: st.cycles,
        lower_bound: shape.lower_bound(pes).unwrap_or(0),
        schedule: name.into(),
        selection: Selection {
            chosen: name.into(),
            reason: "forced".into(),
            candidates: Vec::new(),
        },
        necessary_ops: need.total(),
        ops,
        mem_words: st.programs.iter().map(|p| p.mem_words).collect(),
        programs: ProgramKind::Loops,
        files: (0..pes)
            .map(|pe| PeFiles {
                pe,
                text: format!("pe{pe}.s"),
                binary: format!("pe{pe}.bin"),
            })
            .collect(),
        inputs: st
            .inputs
            .iter()
            .map(|(k, l)| (k.clone(), placement(l)))
            .collect::<BTreeMap<_, _>>(),
        outputs: BTreeMap::from([("y".to_string(), placement(&st.output))]),
    }
}
