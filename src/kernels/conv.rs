//! Host side of `shaders/conv.wgsl`.

use super::{Arg, Kernel, LOOP_BUDGET, Launch, arg, launch, over_budget, u32_len};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::memory::Block;

/// Threads per workgroup: a workgroup tiles part of one plane, and planes are small (14 x 14
/// in MNIST), so small workgroups leave fewer idle threads at a plane's end.
const CONV_WG: u32 = 64;
/// Positions per thread (at stride CONV_WG): fewer, fuller workgroups ran im2col 1.5x
/// faster on lavapipe than one position per thread.
const EPT: u32 = 4;

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
        row0: u32,
        _pad0: u32,
        nc0: u32,
        _pad1: u32,
        _pad2: u32,
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

    /// Windows that tile the input exactly: stride = kernel, no padding, no dilation, the
    /// input a whole number of windows.
    fn tiles(&self) -> bool {
        self.stride == (self.kh, self.kw)
            && self.pad == (0, 0)
            && self.dil == (1, 1)
            && self.h.is_multiple_of(self.kh)
            && self.w.is_multiple_of(self.kw)
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
            row0: 0,
            _pad0: 0,
            nc0: n0 as u32,
            _pad1: 0,
            _pad2: 0,
        }
    }

    /// Errors for windows whose walk would pass the loop budget.
    pub(crate) fn check_window(&self, op: &'static str) -> Result<()> {
        let walk = (self.kh * (self.kw + 1) + 1) * EPT as usize;
        if walk > LOOP_BUDGET {
            return Err(over_budget(
                format!("{op} with a {}x{} window", self.kh, self.kw),
                walk,
                LOOP_BUDGET,
            ));
        }
        Ok(())
    }
}

/// Runs `entry` over `images` images from `n0` on, each with `rows` planes of `plane`
/// positions: one workgroup per (WG positions, plane row, image), in chunks of 65535 rows
/// and images (the grid limit).
#[allow(clippy::too_many_arguments)]
fn run(
    dev: &Device,
    entry: &'static str,
    g: &Geom,
    n0: usize,
    images: usize,
    rows: usize,
    plane: usize,
    args: &[Arg<'_>],
) -> Result<()> {
    u32_len("conv", (n0 + images) * rows.max(g.c) * plane.max(g.h * g.w))?;
    g.check_window(entry)?;
    const MAX: usize = 65535;
    let base = g.params(n0);
    let consts = [("EPT", EPT)];
    for r0 in (0..rows).step_by(MAX) {
        for i0 in (0..images).step_by(MAX) {
            launch(
                dev,
                &Launch {
                    kernel: Kernel::Conv,
                    entry,
                    wg: CONV_WG,
                    consts: &consts,
                    params: ConvParams {
                        n0: (n0 + i0) as u32,
                        row0: r0 as u32,
                        ..base
                    },
                    args,
                    groups: [
                        plane.div_ceil((CONV_WG * EPT) as usize) as u32,
                        (rows - r0).min(MAX) as u32,
                        (images - i0).min(MAX) as u32,
                    ],
                },
            )?;
        }
    }
    Ok(())
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
    let (ho, wo) = g.out().unwrap_or((0, 0));
    run(
        dev,
        "im2col",
        g,
        n0,
        g.n,
        g.c * g.kh * g.kw,
        ho * wo,
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
    run(
        dev,
        "col2im",
        g,
        n0,
        g.n,
        g.c,
        g.h * g.w,
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
    let (ho, wo) = g.out().unwrap_or((0, 0));
    run(
        dev,
        "maxpool",
        g,
        0,
        g.n,
        g.c,
        ho * wo,
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
    let args = [arg(idx, DType::U32), arg(dy, dtype), arg(dx, dtype)];
    if g.tiles() {
        let (ho, wo) = g.out().unwrap_or((0, 0));
        return run(dev, "maxpool_bwd_tiled", g, 0, g.n, g.c, ho * wo, &args);
    }
    run(dev, "maxpool_bwd", g, 0, g.n, g.c, g.h * g.w, &args)
}

pub(crate) fn avgpool(dev: &Device, g: &Geom, x: &Block, y: &Block, dtype: DType) -> Result<()> {
    let (ho, wo) = g.out().unwrap_or((0, 0));
    run(
        dev,
        "avgpool",
        g,
        0,
        g.n,
        g.c,
        ho * wo,
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
        0,
        g.n,
        g.c,
        g.h * g.w,
        &[arg(dy, dtype), arg(dx, dtype)],
    )
}
