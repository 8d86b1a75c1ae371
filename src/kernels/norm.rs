//! Host side of `shaders/norm.wgsl`.

use super::softmax::{ROWS_PER_WG, check_row, register_runs, row_grid, row_wg, subgroup_rows_wg};
use super::{Consts, Kernel, LOOP_BUDGET, Launch, arg, grid_1d, launch, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::memory::Block;
use smallvec::smallvec;

/// Rows one `bwd_params` invocation sums (its loop bound). 64 rather than 256: the GPT's
/// 16384 x 384 gradients then give the GPU 98,304 threads instead of 24,576, enough to hide
/// load latency, which saves far more than the longer chunk sums that follow cost
/// (docs/performance.md, layer norm).
const RCHUNK: usize = 64;

/// Rows each subgroup of `bwd_x_params_vec` takes (its loop bound): chunks of 32 rows, as
/// `bwd_params4`'s.
const FUSED_RPS: usize = 8;

crate::params! {
    /// `struct Params` of norm.wgsl.
    pub struct NormParams {
        rows: u32,
        len: u32,
        eps: f32,
        rms: u32,
        rchunk: u32,
        nchunks: u32,
        res: u32,
        _pad1: u32,
    }
}

/// The tensors of a normalisation over rows of `len`.
pub(crate) struct Norm<'a> {
    pub x: &'a Block,
    pub gamma: &'a Block,
    /// None for RMSNorm.
    pub beta: Option<&'a Block>,
    /// f32 [rows, 3]: first-pass mean, its correction, 1/std.
    pub stats: &'a Block,
    pub dtype: DType,
    pub rows: usize,
    pub len: usize,
    pub eps: f32,
}

impl Norm<'_> {
    /// The parameters every entry reads; `backward` adds the parameter gradients' chunks.
    fn params(&self) -> NormParams {
        NormParams {
            rows: self.rows as u32,
            len: self.len as u32,
            eps: self.eps,
            rms: self.beta.is_none() as u32,
            ..Default::default()
        }
    }
}

/// (entry, workgroup size, grid, constants): a subgroup per row where the adapter allows
/// (`subgroup_rows_wg`), with the row in registers (the `_vec` entry) where `register_runs`
/// allows, else (rows of up to 1024) strided; other rows a workgroup each.
fn row_launch(
    dev: &Device,
    n: &Norm<'_>,
    [vec_entry, rows_entry, entry]: [&'static str; 3],
) -> (&'static str, u32, [u32; 3], Consts) {
    if let Some(wg) = subgroup_rows_wg(dev) {
        let grid = row_grid(n.rows.div_ceil(ROWS_PER_WG as usize), wg);
        if let Some(nv) = register_runs(dev, n.len) {
            return (vec_entry, wg, grid, smallvec![("NV", nv)]);
        }
        if n.len <= 1024 {
            return (rows_entry, wg, grid, smallvec![]);
        }
    }
    let wg = row_wg(n.len);
    (entry, wg, row_grid(n.rows, wg), smallvec![])
}

pub(crate) fn forward(dev: &Device, n: &Norm<'_>, y: &Block) -> Result<()> {
    u32_len("norm", n.rows * n.len)?;
    check_row("norm", n.len)?;
    let (entry, wg, groups, consts) = row_launch(dev, n, ["fwd_vec", "fwd_rows", "fwd"]);
    launch(
        dev,
        &Launch {
            kernel: Kernel::Norm,
            entry,
            wg,
            consts: &consts,
            params: n.params(),
            args: &[
                arg(n.x, n.dtype),
                arg(n.gamma, n.dtype),
                arg(n.beta.unwrap_or(n.gamma), n.dtype),
                arg(y, n.dtype),
                arg(n.stats, DType::F32),
            ],
            groups,
        },
    )
}

/// dx (plus `res`, a gradient x already has, where given), and the parameter gradients
/// `dgamma` and `dbeta` (`None` for RMSNorm), each its own block.
/// dx alone, for frozen norm parameters: the entries without the parameters' sums.
fn dx_launch(dev: &Device, n: &Norm<'_>) -> (&'static str, u32, [u32; 3], Consts) {
    if let Some(wg) = subgroup_rows_wg(dev)
        && n.len <= 1024
    {
        let grid = row_grid(n.rows.div_ceil(ROWS_PER_WG as usize), wg);
        return ("bwd_x_rows", wg, grid, smallvec![]);
    }
    let wg = row_wg(n.len);
    ("bwd_x", wg, row_grid(n.rows, wg), smallvec![])
}

/// dx, and with `dgamma` the parameters' gradients (dbeta for LayerNorm).
pub(crate) fn backward(
    dev: &Device,
    n: &Norm<'_>,
    dy: &Block,
    dx: &Block,
    dgamma: Option<&Block>,
    dbeta: Option<&Block>,
    res: Option<&Block>,
) -> Result<()> {
    check_row("norm backward", n.len)?;
    let (entry, wg, mut groups, mut consts) = match dgamma {
        Some(_) => row_launch(dev, n, ["bwd_x_params_vec", "bwd_x_rows", "bwd_x"]),
        None => dx_launch(dev, n),
    };
    let mut p = NormParams {
        res: res.is_some() as u32,
        ..n.params()
    };
    // `bwd_x_params_vec` also sums the parameter gradients' terms, 4 RPS rows a chunk: RPS
    // past 8 only where the chunks would take bwd_params_sum past the loop budget (over 16
    // million rows).
    let fused = (entry == "bwd_x_params_vec").then(|| {
        let most = 8 * (LOOP_BUDGET - 16);
        let rps = FUSED_RPS.max(n.rows.div_ceil(ROWS_PER_WG as usize * most));
        (rps, n.rows.div_ceil(ROWS_PER_WG as usize * rps).max(1))
    });
    let part = match fused {
        Some((rps, nchunks)) => {
            p.nchunks = u32_len("norm backward", nchunks)?;
            consts.push(("RPS", u32_len("norm backward", rps)?));
            groups = row_grid(nchunks, wg);
            Some(dev.alloc((2 * nchunks * n.len * 4) as u64)?)
        }
        None => None,
    };
    let args = [
        arg(n.x, n.dtype),
        arg(dy, n.dtype),
        arg(n.gamma, n.dtype),
        arg(n.stats, DType::F32),
        // Without one, dy stands in (the same size; never read).
        arg(res.unwrap_or(dy), n.dtype),
        arg(dx, n.dtype),
        arg(part.as_ref().unwrap_or(dx), DType::F32),
    ];
    launch(
        dev,
        &Launch {
            kernel: Kernel::Norm,
            entry,
            wg,
            consts: &consts,
            params: p,
            args: &args[..6 + part.is_some() as usize],
            groups,
        },
    )?;
    let Some(dgamma) = dgamma else {
        return Ok(());
    };
    if let Some(part) = &part {
        return params_sum(dev, n, p, part, dgamma, dbeta);
    }
    // By runs of 4 columns where the rows allow, over chunks of 32 rows instead of 64: a
    // thread then covers twice the elements, and half as many threads run. Longer chunks
    // where the chunk count would take bwd_params_sum past the loop budget (over 16 million
    // rows), so that one pass always sums them.
    let runs = n.len.is_multiple_of(4);
    let least = if runs { RCHUNK / 2 } else { RCHUNK };
    let rchunk = least.max(n.rows.div_ceil(8 * (LOOP_BUDGET - 16)));
    let nchunks = n.rows.div_ceil(rchunk).max(1);
    let p = NormParams {
        rchunk: u32_len("norm backward", rchunk)?,
        nchunks: u32_len("norm backward", nchunks)?,
        ..p
    };
    let part = dev.alloc((2 * nchunks * n.len * 4) as u64)?;
    launch(
        dev,
        &Launch {
            kernel: Kernel::Norm,
            entry: if runs { "bwd_params4" } else { "bwd_params" },
            wg: 256,
            consts: &[],
            params: p,
            args: &[
                arg(n.x, n.dtype),
                arg(dy, n.dtype),
                arg(n.stats, DType::F32),
                arg(&part, DType::F32),
            ],
            groups: grid_1d(n.len / if runs { 4 } else { 1 } * nchunks, 256),
        },
    )?;
    params_sum(dev, n, p, &part, dgamma, dbeta)
}

/// `bwd_params_sum`: the chunks of `part` ([2, nchunks, len]) into dgamma and dbeta.
fn params_sum(
    dev: &Device,
    n: &Norm<'_>,
    p: NormParams,
    part: &Block,
    dgamma: &Block,
    dbeta: Option<&Block>,
) -> Result<()> {
    // [2, nchunks, len] -> dgamma and dbeta.
    let outs = if dbeta.is_some() { 2 * n.len } else { n.len };
    launch(
        dev,
        &Launch {
            kernel: Kernel::Norm,
            entry: "bwd_params_sum",
            wg: 256,
            consts: &[],
            params: p,
            args: &[
                arg(part, DType::F32),
                arg(dgamma, n.dtype),
                arg(dbeta.unwrap_or(dgamma), n.dtype),
            ],
            groups: grid_1d(outs.div_ceil(32) * 256, 256),
        },
    )
}
