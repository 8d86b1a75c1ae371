//! Differentiable tensor ops: each computes through `kernels` and records its `Op` when an
//! input needs gradients.

pub mod elementwise;
pub mod layout;
pub mod reduce;
