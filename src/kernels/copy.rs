//! Host side of `shaders/copy.wgsl`: cast, bit copies and strided copies.

use super::{Arg, Kernel, Launch, grid_1d, launch, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::Block;

const WG: u32 = 256;
/// Highest rank the strided copy handles.
pub(crate) const MAX_RANK: usize = 6;

/// `y = x` for `n` contiguous elements, converting dtypes. Same-dtype copies move raw words, so
/// they are exact for every bit pattern.
pub(crate) fn cast(
    dev: &Device,
    x: &Block,
    xd: DType,
    y: &Block,
    yd: DType,
    n: usize,
) -> Result<()> {
    if xd == yd {
        let words = (xd.bytes(n)).div_ceil(4) as usize;
        let w32 = u32_len("copy", words)?;
        return launch(
            dev,
            &Launch {
                kernel: Kernel::Copy,
                entry: "words",
                wg: WG,
                consts: &[],
                params: &params(w32, &[], &[], 0, &[], 0),
                args: &[
                    Arg::read("x", x, DType::U32),
                    Arg::write("y", y, DType::U32),
                ],
                groups: grid_1d(words, WG),
            },
        );
    }
    let n32 = u32_len("cast", n)?;
    launch(
        dev,
        &Launch {
            kernel: Kernel::Copy,
            entry: "cast",
            wg: WG,
            consts: &[],
            params: &params(n32, &[], &[], 0, &[], 0),
            args: &[Arg::read("x", x, xd), Arg::write("y", y, yd)],
            groups: grid_1d(n, WG),
        },
    )
}

fn params(
    n: u32,
    dims: &[usize],
    xs: &[usize],
    xoff: usize,
    ys: &[usize],
    yoff: usize,
) -> Vec<u32> {
    let mut w = vec![n, dims.len() as u32, xoff as u32, yoff as u32];
    for arr in [dims, xs, ys] {
        let mut v = [0u32; 8];
        for (k, &d) in arr.iter().enumerate() {
            v[k] = d as u32;
        }
        w.extend_from_slice(&v);
    }
    w
}

/// Element strides and offsets of a strided view, in elements.
pub(crate) struct View<'a> {
    pub strides: &'a [usize],
    pub offset: usize,
}

/// `y[view_y(c)] = x[view_x(c)]` for every coordinate `c` of `dims`.
pub(crate) fn strided(
    dev: &Device,
    x: &Block,
    xv: View<'_>,
    y: &Block,
    yv: View<'_>,
    dtype: DType,
    dims: &[usize],
) -> Result<()> {
    if dims.len() > MAX_RANK {
        return Err(Error::invalid(
            "strided copy",
            format!("rank {} is above the supported {MAX_RANK}", dims.len()),
        ));
    }
    let n: usize = dims.iter().product();
    let n32 = u32_len("strided copy", n)?;
    let entry = if dtype == DType::U32 {
        "strided_u32"
    } else {
        "strided"
    };
    launch(
        dev,
        &Launch {
            kernel: Kernel::Copy,
            entry,
            wg: WG,
            consts: &[],
            params: &params(n32, dims, xv.strides, xv.offset, yv.strides, yv.offset),
            args: &[Arg::read("x", x, dtype), Arg::write("y", y, dtype)],
            groups: grid_1d(n, WG),
        },
    )
}
