//! WGSL kernels and their host side.
//!
//! Every kernel family is one file under `shaders/` and one host file here, listed once in
//! [`Kernel`] with its parameter struct and op codes. The shader declares each entry point's
//! bindings on its signature line (see [`compose`]); the host declares the parameter block with
//! [`params!`](crate::params) (checked against the shader's `struct Params` by
//! `tests/shaders.rs`) and op codes with [`codes!`](crate::codes) (emitted into the prelude).
//! A launch names the family, the entry point, the workgroup size, compile-time constants, the
//! parameters and the storage arguments in binding order; the pipeline for that combination is
//! composed, compiled once and cached per device. Kernels know nothing about tensors or
//! autograd: they see blocks of memory, element offsets, dtypes and sizes.
//!
//! A new family is five files: its shader, its host file here, one row in [`Kernel`] (and
//! its `mod` line), its op file in `ops/` with the forward, the backward, an f64 reference and
//! the tests beside them (as `ops/scan.rs`), and its `mod` line there. `tests/shaders.rs`
//! then validates every entry and checks the parameter struct without being edited. A new
//! unary op is one row of `for_each_unary!` in `elementwise.rs`.
//!
//! # Loop budget
//!
//! Every invocation of every kernel runs a bounded number of loop iterations, whatever the
//! problem size: at most [`LOOP_BUDGET`] in total, counting each iteration of a loop whose
//! trip count is not a compile-time constant and one more per entry into such a loop. Big
//! problems are split instead (more workgroups, partial results and a second pass, or
//! several dispatches that carry state), and what cannot be split is an error. Why: Mesa's
//! lavapipe stops an invocation's loops after 65,535 iterations in all (its
//! `LP_MAX_TGSI_LOOP_ITERATIONS`) and carries on with whatever it had, a silent wrong result;
//! other drivers time out very long invocations. The budget keeps a factor of four below that
//! cap. Each host file states its kernels' count, and `tests/limits.rs` runs each kernel past
//! the sizes where an unbounded loop would cross the cap.

pub mod autotune;
pub mod compose;
pub mod decl;
pub(crate) mod pipeline;
pub mod spirv;

pub mod attention;
pub mod conv;
pub mod coop_layout;
pub(crate) mod copy;
pub mod cores;
pub(crate) mod decode;
pub mod elementwise;
pub(crate) mod embedding;
pub(crate) mod fill;
pub(crate) mod index;
pub(crate) mod loss;
pub mod matmul;
pub mod matmul_plan;
pub(crate) mod norm;
pub(crate) mod optim;
pub(crate) mod quant;
pub mod reduce;
pub(crate) mod scan;
pub(crate) mod softmax;
pub(crate) mod split;

use crate::device::Device;
use crate::device::stream::Slice;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::Block;
use compose::{EntrySig, F16Mode, Target};
use decl::{Codes, Field, KernelParams};
use std::any::TypeId;
use std::collections::HashMap;
use std::sync::OnceLock;

/// The kernels layer's per-device state (kept in `Device::kernel_state`): compiled pipelines
/// and measured kernel choices.
#[derive(Default)]
pub(crate) struct State {
    pub(crate) pipelines: pipeline::Cache,
    pub(crate) tuner: autotune::Tuner,
    /// The cooperative-matrix layout, once measured (`coop_layout::layout`), with f16 and
    /// with bf16 operands.
    pub(crate) coop_layout: OnceLock<Option<coop_layout::CoopLayout>>,
    pub(crate) coop_layout_bf16: OnceLock<Option<coop_layout::CoopLayout>>,
    /// The core count measured where the driver reports none (`cores::ensure`).
    pub(crate) cores: OnceLock<Option<usize>>,
}

pub(crate) fn state(dev: &Device) -> Result<&State> {
    dev.kernel_state::<State>()
        .ok_or_else(|| Error::Internal("the device's kernel state has another type".into()))
}

/// What the kernel tuner of `dev` did so far ([`autotune`]).
pub fn autotune_stats(dev: &Device) -> Result<autotune::AutotuneStats> {
    Ok(autotune::stats(&state(dev)?.tuner))
}

/// Loop iterations one invocation may run (see the module docs).
pub const LOOP_BUDGET: usize = 16384;

macro_rules! families {
    ($($(#[$m:meta])* $k:ident => $file:literal, $p:ty, codes [$($c:expr),*], enables [$($e:literal),*];)*) => {
        /// Every kernel family, one per `.wgsl` file.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Kernel { $($(#[$m])* $k),* }

        impl Kernel {
            /// Every family, for validation tests.
            pub const ALL: &'static [Kernel] = &[$(Kernel::$k),*];

            /// The family's WGSL source.
            pub fn source(self) -> &'static str {
                match self { $(Kernel::$k => include_str!(concat!("../../shaders/", $file))),* }
            }

            /// The op codes the family's prelude declares.
            pub fn codes(self) -> &'static [Codes] {
                match self { $(Kernel::$k => &[$($c),*]),* }
            }

            /// Extra `enable` directives the family needs.
            pub fn enables(self) -> &'static [&'static str] {
                match self { $(Kernel::$k => &[$($e),*]),* }
            }

            /// The host twin of the family's `struct Params`.
            pub fn params_fields(self) -> &'static [Field] {
                match self { $(Kernel::$k => <$p as KernelParams>::FIELDS),* }
            }

            fn params_type(self) -> TypeId {
                match self { $(Kernel::$k => TypeId::of::<$p>()),* }
            }
        }
    };
}

families! {
    /// Fill with a constant; random uniform and normal (counter-based, seeded); dropout masks.
    Fill => "fill.wgsl", fill::FillParams, codes [], enables [];
    /// Copy with dtype conversion (cast), and strided copy (transpose / permute / broadcast).
    Copy => "copy.wgsl", copy::CopyParams, codes [], enables [];
    /// Unary, binary (broadcasting), scalar, compare and select ops.
    Elementwise => "elementwise.wgsl", elementwise::EwParams,
        codes [elementwise::Unary::CODES, elementwise::Binary::CODES], enables [];
    /// Sum, mean, max, min, argmax, argmin along an axis.
    Reduce => "reduce.wgsl", reduce::ReduceParams, codes [reduce::ReduceOp::CODES], enables [];
    /// Softmax and log-softmax along the last axis, forward and backward.
    Softmax => "softmax.wgsl", softmax::SoftmaxParams, codes [], enables [];
    /// Tiled matrix multiply with transposes, bias and activation; split-K partial sums.
    Matmul => "matmul.wgsl", matmul::MatmulParams, codes [matmul::Act::CODES], enables [];
    /// Matrix multiply on cooperative matrices (tensor cores), f16 in, f32 accumulate.
    MatmulCoop => "matmul_coop.wgsl", matmul::MatmulParams, codes [matmul::Act::CODES],
        enables ["wgpu_cooperative_matrix"];
    /// The fast tensor-core product: f16 operands in 16-byte runs, 128 x 128 tiles staged
    /// in double-buffered workgroup memory, 64 x 64 per subgroup.
    MatmulTc => "matmul_tc.wgsl", matmul::MatmulParams, codes [matmul::Act::CODES],
        enables ["wgpu_cooperative_matrix"];
    /// The tensor-core product from wgrad's own SPIR-V: f16 operands staged in 16-byte
    /// runs, 128 x 128 tiles, 64 x 64 per subgroup (kernels/spirv.rs).
    MatmulWide => "matmul_wide.wgsl", matmul::MatmulParams, codes [matmul::Act::CODES],
        enables ["wgpu_cooperative_matrix"];
    /// im2col / col2im for convolution; max and average pooling.
    Conv => "conv.wgsl", conv::ConvParams, codes [], enables [];
    /// Fused scaled dot-product attention (flash style), forward and backward.
    Attention => "attention.wgsl", attention::AttnParams, codes [], enables [];
    /// Attention forward and backward on cooperative matrices (f16, tensor cores).
    AttentionCoop => "attention_coop.wgsl", attention::AttnParams, codes [],
        enables ["wgpu_cooperative_matrix"];
    /// LayerNorm and RMSNorm forward and backward.
    Norm => "norm.wgsl", norm::NormParams, codes [], enables [];
    /// Cross-entropy from logits, forward and backward.
    Loss => "loss.wgsl", loss::LossParams, codes [], enables [];
    /// Embedding gather and scatter-add.
    Embedding => "embedding.wgsl", embedding::EmbedParams, codes [], enables [];
    /// Fused optimizer updates (SGD, Adam, AdamW) and gradient sums of squares.
    Optim => "optim.wgsl", optim::OptimParams, codes [optim::Ctl::CODES], enables [];
    /// Cumulative sums along an axis, forward or reversed.
    Scan => "scan.wgsl", scan::ScanParams, codes [], enables [];
    /// Gather, scatter-add and index-select along an axis; top-k ranks.
    Index => "index.wgsl", index::IndexParams, codes [], enables [];
    /// f32 operands split into f16 parts for products on tensor cores, and the scaling back.
    Split => "split.wgsl", split::SplitParams, codes [matmul::Act::CODES], enables [];
    /// A decode step's attention: rotary embedding with the cache write, attention of one
    /// token over the cache split along it (flash-decoding).
    Decode => "decode.wgsl", decode::DecodeParams, codes [], enables [];
    /// Products with a matrix kept in a quantized block format (Q4_0, Q4_1, Q8_0), its
    /// decoding and row lookups.
    Quant => "quant.wgsl", quant::QuantParams, codes [], enables [];
    /// Where a driver puts the elements of a cooperative matrix (one probe).
    CoopLayout => "coop_layout.wgsl", coop_layout::LayoutParams, codes [],
        enables ["wgpu_cooperative_matrix"];
}

impl Kernel {
    /// The entry points of the family with their signatures, parsed from the source once.
    pub fn entries(self) -> Result<&'static [EntrySig]> {
        static SIGS: OnceLock<HashMap<Kernel, std::result::Result<Vec<EntrySig>, String>>> =
            OnceLock::new();
        let all = SIGS.get_or_init(|| {
            Kernel::ALL
                .iter()
                .map(|&k| (k, compose::parse_entries(k.source())))
                .collect()
        });
        match all.get(&self) {
            Some(Ok(v)) => Ok(v),
            Some(Err(e)) => Err(Error::Internal(format!("{self:?}: {e}"))),
            None => Err(Error::Internal(format!("{self:?} has no entries"))),
        }
    }

    /// One entry point's signature.
    pub fn entry(self, name: &str) -> Result<&'static EntrySig> {
        self.entries()?
            .iter()
            .find(|e| e.name == name)
            .ok_or_else(|| Error::Internal(format!("kernel {self:?} has no entry point {name}")))
    }
}

/// A storage argument of a launch: a block and the dtype of its elements. Arguments are
/// given in the order of the entry's signature.
#[derive(Clone, Copy)]
pub(crate) struct Arg<'a> {
    pub block: &'a Block,
    pub dtype: DType,
}

/// Shorthand for an [`Arg`].
pub(crate) fn arg(block: &Block, dtype: DType) -> Arg<'_> {
    Arg { block, dtype }
}

/// One kernel launch.
/// A launch's compile-time constants, inline: a vector was an allocation per launch.
pub(crate) type Consts = smallvec::SmallVec<[(&'static str, u32); 8]>;

pub(crate) struct Launch<'a, P> {
    pub kernel: Kernel,
    pub entry: &'static str,
    /// Threads per workgroup (the prelude's `WG`).
    pub wg: u32,
    /// Compile-time constants (`const NAME: u32`).
    pub consts: &'a [(&'static str, u32)],
    /// The kernel's parameter block.
    pub params: P,
    pub args: &'a [Arg<'a>],
    pub groups: [u32; 3],
}

/// The capability set of a device, as the composer sees it.
pub(crate) fn target(dev: &Device) -> Target {
    let c = dev.caps();
    Target {
        f16: if c.f16 {
            F16Mode::Native
        } else {
            F16Mode::Packed
        },
        subgroups: c.subgroups,
    }
}

/// Compiles (once) and records one launch.
/// Launches `entry` of `kernel` over `n` threads in a 1-D grid of `wg`-thread workgroups, with
/// no compile-time constants: the shape of the elementwise, copy and fill launches.
pub(crate) fn launch_flat<P: KernelParams>(
    dev: &Device,
    kernel: Kernel,
    entry: &'static str,
    wg: u32,
    params: P,
    args: &[Arg<'_>],
    n: usize,
) -> Result<()> {
    launch(
        dev,
        &Launch {
            kernel,
            entry,
            wg,
            consts: &[],
            params,
            args,
            groups: grid_1d(n, wg),
        },
    )
}

pub(crate) fn launch<P: KernelParams>(dev: &Device, l: &Launch<'_, P>) -> Result<()> {
    let key = pipeline::Key::new(l.kernel, l.entry, l.wg, l.consts, l.args)?;
    let pipe = pipeline::get(dev, &key, l.args.len(), || {
        if TypeId::of::<P>() != l.kernel.params_type() {
            return Err(Error::Internal(format!(
                "launch of {:?}/{} with parameters {}",
                l.kernel,
                l.entry,
                std::any::type_name::<P>()
            )));
        }
        let sig = l.kernel.entry(l.entry)?;
        pipeline::check_launch(l.kernel, sig, l.wg, l.consts, l.args)?;
        let dtypes: Vec<DType> = l.args.iter().map(|a| a.dtype).collect();
        compose::compose(
            target(dev),
            l.kernel.source(),
            sig,
            l.wg,
            l.consts,
            &dtypes,
            l.kernel.codes(),
            l.kernel.enables(),
        )
        .ok_or_else(|| {
            Error::Internal(format!(
                "kernel {:?} has no entry point {}",
                l.kernel, l.entry
            ))
        })
    })?;
    let params = bytemuck::bytes_of(&l.params);
    let Some(first) = l.args.first() else {
        return dev.dispatch(&pipe, params, &[], l.groups);
    };
    // On the stack: a vector here was an allocation per launch.
    let mut slices = [Slice {
        buffer: first.block.buffer(),
        page: 0,
        offset: 0,
        size: 0,
    }; pipeline::MAX_ARGS];
    for (s, a) in slices.iter_mut().zip(l.args) {
        *s = Slice {
            buffer: a.block.buffer(),
            page: a.block.page(),
            offset: a.block.offset(),
            size: a.block.size(),
        };
    }
    let slices = slices.get(..l.args.len()).ok_or_else(|| {
        Error::Internal(format!(
            "launch of {:?}/{} with {} arguments",
            l.kernel,
            l.entry,
            l.args.len()
        ))
    })?;
    dev.dispatch(&pipe, params, slices, l.groups)
}

/// Number of pipelines built so far on `dev`.
pub fn pipeline_count(dev: &Device) -> usize {
    pipeline::count(dev)
}

/// The grid for `n` threads in workgroups of `wg`, folded into two dimensions when one would
/// pass the 65535-workgroup limit (kernels index with `flat_id`).
pub(crate) fn grid_1d(n: usize, wg: u32) -> [u32; 3] {
    let groups = (n as u64).div_ceil(wg as u64).max(1);
    if groups <= 65535 {
        [groups as u32, 1, 1]
    } else {
        let y = groups.div_ceil(65535);
        [65535, y as u32, 1]
    }
}

/// Checks that a count fits the u32 indexing kernels use.
pub(crate) fn u32_len(op: &'static str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::LimitExceeded {
        what: format!("{op} on {n} elements"),
        requested: n as u64,
        limit_name: "u32 element indexing",
        limit: u32::MAX as u64,
    })
}

/// An error for a problem one invocation cannot handle within the loop budget.
pub(crate) fn over_budget(what: String, requested: usize, limit: usize) -> Error {
    Error::LimitExceeded {
        what,
        requested: requested as u64,
        limit_name: "wgrad per-invocation loop budget (see kernels::LOOP_BUDGET)",
        limit: limit as u64,
    }
}
