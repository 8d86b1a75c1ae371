//! Host side of `shaders/quant.wgsl`: products with a matrix kept in a quantized block
//! format, its decoding, and row lookups.

use super::{Kernel, LOOP_BUDGET, Launch, arg, grid_1d, launch, over_budget, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::memory::Block;

crate::params! {
    /// `struct Params` of quant.wgsl.
    pub struct QuantParams {
        rows: u32,
        cols: u32,
        m: u32,
        n: u32,
        eps: f32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

/// The block format, as the shader's `FMT` constant numbers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fmt {
    Q4_0 = 0,
    Q4_1 = 1,
    Q8_0 = 2,
}

impl Fmt {
    /// u32 words of quants a block of 32 values takes.
    pub fn words_per_block(self) -> usize {
        match self {
            Fmt::Q8_0 => 8,
            Fmt::Q4_0 | Fmt::Q4_1 => 4,
        }
    }
}

/// The most rows of x one matvec workgroup takes (its accumulators are MB x R registers).
pub(crate) const MATVEC_MAX_BATCH: usize = 8;

/// A matvec launch's shape for `m` rows of x and a matrix of `rows` rows: threads a
/// workgroup, output rows a workgroup, rows of x a workgroup. Consecutive threads read
/// consecutive words of a weight row, so a workgroup of 32 covers a 576-wide 4-bit row
/// (72 words) in three strides.
///
/// On a GPU, one row of x takes two output rows a workgroup. From four rows of x on, the
/// loads of x outnumber the weights': a large plain matrix (an output head) takes eight output
/// rows a workgroup, so each load of x serves eight, and the smaller matrices of a step take
/// one, for the most workgroups. A CPU adapter runs a workgroup's threads as vector lanes of
/// one core, where each workgroup costs its own setup and a load of x is a gather: it takes 8
/// output rows a workgroup for one row of x and 16 from four on. The workgroup's partial
/// sums (32 x rows of x x weight rows, f32) stay within 16 KiB, every adapter's minimum.
pub(crate) fn matvec_shape(m: usize, rows: usize, glu: bool, cpu: bool) -> (u32, u32, u32) {
    let mb = m.clamp(1, MATVEC_MAX_BATCH) as u32;
    let mut r = match (cpu, mb >= 4, rows >= 8192 && !glu) {
        (true, false, _) => 8,
        (true, true, _) => 16,
        (false, false, _) => 2,
        (false, true, true) => 8,
        (false, true, false) => 1,
    };
    let weight_rows = |r: u32| r * (1 + glu as u32);
    while r > 1 && 32 * mb * weight_rows(r) * 4 > 16384 {
        r /= 2;
    }
    (32, r, mb)
}

/// The block storage's operands: quants, scales and their format.
#[derive(Clone, Copy)]
pub(crate) struct QuantArgs<'a> {
    pub qs: &'a Block,
    pub sc: &'a Block,
    pub fmt: Fmt,
    pub rows: usize,
    pub cols: usize,
}

/// What a matvec fuses around the product (see quant.wgsl).
#[derive(Clone, Copy, Default)]
pub(crate) struct Fused<'a> {
    /// RMSNorm of x first: its gain and epsilon.
    pub norm: Option<(&'a Block, f32)>,
    /// The matrix is [2 rows, cols], gate then up: the output is silu(gate) * up.
    pub glu: bool,
    /// Added to the output.
    pub res: Option<&'a Block>,
}

/// y [m, out] = res + f(x [m, cols]) W^T in `dtype` (x, gamma, res and y), with the norm and
/// gated unit of `fused`; `out` is W's rows, or half of them with `glu`.
pub(crate) fn matvec(
    dev: &Device,
    w: QuantArgs<'_>,
    x: &Block,
    fused: Fused<'_>,
    y: &Block,
    dtype: DType,
    m: usize,
) -> Result<()> {
    u32_len("quantized matvec", m.max(1) * w.rows.max(w.cols))?;
    let (wg, r, mb) = matvec_shape(m, w.rows, fused.glu, dev.info().is_cpu());
    let out_rows = if fused.glu { w.rows / 2 } else { w.rows };
    let words = w.cols / 32 * w.fmt.words_per_block();
    let norm_loops = if fused.norm.is_some() {
        mb as usize * (w.cols / 4).div_ceil(wg as usize) + 1
    } else {
        0
    };
    let outputs = (mb * r).div_ceil(wg) as usize;
    let loops = norm_loops + words.div_ceil(wg as usize) + 1 + outputs * 2 * wg as usize;
    if loops > LOOP_BUDGET {
        return Err(over_budget(
            format!("quantized matvec over {} columns", w.cols),
            loops,
            LOOP_BUDGET,
        ));
    }
    let groups = out_rows.div_ceil(r as usize) * m.div_ceil(mb as usize);
    launch(
        dev,
        &Launch {
            kernel: Kernel::Quant,
            entry: "matvec",
            wg,
            consts: &[
                ("FMT", w.fmt as u32),
                ("MB", mb),
                ("R", r),
                ("NORM", fused.norm.is_some() as u32),
                ("GLU", fused.glu as u32),
                ("RES", fused.res.is_some() as u32),
            ],
            params: QuantParams {
                rows: out_rows as u32,
                cols: w.cols as u32,
                m: m as u32,
                eps: fused.norm.map_or(0.0, |n| n.1),
                ..Default::default()
            },
            args: &[
                arg(w.qs, DType::U32),
                arg(w.sc, DType::U32),
                arg(x, dtype),
                arg(fused.norm.map_or(x, |n| n.0), dtype),
                arg(fused.res.unwrap_or(y), dtype),
                arg(y, dtype),
            ],
            groups: grid_1d(groups * wg as usize, wg),
        },
    )
}

/// y [rows, cols] = W decoded, in `dtype`.
pub(crate) fn dequant(dev: &Device, w: QuantArgs<'_>, y: &Block, dtype: DType) -> Result<()> {
    u32_len("quantized decode", w.rows * w.cols)?;
    let words = w.rows * (w.cols / 32) * w.fmt.words_per_block();
    launch(
        dev,
        &Launch {
            kernel: Kernel::Quant,
            entry: "dequant",
            wg: 256,
            consts: &[("FMT", w.fmt as u32)],
            params: QuantParams {
                rows: w.rows as u32,
                cols: w.cols as u32,
                ..Default::default()
            },
            args: &[arg(w.qs, DType::U32), arg(w.sc, DType::U32), arg(y, dtype)],
            groups: grid_1d(words, 256),
        },
    )
}

/// y [n, cols] = rows idx (u32 [n]) of W decoded, in `dtype`; an index past the rows gives
/// NaN.
pub(crate) fn rows(
    dev: &Device,
    w: QuantArgs<'_>,
    idx: &Block,
    y: &Block,
    dtype: DType,
    n: usize,
) -> Result<()> {
    u32_len("quantized embedding", n.max(w.rows) * w.cols)?;
    let words = n * (w.cols / 32) * w.fmt.words_per_block();
    launch(
        dev,
        &Launch {
            kernel: Kernel::Quant,
            entry: "rows",
            wg: 256,
            consts: &[("FMT", w.fmt as u32)],
            params: QuantParams {
                rows: w.rows as u32,
                cols: w.cols as u32,
                n: n as u32,
                ..Default::default()
            },
            args: &[
                arg(w.qs, DType::U32),
                arg(w.sc, DType::U32),
                arg(idx, DType::U32),
                arg(y, dtype),
            ],
            groups: grid_1d(words, 256),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matvec_shapes() {
        // GPUs. One row of x: two output rows a workgroup.
        assert_eq!(matvec_shape(1, 576, false, false), (32, 2, 1));
        assert_eq!(matvec_shape(1, 49152, false, false), (32, 2, 1));
        // A batch: one row a workgroup, eight for a large plain matrix (a head).
        assert_eq!(matvec_shape(8, 576, false, false), (32, 1, 8));
        assert_eq!(matvec_shape(8, 49152, false, false), (32, 8, 8));
        assert_eq!(matvec_shape(8, 16384, true, false), (32, 1, 8));
        // Past the batch a workgroup takes, batches of 8.
        assert_eq!(matvec_shape(40, 576, false, false), (32, 1, 8));
        assert_eq!(matvec_shape(0, 576, false, false), (32, 2, 1));
        // CPU adapters: 8 rows, 16 from four rows of x, halved to keep the partial sums
        // within 16 KiB.
        assert_eq!(matvec_shape(1, 576, false, true), (32, 8, 1));
        assert_eq!(matvec_shape(4, 576, true, true), (32, 16, 4));
        assert_eq!(matvec_shape(8, 576, true, true), (32, 8, 8));
        assert_eq!(matvec_shape(8, 49152, false, true), (32, 16, 8));
        for m in 1..=8 {
            for (glu, cpu) in [(false, false), (true, false), (false, true), (true, true)] {
                let (wg, r, mb) = matvec_shape(m, 49152, glu, cpu);
                assert!(
                    wg * mb * r * (1 + glu as u32) * 4 <= 16384,
                    "{m} {glu} {cpu}"
                );
            }
        }
    }
}
