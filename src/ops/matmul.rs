//! Matrix products: batched, broadcasting, with transposes, bias and a fused activation.
//!
//! Operands may be views: the kernels read any layout whose matrix has one contiguous axis
//! (a transpose is a stride swap) and whose batch dimensions collapse to one stride, so
//! `x.matmul(&w.transpose(0, 1)?)` and the heads of a fused projection cost no copy.

use super::activation::Activation;
use super::elementwise::{broadcast_shape, float_only, same_device, same_dtype};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::matmul::{self as km, Act, Gemm};
use crate::kernels::matmul_plan::{self as mp, Problem};
use crate::kernels::split::{self as ks, pad8};
use crate::layout::Dims;
use crate::tensor::graph::{Backward, record, recording};
use crate::tensor::{Layout, Tensor};
use std::cell::Cell;

/// Everything `Tensor::matmul_with` can fuse.
#[derive(Clone, Copy, Debug, Default)]
pub struct MatmulOpts<'a> {
    /// Use the transpose of the left operand's last two dimensions.
    pub trans_a: bool,
    /// Use the transpose of the right operand's last two dimensions.
    pub trans_b: bool,
    /// Added to every row of the product (length N).
    pub bias: Option<&'a Tensor>,
    /// Applied after the bias: ReLU and GELU run in the product's epilogue (GELU only outside
    /// recording, since its gradient needs its input), the others as their own op.
    pub act: Option<Activation>,
}

/// How the kernels read one operand: op(X)'s rows, columns and their element strides, the
/// batch dimensions collapsed to one stride, and the offset.
struct MatView {
    batch: crate::layout::Dims,
    count: usize,
    rows: usize,
    cols: usize,
    strides: (usize, usize),
    batch_stride: usize,
    offset: usize,
}

/// `t` (possibly transposed) as the kernels read it, or `None` when its layout needs a copy
/// first (neither matrix axis contiguous, or batch dimensions that do not collapse).
fn mat_view(t: &Tensor, trans: bool) -> Option<MatView> {
    let r = t.rank();
    let (shape, st) = (t.shape(), t.strides());
    let (mut sr, mut sc) = (st[r - 2], st[r - 1]);
    let (h, w) = (shape[r - 2], shape[r - 1]);
    // A size-1 axis may carry any stride: give it the one that makes the matrix contiguous.
    if w == 1 {
        sc = 1;
    }
    if h == 1 {
        sr = if sc == 1 { w.max(1) } else { 1 };
    }
    if sr != 1 && sc != 1 {
        return None;
    }
    // Batch dimensions: all broadcast (one matrix), or a run that collapses to one stride.
    let bdims = &shape[..r - 2];
    let bstr = &st[..r - 2];
    let count: usize = bdims.iter().product();
    let batch_stride = crate::layout::run_stride(bdims, bstr)?;
    let (rows, cols, strides) = if trans {
        (w, h, (sc, sr))
    } else {
        (h, w, (sr, sc))
    };
    Some(MatView {
        batch: crate::layout::Dims::from_slice(bdims),
        count,
        rows,
        cols,
        strides,
        batch_stride,
        offset: t.layout().offset(),
    })
}

/// The product without recording: shared by the forward op and by gradients.
pub(crate) fn gemm(
    a: &Tensor,
    b: &Tensor,
    trans_a: bool,
    trans_b: bool,
    bias: Option<&Tensor>,
    act: Act,
) -> Result<Tensor> {
    Ok(gemm_padding(a, b, trans_a, trans_b, bias, act, true, false)?.0)
}

/// `gemm` without bias or activation, and the sums of op(A)'s rows where its kernel adds them
/// on the way (a weight gradient g^T x and its bias's, g's column sums); None where the
/// caller must sum them.
pub(crate) fn gemm_row_sums(
    a: &Tensor,
    b: &Tensor,
    trans_a: bool,
    trans_b: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    gemm_padding(a, b, trans_a, trans_b, None, Act::None, true, true)
}

/// `gemm`, padding misaligned operands (`Padding`) where `pad`; with `row_sums`, also the
/// sums of op(A)'s rows where the product's kernel writes them (one matrix, no bias).
#[allow(clippy::too_many_arguments)]
fn gemm_padding(
    a: &Tensor,
    b: &Tensor,
    trans_a: bool,
    trans_b: bool,
    bias: Option<&Tensor>,
    act: Act,
    pad: bool,
    row_sums: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let op = "matmul";
    let dtype = same_dtype(op, a, b)?;
    same_device(op, a, b)?;
    float_only(op, a)?;
    for t in [a, b] {
        if t.rank() < 2 {
            return Err(Error::shape(
                op,
                format!(
                    "operand of shape {:?} needs at least 2 dimensions",
                    t.shape()
                ),
            ));
        }
    }
    // Layouts the kernels cannot read are made dense (always possible).
    let readable = |t: &Tensor, trans: bool| -> Result<_> {
        if let Some(v) = mat_view(t, trans) {
            return Ok((t.clone(), v));
        }
        let d = t.contiguous()?;
        let v =
            mat_view(&d, trans).ok_or_else(|| Error::Internal("dense matmul operand".into()))?;
        Ok((d, v))
    };
    let (a, va) = readable(a, trans_a)?;
    let (b, vb) = readable(b, trans_b)?;
    let (m, k, k2, n) = (va.rows, va.cols, vb.rows, vb.cols);
    if k != k2 {
        return Err(Error::shape(
            op,
            format!(
                "{:?}{} x {:?}{}: inner dimensions {k} and {k2} differ",
                a.shape(),
                if trans_a { "^T" } else { "" },
                b.shape(),
                if trans_b { "^T" } else { "" }
            ),
        ));
    }
    let bias = match bias {
        Some(t) => {
            same_dtype(op, &a, t)?;
            if t.shape() != [n] {
                return Err(Error::shape(
                    op,
                    format!("bias of shape {:?} for {n} output columns", t.shape()),
                ));
            }
            Some(t.contiguous()?)
        }
        None => None,
    };
    let batch_shape = broadcast_shape(op, &va.batch, &vb.batch)?;
    let batch: usize = batch_shape.iter().product();
    // An operand either has the full batch or a single matrix (stride 0); other broadcasts
    // are materialised.
    let fit = |t: Tensor, v: MatView, trans: bool| -> Result<(Tensor, MatView)> {
        if v.count == batch || v.count == 1 {
            let bs = if v.count == 1 { 0 } else { v.batch_stride };
            return Ok((
                t,
                MatView {
                    batch_stride: bs,
                    ..v
                },
            ));
        }
        let mut full = batch_shape.clone();
        full.extend_from_slice(&t.shape()[t.rank() - 2..]);
        let d = t.broadcast_to(&full)?.contiguous()?;
        let v =
            mat_view(&d, trans).ok_or_else(|| Error::Internal("dense matmul operand".into()))?;
        Ok((d, v))
    };
    let (a, va) = fit(a, va, trans_a)?;
    let (b, vb) = fit(b, vb, trans_b)?;
    // The plans below (padding, the f32 split) count waves on the cores: settle their count.
    crate::kernels::cores::ensure(a.device())?;
    let mut out_shape = batch_shape.clone();
    out_shape.extend_from_slice(&[m, n]);
    if dtype == DType::F32 && split_wanted(a.device(), m, n, k, batch) {
        let ops = [(&a, &va, trans_a), (&b, &vb, trans_b)];
        return Ok((
            split_gemm(ops, bias.as_ref(), act, batch, &out_shape)?,
            None,
        ));
    }
    let layout = km::Operands {
        a_strides: va.strides,
        b_strides: vb.strides,
        offsets: (va.offset, vb.offset),
        batch_strides: (va.batch_stride, vb.batch_stride),
    };
    let p = Padding::new((m, n, k), trans_a, trans_b);
    let copied = p.copied([&a, &b]);
    let (dev, sizes, trans) = (a.device(), (p.mq, p.nq, p.kq), (trans_a, trans_b));
    // Nothing to copy (dense operands of aligned sizes) leaves nothing to gain, and spares
    // the planner's two looks at every aligned product.
    if pad
        && copied > 0
        && let Some(q) = mp::padding_gain(
            &Problem {
                dtype,
                m,
                n,
                k,
                batch,
                operands: layout,
            },
            dev.hardware(),
            km::forced_config(),
            sizes,
            trans,
        )
        && (mp::padding_pays((m, n, p.kq), batch, q, copied) || PAD_EVERYWHERE.with(|c| c.get()))
    {
        // The copies need memory the product itself does not: short of it, the product runs
        // unpadded on the general kernels.
        match p.run(&a, &b, bias.as_ref(), act) {
            Err(e) if e.is_oom() => {}
            r => return Ok((r?, None)),
        }
    }
    let out = Tensor::uninit(a.device(), &out_shape, dtype)?;
    let sums = match row_sums && batch == 1 && bias.is_none() {
        true => Some(Tensor::uninit(a.device(), &[m], dtype)?),
        false => None,
    };
    let fused = km::matmul(
        a.device(),
        &Gemm {
            a: a.block(),
            b: b.block(),
            c: out.dense_block(op)?,
            bias: match &bias {
                Some(t) => Some(t.dense_block(op)?),
                None => None,
            },
            dtype,
            c_dtype: dtype,
            m,
            n,
            k,
            batch,
            a_strides: va.strides,
            b_strides: vb.strides,
            a_bs: va.batch_stride,
            b_bs: vb.batch_stride,
            a_mod: batch,
            b_mod: batch,
            act,
            offsets: (va.offset, vb.offset, 0),
            bias_rows: false,
            bias_bs: 0,
            gather: None,
            row_sums: match &sums {
                Some(t) => Some((t.dense_block(op)?, 0)),
                None => None,
            },
        },
    )?;
    Ok((out, sums.filter(|_| fused)))
}

/// A product run on zero-padded copies of its operands, so that every pitch and contiguous
/// extent is a multiple of 8 and the fast kernel (`wide` needs 8, `reg` 4) takes it: K padded
/// where an operand is contiguous along K (zeros add nothing), M or N where op(A) or op(B) is
/// contiguous along it (the extra rows or columns are cut from the result). A vocabulary of
/// 65 kept the GPT's output-layer backward products on the general kernels.
struct Padding {
    m: usize,
    n: usize,
    k: usize,
    /// The padded sizes.
    mq: usize,
    nq: usize,
    kq: usize,
    trans_a: bool,
    trans_b: bool,
}

impl Padding {
    fn new((m, n, k): (usize, usize, usize), trans_a: bool, trans_b: bool) -> Padding {
        let up = |v: usize, along: bool| if along { v.next_multiple_of(8) } else { v };
        Padding {
            m,
            n,
            k,
            mq: up(m, trans_a),
            nq: up(n, !trans_b),
            kq: up(k, !trans_a || trans_b),
            trans_a,
            trans_b,
        }
    }

    /// Elements the padded path copies: operands `ab` that change size or are not dense, and
    /// the result where it is cut.
    fn copied(&self, [a, b]: [&Tensor; 2]) -> usize {
        let a = (self.mq, self.kq) != (self.m, self.k) || !a.is_contiguous();
        let b = (self.kq, self.nq) != (self.k, self.n) || !b.is_contiguous();
        let c = (self.mq, self.nq) != (self.m, self.n);
        usize::from(a) * self.mq * self.kq
            + usize::from(b) * self.kq * self.nq
            + usize::from(c) * self.mq * self.nq
    }

    /// The product (the copies are the kernel's inputs, not part of the graph: the caller
    /// records the product itself).
    fn run(&self, a: &Tensor, b: &Tensor, bias: Option<&Tensor>, act: Act) -> Result<Tensor> {
        crate::autograd::no_grad(|| {
            let (ar, ac) = if self.trans_a {
                (self.kq, self.mq)
            } else {
                (self.mq, self.kq)
            };
            let (br, bc) = if self.trans_b {
                (self.nq, self.kq)
            } else {
                (self.kq, self.nq)
            };
            let a = padded(a, ar, ac)?;
            let b = padded(b, br, bc)?;
            let bias = match bias {
                Some(t) if self.nq > self.n => Some(padded_vec(t, self.nq)?),
                other => other.cloned(),
            };
            let c = gemm_padding(
                &a,
                &b,
                self.trans_a,
                self.trans_b,
                bias.as_ref(),
                act,
                false,
                false,
            )?
            .0;
            if (self.mq, self.nq) == (self.m, self.n) {
                return Ok(c);
            }
            c.narrow(-2, 0, self.m)?.narrow(-1, 0, self.n)?.contiguous()
        })
    }
}

/// A dense copy of `t` with its last two dimensions zero-padded to `rows` x `cols`.
fn padded(t: &Tensor, rows: usize, cols: usize) -> Result<Tensor> {
    let r = t.rank();
    let mut dims = t.shape().to_vec();
    dims[r - 2] = dims[r - 2].max(rows);
    dims[r - 1] = dims[r - 1].max(cols);
    pad_to(t, &dims)
}

/// `v` (one dimension) zero-padded to `len`.
fn padded_vec(v: &Tensor, len: usize) -> Result<Tensor> {
    pad_to(v, &[v.numel().max(len)])
}

/// `t` (any layout) in the leading corner of zeros of shape `dims`: two launches, a fill and one
/// copy (zeros joined on one axis at a time were three launches an axis, and a lm head's
/// 65-word vocabulary padded both of its product's operands every step).
fn pad_to(t: &Tensor, dims: &[usize]) -> Result<Tensor> {
    if t.shape() == dims {
        return t.contiguous();
    }
    let out = Tensor::zeros(t.device(), dims, t.dtype())?;
    let mut corner = out.layout().clone();
    for (axis, &n) in t.shape().iter().enumerate() {
        corner = corner.narrow(axis, 0, n);
    }
    crate::kernels::copy::strided_layout(
        t.device(),
        t.block(),
        t.layout(),
        out.block(),
        &corner,
        t.dtype(),
    )?;
    Ok(out)
}

thread_local! {
    /// Set by [`pad_everywhere`].
    static PAD_EVERYWHERE: Cell<bool> = const { Cell::new(false) };
    /// Set by [`split_everywhere`].
    static SPLIT_EVERYWHERE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with the thread's `flag` set, then restores it.
fn with_flag<R>(flag: &'static std::thread::LocalKey<Cell<bool>>, f: impl FnOnce() -> R) -> R {
    let before = flag.with(|c| c.replace(true));
    let r = f();
    flag.with(|c| c.set(before));
    r
}

/// Runs `f` with every misaligned product on this thread padded (`Padding`), however small:
/// tests reach the padded path with products a CPU adapter computes quickly.
#[doc(hidden)]
pub fn pad_everywhere<R>(f: impl FnOnce() -> R) -> R {
    with_flag(&PAD_EVERYWHERE, f)
}

/// Runs `f` with every f32 product on this thread computed as `MatmulPrecision::High` does
/// on tensor cores, whatever the adapter, the device's setting and the size: tests check the
/// split path on adapters without tensor cores (where the f16 product runs on the other
/// kernels, with the same f32 accumulation).
#[doc(hidden)]
pub fn split_everywhere<R>(f: impl FnOnce() -> R) -> R {
    with_flag(&SPLIT_EVERYWHERE, f)
}

/// Whether an f32 product of these sizes runs as three f16 products: `MatmulPrecision::High`
/// on a device with f16 tensor cores, for products big enough that the extra passes cost
/// less than they save.
fn split_wanted(dev: &Device, m: usize, n: usize, k: usize, batch: usize) -> bool {
    if m == 0 || n == 0 || k == 0 || batch == 0 {
        return false;
    }
    if SPLIT_EVERYWHERE.with(|c| c.get()) {
        return true;
    }
    let p = Problem {
        batch,
        ..Problem::dense(DType::F32, (m, n, k), (false, false))
    };
    mp::f32_as_three_f16(&p, dev.matmul_precision(), dev.hardware())
}

/// One operand's parts as the product reads them.
struct Parts {
    /// The three f16 parts (kernels::split).
    hl: Tensor,
    /// Each line's -log2(scale), f32 [matrices, lines].
    ex: Tensor,
    /// Strides of the parts' lines and of K.
    strides: (usize, usize),
    /// Elements between consecutive matrices of a batch (0: one matrix for the batch).
    mat_stride: usize,
}

/// An f32 product as three f16 products (`MatmulPrecision::High`, shaders/split.wgsl): each
/// operand's lines (rows of op(A), columns of op(B)) scaled by a power of two and split into
/// f16 parts hi + lo, then [Ah | Ah | Al] x [Bh ; Bl ; Bh] on the f16 kernels with f32 sums,
/// and the scaling undone with the bias and activation applied. `ops` are A and B as `fit`
/// left them, with their transposes.
fn split_gemm(
    ops: [(&Tensor, &MatView, bool); 2],
    bias: Option<&Tensor>,
    act: Act,
    batch: usize,
    out_shape: &[usize],
) -> Result<Tensor> {
    let op = "matmul";
    let dev = ops[0].0.device();
    let mut parts = Vec::with_capacity(2);
    for (i, (t, v, trans)) in ops.into_iter().enumerate() {
        let second = i == 1;
        // Lines are A's rows (t's rows, or its columns when transposed) and B's columns.
        let (lines, len, (line_stride, k_stride)) = if second {
            (v.cols, v.rows, (v.strides.1, v.strides.0))
        } else {
            (v.rows, v.cols, v.strides)
        };
        let axis = if trans != second { -2 } else { -1 };
        let amax = t.abs_max(axis)?;
        let nmat = if batch > 1 && v.batch_stride != 0 {
            batch
        } else {
            1
        };
        let o = ks::Operand {
            x: t.block(),
            amax: amax.dense_block(op)?,
            nmat,
            lines,
            k: len,
            offset: v.offset,
            mat_stride: v.batch_stride,
            line_stride,
            k_stride,
            second,
        };
        let hl = Tensor::uninit(dev, &[o.parts_len()], DType::F16)?;
        let ex = Tensor::uninit(dev, &[nmat * lines], DType::F32)?;
        ks::parts(dev, &o, hl.dense_block(op)?, ex.dense_block(op)?)?;
        // Where the product finds element (row, k) of op(A) or (k, column) of op(B) in the
        // parts, which keep the operand's fast axis: (stride of lines, stride of k).
        let (l8, k3) = (pad8(lines), 3 * pad8(len));
        parts.push(Parts {
            hl,
            ex,
            strides: if o.kfast() { (k3, 1) } else { (1, l8) },
            mat_stride: if nmat > 1 { l8 * k3 } else { 0 },
        });
    }
    let (m, n, k) = (ops[0].1.rows, ops[1].1.cols, ops[0].1.cols);
    let (m8, n8) = (pad8(m), pad8(n));
    let cp = Tensor::uninit(dev, &[batch, m8, n8], DType::F32)?;
    let (pa, pb) = (&parts[0], &parts[1]);
    km::matmul(
        dev,
        &Gemm {
            a: pa.hl.block(),
            b: pb.hl.block(),
            c: cp.dense_block(op)?,
            bias: None,
            dtype: DType::F16,
            c_dtype: DType::F32,
            m: m8,
            n: n8,
            k: 3 * pad8(k),
            batch,
            a_strides: pa.strides,
            b_strides: (pb.strides.1, pb.strides.0),
            a_bs: pa.mat_stride,
            b_bs: pb.mat_stride,
            a_mod: batch,
            b_mod: batch,
            act: Act::None,
            offsets: (0, 0, 0),
            bias_rows: false,
            bias_bs: 0,
            gather: None,
            row_sums: None,
        },
    )?;
    let out = Tensor::uninit(dev, out_shape, DType::F32)?;
    ks::join(
        dev,
        &ks::Join {
            cp: cp.dense_block(op)?,
            ea: pa.ex.dense_block(op)?,
            eb: pb.ex.dense_block(op)?,
            bias: match bias {
                Some(t) => Some(t.dense_block(op)?),
                None => None,
            },
            c: out.dense_block(op)?,
            batch,
            m,
            n,
            ea_bs: if pa.mat_stride != 0 { m } else { 0 },
            eb_bs: if pb.mat_stride != 0 { n } else { 0 },
            act,
        },
    )?;
    Ok(out)
}

/// `t` [..., rows, cols] as one [(...) rows, cols] matrix (a view, no autograd), where its
/// leading axes step over whole row blocks; `None` at rank 2 or where they do not chain.
/// A batch of rows times one matrix (a linear layer on [batch, seq, in]) runs as one product:
/// nn::Linear reshaped to two dimensions and back instead, two recorded ops a layer.
fn folded(t: &Tensor) -> Option<Tensor> {
    let r = t.rank();
    if r <= 2 {
        return None;
    }
    let (shape, st) = (t.shape(), t.strides());
    let row_stride = crate::layout::run_stride(&shape[..r - 1], &st[..r - 1])?;
    let rows = shape[..r - 1].iter().product();
    let layout = Layout::from_parts(
        &[rows, shape[r - 1]],
        &[row_stride, st[r - 1]],
        t.layout().offset(),
    );
    Some(t.view(layout, None))
}

/// Gradients of `C = act(op(A) op(B) + bias)`; inputs a, b and the bias if any.
struct MatmulBack {
    trans_a: bool,
    trans_b: bool,
    /// The output, when a ReLU was fused (its gradient mask).
    relu_out: Option<Tensor>,
}

impl Backward for MatmulBack {
    fn backward(&self, inputs: &[Tensor], _out: &Tensor, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let (ta, tb) = (self.trans_a, self.trans_b);
        let g = match &self.relu_out {
            Some(out) => relu_grad(out, &g)?,
            None => g,
        };
        // Rows folded in the forward pass (`matmul_with`) fold here too: A's gradient is then
        // one product, and B's one product over all rows, not a batch of them summed after.
        let (a0, b) = (&inputs[0], &inputs[1]);
        let folds = match !ta && b.rank() == 2 {
            true => folded(a0).zip(folded(&g)),
            false => None,
        };
        let fold = folds.is_some();
        let (a, g) = folds.unwrap_or_else(|| (a0.clone(), g));
        let a = &a;
        let ga = if a0.requires_grad() {
            let ga = if ta {
                gemm(b, &g, tb, true, None, Act::None)?
            } else {
                gemm(&g, b, false, !tb, None, Act::None)?
            };
            Some(match fold {
                true => ga.reshape(a0.shape())?,
                false => ga.sum_to(a0.shape())?,
            })
        } else {
            None
        };
        let bias_grad = inputs.get(2).is_some_and(|t| t.requires_grad());
        // The bias's gradient, g's column sums, where the weight gradient's kernel (g^T op(A))
        // adds them as it reads g: the GPT's linear layers saved a pass over g each.
        let mut g_sums = None;
        let gb = if b.requires_grad() {
            let gb = if tb && bias_grad {
                let (gb, sums) = gemm_row_sums(&g, a, true, ta)?;
                g_sums = sums;
                gb
            } else if tb {
                gemm(&g, a, true, ta, None, Act::None)?
            } else {
                gemm(a, &g, !ta, false, None, Act::None)?
            };
            Some(gb.sum_to(b.shape())?)
        } else {
            None
        };
        let mut v = Vec::with_capacity(inputs.len());
        v.extend([ga, gb]);
        if let Some(bias) = inputs.get(2) {
            v.push(match (bias_grad, g_sums) {
                (true, Some(s)) => Some(s),
                (true, None) => {
                    let n = bias.numel();
                    Some(g.reshape(&[g.numel() / n.max(1), n])?.sum(0, false)?)
                }
                (false, _) => None,
            });
        }
        Ok(v)
    }
}

impl Tensor {
    /// Matrix product over the last two dimensions, broadcasting the leading ones.
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// let a = dev.tensor(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
    /// let b = dev.tensor(&[5.0f32, 6.0, 7.0, 8.0], &[2, 2])?;
    /// assert_eq!(a.matmul(&b)?.to_vec::<f32>()?, [19.0, 22.0, 43.0, 50.0]);
    /// // A batch of three [4, 2] matrices times one [2, 2]: b is broadcast.
    /// let batch = dev.randn(&[3, 4, 2], wgrad::DType::F32)?;
    /// assert_eq!(batch.matmul(&b)?.shape(), [3, 4, 2]);
    /// // Transposed operands are views; the product reads their strides.
    /// assert_eq!(a.transpose(0, 1)?.matmul(&b)?.to_vec::<f32>()?, [26.0, 30.0, 38.0, 44.0]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        self.matmul_with(other, MatmulOpts::default())
    }

    /// Matrix product with transposes, bias and activation fused into one kernel.
    pub fn matmul_with(&self, other: &Tensor, o: MatmulOpts<'_>) -> Result<Tensor> {
        // Inline: pushing the bias onto a vector of two reallocated it, once a linear layer.
        let mut inputs: smallvec::SmallVec<[&Tensor; 3]> = smallvec::smallvec![self, other];
        if let Some(b) = o.bias {
            inputs.push(b);
        }
        // GELU's gradient needs its input, which the fused kernel does not keep: when
        // recording, run it as a separate op (it saves what it needs); so do activations the
        // epilogue has no code for.
        if let Some(a) = o.act
            && (a.fused().is_none() || (recording(&inputs) && a == Activation::Gelu))
        {
            return a.apply(&self.matmul_with(other, MatmulOpts { act: None, ..o })?);
        }
        let act = o.act.and_then(Activation::fused).unwrap_or(Act::None);
        let fold = match !o.trans_a && other.rank() == 2 {
            true => folded(self),
            false => None,
        };
        let out = match fold {
            // Rows of a batch times one matrix: one product over all of them (`folded`).
            Some(a) => {
                let c = gemm(&a, other, false, o.trans_b, o.bias, act)?;
                let mut shape = Dims::from_slice(self.shape());
                let last = shape.len() - 1;
                shape[last] = c.shape()[1];
                c.reshape(&shape)?
            }
            None => gemm(self, other, o.trans_a, o.trans_b, o.bias, act)?,
        };
        let rec = record("matmul", &inputs, || MatmulBack {
            trans_a: o.trans_a,
            trans_b: o.trans_b,
            relu_out: (act == Act::Relu).then(|| out.detach()),
        });
        Ok(out.with_node(rec))
    }

    /// `self x weight^T + bias` with weight [out, in] (PyTorch's Linear layout).
    pub fn linear(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        self.matmul_with(
            weight,
            MatmulOpts {
                trans_b: true,
                bias,
                ..Default::default()
            },
        )
    }
}

/// The gradient through a fused ReLU, from its output: g where out > 0, else 0.
pub(crate) fn relu_grad(out: &Tensor, g: &Tensor) -> Result<Tensor> {
    let g = g.contiguous()?;
    let dx = Tensor::uninit(g.device(), g.shape(), g.dtype())?;
    crate::kernels::elementwise::unary_bwd(
        g.device(),
        crate::kernels::elementwise::Unary::Relu,
        out.dense_block("relu backward")?,
        g.dense_block("relu backward")?,
        dx.dense_block("relu backward")?,
        g.dtype(),
        g.numel(),
        0.0,
        0.0,
    )?;
    Ok(dx)
}
