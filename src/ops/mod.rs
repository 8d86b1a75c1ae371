//! Differentiable tensor ops. Each op's file holds its forward pass (through `kernels`), what
//! it saves, and its backward pass (a [`Backward`](crate::tensor::graph::Backward) recorded on
//! the output when an input needs gradients).

pub mod activation;
pub mod attention;
pub mod conv;
pub mod dropout;
pub mod elementwise;
pub mod embedding;
pub mod index;
pub mod layout;
pub mod loss;
pub mod matmul;
pub mod norm;
pub mod reduce;
pub mod scan;
pub mod softmax;
pub mod transfer;

pub use activation::Activation;
pub use attention::AttentionOpts;
pub use conv::Conv2dOpts;
pub use matmul::MatmulOpts;
