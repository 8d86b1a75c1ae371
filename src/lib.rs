//! Portable GPU compute and training on [wgpu](https://wgpu.rs).
//!
//! wgrad's kernels are WGSL, so they run wherever wgpu opens an adapter: Vulkan, Metal, DX12
//! and OpenGL, and on a machine without a GPU through Mesa's lavapipe (Vulkan on the CPU,
//! which is what the examples in these pages run on in CI). There is no CUDA to install.
//!
//! # Concepts
//!
//! - **[`Device`]**: one opened adapter with its queue and memory pool; a cheap handle,
//!   `Send + Sync`. The pool ([`memory`]) caches freed blocks, so a steady training loop makes
//!   no driver allocations, and keeps to a budget ([`DeviceOptions::memory_limit`],
//!   [`Device::set_memory_limit`]): past it an allocation fails with [`Error::OutOfMemory`]
//!   ([`Error::is_oom`]) and every live tensor stays intact. [`Device::memory_report`] says
//!   where the memory went.
//! - **[`Tensor`]**: a layout (shape, strides, offset) over storage in that pool, of one
//!   [`DType`] (f32, f16, bf16, u32). Views ([`Tensor::reshape`], [`Tensor::transpose`],
//!   [`Tensor::permute`], [`Tensor::narrow`], [`Tensor::broadcast_to`]) share the storage
//!   instead of copying it. Ops do not wait for the device: they are recorded in its ordered
//!   command stream, and the host waits only to read a result back ([`Tensor::to_vec`],
//!   [`Tensor::to_scalar`]) or at [`Device::sync`].
//! - **Autograd** ([`autograd`]): gradients are tracked for [variables](Tensor::variable) and
//!   for what is computed from them. [`Tensor::backward`] walks the recorded graph in reverse,
//!   adds each variable's gradient into [`Tensor::grad`], and frees activations as it goes.
//!   [`no_grad`] turns recording off; [`nn::Checkpointed`] recomputes a segment in the
//!   backward pass instead of keeping its activations.
//! - **[`nn`]**: layers as [`nn::Module`]s (Linear, Conv1d and Conv2d, the norms, Embedding,
//!   attention, TransformerBlock, Sequential), initialisation, and safetensors weight files
//!   ([`nn::save`], [`nn::load_into`]).
//! - **[`optim`]**: [`optim::Sgd`] and [`optim::Adam`] (also AdamW) with fused update
//!   kernels, learning-rate schedules, and [`optim::GradScaler`]: loss scaling, gradient
//!   clipping and skipping steps whose gradients overflowed, decided on the device.
//! - **[`train`]**: resumable training checkpoints ([`train::save_checkpoint`],
//!   [`train::load_checkpoint`]) and batch sizes that fit the budget
//!   ([`train::find_batch_size`], [`train::DynamicBatch`]).
//! - **[`data`]**: the [`data::Dataset`] trait, in-memory, memory-mapped, MNIST and
//!   character-level text datasets, and a [`data::DataLoader`] that collates and uploads the
//!   next batches on worker threads while the current step runs.
//! - **[`parallel`]**: data parallelism ([`parallel::DataParallel`]) and pipeline stages
//!   ([`parallel::Pipeline`]) over several devices, and across processes with the `mpi`
//!   feature.
//!
//! Beneath these, [`ops`] holds each op's forward and backward pass and [`kernels`] the WGSL
//! kernels and their launches; a program rarely needs either directly.
//!
//! # Quick start
//!
//! Fit `y = 2x + 1` with one linear layer:
//!
//! ```
//! use wgrad::nn::{Linear, Module};
//! use wgrad::optim::{Optimizer, Sgd};
//! use wgrad::{DType, Device};
//!
//! # fn main() -> wgrad::Result<()> {
//! let dev = Device::new()?; // the best adapter; WGRAD_ADAPTER picks another
//! let x = dev.tensor(&[0.0f32, 1.0, 2.0, 3.0], &[4, 1])?;
//! let y = dev.tensor(&[1.0f32, 3.0, 5.0, 7.0], &[4, 1])?;
//! let model = Linear::new(&dev, 1, 1, true, DType::F32)?;
//! let mut opt = Sgd::new(model.params(), 0.05, 0.0, 0.0, false)?;
//!
//! let before = model.forward(&x)?.mse_loss(&y)?.to_scalar()?;
//! for _ in 0..100 {
//!     let loss = model.forward(&x)?.mse_loss(&y)?; // recorded, not waited on
//!     opt.zero_grad();
//!     loss.backward()?; // gradients into the weight and the bias
//!     opt.step()?; // fused update kernels, on the device
//! }
//! let after = model.forward(&x)?.mse_loss(&y)?.to_scalar()?; // waits here
//! assert!(after < before / 10.0);
//! # Ok(())
//! # }
//! ```
//!
//! `examples/` holds complete programs: MNIST, a character-level GPT, profiling.
//!
//! # Cargo features
//!
//! - `gzip` (on by default): reads gzip'd data files, such as MNIST's IDX files as
//!   published ([`data::mnist`]); without it they must be inflated first.
//! - `mpi`: `parallel::MpiGroup`, data parallelism across processes and hosts under
//!   `mpirun`; it needs a system MPI and libclang.
//! - `tokenizers`: [`llm::Tokenizer`], published models' tokenizers from GGUF metadata or a
//!   `tokenizer.json`, through Hugging Face's tokenizers crate (pure Rust); without it the
//!   tokenizer's constructors return an error.
//! - `testing`: hidden hooks below the tensor level for wgrad's own tests and benchmarks.
//!
//! # Environment
//!
//! [`Device::new`] takes its options from `WGRAD_*` variables ([`DeviceOptions::from_env`]);
//! `docs/environment.md` tells what each does.
//!
//! - `WGRAD_ADAPTER=<name part>|#N`: the adapter to open (wgpu's `WGPU_BACKEND` picks the
//!   backends).
//! - `WGRAD_MEMORY_LIMIT=2GiB|50%`: the memory budget.
//! - `WGRAD_RELEASE_THRESHOLD=512MiB|5%`: the most memory kept in empty cached pages.
//! - `WGRAD_NO_CACHE=1`: no block reuse (hunting aliasing bugs).
//! - `WGRAD_TRACE=1`: the memory event trace from the start.
//! - `WGRAD_POISON=1`: every new tensor filled with NaN.
//! - `WGRAD_CHECKED=1`: index inputs checked on the host, with an error naming the bad index.
//! - `WGRAD_DISABLE=f16,subgroups,coop,spirv,elements,submit_thread`: optional features left
//!   unused (the fallback paths).
//! - `WGRAD_MATMUL_PRECISION=highest|high`: how f32 matrix products are computed
//!   ([`MatmulPrecision`]).
//! - `WGRAD_SHADER_CHECKS=full|fast|none`: the runtime checks wgpu adds to shaders
//!   ([`ShaderChecks`]).
//! - `WGRAD_AUTOTUNE=on|all|off`, `WGRAD_CACHE_DIR=DIR`: timing the candidate kernels of a
//!   product shape and keeping the fastest, and where those choices are cached.
//! - `WGRAD_DUMP_WGSL=DIR`: every composed shader written to `DIR`.
//! - `WGRAD_CORES=N|measure|none`: the compute-unit count kernel planning counts waves on;
//!   `measure` times it instead of taking the driver's, `none` plans without one
//!   ([`device::DeviceProfile::cores`]).
#![warn(missing_docs)]

// The README's and the guide pages' Rust examples, run by `cargo test --doc` and compiled
// nowhere else.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/guide/training-loop.md")]
struct TrainingLoopGuideDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/guide/custom-module.md")]
struct CustomModuleGuideDoctests;

pub mod autograd;
pub mod data;
pub mod device;
pub mod dtype;
pub mod error;
pub mod gguf;
mod hash;
pub mod kernels;
pub mod layout;
pub mod llm;
pub mod memory;
pub mod names;
pub mod nn;
pub mod ops;
pub mod optim;
pub mod parallel;
pub mod quant;
#[doc(hidden)]
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
