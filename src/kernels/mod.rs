//! WGSL kernels and their host side.
//!
//! Every kernel family is one file under `shaders/`, listed once in [`Kernel`]. A launch names
//! the family, the entry point, the workgroup size, compile-time constants, the parameter words
//! and the storage arguments; the pipeline for that combination is composed (see
//! [`compose`]), compiled once and cached by the device. Kernels know nothing about tensors or
//! autograd: they see blocks of memory, dtypes and sizes.

pub mod compose;
pub mod signature;

pub mod attention;
pub mod conv;
pub(crate) mod copy;
pub mod elementwise;
pub(crate) mod embedding;
pub(crate) mod fill;
pub(crate) mod loss;
pub mod matmul;
pub(crate) mod norm;
pub(crate) mod optim;
pub(crate) mod reduce;
pub(crate) mod softmax;

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::Block;
use crate::stream::Slice;
use compose::{Decl, F16Mode, Target};

/// Every kernel family, one per `.wgsl` file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// Fill with a constant; random uniform and normal (counter-based, seeded); dropout masks.
    Fill,
    /// Copy with dtype conversion (cast), and strided copy (transpose / permute / broadcast).
    Copy,
    /// Unary, binary (broadcasting), scalar, compare and select ops.
    Elementwise,
    /// Sum, mean, max, argmax along an axis.
    Reduce,
    /// Softmax and log-softmax along the last axis, forward and backward.
    Softmax,
    /// Tiled matrix multiply with transposes, bias and activation.
    Matmul,
    /// Matrix multiply on cooperative matrices (tensor cores), f16 in, f32 accumulate.
    MatmulCoop,
    /// im2col / col2im for convolution; max and average pooling.
    Conv,
    /// Fused scaled dot-product attention (flash style), forward and backward.
    Attention,
    /// The attention forward pass on cooperative matrices (f16, tensor cores).
    AttentionCoop,
    /// LayerNorm and RMSNorm forward and backward.
    Norm,
    /// Cross-entropy from logits, forward and backward.
    Loss,
    /// Embedding gather and scatter-add.
    Embedding,
    /// Fused optimizer updates (SGD, Adam, AdamW) and gradient sums of squares.
    Optim,
}

impl Kernel {
    /// Every family, for validation tests.
    pub const ALL: &'static [Kernel] = &[
        Kernel::Fill,
        Kernel::Copy,
        Kernel::Elementwise,
        Kernel::Reduce,
        Kernel::Softmax,
        Kernel::Matmul,
        Kernel::MatmulCoop,
        Kernel::Conv,
        Kernel::Attention,
        Kernel::AttentionCoop,
        Kernel::Norm,
        Kernel::Loss,
        Kernel::Embedding,
        Kernel::Optim,
    ];

    /// The family's WGSL source.
    pub fn source(self) -> &'static str {
        match self {
            Kernel::Fill => include_str!("../../shaders/fill.wgsl"),
            Kernel::Copy => include_str!("../../shaders/copy.wgsl"),
            Kernel::Elementwise => include_str!("../../shaders/elementwise.wgsl"),
            Kernel::Reduce => include_str!("../../shaders/reduce.wgsl"),
            Kernel::Softmax => include_str!("../../shaders/softmax.wgsl"),
            Kernel::Matmul => include_str!("../../shaders/matmul.wgsl"),
            Kernel::MatmulCoop => include_str!("../../shaders/matmul_coop.wgsl"),
            Kernel::Conv => include_str!("../../shaders/conv.wgsl"),
            Kernel::Attention => include_str!("../../shaders/attention.wgsl"),
            Kernel::AttentionCoop => include_str!("../../shaders/attention_coop.wgsl"),
            Kernel::Norm => include_str!("../../shaders/norm.wgsl"),
            Kernel::Loss => include_str!("../../shaders/loss.wgsl"),
            Kernel::Embedding => include_str!("../../shaders/embedding.wgsl"),
            Kernel::Optim => include_str!("../../shaders/optim.wgsl"),
        }
    }

    /// Extra `enable` directives the family needs.
    pub fn enables(self) -> &'static [&'static str] {
        match self {
            Kernel::MatmulCoop | Kernel::AttentionCoop => &["wgpu_cooperative_matrix"],
            _ => &[],
        }
    }
}

/// A storage argument of a launch.
pub(crate) struct Arg<'a> {
    pub name: &'static str,
    pub block: &'a Block,
    pub dtype: DType,
    pub write: bool,
}

impl<'a> Arg<'a> {
    pub fn read(name: &'static str, block: &'a Block, dtype: DType) -> Self {
        Arg {
            name,
            block,
            dtype,
            write: false,
        }
    }
    pub fn write(name: &'static str, block: &'a Block, dtype: DType) -> Self {
        Arg {
            name,
            block,
            dtype,
            write: true,
        }
    }
}

/// One kernel launch.
pub(crate) struct Launch<'a> {
    pub kernel: Kernel,
    pub entry: &'static str,
    /// Threads per workgroup (the prelude's `WG`).
    pub wg: u32,
    /// Compile-time constants (`const NAME: u32`).
    pub consts: &'a [(&'static str, u32)],
    /// The words of the kernel's `Params` struct.
    pub params: &'a [u32],
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
pub(crate) fn launch(dev: &Device, l: &Launch<'_>) -> Result<()> {
    let t = target(dev);
    let mut key = format!(
        "{:?}/{}/wg{}/{:?}/sg{}",
        l.kernel, l.entry, l.wg, t.f16, t.subgroups as u8
    );
    for (n, v) in l.consts {
        key.push_str(&format!("/{n}={v}"));
    }
    for a in l.args {
        key.push_str(&format!(
            "/{}:{}{}",
            a.name,
            a.dtype,
            if a.write { "w" } else { "" }
        ));
    }
    let pipe = dev.pipeline(&key, l.args.len(), || {
        check_signature(l)?;
        let decls: Vec<Decl> = l
            .args
            .iter()
            .map(|a| Decl {
                name: a.name,
                dtype: a.dtype,
                write: a.write,
            })
            .collect();
        compose::compose(
            t,
            l.kernel.source(),
            l.entry,
            l.wg,
            l.consts,
            &decls,
            l.kernel.enables(),
        )
        .ok_or_else(|| {
            Error::Gpu(format!(
                "kernel {:?} has no entry point {}",
                l.kernel, l.entry
            ))
        })
    })?;
    let slices: Vec<Slice<'_>> = l
        .args
        .iter()
        .map(|a| Slice {
            buffer: a.block.buffer(),
            offset: a.block.offset(),
            size: a.block.size(),
        })
        .collect();
    dev.dispatch(&pipe, l.params, &slices, l.groups)
}

/// Checks a launch against the signature table (once per pipeline): the table is what the
/// naga validation test covers, so it must describe what really runs.
fn check_signature(l: &Launch<'_>) -> Result<()> {
    let bad = |why: String| {
        Err(Error::Gpu(format!(
            "internal: launch of {:?}/{} {why}",
            l.kernel, l.entry
        )))
    };
    let Some(sig) = signature::find(l.kernel, l.entry) else {
        return bad("has no signature".into());
    };
    if sig.bindings.len() != l.args.len() {
        return bad(format!(
            "binds {} buffers, the signature {}",
            l.args.len(),
            sig.bindings.len()
        ));
    }
    for (a, &(name, elem, write)) in l.args.iter().zip(sig.bindings) {
        if a.name != name || a.write != write || !elem.allows(a.dtype) {
            return bad(format!(
                "binds {} ({}, write {}) where the signature has {name} ({elem:?}, write {write})",
                a.name, a.dtype, a.write
            ));
        }
    }
    if !sig.wgs.contains(&l.wg) {
        return bad(format!("uses workgroup size {} not in {:?}", l.wg, sig.wgs));
    }
    let same_names = |c: &[(&str, u32)]| {
        c.len() == l.consts.len() && c.iter().zip(l.consts).all(|(a, b)| a.0 == b.0)
    };
    let exact = sig.consts.contains(&l.consts);
    let shape_consts = l.kernel == Kernel::MatmulCoop && sig.consts.iter().any(|c| same_names(c));
    if !exact && !shape_consts {
        return bad(format!(
            "uses constants {:?} not in the signature",
            l.consts
        ));
    }
    Ok(())
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

/// Reinterprets an f32 as a parameter word.
pub(crate) fn f(v: f32) -> u32 {
    v.to_bits()
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
