//! Host side of `shaders/reduce.wgsl`: reductions along one axis in chunked passes.
//!
//! Loop budget: a `rows` invocation strides over at most `ROWS_CHUNK` elements in steps of
//! 256 (32 iterations); a `cols` invocation walks at most `COLS_CHUNK` elements. Longer axes
//! get partial results per chunk and further passes over the partials (each pass divides the
//! length by the chunk, so three passes cover any length that fits u32 indexing).

use super::{Arg, Kernel, Launch, arg, grid_1d, launch, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::Block;

const WG: u32 = 256;
/// Elements of one row chunk (one workgroup's share of a row).
pub(crate) const ROWS_CHUNK: usize = 8192;
/// Elements one `cols` invocation folds.
pub(crate) const COLS_CHUNK: usize = 8192;

crate::codes! {
    /// How a reduction combines (shader constants `RED_*`).
    pub enum ReduceOp: "RED" {
        /// Sum (mean is a sum with a scale).
        Sum = "SUM",
        /// Maximum (NaN wins).
        Max = "MAX",
        /// Minimum (NaN wins).
        Min = "MIN",
        /// Largest magnitude, max |x| (NaN wins; the scales of split f32 products).
        AbsMax = "AMAX",
    }
}

crate::params! {
    /// `struct Params` of reduce.wgsl.
    pub struct ReduceParams {
        outer: u32,
        len: u32,
        inner: u32,
        op: u32,
        scale: f32,
        chunk: u32,
        nchunks: u32,
        init: f32,
        merge: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

/// A view of the data a pass reads: `outer x len x inner` elements of `dtype` in `block`.
#[derive(Clone, Copy)]
struct Src<'a> {
    block: &'a Block,
    dtype: DType,
    len: usize,
}

fn init(op: ReduceOp) -> f32 {
    match op {
        ReduceOp::Sum => 0.0,
        ReduceOp::Max => f32::NEG_INFINITY,
        ReduceOp::Min => f32::INFINITY,
        ReduceOp::AbsMax => 0.0,
    }
}

/// Whether contiguous rows take the workgroup-per-row kernels. CPU adapters run workgroup
/// barriers as coroutine switches, so there one invocation walks each row instead (the
/// `cols` kernels with inner = 1): MNIST's conv-bias gradient sums ran 10x faster that way
/// on lavapipe.
fn rows_path(dev: &Device, inner: usize) -> bool {
    inner == 1 && gpu_paths(dev)
}

thread_local! {
    static GPU_PATHS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the GPU-only paths (`rows`, `tiles`) may run: on GPUs, or anywhere
/// inside [`gpu_paths_forced`].
fn gpu_paths(dev: &Device) -> bool {
    !dev.info().is_cpu() || GPU_PATHS.with(|c| c.get())
}

/// Runs `f` with reductions on this thread taking the GPUs' kernels on every adapter, so
/// that CPU adapters (CI's lavapipe) test them too.
#[doc(hidden)]
pub fn gpu_paths_forced<R>(f: impl FnOnce() -> R) -> R {
    let before = GPU_PATHS.with(|c| c.replace(true));
    let r = f();
    GPU_PATHS.with(|c| c.set(before));
    r
}

/// Threads a `cols` pass aims for on a GPU: a few per core, so every core has work.
const COLS_THREADS: usize = 65536;

/// (chunk, number of chunks) for an axis of `len` with `lines` = outer x inner lines.
/// `cols` passes on a GPU cut the axis finer when there are few lines (a bias gradient sums
/// 16,384 rows into 1,152 columns: chunks of 8,192 would be 2,304 threads, too few to hide
/// a large GPU's load latency); CPU adapters keep long chunks, since their few cores are
/// busy anyway.
fn chunks(len: usize, rows: bool, lines: usize, cpu: bool) -> Result<(usize, usize)> {
    let chunk = if rows {
        ROWS_CHUNK
    } else if cpu {
        COLS_CHUNK
    } else {
        let want = COLS_THREADS.div_ceil(lines.max(1));
        len.div_ceil(want).clamp(64, COLS_CHUNK)
    };
    let n = len.div_ceil(chunk).max(1);
    // Row chunks go on the x axis of the grid.
    if rows && n > 65535 {
        return Err(Error::LimitExceeded {
            what: format!("reduction over an axis of {len}"),
            requested: len as u64,
            limit_name: "max_compute_workgroups_per_dimension x reduce::ROWS_CHUNK",
            limit: 65535 * ROWS_CHUNK as u64,
        });
    }
    Ok((chunk, n))
}

/// Workgroups a `tiles` pass aims for: a few per core of a large GPU.
const TILES_WGS: usize = 512;
/// Rows of a `tiles` chunk: at least 64 per row lane (shorter axes take one chunk, so a
/// second pass over the partial results is the last), at most 8192 per lane (loop budget).
const TILES_MIN: usize = 512;
const TILES_MAX: usize = 65536;
/// Columns of a `tiles` workgroup (TC in reduce.wgsl).
const TILE_COLS: usize = 32;
/// Columns of a `tiles4` workgroup, and its chunks' least rows: 16 per row lane, since it
/// has a quarter as many column tiles to spread over the GPU (the GPT's 384-column bias
/// gradients: 384 workgroups, where 512 rows a chunk would leave 96).
const TILE4_COLS: usize = 4 * TILE_COLS;
const TILES4_MIN: usize = 128;

/// Whether a reduction over a middle axis (inner > 1) takes the `tiles` kernel: on GPUs,
/// where one thread per column waited out each load's latency in turn (column sums of the GPT's
/// bias gradients ran at a fifth of the memory bandwidth); CPU adapters keep `cols` (few
/// threads, and barriers are coroutine switches there).
fn tiles_path(dev: &Device, inner: usize) -> bool {
    inner > 1 && gpu_paths(dev) && inner.div_ceil(TILE_COLS) <= 65535
}

/// (chunk, number of chunks) of a `tiles` pass over `cols` columns a workgroup, whose chunks
/// are at least `min` rows.
fn tile_chunks(len: usize, outer: usize, inner: usize, cols: usize, min: usize) -> (usize, usize) {
    let tiles = inner.div_ceil(cols) * outer;
    let chunk = len
        .div_ceil(TILES_WGS.div_ceil(tiles.max(1)))
        .clamp(min, TILES_MAX);
    (chunk, len.div_ceil(chunk).max(1))
}

/// Grid of `rows`-style entries: chunks on x, rows on y, rows past 65535 on z.
fn rows_grid(nchunks: usize, outer: usize) -> [u32; 3] {
    [
        nchunks as u32,
        outer.clamp(1, 65535) as u32,
        outer.div_ceil(65535).max(1) as u32,
    ]
}

fn params(
    op: ReduceOp,
    outer: usize,
    len: usize,
    inner: usize,
    chunk: usize,
    n: usize,
) -> ReduceParams {
    ReduceParams {
        outer: outer as u32,
        len: len as u32,
        inner: inner as u32,
        op: op as u32,
        scale: 1.0,
        chunk: chunk as u32,
        nchunks: n as u32,
        init: init(op),
        ..Default::default()
    }
}

fn grid(rows: bool, outer: usize, n: usize, inner: usize) -> [u32; 3] {
    if rows {
        rows_grid(n, outer)
    } else {
        grid_1d(outer * n * inner, WG)
    }
}

fn run(
    dev: &Device,
    entry: &'static str,
    p: ReduceParams,
    args: &[Arg<'_>],
    groups: [u32; 3],
) -> Result<()> {
    launch(
        dev,
        &Launch {
            kernel: Kernel::Reduce,
            entry,
            wg: WG,
            consts: &[],
            params: p,
            args,
            groups,
        },
    )
}

/// Reduces x (of `dtype`) viewed as [outer, len, inner] over the middle axis into y of
/// [outer, inner] (of `ydtype`), multiplying sums by `scale`. `len` must be at least 1.
#[allow(clippy::too_many_arguments)]
pub(crate) fn reduce(
    dev: &Device,
    op: ReduceOp,
    scale: f32,
    x: &Block,
    dtype: DType,
    y: &Block,
    ydtype: DType,
    outer: usize,
    len: usize,
    inner: usize,
) -> Result<()> {
    u32_len("reduce", outer * len * inner)?;
    let rows = rows_path(dev, inner);
    let tiles = tiles_path(dev, inner);
    // Runs of 4 columns where every row starts on one (x's rows are `inner` apart from 0).
    let runs = tiles && inner.is_multiple_of(4);
    let entry = match (rows, tiles, runs) {
        (true, ..) => "rows",
        (_, true, true) => "tiles4",
        (_, true, false) => "tiles",
        _ => "cols",
    };
    let (tile_cols, tile_min) = if runs {
        (TILE4_COLS, TILES4_MIN)
    } else {
        (TILE_COLS, TILES_MIN)
    };
    let grid = |n: usize| {
        if tiles {
            let [_, y, z] = rows_grid(1, outer * n);
            [inner.div_ceil(tile_cols) as u32, y, z]
        } else {
            grid(rows, outer, n, inner)
        }
    };
    let mut owned: Option<Block> = None;
    let mut len = len;
    loop {
        let (chunk, n) = if tiles {
            tile_chunks(len, outer, inner, tile_cols, tile_min)
        } else {
            chunks(len, rows, outer * inner, dev.info().is_cpu())?
        };
        let src = Src {
            block: owned.as_ref().unwrap_or(x),
            dtype: if owned.is_some() { DType::F32 } else { dtype },
            len,
        };
        let mut p = params(op, outer, src.len, inner, chunk, n);
        if n == 1 {
            p.scale = scale;
            return run(
                dev,
                entry,
                p,
                &[arg(src.block, src.dtype), arg(y, ydtype)],
                grid(1),
            );
        }
        let part = dev.alloc((outer * n * inner * 4) as u64)?;
        run(
            dev,
            entry,
            p,
            &[arg(src.block, src.dtype), arg(&part, DType::F32)],
            grid(n),
        )?;
        owned = Some(part);
        len = n;
    }
}

/// Index of the maximum (`op` Max) or minimum (`op` Min) of x viewed as [outer, len, inner]
/// along the middle axis, as u32 into `y`: the first one on ties, the first NaN if any.
#[allow(clippy::too_many_arguments)]
pub(crate) fn arg_reduce(
    dev: &Device,
    op: ReduceOp,
    x: &Block,
    y: &Block,
    dtype: DType,
    outer: usize,
    len: usize,
    inner: usize,
) -> Result<()> {
    if matches!(op, ReduceOp::Sum | ReduceOp::AbsMax) {
        return Err(Error::Internal(format!("arg_reduce of {op:?}")));
    }
    u32_len("argmax", outer * len * inner)?;
    let rows = rows_path(dev, inner);
    let entry = if rows { "arg_rows" } else { "arg_cols" };
    // (values, indices) of the previous pass.
    let mut prev: Option<(Block, Block)> = None;
    let mut len = len;
    loop {
        let (chunk, n) = chunks(len, rows, outer * inner, dev.info().is_cpu())?;
        let mut p = params(op, outer, len, inner, chunk, n);
        p.merge = prev.is_some() as u32;
        let (xv, xd, pidx) = match &prev {
            Some((v, i)) => (v, DType::F32, i),
            // Not read unless merging; any u32 block will do.
            None => (x, dtype, y),
        };
        let vals = dev.alloc((outer * n * inner * 4) as u64)?;
        let last = n == 1;
        let idx_owned = if last {
            None
        } else {
            Some(dev.alloc((outer * n * inner * 4) as u64)?)
        };
        let idx = idx_owned.as_ref().unwrap_or(y);
        run(
            dev,
            entry,
            p,
            &[
                arg(xv, xd),
                arg(pidx, DType::U32),
                arg(&vals, DType::F32),
                arg(idx, DType::U32),
            ],
            grid(rows, outer, n, inner),
        )?;
        match idx_owned {
            None => return Ok(()),
            Some(i) => prev = Some((vals, i)),
        }
        len = n;
    }
}
