//! Host side of `shaders/norm.wgsl`.

use super::reduce::{self, ReduceOp};
use super::softmax::{check_row, row_grid, row_wg};
use super::{Kernel, Launch, arg, grid_1d, launch, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::memory::Block;

/// Rows one `bwd_params` invocation sums (its loop bound).
const RCHUNK: usize = 256;

crate::params! {
    /// `struct Params` of norm.wgsl.
    pub struct NormParams {
        rows: u32,
        len: u32,
        eps: f32,
        rms: u32,
        rchunk: u32,
        nchunks: u32,
        _pad0: u32,
        _pad1: u32,
    }
}

/// The tensors of a normalisation over rows of `len`.
pub(crate) struct Norm<'a> {
    pub x: &'a Block,
    pub gamma: &'a Block,
    /// None for RMSNorm.
    pub beta: Option<&'a Block>,
    /// f32 [rows, 3]: first-pass mean, its correction, 1/std.
    pub stats: &'a Block,
    pub dtype: DType,
    pub rows: usize,
    pub len: usize,
    pub eps: f32,
}

impl Norm<'_> {
    fn params(&self) -> NormParams {
        let nchunks = self.rows.div_ceil(RCHUNK).max(1);
        NormParams {
            rows: self.rows as u32,
            len: self.len as u32,
            eps: self.eps,
            rms: self.beta.is_none() as u32,
            rchunk: RCHUNK as u32,
            nchunks: nchunks as u32,
            ..Default::default()
        }
    }
}

pub(crate) fn forward(dev: &Device, n: &Norm<'_>, y: &Block) -> Result<()> {
    u32_len("norm", n.rows * n.len)?;
    check_row("norm", n.len)?;
    let wg = row_wg(n.len);
    launch(
        dev,
        &Launch {
            kernel: Kernel::Norm,
            entry: "fwd",
            wg,
            consts: &[],
            params: n.params(),
            args: &[
                arg(n.x, n.dtype),
                arg(n.gamma, n.dtype),
                arg(n.beta.unwrap_or(n.gamma), n.dtype),
                arg(y, n.dtype),
                arg(n.stats, DType::F32),
            ],
            groups: row_grid(n.rows, wg),
        },
    )
}

/// dx, and the parameter gradients as one [2, len] block (`dparams`: dgamma, then dbeta,
/// which is zero-use for RMSNorm).
pub(crate) fn backward(
    dev: &Device,
    n: &Norm<'_>,
    dy: &Block,
    dx: &Block,
    dparams: &Block,
) -> Result<()> {
    check_row("norm backward", n.len)?;
    let wg = row_wg(n.len);
    let p = n.params();
    launch(
        dev,
        &Launch {
            kernel: Kernel::Norm,
            entry: "bwd_x",
            wg,
            consts: &[],
            params: p,
            args: &[
                arg(n.x, n.dtype),
                arg(dy, n.dtype),
                arg(n.gamma, n.dtype),
                arg(n.stats, DType::F32),
                arg(dx, n.dtype),
            ],
            groups: row_grid(n.rows, wg),
        },
    )?;
    let nchunks = p.nchunks as usize;
    let part = dev.alloc((2 * nchunks * n.len * 4) as u64)?;
    launch(
        dev,
        &Launch {
            kernel: Kernel::Norm,
            entry: "bwd_params",
            wg: 256,
            consts: &[],
            params: p,
            args: &[
                arg(n.x, n.dtype),
                arg(dy, n.dtype),
                arg(n.stats, DType::F32),
                arg(&part, DType::F32),
            ],
            groups: grid_1d(n.len * nchunks, 256),
        },
    )?;
    // [2, nchunks, len] -> [2, len].
    reduce::reduce(
        dev,
        ReduceOp::Sum,
        1.0,
        &part,
        DType::F32,
        dparams,
        n.dtype,
        2,
        nchunks,
        n.len,
    )
}
