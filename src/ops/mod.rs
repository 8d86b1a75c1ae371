//! Differentiable tensor ops: each computes through `kernels` and records its `Op` when an
//! input needs gradients.

pub mod activation;
pub mod attention;
pub mod conv;
pub mod elementwise;
pub mod embedding;
pub mod layout;
pub mod loss;
pub mod matmul;
pub mod norm;
pub mod reduce;
pub mod softmax;

pub use activation::Activation;
pub use conv::Conv2dOpts;
pub use matmul::MatmulOpts;
