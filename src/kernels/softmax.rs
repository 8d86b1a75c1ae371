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

/// Rows (subgroups) per workgroup of the one-subgroup-per-row entries (softmax.wgsl's and
/// norm.wgsl's `_vec`, norm.wgsl's `_rows`).
pub(crate) const ROWS_PER_WG: u32 = 4;

/// The workgroup size of the one-subgroup-per-row entries: ROWS_PER_WG subgroups, on adapters
/// with one subgroup size. None where a workgroup per row runs instead.
pub(crate) fn subgroup_rows_wg(dev: &Device) -> Option<u32> {
    let c = dev.caps();
    let wg = ROWS_PER_WG * c.subgroup_max;
    (c.subgroups && c.subgroup_min == c.subgroup_max && [32, 64, 128, 256].contains(&wg))
        .then_some(wg)
}

/// Runs of 4 a lane holds at most in the `_vec` entries: rows of up to 2048 elements on
/// 32-wide subgroups. (16 runs are 64 registers of x in a forward, of each operand in a
/// backward.)
const MOST_RUNS: usize = 16;

/// The `_vec` entries' NV (runs of 4 a lane) for rows of `len`, where they apply: a multiple
/// of 4, at most MOST_RUNS runs a lane on the adapter's subgroups.
pub(crate) fn register_runs(dev: &Device, len: usize) -> Option<u32> {
    let runs = len.div_ceil(4 * dev.caps().subgroup_max.max(1) as usize);
    (len.is_multiple_of(4) && runs <= MOST_RUNS).then_some(runs.max(1) as u32)
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
    let params = SoftmaxParams {
        rows: rows as u32,
        len: len as u32,
        log: log as u32,
        _pad: 0,
    };
    // A subgroup per row with the row in registers where the adapter and the length allow.
    if let (Some(wg), Some(nv)) = (subgroup_rows_wg(dev), register_runs(dev, len)) {
        return launch(
            dev,
            &Launch {
                kernel: Kernel::Softmax,
                entry: if entry == "fwd" { "fwd_vec" } else { "bwd_vec" },
                wg,
                consts: &[("NV", nv)],
                params,
                args,
                groups: row_grid(rows.div_ceil(ROWS_PER_WG as usize), wg),
            },
        );
    }
    let wg = row_wg(len);
    launch(
        dev,
        &Launch {
            kernel: Kernel::Softmax,
            entry,
            wg,
            consts: &[],
            params,
            args,
            groups: row_grid(rows, wg),
        },
    )
}
