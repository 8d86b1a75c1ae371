//! Host side of `shaders/softmax.wgsl`.

use super::{Arg, Kernel, Launch, grid_1d, launch, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::memory::Block;

/// Threads per row: enough to cover short rows without idle lanes, 256 for long ones.
pub(crate) fn row_wg(len: usize) -> u32 {
    (len.next_power_of_two() as u32).clamp(32, 256)
}

/// Grid of one workgroup per row.
pub(crate) fn row_grid(rows: usize, wg: u32) -> [u32; 3] {
    grid_1d(rows * wg as usize, wg)
}

/// Softmax (or log-softmax) of each row of x viewed as [rows, len].
pub(crate) fn forward(
    dev: &Device,
    x: &Block,
    y: &Block,
    dtype: DType,
    rows: usize,
    len: usize,
    log: bool,
) -> Result<()> {
    u32_len("softmax", rows * len)?;
    let wg = row_wg(len);
    launch(
        dev,
        &Launch {
            kernel: Kernel::Softmax,
            entry: "fwd",
            wg,
            consts: &[],
            params: &[rows as u32, len as u32, log as u32, 0],
            args: &[Arg::read("x", x, dtype), Arg::write("y", y, dtype)],
            groups: row_grid(rows, wg),
        },
    )
}

/// Gradient of softmax (or log-softmax) from its output y and the output's gradient dy.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    dev: &Device,
    y: &Block,
    dy: &Block,
    dx: &Block,
    dtype: DType,
    rows: usize,
    len: usize,
    log: bool,
) -> Result<()> {
    let wg = row_wg(len);
    launch(
        dev,
        &Launch {
            kernel: Kernel::Softmax,
            entry: "bwd",
            wg,
            consts: &[],
            params: &[rows as u32, len as u32, log as u32, 0],
            args: &[
                Arg::read("y", y, dtype),
                Arg::read("dy", dy, dtype),
                Arg::write("dx", dx, dtype),
            ],
            groups: row_grid(rows, wg),
        },
    )
}
