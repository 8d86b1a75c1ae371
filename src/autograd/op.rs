//! The recorded ops: what each differentiable op keeps for its backward pass.
//!
//! Saved outputs are stored *detached* (same storage, no op), never as the output tensor
//! itself, which would make a reference cycle.

use crate::kernels::elementwise::{Binary, Unary};
use crate::tensor::Tensor;

/// How a tensor was computed. One variant per differentiable op.
#[allow(missing_docs)]
pub enum Op {
    /// Same elements, new shape (also plain copies).
    Reshape { x: Tensor },
    /// Dtype conversion between float types.
    Cast { x: Tensor },
    /// A unary op; `saved` is its input or its output (see `Unary::grad_uses_output`).
    Unary {
        op: Unary,
        x: Tensor,
        a: f32,
        b: f32,
        saved: Tensor,
    },
    /// A broadcasting binary op.
    Binary { op: Binary, x: Tensor, y: Tensor },
    /// `where(c, x, y)`.
    Select { c: Tensor, x: Tensor, y: Tensor },
    /// Sum along an axis times `scale` (mean has 1/len).
    Sum {
        x: Tensor,
        axis: usize,
        keepdim: bool,
        scale: f32,
    },
    /// Max along an axis; `out` is the result (detached).
    Max {
        x: Tensor,
        axis: usize,
        keepdim: bool,
        out: Tensor,
    },
    /// Dimension permutation.
    Permute { x: Tensor, perm: Vec<usize> },
    /// Broadcast to a larger shape.
    Expand { x: Tensor },
    /// A slice along an axis.
    Narrow {
        x: Tensor,
        axis: usize,
        start: usize,
    },
    /// Concatenation along an axis.
    Cat { xs: Vec<Tensor>, axis: usize },
}

impl Op {
    /// The tensors gradients flow to.
    pub fn inputs(&self) -> Vec<&Tensor> {
        match self {
            Op::Reshape { x }
            | Op::Cast { x }
            | Op::Unary { x, .. }
            | Op::Sum { x, .. }
            | Op::Max { x, .. }
            | Op::Permute { x, .. }
            | Op::Expand { x }
            | Op::Narrow { x, .. } => vec![x],
            Op::Binary { x, y, .. } | Op::Select { x, y, .. } => vec![x, y],
            Op::Cat { xs, .. } => xs.iter().collect(),
        }
    }
}
