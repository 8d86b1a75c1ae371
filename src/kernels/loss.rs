//! Host side of `shaders/loss.wgsl`.

use super::softmax::{row_grid, row_wg};
use super::{Arg, Kernel, Launch, grid_1d, launch, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::memory::Block;

/// Per-row cross-entropy of logits [rows, classes] against u32 labels; writes loss (dtype)
/// and lse (f32).
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    dev: &Device,
    x: &Block,
    labels: &Block,
    loss: &Block,
    lse: &Block,
    dtype: DType,
    rows: usize,
    classes: usize,
) -> Result<()> {
    u32_len("cross_entropy", rows * classes)?;
    let wg = row_wg(classes);
    launch(
        dev,
        &Launch {
            kernel: Kernel::Loss,
            entry: "fwd",
            wg,
            consts: &[],
            params: &[rows as u32, classes as u32],
            args: &[
                Arg::read("x", x, dtype),
                Arg::read("labels", labels, DType::U32),
                Arg::write("loss", loss, dtype),
                Arg::write("lse", lse, DType::F32),
            ],
            groups: row_grid(rows, wg),
        },
    )
}

/// dx = g[row] * (softmax(x) - onehot(label)).
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    dev: &Device,
    x: &Block,
    labels: &Block,
    lse: &Block,
    g: &Block,
    dx: &Block,
    dtype: DType,
    rows: usize,
    classes: usize,
) -> Result<()> {
    launch(
        dev,
        &Launch {
            kernel: Kernel::Loss,
            entry: "bwd",
            wg: 256,
            consts: &[],
            params: &[rows as u32, classes as u32],
            args: &[
                Arg::read("x", x, dtype),
                Arg::read("labels", labels, DType::U32),
                Arg::read("lse", lse, DType::F32),
                Arg::read("g", g, dtype),
                Arg::write("dx", dx, dtype),
            ],
            groups: grid_1d(rows * classes, 256),
        },
    )
}
