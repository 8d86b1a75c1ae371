//! The recorded ops: what each differentiable op keeps for its backward pass.
//!
//! Saved outputs are stored *detached* (same storage, no op), never as the output tensor
//! itself, which would make a reference cycle.

use crate::kernels::conv::Geom;
use crate::kernels::elementwise::{Binary, Unary};
use crate::ops::Conv2dOpts;
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
    /// `act(op(a) op(b) + bias)`; `relu_out` is the output when the activation was ReLU.
    Matmul {
        a: Tensor,
        b: Tensor,
        bias: Option<Tensor>,
        trans_a: bool,
        trans_b: bool,
        relu_out: Option<Tensor>,
    },
    /// 2-D convolution; `relu_out` is the output when a ReLU was fused.
    Conv2d {
        x: Tensor,
        w: Tensor,
        bias: Option<Tensor>,
        opts: Conv2dOpts,
        relu_out: Option<Tensor>,
    },
    /// Max pooling; `idx` holds the position of each window's maximum.
    MaxPool { x: Tensor, geom: Geom, idx: Tensor },
    /// Average pooling.
    AvgPool { x: Tensor, geom: Geom },
    /// Softmax or log-softmax along the last axis; `y` is the output.
    Softmax { x: Tensor, y: Tensor, log: bool },
    /// Fused attention; `out` and `lse` are what the backward pass recomputes from.
    Attention {
        q: Tensor,
        k: Tensor,
        v: Tensor,
        out: Tensor,
        lse: Tensor,
        causal: bool,
        scale: f32,
    },
    /// LayerNorm (with beta) or RMSNorm; `stats` holds each row's statistics.
    Norm {
        x: Tensor,
        gamma: Tensor,
        beta: Option<Tensor>,
        stats: Tensor,
        eps: f32,
    },
    /// Per-row cross-entropy from logits; `stats` holds each row's max and log-sum-exp.
    CrossEntropy {
        x: Tensor,
        labels: Tensor,
        stats: Tensor,
    },
    /// Embedding lookup.
    Embedding { w: Tensor, idx: Tensor },
    /// Dropout with the seed of its mask.
    Dropout { x: Tensor, p: f32, seed: u64 },
    /// A checkpointed segment: recomputed from `x` during backward, with the random seed
    /// counter rewound to `seed`.
    Checkpoint {
        x: Tensor,
        segment: super::Segment,
        seed: u64,
    },
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
            | Op::Narrow { x, .. }
            | Op::MaxPool { x, .. }
            | Op::AvgPool { x, .. }
            | Op::Softmax { x, .. }
            | Op::CrossEntropy { x, .. }
            | Op::Dropout { x, .. }
            | Op::Checkpoint { x, .. } => vec![x],
            Op::Embedding { w, .. } => vec![w],
            Op::Binary { x, y, .. } | Op::Select { x, y, .. } => vec![x, y],
            Op::Cat { xs, .. } => xs.iter().collect(),
            Op::Matmul { a, b, bias, .. } => [Some(a), Some(b), bias.as_ref()]
                .into_iter()
                .flatten()
                .collect(),
            Op::Conv2d { x, w, bias, .. } => [Some(x), Some(w), bias.as_ref()]
                .into_iter()
                .flatten()
                .collect(),
            Op::Attention { q, k, v, .. } => vec![q, k, v],
            Op::Norm { x, gamma, beta, .. } => [Some(x), Some(gamma), beta.as_ref()]
                .into_iter()
                .flatten()
                .collect(),
        }
    }
}
