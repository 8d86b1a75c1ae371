//! Host side of `shaders/conv.wgsl`.

use super::{Arg, Kernel, LOOP_BUDGET, Launch, arg, grid_1d, launch, over_budget, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::memory::Block;

crate::params! {
    /// `struct Params` of conv.wgsl.
    pub struct ConvParams {
        n: u32,
        c: u32,
        h: u32,
        w: u32,
        kh: u32,
        kw: u32,
        sh: u32,
        sw: u32,
        ph: u32,
        pw: u32,
        dh: u32,
        dw: u32,
        ho: u32,
        wo: u32,
        n0: u32,
        _pad: u32,
    }
}

/// Geometry of a 2-D window op over NCHW input (convolution or pooling).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geom {
    /// Batch.
    pub n: usize,
    /// Channels (input channels for im2col).
    pub c: usize,
    /// Input height and width.
    pub h: usize,
    /// Input width.
    pub w: usize,
    /// Kernel height.
    pub kh: usize,
    /// Kernel width.
    pub kw: usize,
    /// Strides.
    pub stride: (usize, usize),
    /// Zero padding.
    pub pad: (usize, usize),
    /// Dilation.
    pub dil: (usize, usize),
}

impl Geom {
    /// Output height and width, or None when the window does not fit.
    pub fn out(&self) -> Option<(usize, usize)> {
        let eh = self.dil.0 * (self.kh.checked_sub(1)?) + 1;
        let ew = self.dil.1 * (self.kw.checked_sub(1)?) + 1;
        let hp = self.h + 2 * self.pad.0;
        let wp = self.w + 2 * self.pad.1;
        if hp < eh || wp < ew || self.stride.0 == 0 || self.stride.1 == 0 {
            return None;
        }
        Some(((hp - eh) / self.stride.0 + 1, (wp - ew) / self.stride.1 + 1))
    }

    fn params(&self, n0: usize) -> ConvParams {
        let (ho, wo) = self.out().unwrap_or((0, 0));
        ConvParams {
            n: self.n as u32,
            c: self.c as u32,
            h: self.h as u32,
            w: self.w as u32,
            kh: self.kh as u32,
            kw: self.kw as u32,
            sh: self.stride.0 as u32,
            sw: self.stride.1 as u32,
            ph: self.pad.0 as u32,
            pw: self.pad.1 as u32,
            dh: self.dil.0 as u32,
            dw: self.dil.1 as u32,
            ho: ho as u32,
            wo: wo as u32,
            n0: n0 as u32,
            _pad: 0,
        }
    }

    /// Errors for windows whose walk would pass the loop budget.
    pub(crate) fn check_window(&self, op: &'static str) -> Result<()> {
        let walk = self.kh * (self.kw + 1) + 1;
        if walk > LOOP_BUDGET {
            return Err(over_budget(
                format!("{op} with a {}x{} window", self.kh, self.kw),
                walk,
                LOOP_BUDGET,
            ));
        }
        Ok(())
    }

    fn out_len(&self) -> usize {
        let (ho, wo) = self.out().unwrap_or((0, 0));
        self.n * self.c * ho * wo
    }

    fn in_len(&self) -> usize {
        self.n * self.c * self.h * self.w
    }
}

fn run_at(
    dev: &Device,
    entry: &'static str,
    g: &Geom,
    n0: usize,
    threads: usize,
    args: &[Arg<'_>],
) -> Result<()> {
    u32_len("conv", threads.max((n0 + g.n) * g.c * g.h * g.w))?;
    g.check_window(entry)?;
    launch(
        dev,
        &Launch {
            kernel: Kernel::Conv,
            entry,
            wg: 256,
            consts: &[],
            params: g.params(n0),
            args,
            groups: grid_1d(threads, 256),
        },
    )
}

fn run(
    dev: &Device,
    entry: &'static str,
    g: &Geom,
    threads: usize,
    args: &[Arg<'_>],
) -> Result<()> {
    run_at(dev, entry, g, 0, threads, args)
}

/// col [g.n, C*KH*KW, HO*WO] from images n0 .. n0 + g.n of x.
pub(crate) fn im2col(
    dev: &Device,
    g: &Geom,
    n0: usize,
    x: &Block,
    col: &Block,
    dtype: DType,
) -> Result<()> {
    run_at(
        dev,
        "im2col",
        g,
        n0,
        g.out_len() * g.kh * g.kw,
        &[arg(x, dtype), arg(col, dtype)],
    )
}

/// Images n0 .. n0 + g.n of dx from dcol (the adjoint of im2col).
pub(crate) fn col2im(
    dev: &Device,
    g: &Geom,
    n0: usize,
    dcol: &Block,
    dx: &Block,
    dtype: DType,
) -> Result<()> {
    run_at(
        dev,
        "col2im",
        g,
        n0,
        g.in_len(),
        &[arg(dcol, dtype), arg(dx, dtype)],
    )
}

/// Max pooling: y and the u32 position of each maximum.
pub(crate) fn maxpool(
    dev: &Device,
    g: &Geom,
    x: &Block,
    y: &Block,
    idx: &Block,
    dtype: DType,
) -> Result<()> {
    run(
        dev,
        "maxpool",
        g,
        g.out_len(),
        &[arg(x, dtype), arg(y, dtype), arg(idx, DType::U32)],
    )
}

pub(crate) fn maxpool_bwd(
    dev: &Device,
    g: &Geom,
    idx: &Block,
    dy: &Block,
    dx: &Block,
    dtype: DType,
) -> Result<()> {
    run(
        dev,
        "maxpool_bwd",
        g,
        g.in_len(),
        &[arg(idx, DType::U32), arg(dy, dtype), arg(dx, dtype)],
    )
}

pub(crate) fn avgpool(dev: &Device, g: &Geom, x: &Block, y: &Block, dtype: DType) -> Result<()> {
    run(
        dev,
        "avgpool",
        g,
        g.out_len(),
        &[arg(x, dtype), arg(y, dtype)],
    )
}

pub(crate) fn avgpool_bwd(
    dev: &Device,
    g: &Geom,
    dy: &Block,
    dx: &Block,
    dtype: DType,
) -> Result<()> {
    run(
        dev,
        "avgpool_bwd",
        g,
        g.in_len(),
        &[arg(dy, dtype), arg(dx, dtype)],
    )
}
