//! Host side of `shaders/reduce.wgsl`.

use super::{Arg, Kernel, Launch, f, grid_1d, launch, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::memory::Block;

const WG: u32 = 256;
/// Rows longer than this are split into chunks reduced by separate workgroups.
const CHUNK: usize = 8192;

/// What to reduce with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum ReduceOp {
    /// Sum times a scale (1 for sum, 1/len for mean).
    Sum(f32),
    /// Maximum.
    Max,
}

fn params(
    outer: usize,
    len: usize,
    inner: usize,
    op: ReduceOp,
    chunk: usize,
    nchunks: usize,
) -> Vec<u32> {
    let (code, scale) = match op {
        ReduceOp::Sum(s) => (0, s),
        ReduceOp::Max => (1, 1.0),
    };
    vec![
        outer as u32,
        len as u32,
        inner as u32,
        code,
        f(scale),
        chunk as u32,
        nchunks as u32,
        f(f32::NEG_INFINITY),
    ]
}

/// Grid of `rows`: chunks on x, rows on y, rows past 65535 on z.
fn rows_grid(nchunks: usize, outer: usize) -> [u32; 3] {
    let y = outer.clamp(1, 65535);
    [
        nchunks as u32,
        y as u32,
        outer.div_ceil(65535).max(1) as u32,
    ]
}

/// Reduces x viewed as [outer, len, inner] over the middle axis into y of [outer, inner].
/// `scratch` is called for the partials of very long rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn reduce(
    dev: &Device,
    op: ReduceOp,
    x: &Block,
    y: &Block,
    dtype: DType,
    outer: usize,
    len: usize,
    inner: usize,
    scratch: impl FnOnce(usize) -> Result<Block>,
) -> Result<()> {
    u32_len("reduce", outer * len * inner)?;
    if inner > 1 {
        return launch(
            dev,
            &Launch {
                kernel: Kernel::Reduce,
                entry: "cols",
                wg: WG,
                consts: &[],
                params: &params(outer, len, inner, op, 0, 0),
                args: &[Arg::read("x", x, dtype), Arg::write("y", y, dtype)],
                groups: grid_1d(outer * inner, WG),
            },
        );
    }
    // Split long rows only when there are too few rows to fill the device.
    let nchunks = if len > CHUNK && outer < 1024 {
        len.div_ceil(CHUNK)
    } else {
        1
    };
    if nchunks == 1 {
        return launch(
            dev,
            &Launch {
                kernel: Kernel::Reduce,
                entry: "rows",
                wg: WG,
                consts: &[],
                params: &params(outer, len, 1, op, len.max(1), 1),
                args: &[Arg::read("x", x, dtype), Arg::write("y", y, dtype)],
                groups: rows_grid(1, outer),
            },
        );
    }
    // Pass 1 writes f32 partials [outer, nchunks] (unscaled); pass 2 reduces them.
    let part = scratch(outer * nchunks * 4)?;
    let first = match op {
        ReduceOp::Sum(_) => ReduceOp::Sum(1.0),
        ReduceOp::Max => ReduceOp::Max,
    };
    launch(
        dev,
        &Launch {
            kernel: Kernel::Reduce,
            entry: "rows",
            wg: WG,
            consts: &[],
            params: &params(outer, len, 1, first, CHUNK, nchunks),
            args: &[Arg::read("x", x, dtype), Arg::write("y", &part, DType::F32)],
            groups: rows_grid(nchunks, outer),
        },
    )?;
    launch(
        dev,
        &Launch {
            kernel: Kernel::Reduce,
            entry: "rows",
            wg: WG,
            consts: &[],
            params: &params(outer, nchunks, 1, op, nchunks, 1),
            args: &[Arg::read("x", &part, DType::F32), Arg::write("y", y, dtype)],
            groups: rows_grid(1, outer),
        },
    )
}

/// Index of the maximum of x viewed as [outer, len, inner] along the middle axis, as u32.
pub(crate) fn argmax(
    dev: &Device,
    x: &Block,
    y: &Block,
    dtype: DType,
    outer: usize,
    len: usize,
    inner: usize,
) -> Result<()> {
    u32_len("argmax", outer * len * inner)?;
    let (entry, groups) = if inner > 1 {
        ("argmax_cols", grid_1d(outer * inner, WG))
    } else {
        ("argmax_rows", grid_1d(outer * WG as usize, WG))
    };
    launch(
        dev,
        &Launch {
            kernel: Kernel::Reduce,
            entry,
            wg: WG,
            consts: &[],
            params: &params(outer, len, inner, ReduceOp::Max, 0, 0),
            args: &[Arg::read("x", x, dtype), Arg::write("y", y, DType::U32)],
            groups,
        },
    )
}
