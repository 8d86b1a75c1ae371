//! Differentiable tensor ops. Each op's file holds its forward pass (through `kernels`), what
//! it saves, and its backward pass (a [`Backward`](crate::tensor::graph::Backward) recorded on
//! the output when an input needs gradients).
//!
//! The ops are [`Tensor`](crate::Tensor) methods, grouped by file: [`elementwise`] (unary,
//! scalar and broadcasting binary ops, comparisons, `where_cond`), [`layout`] (views, copies,
//! casts, `cat`), [`reduce`] and [`scan`], [`matmul`] (also `linear`), [`softmax`], [`norm`],
//! [`loss`], [`conv`] (convolution and pooling), [`attention`], [`embedding`], [`index`]
//! (gather, scatter-add, top-k), [`dropout`], and [`transfer`] between devices. Binary ops
//! broadcast as NumPy and PyTorch do: shapes are aligned at their last axes, and an axis of
//! size 1 (or a missing leading one) repeats, read through a stride of 0 without a copy.
//!
//! ```
//! # fn main() -> wgrad::Result<()> {
//! let dev = wgrad::Device::new()?;
//! let x = dev.tensor(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
//! let row = dev.tensor(&[10.0f32, 20.0, 30.0], &[3])?; // repeated for each row
//! let col = dev.tensor(&[1.0f32, 2.0], &[2, 1])?; // repeated for each column
//! let y = x.add(&row)?.mul(&col)?.add_scalar(-1.0)?;
//! assert_eq!(y.shape(), [2, 3]);
//! assert_eq!(y.to_vec::<f32>()?, [10.0, 21.0, 32.0, 27.0, 49.0, 71.0]);
//! # Ok(())
//! # }
//! ```

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
pub mod operators;
pub mod print;
pub mod reduce;
pub mod scan;
pub mod softmax;
pub mod transfer;

pub use activation::Activation;
pub use attention::AttentionOpts;
pub use conv::Conv2dOpts;
pub use matmul::MatmulOpts;
