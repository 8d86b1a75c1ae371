//! Host side of `shaders/split.wgsl`: f32 products as three f16 products on tensor cores
//! (`MatmulPrecision::High`). `parts` splits an operand, the product runs on the matmul
//! kernels (f16 operands, f32 result), and `join` undoes the scaling and applies the epilogue.
//!
//! Loop budget: neither kernel loops.

use super::matmul::Act;
use super::{Kernel, arg, launch_flat, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::memory::Block;

crate::params! {
    /// `struct Params` of split.wgsl.
    pub struct SplitParams {
        nmat: u32,
        lines: u32,
        k: u32,
        lines8: u32,
        k8: u32,
        x_off: u32,
        x_bs: u32,
        s_line: u32,
        s_k: u32,
        kfast: u32,
        order: u32,
        batch: u32,
        m: u32,
        n: u32,
        m8: u32,
        n8: u32,
        ea_bs: u32,
        eb_bs: u32,
        has_bias: u32,
        act: u32,
    }
}

/// An extent padded to the product's runs of 8.
pub(crate) fn pad8(n: usize) -> usize {
    n.next_multiple_of(8)
}

/// One f32 operand: `nmat` matrices of `lines` lines (rows of op(A), columns of op(B)) of
/// length `k`; element (mat, line, k) at `offset + mat * mat_stride + line * line_stride +
/// k * k_stride` in `x`. `amax` holds each line's largest magnitude, f32 [nmat, lines].
pub(crate) struct Operand<'a> {
    pub x: &'a Block,
    pub amax: &'a Block,
    pub nmat: usize,
    pub lines: usize,
    pub k: usize,
    pub offset: usize,
    pub mat_stride: usize,
    pub line_stride: usize,
    pub k_stride: usize,
    /// B's order of parts along K, [hi, lo, hi], instead of A's [hi, hi, lo].
    pub second: bool,
}

impl Operand<'_> {
    /// Whether the parts are k-fast (as the operand is; else lines-fast).
    pub fn kfast(&self) -> bool {
        self.k_stride == 1
    }

    /// Elements of the parts: [nmat, pad8(lines), 3 pad8(k)] or [nmat, 3 pad8(k), pad8(lines)].
    pub fn parts_len(&self) -> usize {
        self.nmat * pad8(self.lines) * 3 * pad8(self.k)
    }
}

/// Writes `o`'s three f16 parts to `hl` (`Operand::parts_len` halves) and each line's
/// -log2(scale) to `ex` (f32 [nmat, lines], NaN for a line with inf or NaN).
pub(crate) fn parts(dev: &Device, o: &Operand<'_>, hl: &Block, ex: &Block) -> Result<()> {
    let what = "matmul (split f32)";
    u32_len(what, o.parts_len())?;
    u32_len(
        what,
        o.offset + o.mat_stride * o.nmat + o.line_stride * o.lines + o.k_stride * o.k,
    )?;
    let p = SplitParams {
        nmat: o.nmat as u32,
        lines: o.lines as u32,
        k: o.k as u32,
        lines8: pad8(o.lines) as u32,
        k8: pad8(o.k) as u32,
        x_off: o.offset as u32,
        x_bs: o.mat_stride as u32,
        s_line: o.line_stride as u32,
        s_k: o.k_stride as u32,
        kfast: o.kfast() as u32,
        order: o.second as u32,
        ..Default::default()
    };
    let args = [
        arg(o.x, DType::F32),
        arg(o.amax, DType::F32),
        arg(hl, DType::F16),
        arg(ex, DType::F32),
    ];
    // Four elements a thread (pad8 makes every extent a multiple of 4).
    let threads = o.nmat * pad8(o.lines) * pad8(o.k) / 4;
    launch_flat(dev, Kernel::Split, "parts", 256, p, &args, threads)
}

/// `c[b, m, n] = act(cp[b, m, n] 2^(ea[b, m] + eb[b, n]) + bias[n])`, with `cp` the product
/// of the parts, [batch, pad8(m), pad8(n)], and the operands' exponents from `parts` at
/// `ea_bs` b and `eb_bs` b (0 for an operand shared by the batch).
pub(crate) struct Join<'a> {
    pub cp: &'a Block,
    pub ea: &'a Block,
    pub eb: &'a Block,
    pub bias: Option<&'a Block>,
    pub c: &'a Block,
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub ea_bs: usize,
    pub eb_bs: usize,
    pub act: Act,
}

/// Runs [`Join`].
pub(crate) fn join(dev: &Device, j: &Join<'_>) -> Result<()> {
    let total = j.batch * j.m * j.n;
    u32_len("matmul (split f32)", j.batch * pad8(j.m) * pad8(j.n))?;
    let p = SplitParams {
        batch: j.batch as u32,
        m: j.m as u32,
        n: j.n as u32,
        m8: pad8(j.m) as u32,
        n8: pad8(j.n) as u32,
        ea_bs: j.ea_bs as u32,
        eb_bs: j.eb_bs as u32,
        has_bias: j.bias.is_some() as u32,
        act: j.act as u32,
        ..Default::default()
    };
    let args = [
        arg(j.cp, DType::F32),
        arg(j.ea, DType::F32),
        arg(j.eb, DType::F32),
        arg(j.bias.unwrap_or(j.c), DType::F32),
        arg(j.c, DType::F32),
    ];
    launch_flat(dev, Kernel::Split, "join", 256, p, &args, total)
}
