//! wgrad: portable GPU compute and training on wgpu.
#![warn(missing_docs)]

pub mod autograd;
pub mod data;
pub mod device;
pub mod dtype;
pub mod error;
mod hash;
pub mod kernels;
pub mod layout;
pub mod memory;
pub mod nn;
pub mod ops;
pub mod optim;
pub mod parallel;
pub mod reference;
pub mod tensor;
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing;
pub mod train;

pub use autograd::no_grad;
pub use device::{
    AdapterChoice, Device, DeviceOptions, DispatchStats, MatmulPrecision, MemoryLimit, Profile,
    Readback, ShaderChecks,
};
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use half;
pub use memory::{MemoryReport, MemoryStats};
pub use ops::Activation;
pub use tensor::Tensor;
