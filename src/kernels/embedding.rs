//! Host side of `shaders/embedding.wgsl`.

use super::{Arg, Kernel, Launch, grid_1d, launch, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::memory::Block;

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
    launch(
        dev,
        &Launch {
            kernel: Kernel::Embedding,
            entry: "gather",
            wg: 256,
            consts: &[],
            params: &[n as u32, dim as u32, vocab as u32],
            args: &[
                Arg::read("w", w, dtype),
                Arg::read("idx", idx, DType::U32),
                Arg::write("y", y, dtype),
            ],
            groups: grid_1d(n * dim, 256),
        },
    )
}

/// dw = scatter-add of dy rows at idx. `dw` must be zero for the column variant, which the
/// caller signals with `dw_zeroed`; the row variant overwrites every element.
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
    dw_zeroed: bool,
) -> Result<()> {
    u32_len("embedding backward", vocab.max(n) * dim)?;
    // Row variant: vocab*dim threads each reading all n indices. Column variant: dim threads
    // each walking all n rows. Pick the one with less total work per thread.
    let rows_variant = !dw_zeroed || (vocab * dim >= 4096 && vocab <= 4096);
    let (entry, groups) = if rows_variant {
        ("scatter_rows", grid_1d(vocab * dim, 256))
    } else {
        ("scatter_cols", grid_1d(dim, 256))
    };
    launch(
        dev,
        &Launch {
            kernel: Kernel::Embedding,
            entry,
            wg: 256,
            consts: &[],
            params: &[n as u32, dim as u32, vocab as u32],
            args: &[
                Arg::read("idx", idx, DType::U32),
                Arg::read("dy", dy, dtype),
                Arg::write("dw", dw, dtype),
            ],
            groups,
        },
    )
}
