//! `lower`: turns a checked layer description into the dataflow graph, one chain of nodes per head.

use crate::ir::{Graph, MaskKind, NodeData, Tensor};
use cranelift_entity::PrimaryMap;
use lang::{Layer, Mask, Qkv};
use runtime::layer::Softmax;

pub const NAME: &str = "lower";
pub const DESCRIPTION: &str = "lower a layer description to the dataflow graph";

pub fn run(layer: &Layer) -> Graph {
    let mut nodes = PrimaryMap::new();
    let mask = match layer.mask {
        Mask::None => MaskKind::None,
        Mask::Causal => MaskKind::Causal,
    };
    for head in 0..layer.heads {
        let input =
            |nodes: &mut PrimaryMap<_, _>, tensor| nodes.push(NodeData::Input { tensor, head });
        let (q, k, v) = match layer.qkv {
            // One input node used three times: the sharing is visible to analysis as operand
            // identity, not as a flag copied from the DSL.
            Qkv::Shared => {
                let x = input(&mut nodes, Tensor::X);
                (x, x, x)
            }
            Qkv::Separate => (
                input(&mut nodes, Tensor::Q),
                input(&mut nodes, Tensor::K),
                input(&mut nodes, Tensor::V),
            ),
        };
        let scores = nodes.push(NodeData::Scores {
            lhs: q,
            rhs: k,
            mask,
        });
        let weights = nodes.push(NodeData::Softmax {
            scores,
            scale: layer.scale,
            form: match layer.softmax {
                lang::Softmax::Safe => Softmax::Safe,
                lang::Softmax::Plain => Softmax::Plain,
            },
        });
        let y = nodes.push(NodeData::WeightedSum { weights, values: v });
        nodes.push(NodeData::Output { value: y, head });
    }
    Graph {
        name: layer.name.clone(),
        tokens: layer.tokens,
        dim: layer.dim,
        heads: layer.heads,
        scale: layer.scale,
        nodes,
    }
}
