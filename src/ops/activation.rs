//! The activation functions, one public type for every place that takes one: the
//! `nn::Activation` layer, and the activations fused into matmul and conv2d epilogues.

use crate::error::Result;
use crate::kernels::matmul::Act;
use crate::tensor::Tensor;

/// An elementwise activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// max(x, 0).
    Relu,
    /// GELU (the exact, erf form).
    Gelu,
    /// tanh.
    Tanh,
    /// Logistic sigmoid.
    Sigmoid,
    /// x * sigmoid(x).
    Silu,
}

impl Activation {
    /// Every activation (for tests).
    pub const ALL: [Activation; 5] = [
        Activation::Relu,
        Activation::Gelu,
        Activation::Tanh,
        Activation::Sigmoid,
        Activation::Silu,
    ];

    /// Applies it as its own op.
    pub fn apply(self, x: &Tensor) -> Result<Tensor> {
        match self {
            Activation::Relu => x.relu(),
            Activation::Gelu => x.gelu(),
            Activation::Tanh => x.tanh(),
            Activation::Sigmoid => x.sigmoid(),
            Activation::Silu => x.silu(),
        }
    }

    /// The matrix kernels' epilogue code, for the activations they fuse.
    pub(crate) fn fused(self) -> Option<Act> {
        match self {
            Activation::Relu => Some(Act::Relu),
            Activation::Gelu => Some(Act::Gelu),
            _ => None,
        }
    }
}

impl Tensor {
    /// SwiGLU of a stacked gate/up product: `silu(a) * b`, where `a` and `b` are the first and
    /// second halves of the last axis.
    pub(crate) fn swiglu_halves(&self) -> Result<Tensor> {
        let half = self.shape().last().copied().unwrap_or(0) / 2;
        self.narrow(-1, 0, half)?
            .silu()?
            .mul(&self.narrow(-1, half, half)?)
    }
}
