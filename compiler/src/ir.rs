//! The tensor-level dataflow IR: one graph per layer, a handful of nodes per head.
//!
//! Nodes are owned by a `PrimaryMap`; everything later passes learn about a node lives beside the
//! graph in `SecondaryMap`s (see [`crate::passes::analyze`]), never inside [`NodeData`], so the IR
//! stays what the user wrote and each pass's findings can be dumped and checked on their own.

use cranelift_entity::{entity_impl, PrimaryMap};
use std::fmt;

/// A node of the dataflow graph (`n0`, `n1`, … in dumps).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Node(u32);
entity_impl!(Node, "n");

/// The tensors of a layer: inputs `q`, `k`, `v` (or the single `x` of a shared-qkv layer) and the
/// output `y`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tensor {
    Q,
    K,
    V,
    X,
    Y,
}

impl Tensor {
    pub fn name(self) -> &'static str {
        match self {
            Tensor::Q => "q",
            Tensor::K => "k",
            Tensor::V => "v",
            Tensor::X => "x",
            Tensor::Y => "y",
        }
    }
}

/// The mask applied to the score matrix before softmax.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaskKind {
    None,
    /// Only `j <= i` takes part.
    Causal,
}

#[derive(Clone, Debug, PartialEq)]
pub enum NodeData {
    /// One head's `[tokens, dim]` slice of an input tensor, preloaded into PE memories.
    Input { tensor: Tensor, head: u32 },
    /// `w'[i][j] = lhs_i · rhs_j`, with the mask applied (masked elements do not exist).
    Scores {
        lhs: Node,
        rhs: Node,
        mask: MaskKind,
    },
    /// Row softmax of `scale · w'`, formed as `form` says (with or without the row maximum
    /// subtracted).
    Softmax {
        scores: Node,
        scale: f64,
        form: runtime::layer::Softmax,
    },
    /// `y_i = Σ_j w[i][j] · values_j`.
    WeightedSum { weights: Node, values: Node },
    /// The head's slice of the output tensor `y`.
    Output { value: Node, head: u32 },
}

/// One attention layer as a dataflow graph.
#[derive(Clone, Debug)]
pub struct Graph {
    pub name: String,
    pub tokens: u32,
    pub dim: u32,
    pub heads: u32,
    pub scale: f64,
    pub nodes: PrimaryMap<Node, NodeData>,
}

impl Graph {
    /// The `Input` node of `tensor` for `head`.
    pub fn input(&self, tensor: Tensor, head: u32) -> Option<Node> {
        self.nodes.iter().find_map(|(id, n)| match n {
            NodeData::Input { tensor: t, head: h } if *t == tensor && *h == head => Some(id),
            _ => None,
        })
    }

    /// The `Output` node of each head, in head order.
    pub fn outputs(&self) -> Vec<Node> {
        let mut outs: Vec<(u32, Node)> = self
            .nodes
            .iter()
            .filter_map(|(id, n)| match n {
                NodeData::Output { head, .. } => Some((*head, id)),
                _ => None,
            })
            .collect();
        outs.sort();
        outs.into_iter().map(|(_, id)| id).collect()
    }
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "graph {} (tokens={}, dim={}, heads={}, scale={}) {{",
            self.name, self.tokens, self.dim, self.heads, self.scale
        )?;
        for (id, node) in &self.nodes {
            let rhs = match node {
                NodeData::Input { tensor, head } => {
                    format!(
                        "input {}[{head}] : [{}x{}]",
                        tensor.name(),
                        self.tokens,
                        self.dim
                    )
                }
                NodeData::Scores { lhs, rhs, mask } => {
                    let m = match mask {
                        MaskKind::None => "",
                        MaskKind::Causal => ", mask=causal",
                    };
                    format!("scores {lhs}, {rhs}{m}")
                }
                // Printed only when safe, so a plain layer's dump is what it always was.
                NodeData::Softmax {
                    scores,
                    scale,
                    form,
                } => match form {
                    runtime::layer::Softmax::Plain => format!("softmax {scores}, scale={scale}"),
                    runtime::layer::Softmax::Safe => {
                        format!("softmax {scores}, scale={scale}, max-subtracted")
                    }
                },
                NodeData::WeightedSum { weights, values } => {
                    format!("weighted_sum {weights}, {values}")
                }
                NodeData::Output { value, head } => format!("output y[{head}] = {value}"),
            };
            writeln!(f, "    {id} = {rhs}")?;
        }
        write!(f, "}}")
    }
}
