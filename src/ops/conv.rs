//! 2-D convolution and pooling, NCHW.
//!
//! A convolution is a batched product per image and group: `out[n, g] = w[g] x col[n, g]`,
//! with col[n, g] the image's patches as a [Cg*KH*KW, HO*WO] column matrix. Where a GPU
//! kernel can, the product reads col straight from the image (an implicit GEMM,
//! `matmul::Gather`) instead of a column matrix in memory:
//! - `wide` (f16 on tensor cores) gathers 16-byte runs of channels, so the image and the
//!   weight are first copied channels last (NHWC, [O, KH, KW, C]; a copy of x is a ninth of
//!   a 3x3 column matrix): the forward, the stride-1 input gradient (a convolution of the
//!   output gradient with the weight transposed and its windows mirrored) and the weight's
//!   gradient, with one group and channels in multiples of 8;
//! - `reg` (f32, and any dtype without tensor cores) gathers the same from channels-last
//!   copies in runs of 4 channels, and from the NCHW image itself where channels last does
//!   not apply (groups, channels off 4, a single tap).
//!
//! Elsewhere (CPU adapters, layouts the kernels cannot load, strided inputs' gradients)
//! `im2col` writes col in chunks of images and `col2im`
//! folds the input's gradient back.

use super::activation::Activation;
use super::elementwise::{float_only, same_device, same_dtype};
use crate::error::{Error, Result};
use crate::kernels::conv::{self as kc, Geom};
use crate::kernels::matmul::{self as km, Act, Gather, Gemm, ImageLayout};
use crate::tensor::Tensor;
use crate::tensor::graph::{Backward, record, record_fn, recording};
use std::cell::Cell;

thread_local! {
    static IM2COL: Cell<bool> = const { Cell::new(false) };
    static BUDGET: Cell<u64> = const { Cell::new(COL_BUDGET) };
}

/// Bytes a convolution's transient buffers may take on this thread: [`COL_BUDGET`] unless
/// `with_col_budget` set another.
fn col_budget(dev: &crate::Device) -> u64 {
    BUDGET.with(|b| b.get()).min(dev.caps().max_binding)
}

/// How many images whose transient buffer takes `elems` elements of `dtype` each fit the
/// budget together (at least one).
fn images_in_budget(dev: &crate::Device, dtype: crate::DType, elems: usize) -> usize {
    ((col_budget(dev) / dtype.bytes(elems).max(1)) as usize).max(1)
}

/// Runs `f` with convolutions' column buffers and channels-last image copies bounded by
/// `bytes` (one image a chunk at the least) instead of 256 MiB: for tests of the chunked
/// paths, which otherwise need batches of images past that size.
#[doc(hidden)]
pub fn with_col_budget<R>(bytes: u64, f: impl FnOnce() -> R) -> R {
    let before = BUDGET.with(|b| b.replace(bytes));
    let r = f();
    BUDGET.with(|b| b.set(before));
    r
}

/// Runs `f` with every convolution on this thread taking the column-matrix path (`im2col`,
/// products, `col2im`) even where it could gather implicitly: for benchmarks and tests that
/// compare the two.
#[doc(hidden)]
pub fn with_im2col<R>(f: impl FnOnce() -> R) -> R {
    let before = IM2COL.with(|c| c.replace(true));
    let r = f();
    IM2COL.with(|c| c.set(before));
    r
}

/// Convolution hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dOpts {
    /// Stride (rows, cols).
    pub stride: (usize, usize),
    /// Zero padding (rows, cols).
    pub padding: (usize, usize),
    /// Dilation (rows, cols).
    pub dilation: (usize, usize),
    /// Channel groups.
    pub groups: usize,
    /// An activation after the bias: ReLU (and GELU outside recording) runs in the
    /// product's epilogue, the others as their own op.
    pub act: Option<Activation>,
}

impl Default for Conv2dOpts {
    fn default() -> Self {
        Conv2dOpts {
            stride: (1, 1),
            padding: (0, 0),
            dilation: (1, 1),
            groups: 1,
            act: None,
        }
    }
}

/// Column buffers and channels-last copies of the images are bounded by this many bytes (and
/// by the binding limit): the batch is processed in chunks of images.
const COL_BUDGET: u64 = 256 << 20;

/// Sizes of one convolution.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConvDims {
    pub geom: Geom,
    pub o: usize,
    pub groups: usize,
    pub ho: usize,
    pub wo: usize,
    /// The weight is applied with each window mirrored (an input gradient's convolution).
    pub mirrored: bool,
}

impl ConvDims {
    fn cg_kk(&self) -> usize {
        self.geom.c / self.groups * self.geom.kh * self.geom.kw
    }
    fn og(&self) -> usize {
        self.o / self.groups
    }
    fn hw(&self) -> usize {
        self.ho * self.wo
    }
    /// How the forward product reads the image implicitly (A is the weight [Og, Cg*KH*KW]
    /// of each group), or None where it goes through column matrices.
    fn implicit(&self, x: &Tensor) -> Option<ImageLayout> {
        if IM2COL.with(|c| c.get()) {
            return None;
        }
        let g = km::gathers(x.device(), x.dtype())?;
        if self.channels_last(&g) {
            return Some(ImageLayout::ChannelsLast);
        }
        let k = self.cg_kk();
        (g.planar && k > 0 && [self.og() * k, k].iter().all(|v| v % 4 == 0))
            .then_some(ImageLayout::Planar)
    }

    /// Whether the images go channels last: one group, the channels in whole runs of the
    /// gathering kernel, and, where planar images gather too (`reg`), more than one tap.
    /// A planar image's runs of 4 positions take four loads and four bounds tests where a
    /// channels-last one's 4 channels take one each, and for a 3x3 convolution the products
    /// save several times what the copy of the image costs (docs/performance.md,
    /// convolution). With one tap
    /// the planar runs are contiguous already, and copies would only add traffic.
    fn channels_last(&self, g: &km::Gathers) -> bool {
        self.groups == 1
            && self.cg_kk() > 0
            && self.geom.c.is_multiple_of(g.run)
            && (!g.planar || self.geom.kh * self.geom.kw > 1)
    }

    /// Images per implicit product: the product's batch (images x groups, times up to a
    /// few splits of K) within the grid's z limit.
    fn gather_chunk(&self, x: &Tensor) -> usize {
        let z = x.device().caps().max_groups_per_dim as usize;
        (z / (8 * self.groups)).clamp(1, self.geom.n.max(1))
    }

    /// Images per chunk so a column buffer fits the budget and the binding limit.
    fn chunk(&self, x: &Tensor) -> usize {
        let g = &self.geom;
        images_in_budget(x.device(), x.dtype(), g.c * g.kh * g.kw * self.hw()).min(g.n.max(1))
    }

    /// Images per chunk so a channels-last copy of them fits the budget: the copy is
    /// transient, and a whole batch's could double a large input's memory.
    fn copy_chunk(&self, x: &Tensor) -> usize {
        let g = &self.geom;
        images_in_budget(x.device(), x.dtype(), g.c * g.h * g.w).min(g.n.max(1))
    }

    /// Images n0 .. n0 + cn of x copied channels last, [cn, H, W, C], where the product
    /// gathers them so (one chunk's copy, `copy_chunk`).
    fn channels_last_copy(
        x: &Tensor,
        n0: usize,
        cn: usize,
        wanted: bool,
    ) -> Result<Option<Tensor>> {
        if !wanted {
            return Ok(None);
        }
        Ok(Some(
            x.narrow(0, n0, cn)?.permute(&[0, 2, 3, 1])?.contiguous()?,
        ))
    }
}

fn conv_dims(x: &Tensor, w: &Tensor, o: &Conv2dOpts) -> Result<ConvDims> {
    let op = "conv2d";
    if x.rank() != 4 || w.rank() != 4 {
        return Err(Error::shape(
            op,
            format!(
                "input {:?} and weight {:?} must both be 4-D (NCHW, OIHW)",
                x.shape(),
                w.shape()
            ),
        ));
    }
    let (n, c, h, wd) = (x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]);
    let (oc, cg, kh, kw) = (w.shape()[0], w.shape()[1], w.shape()[2], w.shape()[3]);
    let g = o.groups;
    if g == 0 || c % g != 0 || oc % g != 0 || cg != c / g {
        return Err(Error::shape(
            op,
            format!(
                "input {:?}, weight {:?} and {g} groups do not fit",
                x.shape(),
                w.shape()
            ),
        ));
    }
    let geom = Geom {
        n,
        c,
        h,
        w: wd,
        kh,
        kw,
        stride: o.stride,
        pad: o.padding,
        dil: o.dilation,
    };
    let Some((ho, wo)) = geom.out() else {
        return Err(Error::shape(
            op,
            format!(
                "kernel {kh}x{kw} with {o:?} does not fit input {:?}",
                x.shape()
            ),
        ));
    };
    Ok(ConvDims {
        geom,
        o: oc,
        groups: g,
        ho,
        wo,
        mirrored: false,
    })
}

impl Tensor {
    /// 2-D convolution of an NCHW input with an OIHW weight, optional bias \[O\].
    pub fn conv2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        opts: Conv2dOpts,
    ) -> Result<Tensor> {
        float_only("conv2d", self)?;
        same_dtype("conv2d", self, weight)?;
        same_device("conv2d", self, weight)?;
        let d = conv_dims(self, weight, &opts)?;
        if let Some(b) = bias {
            same_dtype("conv2d", self, b)?;
            if b.shape() != [d.o] {
                return Err(Error::shape(
                    "conv2d",
                    format!("bias {:?} for {} output channels", b.shape(), d.o),
                ));
            }
        }
        let mut inputs = vec![self, weight];
        inputs.extend(bias);
        if let Some(a) = opts.act
            && (a.fused().is_none() || (recording(&inputs) && a == Activation::Gelu))
        {
            let plain = self.conv2d(weight, bias, Conv2dOpts { act: None, ..opts })?;
            return a.apply(&plain);
        }
        let act = opts.act.and_then(Activation::fused).unwrap_or(Act::None);
        // Bias and activation run in the product's epilogue.
        let (x, w) = (self.contiguous()?, weight.contiguous()?);
        let b = bias.map(Tensor::contiguous).transpose()?;
        let out = conv_forward(&x, &w, b.as_ref(), act, &d)?;
        let mut ran_on = vec![&x, &w];
        ran_on.extend(bias);
        let rec = record("conv2d", &ran_on, || ConvBack {
            opts,
            relu_out: (act == Act::Relu).then(|| out.detach()),
        });
        Ok(out.with_node(rec))
    }

    /// Max pooling over `k` windows.
    pub fn max_pool2d(
        &self,
        k: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
    ) -> Result<Tensor> {
        let g = pool_geom("max_pool2d", self, k, stride, padding)?;
        let (ho, wo) = g.out().unwrap_or((0, 0));
        let x = self.contiguous()?;
        let out = Tensor::uninit(self.device(), &[g.n, g.c, ho, wo], self.dtype())?;
        let idx = Tensor::uninit(self.device(), &[g.n, g.c, ho, wo], crate::DType::U32)?;
        kc::maxpool(
            self.device(),
            &g,
            x.dense_block("max_pool2d")?,
            out.dense_block("max_pool2d")?,
            idx.dense_block("max_pool2d")?,
            self.dtype(),
        )?;
        let rec = record_fn("max_pool2d", self, move |x, dy| {
            max_pool_grad(x, &g, &idx, dy)
        });
        Ok(out.with_node(rec))
    }

    /// Average pooling over `k` windows (zero padding counts in the average).
    pub fn avg_pool2d(
        &self,
        k: (usize, usize),
        stride: (usize, usize),
        padding: (usize, usize),
    ) -> Result<Tensor> {
        let g = pool_geom("avg_pool2d", self, k, stride, padding)?;
        let (ho, wo) = g.out().unwrap_or((0, 0));
        let x = self.contiguous()?;
        let out = Tensor::uninit(self.device(), &[g.n, g.c, ho, wo], self.dtype())?;
        kc::avgpool(
            self.device(),
            &g,
            x.dense_block("avg_pool2d")?,
            out.dense_block("avg_pool2d")?,
            self.dtype(),
        )?;
        let rec = record_fn("avg_pool2d", self, move |x, dy| avg_pool_grad(x, &g, dy));
        Ok(out.with_node(rec))
    }
}

fn pool_geom(
    op: &'static str,
    x: &Tensor,
    k: (usize, usize),
    stride: (usize, usize),
    padding: (usize, usize),
) -> Result<Geom> {
    float_only(op, x)?;
    if x.rank() != 4 {
        return Err(Error::shape(
            op,
            format!("input {:?} must be NCHW", x.shape()),
        ));
    }
    let s = x.shape();
    let g = Geom {
        n: s[0],
        c: s[1],
        h: s[2],
        w: s[3],
        kh: k.0,
        kw: k.1,
        stride,
        pad: padding,
        dil: (1, 1),
    };
    if g.out().is_none() || padding.0 * 2 > k.0 || padding.1 * 2 > k.1 {
        return Err(Error::shape(
            op,
            format!("window {k:?}, stride {stride:?}, padding {padding:?} do not fit input {s:?}"),
        ));
    }
    Ok(g)
}

/// The product for images n0 .. n0 + cn: out[n, g] = act(w[g] x col[n, g] + bias[g]) (batch
/// index n*G + g; the bias is per output row, a group's channels). One product per image: a
/// single product over all images needs the output and its gradient copied between [N, O, HW]
/// and [O, N*HW], which on lavapipe cost as much as the wider product saved.
fn conv_forward(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    act: Act,
    d: &ConvDims,
) -> Result<Tensor> {
    let dev = x.device();
    let out = Tensor::uninit(dev, &[d.geom.n, d.o, d.ho, d.wo], x.dtype())?;
    let gather = d.implicit(x);
    if d.mirrored && gather.is_none() {
        return Err(Error::Internal(
            "conv2d: a mirrored window needs the implicit product".into(),
        ));
    }
    let chunk = match gather {
        Some(ImageLayout::ChannelsLast) => d.gather_chunk(x).min(d.copy_chunk(x)),
        Some(_) => d.gather_chunk(x),
        None => d.chunk(x),
    };
    // Channels last: the weight as [O, KH, KW, C] and each chunk's images as [cn, H, W, C],
    // so K runs (tap, channel) and a run of it is 16 bytes of one pixel.
    let channels_last = gather == Some(ImageLayout::ChannelsLast);
    let w = if channels_last {
        w.permute(&[0, 2, 3, 1])?.contiguous()?
    } else {
        w.contiguous()?
    };
    let (c, hw_in) = (d.geom.c, d.geom.h * d.geom.w);
    for n0 in (0..d.geom.n).step_by(chunk) {
        let cn = chunk.min(d.geom.n - n0);
        let copy = ConvDims::channels_last_copy(x, n0, cn, channels_last)?;
        // B: the images themselves where the product gathers, else this chunk's columns.
        let col = match gather {
            Some(_) => None,
            None => {
                let col = Tensor::uninit(
                    dev,
                    &[cn, d.geom.c * d.geom.kh * d.geom.kw, d.hw()],
                    x.dtype(),
                )?;
                let g = Geom { n: cn, ..d.geom };
                kc::im2col(
                    dev,
                    &g,
                    n0,
                    x.dense_block("conv2d")?,
                    col.dense_block("conv2d")?,
                    x.dtype(),
                )?;
                Some(col)
            }
        };
        let (b, b_strides, b_bs, b_off) = match (&col, &copy) {
            (Some(col), _) => (
                col.dense_block("conv2d")?,
                (d.hw(), 1),
                d.cg_kk() * d.hw(),
                0,
            ),
            (None, Some(copy)) => (
                copy.dense_block("conv2d")?,
                (1, d.cg_kk()),
                c / d.groups * hw_in,
                0,
            ),
            (None, None) => (
                x.dense_block("conv2d")?,
                (d.hw(), 1),
                c / d.groups * hw_in,
                n0 * c * hw_in,
            ),
        };
        km::matmul(
            dev,
            &Gemm {
                a: w.dense_block("conv2d")?,
                b,
                c: out.dense_block("conv2d")?,
                bias: match bias {
                    Some(b) => Some(b.dense_block("conv2d")?),
                    None => None,
                },
                dtype: x.dtype(),
                c_dtype: x.dtype(),
                m: d.og(),
                n: d.hw(),
                k: d.cg_kk(),
                batch: cn * d.groups,
                a_strides: (d.cg_kk(), 1),
                b_strides,
                a_bs: d.og() * d.cg_kk(),
                b_bs,
                a_mod: d.groups,
                b_mod: cn * d.groups,
                act,
                offsets: (0, b_off, n0 * d.o * d.hw()),
                bias_rows: true,
                bias_bs: d.og(),
                gather: gather.map(|layout| Gather {
                    geom: d.geom,
                    mirrored: d.mirrored,
                    layout,
                }),
                row_sums: None,
            },
        )?;
    }
    Ok(out)
}

/// Gradients of conv2d for the inputs that need them; `relu_out` is the output when a ReLU
/// was fused.
pub(crate) fn conv_grads(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    opts: &Conv2dOpts,
    relu_out: Option<&Tensor>,
    dy: Tensor,
) -> Result<Vec<(Tensor, Tensor)>> {
    let dy = match relu_out {
        Some(out) => crate::ops::matmul::relu_grad(out, &dy)?,
        None => dy.contiguous()?,
    };
    let d = conv_dims(x, w, opts)?;
    let mut v = Vec::new();
    if x.requires_grad() {
        let dx = match mirrored_dims(&d) {
            Some(fd) if fd.implicit(&dy).is_some() => {
                conv_forward(&dy, &transposed(w, &d)?, None, Act::None, &fd)?
            }
            _ => input_grad_cols(w, &dy, &d, x)?,
        };
        v.push((x.clone(), dx));
    }
    if w.requires_grad() {
        v.push((w.clone(), weight_grad(x, &dy, &d)?.reshape(w.shape())?));
    }
    if let Some(b) = bias
        && b.requires_grad()
    {
        let s = dy
            .reshape(&[d.geom.n, d.o, d.hw()])?
            .sum(2, false)?
            .sum(0, false)?;
        v.push((b.clone(), s));
    }
    Ok(v)
}

/// The convolution whose output is the input's gradient, for stride 1: dx = conv(dy, w')
/// with w'[g, c, o] the group's weight transposed, read with its windows mirrored, and
/// padded so every tap that reached an input position reaches it back. None for other
/// strides.
fn mirrored_dims(d: &ConvDims) -> Option<ConvDims> {
    let g = &d.geom;
    if g.stride != (1, 1) {
        return None;
    }
    let pad = (
        (g.dil.0 * (g.kh - 1)).checked_sub(g.pad.0)?,
        (g.dil.1 * (g.kw - 1)).checked_sub(g.pad.1)?,
    );
    Some(ConvDims {
        geom: Geom {
            n: g.n,
            c: d.o,
            h: d.ho,
            w: d.wo,
            kh: g.kh,
            kw: g.kw,
            stride: (1, 1),
            pad,
            dil: g.dil,
        },
        o: g.c,
        groups: d.groups,
        ho: g.h,
        wo: g.w,
        mirrored: true,
    })
}

/// w' [C, O/G, KH, KW] from w [O, C/G, KH, KW]: w'[g Cg + c, o] = w[g Og + o, c], each group's
/// weight transposed (the product reads the windows mirrored, `ConvDims::mirrored`). With
/// one group a view: `conv_forward` copies it once, into the layout its product reads.
fn transposed(w: &Tensor, d: &ConvDims) -> Result<Tensor> {
    if d.groups == 1 {
        return w.permute(&[1, 0, 2, 3]);
    }
    let (og, cg) = (d.og(), d.geom.c / d.groups);
    w.reshape(&[d.groups, og, cg, d.geom.kh * d.geom.kw])?
        .permute(&[0, 2, 1, 3])?
        .contiguous()?
        .reshape(&[d.geom.c, og, d.geom.kh, d.geom.kw])
}

/// The input's gradient through column matrices: dcol[n, g] = w[g]^T (Cg*kk x Og) x
/// dy[n, g] (Og x HW), then col2im, in chunks of images.
fn input_grad_cols(w: &Tensor, dy: &Tensor, d: &ConvDims, x: &Tensor) -> Result<Tensor> {
    let (dev, dt) = (x.device(), x.dtype());
    let dx = Tensor::uninit(dev, x.shape(), dt)?;
    let chunk = d.chunk(x);
    for n0 in (0..d.geom.n).step_by(chunk) {
        let cn = chunk.min(d.geom.n - n0);
        let g = Geom { n: cn, ..d.geom };
        let dcol = Tensor::uninit(dev, &[cn, d.geom.c * d.geom.kh * d.geom.kw, d.hw()], dt)?;
        km::matmul(
            dev,
            &Gemm {
                a: w.dense_block("conv2d backward")?,
                b: dy.dense_block("conv2d backward")?,
                c: dcol.dense_block("conv2d backward")?,
                bias: None,
                dtype: dt,
                c_dtype: dt,
                m: d.cg_kk(),
                n: d.hw(),
                k: d.og(),
                batch: cn * d.groups,
                a_strides: (1, d.cg_kk()),
                b_strides: (d.hw(), 1),
                a_bs: d.og() * d.cg_kk(),
                b_bs: d.og() * d.hw(),
                a_mod: d.groups,
                b_mod: cn * d.groups,
                act: Act::None,
                offsets: (0, n0 * d.o * d.hw(), 0),
                bias_rows: false,
                bias_bs: 0,
                gather: None,
                row_sums: None,
            },
        )?;
        kc::col2im(
            dev,
            &g,
            n0,
            dcol.dense_block("conv2d backward")?,
            dx.dense_block("conv2d backward")?,
            dt,
        )?;
    }
    Ok(dx)
}

/// The weight's gradient [O, Cg*KH*KW]: dw[g] = sum over images n of dy[n, g] (Og x HW) x
/// col[n, g]^T (HW x Cg*kk), each image's product a batch element, summed after. col is
/// gathered from x where the product allows it, else written by im2col; either way in
/// chunks whose per-image products (and column matrices) fit the column budget.
fn weight_grad(x: &Tensor, dy: &Tensor, d: &ConvDims) -> Result<Tensor> {
    let (dev, dt) = (x.device(), x.dtype());
    let gathers = if IM2COL.with(|c| c.get()) || d.hw() == 0 {
        None
    } else {
        km::gathers(dev, dt)
    };
    // dy's rows are A, in runs of the gathering kernel's width (4 positions for `reg`, 8
    // for `wide`) for a channels-last image, 4 for a planar one.
    let layout = match gathers {
        Some(g) if d.channels_last(&g) && d.hw().is_multiple_of(g.run) => {
            Some(ImageLayout::ChannelsLast)
        }
        Some(g) if g.planar && d.hw().is_multiple_of(4) => Some(ImageLayout::Planar),
        _ => None,
    };
    let channels_last = layout == Some(ImageLayout::ChannelsLast);
    let chunk = if layout.is_some() {
        let chunk = images_in_budget(dev, dt, d.o * d.cg_kk()).min(d.gather_chunk(x));
        // Each chunk's images copied channels last (see conv_forward).
        if channels_last {
            chunk.min(d.copy_chunk(x))
        } else {
            chunk
        }
    } else {
        d.chunk(x)
    };
    let (c, hw_in) = (d.geom.c, d.geom.h * d.geom.w);
    let b_strides = if channels_last {
        (d.cg_kk(), 1)
    } else {
        (1, d.hw())
    };
    let mut dw: Option<Tensor> = None;
    for n0 in (0..d.geom.n).step_by(chunk) {
        let cn = chunk.min(d.geom.n - n0);
        let copy = ConvDims::channels_last_copy(x, n0, cn, channels_last)?;
        let col = if layout.is_some() {
            None
        } else {
            let col = Tensor::uninit(dev, &[cn, c * d.geom.kh * d.geom.kw, d.hw()], dt)?;
            let g = Geom { n: cn, ..d.geom };
            kc::im2col(
                dev,
                &g,
                n0,
                x.dense_block("conv2d backward")?,
                col.dense_block("conv2d backward")?,
                dt,
            )?;
            Some(col)
        };
        let part = Tensor::uninit(dev, &[cn, d.o * d.cg_kk()], dt)?;
        let (b, b_bs, b_off) = match (&col, &copy) {
            (Some(col), _) => (col.dense_block("conv2d backward")?, d.cg_kk() * d.hw(), 0),
            (None, Some(copy)) => (copy.dense_block("conv2d backward")?, c * hw_in, 0),
            (None, None) => (
                x.dense_block("conv2d backward")?,
                c / d.groups * hw_in,
                n0 * c * hw_in,
            ),
        };
        km::matmul(
            dev,
            &Gemm {
                a: dy.dense_block("conv2d backward")?,
                b,
                c: part.dense_block("conv2d backward")?,
                bias: None,
                dtype: dt,
                c_dtype: dt,
                m: d.og(),
                n: d.cg_kk(),
                k: d.hw(),
                batch: cn * d.groups,
                a_strides: (d.hw(), 1),
                b_strides,
                a_bs: d.og() * d.hw(),
                b_bs,
                a_mod: cn * d.groups,
                b_mod: cn * d.groups,
                act: Act::None,
                offsets: (n0 * d.o * d.hw(), b_off, 0),
                bias_rows: false,
                bias_bs: 0,
                gather: layout.map(|layout| Gather {
                    geom: d.geom,
                    mirrored: false,
                    layout,
                }),
                row_sums: None,
            },
        )?;
        let s = part.sum(0, false)?;
        dw = Some(match dw {
            Some(acc) => acc.add(&s)?,
            None => s,
        });
    }
    let dw = match dw {
        Some(dw) => dw,
        // No images: the gradient of a sum over none.
        None => return Tensor::zeros(dev, &[d.o * d.cg_kk()], dt),
    };
    match layout {
        // Columns ordered (tap, channel): back to [O, C, KH, KW].
        Some(ImageLayout::ChannelsLast) => dw
            .reshape(&[d.o, d.geom.kh, d.geom.kw, c])?
            .permute(&[0, 3, 1, 2])?
            .contiguous(),
        _ => Ok(dw),
    }
}

/// Gradients of conv2d; inputs: the dense x and weight it ran on, and the bias if any.
struct ConvBack {
    opts: Conv2dOpts,
    /// The output, when a ReLU was fused.
    relu_out: Option<Tensor>,
}

impl Backward for ConvBack {
    fn backward(&self, inputs: &[Tensor], _out: &Tensor, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let mut got = conv_grads(
            &inputs[0],
            &inputs[1],
            inputs.get(2),
            &self.opts,
            self.relu_out.as_ref(),
            g,
        )?;
        // conv_grads lists (input, gradient) for the inputs that need one.
        let mut take = |t: &Tensor| -> Option<Tensor> {
            let i = got.iter().position(|(x, _)| x.id() == t.id())?;
            Some(got.swap_remove(i).1)
        };
        Ok(inputs.iter().map(&mut take).collect())
    }
}

/// Max pooling's gradient: each input gets the gradients of the windows it was the maximum of.
fn max_pool_grad(x: &Tensor, geom: &Geom, idx: &Tensor, dy: Tensor) -> Result<Tensor> {
    let dy = dy.contiguous()?;
    let dx = Tensor::uninit(x.device(), x.shape(), dy.dtype())?;
    kc::maxpool_bwd(
        x.device(),
        geom,
        idx.dense_block("max_pool2d backward")?,
        dy.dense_block("max_pool2d backward")?,
        dx.dense_block("max_pool2d backward")?,
        dy.dtype(),
    )?;
    Ok(dx)
}

/// Average pooling's gradient.
fn avg_pool_grad(x: &Tensor, geom: &Geom, dy: Tensor) -> Result<Tensor> {
    let dy = dy.contiguous()?;
    let dx = Tensor::uninit(x.device(), x.shape(), dy.dtype())?;
    kc::avgpool_bwd(
        x.device(),
        geom,
        dy.dense_block("avg_pool2d backward")?,
        dx.dense_block("avg_pool2d backward")?,
        dy.dtype(),
    )?;
    Ok(dx)
}
