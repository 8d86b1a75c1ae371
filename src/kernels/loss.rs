//! Host side of `shaders/loss.wgsl`.

use super::softmax::{check_row, row_grid, row_wg};
use super::{Kernel, Launch, arg, launch, launch_flat, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::memory::Block;

crate::params! {
    /// `struct Params` of loss.wgsl.
    pub struct LossParams {
        rows: u32,
        classes: u32,
    }
}

/// Per-row cross-entropy of logits [rows, classes] against u32 labels; writes loss (dtype)
/// and stats (f32 [rows, 2]: the row max and the log of the sum of exp).
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    dev: &Device,
    x: &Block,
    labels: &Block,
    loss: &Block,
    stats: &Block,
    dtype: DType,
    rows: usize,
    classes: usize,
) -> Result<()> {
    u32_len("cross_entropy", rows * classes)?;
    check_row("cross_entropy", classes)?;
    let wg = row_wg(classes);
    launch(
        dev,
        &Launch {
            kernel: Kernel::Loss,
            entry: "fwd",
            wg,
            consts: &[],
            params: LossParams {
                rows: rows as u32,
                classes: classes as u32,
            },
            args: &[
                arg(x, dtype),
                arg(labels, DType::U32),
                arg(loss, dtype),
                arg(stats, DType::F32),
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
    stats: &Block,
    g: &Block,
    dx: &Block,
    dtype: DType,
    rows: usize,
    classes: usize,
) -> Result<()> {
    // One thread per logit.
    let n = u32_len("cross_entropy backward", rows * classes)?;
    let p = LossParams {
        rows: rows as u32,
        classes: classes as u32,
    };
    let args = [
        arg(x, dtype),
        arg(labels, DType::U32),
        arg(stats, DType::F32),
        arg(g, dtype),
        arg(dx, dtype),
    ];
    launch_flat(dev, Kernel::Loss, "bwd", 256, p, &args, n as usize)
}
