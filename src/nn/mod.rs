//! Layers, composition, initialisation and weight files.
//!
//! A layer is a [`Module`]: `forward` plus its named parameters. Parameters are variables
//! (tensors whose gradients accumulate); an optimizer built from `module.params()` updates
//! them in place, so the module sees the new weights without any hand-off.

mod attention;
mod checkpointed;
mod conv;
pub mod init;
mod layers;
mod linear;
mod module;
mod norm;
pub(crate) mod safetensors;

pub use attention::{MultiHeadAttention, TransformerBlock};
pub use checkpointed::Checkpointed;
pub use conv::{Conv1d, Conv2d};
pub use layers::{Activation, AvgPool2d, Dropout, Embedding, Flatten, MaxPool2d};
pub use linear::Linear;
pub use module::{Module, Sequential};
pub use norm::{BatchNorm2d, GroupNorm, LayerNorm, RmsNorm};
pub use safetensors::{load, load_as, load_into, load_into_converting, save};
