//! Layers, composition, initialisation and weight files.
//!
//! A layer is a [`Module`]: `forward` plus its named parameters. Parameters are variables
//! (tensors whose gradients accumulate); an optimizer built from `module.params()` updates
//! them in place, so the module sees the new weights without any hand-off.
//!
//! Layers: [`Linear`], [`Conv1d`], [`Conv2d`], the pools, [`LayerNorm`], [`RmsNorm`],
//! [`BatchNorm2d`], [`GroupNorm`], [`Embedding`], [`Dropout`], [`Activation`],
//! [`MultiHeadAttention`] and [`TransformerBlock`]. [`Sequential`] chains layers and names
//! their parameters `<layer>.<parameter>`; [`Checkpointed`] wraps one to recompute its
//! activations in the backward pass. [`init`] draws initial weights on the device. Weight
//! files are safetensors, PyTorch's layouts and names: [`save`] writes a
//! [`Module::state_dict`], [`load_into`] reads one back by name, [`load`] reads any file.

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
pub use module::{Module, Sequential, freeze, prefixed, unfreeze};
pub use norm::{BatchNorm2d, GroupNorm, LayerNorm, RmsNorm};
pub use safetensors::{load, load_as, load_into, load_into_converting, save};
