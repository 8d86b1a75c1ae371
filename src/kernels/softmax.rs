//! Host side of `shaders/softmax.wgsl`.

use super::{Arg, Kernel, Launch, arg, grid_1d, launch, over_budget, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::memory::Block;

/// Longest row the row kernels (softmax, norms, cross-entropy) take: each of their loops
/// strides over a row in steps of the workgroup, so 2^20 elements is 4096 iterations at 256
/// threads, and a kernel's two to three such loops stay inside the loop budget.
pub(crate) const MAX_ROW: usize = 1 << 20;

/// Errors for rows past [`MAX_ROW`].
pub(crate) fn check_row(op: &'static str, len: usize) -> Result<()> {
    if len > MAX_ROW {
        return Err(over_budget(
            format!("{op} over rows of {len} elements"),
            len,
            MAX_ROW,
        ));
    }
    Ok(())
}

crate::params! {
    /// `struct Params` of softmax.wgsl.
    pub struct SoftmaxParams {
        rows: u32,
        len: u32,
        log: u32,
        _pad: u32,
    }
}

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
    let args = [arg(x, dtype), arg(y, dtype)];
    run_rows(dev, "softmax", "fwd", rows, len, log, &args)
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
    let args = [arg(y, dtype), arg(dy, dtype), arg(dx, dtype)];
    run_rows(dev, "softmax backward", "bwd", rows, len, log, &args)
}

/// One workgroup per row of `len`.
fn run_rows(
    dev: &Device,
    what: &'static str,
    entry: &'static str,
    rows: usize,
    len: usize,
    log: bool,
    args: &[Arg<'_>],
) -> Result<()> {
    u32_len(what, rows * len)?;
    check_row(what, len)?;
    let wg = row_wg(len);
    launch(
        dev,
        &Launch {
            kernel: Kernel::Softmax,
            entry,
            wg,
            consts: &[],
            params: SoftmaxParams {
                rows: rows as u32,
                len: len as u32,
                log: log as u32,
                _pad: 0,
            },
            args,
            groups: row_grid(rows, wg),
        },
    )
}
