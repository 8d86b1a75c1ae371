//! Host side of `shaders/copy.wgsl`: cast, bit copies and strided copies.

use super::{Arg, Kernel, Launch, arg, launch, launch_flat, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::Block;

const WG: u32 = 256;
/// Highest rank the strided copy handles.
pub(crate) const MAX_RANK: usize = 6;

crate::params! {
    /// `struct Params` of copy.wgsl.
    pub struct CopyParams {
        n: u32,
        rank: u32,
        xoff: u32,
        yoff: u32,
        dims: [[u32; 4]; 2],
        xs: [[u32; 4]; 2],
        ys: [[u32; 4]; 2],
    }
}

/// Packs up to 8 sizes or strides into two vec4<u32>.
pub(crate) fn pack8(v: &[usize]) -> [[u32; 4]; 2] {
    let mut a = [[0u32; 4]; 2];
    for (k, &d) in v.iter().take(8).enumerate() {
        a[k / 4][k % 4] = d as u32;
    }
    a
}

fn run(dev: &Device, entry: &'static str, p: CopyParams, args: &[Arg<'_>]) -> Result<()> {
    launch_flat(dev, Kernel::Copy, entry, WG, p, args, p.n as usize)
}

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
        let p = CopyParams {
            n: u32_len("copy", words)?,
            ..Default::default()
        };
        return run(dev, "words", p, &[arg(x, DType::U32), arg(y, DType::U32)]);
    }
    let p = CopyParams {
        n: u32_len("cast", n)?,
        ..Default::default()
    };
    run(dev, "cast", p, &[arg(x, xd), arg(y, yd)])
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
    let entry = if dtype == DType::U32 {
        "strided_u32"
    } else {
        "strided"
    };
    let p = CopyParams {
        n: u32_len("strided copy", n)?,
        rank: dims.len() as u32,
        xoff: u32_len("strided copy offset", xv.offset)?,
        yoff: u32_len("strided copy offset", yv.offset)?,
        dims: pack8(dims),
        xs: pack8(xv.strides),
        ys: pack8(yv.strides),
    };
    run(dev, entry, p, &[arg(x, dtype), arg(y, dtype)])
}

/// `y = x` element by element between two layouts of the same shape (any strides and
/// offsets): views made dense, slices written into larger tensors. Dimensions that are
/// contiguous in both are merged first, so most copies run at rank 1 to 3.
pub(crate) fn strided_layout(
    dev: &Device,
    x: &Block,
    xl: &crate::layout::Layout,
    y: &Block,
    yl: &crate::layout::Layout,
    dtype: DType,
) -> Result<()> {
    if xl.shape() != yl.shape() {
        return Err(Error::Internal(format!(
            "copy between shapes {:?} and {:?}",
            xl.shape(),
            yl.shape()
        )));
    }
    if xl.numel() == 0 {
        return Ok(());
    }
    let (dims, st) =
        super::elementwise::simplify(xl.shape(), &[xl.strides().to_vec(), yl.strides().to_vec()]);
    // A single element simplifies to rank 0.
    let (dims, xs, ys) = if dims.is_empty() {
        (vec![1], vec![1], vec![1])
    } else {
        (dims, st[0].clone(), st[1].clone())
    };
    // Both sides one contiguous run on 4-byte boundaries: whole words, no index arithmetic
    // (f16 moves two halves a thread).
    let size = dtype.size();
    let n = xl.numel();
    if xs == [1]
        && ys == [1]
        && (xl.offset() * size).is_multiple_of(4)
        && (yl.offset() * size).is_multiple_of(4)
        && (n * size).is_multiple_of(4)
    {
        let p = CopyParams {
            n: u32_len("copy", n * size / 4)?,
            xoff: u32_len("copy offset", xl.offset() * size / 4)?,
            yoff: u32_len("copy offset", yl.offset() * size / 4)?,
            ..Default::default()
        };
        return run(dev, "words", p, &[arg(x, DType::U32), arg(y, DType::U32)]);
    }
    if dtype != DType::U32
        && transpose(dev, x, xl.offset(), y, yl.offset(), dtype, &dims, &xs, &ys)?
    {
        return Ok(());
    }
    strided(
        dev,
        x,
        View {
            strides: &xs,
            offset: xl.offset(),
        },
        y,
        View {
            strides: &ys,
            offset: yl.offset(),
        },
        dtype,
        &dims,
    )
}

/// The `transpose` entry for a simplified copy that is a batched 2-D transpose (one axis
/// contiguous in x, the other in y, at most one batch axis): false where it is not one, or
/// its grid would pass the adapter's limit, for the strided copy to take.
#[allow(clippy::too_many_arguments)]
fn transpose(
    dev: &Device,
    x: &Block,
    xoff: usize,
    y: &Block,
    yoff: usize,
    dtype: DType,
    dims: &[usize],
    xs: &[usize],
    ys: &[usize],
) -> Result<bool> {
    // As [B, P, Q] with x contiguous along P and y along Q.
    let (b, xb, yb, r) = match dims.len() {
        2 => (1, 0, 0, 0),
        3 => (dims[0], xs[0], ys[0], 1),
        _ => return Ok(false),
    };
    let (p, q, xq, yp) = if xs[r] == 1 && ys[r + 1] == 1 {
        (dims[r], dims[r + 1], xs[r + 1], ys[r])
    } else if xs[r + 1] == 1 && ys[r] == 1 {
        (dims[r + 1], dims[r], xs[r], ys[r + 1])
    } else {
        return Ok(false);
    };
    let max = dev.caps().max_groups_per_dim as usize;
    let groups = [p.div_ceil(32), q.div_ceil(32), b];
    if groups.iter().any(|&g| g > max) {
        return Ok(false);
    }
    let params = CopyParams {
        n: u32_len("transpose", b * p * q)?,
        rank: 3,
        xoff: u32_len("transpose offset", xoff)?,
        yoff: u32_len("transpose offset", yoff)?,
        dims: pack8(&[b, p, q]),
        xs: pack8(&[xb, xq]),
        ys: pack8(&[yb, yp]),
    };
    launch(
        dev,
        &Launch {
            kernel: Kernel::Copy,
            entry: "transpose",
            wg: WG,
            consts: &[],
            params,
            args: &[arg(x, dtype), arg(y, dtype)],
            groups: groups.map(|g| g as u32),
        },
    )?;
    Ok(true)
}
