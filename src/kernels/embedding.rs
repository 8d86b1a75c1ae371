//! Host side of `shaders/embedding.wgsl`.

use super::reduce::{self, ReduceOp};
use super::{Kernel, Launch, arg, copy, fill, grid_1d, launch, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::memory::Block;

/// Positions one scatter invocation walks at most (its loop bound).
const PCHUNK: usize = 8192;
/// Invocations the row scatter aims for on a GPU: each walks a chunk of the positions for
/// one output element, so few long chunks leave a large GPU waiting on load latency (the
/// GPT's token embedding, 16,384 positions into 65 x 384, would be 2 chunks of 8,192).
const SCATTER_THREADS: usize = 1 << 20;
/// Vocabularies up to this size use the row variant of the scatter.
const ROWS_VOCAB: usize = 4096;
/// Vocabularies up to this size use `scatter_tab` where its table ([VT, 32] f32, VT the
/// vocabulary's next power of two, at least 32) fits the workgroup memory.
const TAB_VOCAB: usize = 256;
/// Workgroups (of 32 threads) `scatter_tab` aims for, and the cap on its partial sums: chunks
/// times vocabulary at most half the positions, so the partials (f32) stay about as large as
/// dy itself.
const TAB_WGS: usize = 1024;

crate::params! {
    /// `struct Params` of embedding.wgsl.
    pub struct EmbedParams {
        n: u32,
        dim: u32,
        vocab: u32,
        t0: u32,
        t1: u32,
        pchunk: u32,
        nchunks: u32,
        _pad: u32,
    }
}

fn base(n: usize, dim: usize, vocab: usize) -> EmbedParams {
    EmbedParams {
        n: n as u32,
        dim: dim as u32,
        vocab: vocab as u32,
        pchunk: PCHUNK as u32,
        nchunks: n.div_ceil(PCHUNK).max(1) as u32,
        ..Default::default()
    }
}

/// The row scatter's chunk of positions: on GPUs short enough that about SCATTER_THREADS
/// invocations run (at least 256 positions each); CPU adapters keep the longest chunks.
fn scatter_chunk(dev: &Device, n: usize, dim: usize, vocab: usize) -> usize {
    if dev.info().is_cpu() {
        return PCHUNK;
    }
    let chunks = SCATTER_THREADS.div_ceil((vocab * dim).max(1));
    n.div_ceil(chunks).clamp(256, PCHUNK)
}

/// y[t] = w[idx[t]] for n indices into a [vocab, dim] table.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gather(
    dev: &Device,
    w: &Block,
    idx: &Block,
    y: &Block,
    dtype: DType,
    n: usize,
    dim: usize,
    vocab: usize,
) -> Result<()> {
    u32_len("embedding", n * dim)?;
    u32_len("embedding", vocab * dim)?;
    launch(
        dev,
        &Launch {
            kernel: Kernel::Embedding,
            entry: "gather",
            wg: 256,
            consts: &[],
            params: base(n, dim, vocab),
            args: &[arg(w, dtype), arg(idx, DType::U32), arg(y, dtype)],
            groups: grid_1d(n * dim, 256),
        },
    )
}

/// dw ([vocab, dim], `dtype`) = the scatter-add of the rows of dy at idx; overwrites dw.
/// Vocabularies up to 256 take `scatter_tab` (one pass over dy per chunk of positions), up
/// to 4096 `scatter_rows`, larger ones `scatter_cols`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn scatter_add(
    dev: &Device,
    idx: &Block,
    dy: &Block,
    dw: &Block,
    dtype: DType,
    n: usize,
    dim: usize,
    vocab: usize,
) -> Result<()> {
    u32_len("embedding backward", n.max(vocab) * dim)?;
    if vocab <= TAB_VOCAB
        && (tab_rows(vocab) * 32 * 4) as u64 <= dev.caps().workgroup_storage as u64
    {
        let groups = dim.div_ceil(32).max(1);
        let nchunks = TAB_WGS
            .div_ceil(groups)
            .min(n / (2 * vocab.max(1)))
            .clamp(1, n.max(1));
        let pchunk = n.div_ceil(nchunks).clamp(1, PCHUNK);
        let nchunks = n.div_ceil(pchunk).max(1);
        if nchunks <= dev.caps().max_groups_per_dim as usize {
            return scatter_tab(dev, idx, dy, dw, dtype, (n, dim, vocab), (pchunk, nchunks));
        }
    }
    let mut p = base(n, dim, vocab);
    let pchunk = scatter_chunk(dev, n, dim, vocab);
    p.pchunk = pchunk as u32;
    p.nchunks = n.div_ceil(pchunk).max(1) as u32;
    if vocab <= ROWS_VOCAB
        && u32_len("embedding backward", vocab * dim * p.nchunks as usize).is_ok()
    {
        let nchunks = p.nchunks as usize;
        let part = dev.alloc((nchunks * vocab * dim * 4) as u64)?;
        launch(
            dev,
            &Launch {
                kernel: Kernel::Embedding,
                entry: "scatter_rows",
                wg: 256,
                consts: &[],
                params: p,
                args: &[arg(idx, DType::U32), arg(dy, dtype), arg(&part, DType::F32)],
                groups: grid_1d(nchunks * vocab * dim, 256),
            },
        )?;
        return sum_chunks(dev, &part, dw, dtype, nchunks, vocab * dim);
    }
    // Column variant: one f32 accumulator, one dispatch per chunk of positions, in order.
    let f32_acc = if dtype == DType::F32 {
        None
    } else {
        Some(dev.alloc((vocab * dim * 4) as u64)?)
    };
    let acc = f32_acc.as_ref().unwrap_or(dw);
    fill::fill(dev, acc, DType::F32, vocab * dim, 0.0)?;
    let mut t0 = 0;
    while t0 < n {
        let t1 = (t0 + PCHUNK).min(n);
        launch(
            dev,
            &Launch {
                kernel: Kernel::Embedding,
                entry: "scatter_cols",
                wg: 256,
                consts: &[],
                params: EmbedParams {
                    t0: t0 as u32,
                    t1: t1 as u32,
                    ..p
                },
                args: &[arg(idx, DType::U32), arg(dy, dtype), arg(acc, DType::F32)],
                groups: grid_1d(dim, 256),
            },
        )?;
        t0 = t1;
    }
    if let Some(a) = &f32_acc {
        copy::cast(dev, a, DType::F32, dw, dtype, vocab * dim)?;
    }
    Ok(())
}

/// Rows of `scatter_tab`'s table (VT): the vocabulary's next power of two, at least 32, so
/// few pipelines serve every small vocabulary.
fn tab_rows(vocab: usize) -> usize {
    vocab.next_power_of_two().max(32)
}

/// `scatter_tab` (embedding.wgsl) over `nchunks` chunks of `pchunk` positions into f32
/// partials [nchunks, vocab, dim], summed into dw by a reduce pass.
fn scatter_tab(
    dev: &Device,
    idx: &Block,
    dy: &Block,
    dw: &Block,
    dtype: DType,
    (n, dim, vocab): (usize, usize, usize),
    (pchunk, nchunks): (usize, usize),
) -> Result<()> {
    u32_len("embedding backward", nchunks * vocab * dim)?;
    let part = dev.alloc((nchunks * vocab * dim * 4) as u64)?;
    launch(
        dev,
        &Launch {
            kernel: Kernel::Embedding,
            entry: "scatter_tab",
            wg: 32,
            consts: &[("VT", tab_rows(vocab) as u32)],
            params: EmbedParams {
                pchunk: pchunk as u32,
                nchunks: nchunks as u32,
                ..base(n, dim, vocab)
            },
            args: &[arg(idx, DType::U32), arg(dy, dtype), arg(&part, DType::F32)],
            groups: [dim.div_ceil(32).max(1) as u32, nchunks as u32, 1],
        },
    )?;
    sum_chunks(dev, &part, dw, dtype, nchunks, vocab * dim)
}

/// dw (`dtype`) = the sum over the chunks of the row scatters' f32 partials [nchunks, len].
fn sum_chunks(
    dev: &Device,
    part: &Block,
    dw: &Block,
    dtype: DType,
    nchunks: usize,
    len: usize,
) -> Result<()> {
    reduce::reduce(
        dev,
        ReduceOp::Sum,
        1.0,
        part,
        DType::F32,
        dw,
        dtype,
        1,
        nchunks,
        len,
    )
}
