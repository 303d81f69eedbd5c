//! `analyze`: derives the facts scheduling relies on from the graph itself: which score nodes
//! multiply a value by itself (so `w'` is symmetric), which weighted sums read the same value as
//! their scores, and which elements a mask removes. Facts live in a `SecondaryMap` beside the
//! graph.

use crate::ir::{Graph, MaskKind, Node, NodeData};
use crate::problem::Problem;
use cranelift_entity::SecondaryMap;
use std::fmt;

pub const NAME: &str = "analyze";
pub const DESCRIPTION: &str = "find symmetric scores, shared operands and masked elements";

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NodeFacts {
    /// Scores whose two operands are the same value.
    pub symmetric: bool,
    /// Scores with a causal mask: elements `j > i` do not exist.
    pub causal: bool,
    /// Weighted sum whose values operand is also both operands of its scores.
    pub values_shared: bool,
}

#[derive(Clone, Debug)]
pub struct Facts {
    pub nodes: SecondaryMap<Node, NodeFacts>,
    pub problem: Problem,
}

/// An IR the scheduler cannot take: heads that differ in shape of computation.
#[derive(Debug, Clone, PartialEq)]
pub struct AnalyzeError(pub String);

pub fn run(g: &Graph) -> Result<Facts, AnalyzeError> {
    let mut nodes: SecondaryMap<Node, NodeFacts> = SecondaryMap::new();
    for (id, node) in &g.nodes {
        match *node {
            NodeData::Scores { lhs, rhs, mask } => {
                nodes[id].symmetric = lhs == rhs;
                nodes[id].causal = mask == MaskKind::Causal;
            }
            NodeData::WeightedSum { weights, values } => {
                if let NodeData::Softmax { scores, .. } = g.nodes[weights] {
                    if let NodeData::Scores { lhs, rhs, .. } = g.nodes[scores] {
                        nodes[id].values_shared = lhs == values && rhs == values;
                    }
                }
            }
            _ => {}
        }
    }
    // The schedulers treat all heads alike, so every head must carry the same facts.
    let per_kind =
        |pick: fn(&NodeFacts) -> bool, kind: fn(&NodeData) -> bool| -> Result<bool, AnalyzeError> {
            let vals: Vec<bool> = g
                .nodes
                .iter()
                .filter(|(_, n)| kind(n))
                .map(|(id, _)| pick(&nodes[id]))
                .collect();
            match vals.first() {
                Some(&first) if vals.iter().all(|&v| v == first) => Ok(first),
                Some(_) => Err(AnalyzeError("heads differ in structure".into())),
                None => Err(AnalyzeError("the graph has no head".into())),
            }
        };
    // Every head's softmax must be formed the same way, for the same reason.
    let mut forms = g.nodes.values().filter_map(|n| match n {
        NodeData::Softmax { form, .. } => Some(*form),
        _ => None,
    });
    let softmax = forms.next().unwrap_or_default();
    if forms.any(|f| f != softmax) {
        return Err(AnalyzeError("heads differ in structure".into()));
    }
    let is_scores = |n: &NodeData| matches!(n, NodeData::Scores { .. });
    let is_wsum = |n: &NodeData| matches!(n, NodeData::WeightedSum { .. });
    let problem = Problem {
        tokens: g.tokens,
        dim: g.dim,
        heads: g.heads,
        scale: g.scale,
        symmetric: per_kind(|f| f.symmetric, is_scores)?,
        causal: per_kind(|f| f.causal, is_scores)?,
        shared_values: per_kind(|f| f.values_shared, is_wsum)?,
        softmax,
        copies: false,
    };
    Ok(Facts { nodes, problem })
}

impl fmt::Display for Facts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "facts {{")?;
        for (id, facts) in self.nodes.iter() {
            if *facts == NodeFacts::default() {
                continue;
            }
            let mut words = Vec::new();
            if facts.symmetric {
                words.push("symmetric");
            }
            if facts.causal {
                words.push("causal");
            }
            if facts.values_shared {
                words.push("values-shared");
            }
            writeln!(f, "    {id}: {}", words.join(", "))?;
        }
        writeln!(f, "    problem: {:?}", self.problem)?;
        write!(f, "}}")
    }
}
