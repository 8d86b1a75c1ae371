//! Host side of `shaders/index.wgsl`: gather, deterministic scatter-add, and top-k ranks.
//!
//! Loop budget: `scatter` and `rank` loop over at most [`CHUNK`] positions of the indexed
//! axis per dispatch; a longer axis takes several dispatches that accumulate (mode 2), so no
//! length is refused. `gather` and `pick` have no loops.

use super::{Kernel, arg, launch_flat, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::memory::Block;

/// Positions of the indexed axis one dispatch of `scatter` or `rank` visits per thread.
const CHUNK: usize = 8192;

crate::params! {
    /// `struct Params` of index.wgsl.
    pub struct IndexParams {
        outer: u32,
        len: u32,
        klen: u32,
        inner: u32,
        c0: u32,
        c1: u32,
        mode: u32,
        flat: u32,
    }
}

/// Data [outer, len, inner] indexed along `len` by an index tensor [outer, klen, inner], or by
/// one list [klen] shared by every (outer, inner) when `flat`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Axis {
    pub outer: usize,
    pub len: usize,
    pub klen: usize,
    pub inner: usize,
    pub flat: bool,
}

impl Axis {
    fn params(&self, what: &'static str) -> Result<IndexParams> {
        u32_len(what, self.outer * self.len.max(self.klen) * self.inner)?;
        Ok(IndexParams {
            outer: self.outer as u32,
            len: self.len as u32,
            klen: self.klen as u32,
            inner: self.inner as u32,
            flat: self.flat as u32,
            ..Default::default()
        })
    }
}

/// `y[o, k, i] = x[o, idx(o, k, i), i]`.
pub(crate) fn gather(
    dev: &Device,
    x: &Block,
    idx: &Block,
    y: &Block,
    dtype: DType,
    ax: Axis,
) -> Result<()> {
    let p = ax.params("gather")?;
    let args = [arg(x, dtype), arg(idx, DType::U32), arg(y, dtype)];
    launch_flat(
        dev,
        Kernel::Index,
        "gather",
        256,
        p,
        &args,
        ax.outer * ax.klen * ax.inner,
    )
}

/// `y[o, a, i] = base[o, a, i] + sum of src[o, k, i] over k with idx(o, k, i) == a`, or the
/// sum alone when `base` is `None`; y is [outer, len, inner].
pub(crate) fn scatter_add(
    dev: &Device,
    base: Option<&Block>,
    idx: &Block,
    src: &Block,
    y: &Block,
    dtype: DType,
    ax: Axis,
) -> Result<()> {
    let p = ax.params("scatter_add")?;
    let n = ax.outer * ax.len * ax.inner;
    // Several dispatches add into y: in f32, so f16 and bf16 round once, at the end.
    let wide = if ax.klen > CHUNK && dtype != DType::F32 {
        Some(dev.alloc((n * 4) as u64)?)
    } else {
        None
    };
    let (acc, acc_dt) = match &wide {
        Some(b) => (b, DType::F32),
        None => (y, dtype),
    };
    let mut c0 = 0;
    loop {
        let c1 = (c0 + CHUNK).min(ax.klen);
        let mode = match (c0, base) {
            (0, None) => 0,
            (0, Some(_)) => 1,
            _ => 2,
        };
        // The base binding is only read in mode 1; src stands in for it otherwise.
        let b = base.unwrap_or(src);
        let args = [
            arg(b, dtype),
            arg(idx, DType::U32),
            arg(src, dtype),
            arg(acc, acc_dt),
        ];
        let q = IndexParams {
            c0: c0 as u32,
            c1: c1 as u32,
            mode,
            ..p
        };
        launch_flat(dev, Kernel::Index, "scatter", 256, q, &args, n)?;
        c0 = c1;
        if c0 >= ax.klen {
            break;
        }
    }
    match &wide {
        Some(b) => super::copy::cast(dev, b, DType::F32, y, dtype, n),
        None => Ok(()),
    }
}

/// The positions of the `k` largest (or smallest) elements of each row of dense
/// [rows, len], in sorted order, into u32 [rows, k]. NaN counts as the largest value; equal
/// values keep their order.
#[allow(clippy::too_many_arguments)]
pub(crate) fn topk_indices(
    dev: &Device,
    x: &Block,
    dtype: DType,
    out: &Block,
    rows: usize,
    len: usize,
    k: usize,
    largest: bool,
) -> Result<()> {
    let n = u32_len("topk", rows * len)? as usize;
    let p = IndexParams {
        outer: rows as u32,
        len: len as u32,
        klen: k as u32,
        inner: 1,
        flat: largest as u32,
        ..Default::default()
    };
    let rank = dev.alloc((n.max(1) * 4) as u64)?;
    let mut c0 = 0;
    while c0 < len {
        let c1 = (c0 + CHUNK).min(len);
        let q = IndexParams {
            c0: c0 as u32,
            c1: c1 as u32,
            mode: if c0 == 0 { 0 } else { 2 },
            ..p
        };
        launch_flat(
            dev,
            Kernel::Index,
            "rank",
            256,
            q,
            &[arg(x, dtype), arg(&rank, DType::U32)],
            n,
        )?;
        c0 = c1;
    }
    let args = [arg(&rank, DType::U32), arg(out, DType::U32)];
    launch_flat(dev, Kernel::Index, "pick", 256, p, &args, n)
}
