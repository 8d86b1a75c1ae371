//! Host side of `shaders/scan.wgsl`: cumulative sums along an axis.
//!
//! Loop budget: `totals` runs [`CHUNK`] iterations, `scan` at most [`MAX_CHUNKS`] + [`CHUNK`]
//! (= [`LOOP_BUDGET`](super::LOOP_BUDGET)); a longer axis is an error.

use super::{Kernel, arg, launch_flat, over_budget, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::memory::Block;

/// Positions one invocation sums.
const CHUNK: usize = 4096;
/// Chunks of one line: each `scan` invocation adds up the totals of those before it.
const MAX_CHUNKS: usize = super::LOOP_BUDGET - CHUNK;

crate::params! {
    /// `struct Params` of scan.wgsl.
    pub struct ScanParams {
        outer: u32,
        len: u32,
        inner: u32,
        chunk: u32,
        nchunks: u32,
        reverse: u32,
        _pad0: u32,
        _pad1: u32,
    }
}

/// A dense tensor seen as [outer, len, inner], summed along `len`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lines {
    pub outer: usize,
    pub len: usize,
    pub inner: usize,
    /// Sum from the end: `y[q] = x[q] + x[q + 1] + ...` (the gradient of a cumulative sum).
    pub reverse: bool,
}

/// `y[o, q, j] = x[o, 0, j] + ... + x[o, q, j]` (or from the end when reversed).
pub(crate) fn cumsum(dev: &Device, x: &Block, y: &Block, dtype: DType, l: Lines) -> Result<()> {
    let what = "cumsum";
    u32_len(what, l.outer * l.len * l.inner)?;
    let nchunks = l.len.div_ceil(CHUNK).max(1);
    if nchunks > MAX_CHUNKS {
        return Err(over_budget(
            format!("cumsum over an axis of {}", l.len),
            l.len,
            MAX_CHUNKS * CHUNK,
        ));
    }
    let threads = l.outer * nchunks * l.inner;
    let n = u32_len(what, threads)? as usize;
    let p = ScanParams {
        outer: l.outer as u32,
        len: l.len as u32,
        inner: l.inner as u32,
        chunk: CHUNK as u32,
        nchunks: nchunks as u32,
        reverse: l.reverse as u32,
        ..Default::default()
    };
    // One chunk a line needs no totals (scan reads none); the binding still wants a block.
    let part = dev.alloc((threads.max(1) * 4) as u64)?;
    if nchunks > 1 {
        let args = [arg(x, dtype), arg(&part, DType::F32)];
        launch_flat(dev, Kernel::Scan, "totals", 256, p, &args, n)?;
    }
    let args = [arg(x, dtype), arg(&part, DType::F32), arg(y, dtype)];
    launch_flat(dev, Kernel::Scan, "scan", 256, p, &args, n)
}
