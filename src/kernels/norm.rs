//! Host side of `shaders/norm.wgsl`.

use super::softmax::{row_grid, row_wg};
use super::{Arg, Kernel, Launch, f, grid_1d, launch, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::memory::Block;

/// The tensors of a normalisation over rows of `len`.
pub(crate) struct Norm<'a> {
    pub x: &'a Block,
    pub gamma: &'a Block,
    /// None for RMSNorm.
    pub beta: Option<&'a Block>,
    /// f32 [rows].
    pub mean: &'a Block,
    /// f32 [rows].
    pub rstd: &'a Block,
    pub dtype: DType,
    pub rows: usize,
    pub len: usize,
    pub eps: f32,
}

impl Norm<'_> {
    fn params(&self) -> [u32; 4] {
        [
            self.rows as u32,
            self.len as u32,
            f(self.eps),
            self.beta.is_none() as u32,
        ]
    }
}

pub(crate) fn forward(dev: &Device, n: &Norm<'_>, y: &Block) -> Result<()> {
    u32_len("norm", n.rows * n.len)?;
    let wg = row_wg(n.len);
    launch(
        dev,
        &Launch {
            kernel: Kernel::Norm,
            entry: "fwd",
            wg,
            consts: &[],
            params: &n.params(),
            args: &[
                Arg::read("x", n.x, n.dtype),
                Arg::read("gamma", n.gamma, n.dtype),
                Arg::read("beta", n.beta.unwrap_or(n.gamma), n.dtype),
                Arg::write("y", y, n.dtype),
                Arg::write("mean", n.mean, DType::F32),
                Arg::write("rstd", n.rstd, DType::F32),
            ],
            groups: row_grid(n.rows, wg),
        },
    )
}

/// dx, and dgamma / dbeta (dbeta is written to a scratch block for RMSNorm).
pub(crate) fn backward(
    dev: &Device,
    n: &Norm<'_>,
    dy: &Block,
    dx: &Block,
    dgamma: &Block,
    dbeta: &Block,
) -> Result<()> {
    let wg = row_wg(n.len);
    launch(
        dev,
        &Launch {
            kernel: Kernel::Norm,
            entry: "bwd_x",
            wg,
            consts: &[],
            params: &n.params(),
            args: &[
                Arg::read("x", n.x, n.dtype),
                Arg::read("dy", dy, n.dtype),
                Arg::read("gamma", n.gamma, n.dtype),
                Arg::read("mean", n.mean, DType::F32),
                Arg::read("rstd", n.rstd, DType::F32),
                Arg::write("dx", dx, n.dtype),
            ],
            groups: row_grid(n.rows, wg),
        },
    )?;
    launch(
        dev,
        &Launch {
            kernel: Kernel::Norm,
            entry: "bwd_params",
            wg: 256,
            consts: &[],
            params: &n.params(),
            args: &[
                Arg::read("x", n.x, n.dtype),
                Arg::read("dy", dy, n.dtype),
                Arg::read("mean", n.mean, DType::F32),
                Arg::read("rstd", n.rstd, DType::F32),
                Arg::write("dgamma", dgamma, n.dtype),
                Arg::write("dbeta", dbeta, n.dtype),
            ],
            groups: grid_1d(n.len, 256),
        },
    )
}
