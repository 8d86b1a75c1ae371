//! Matrix products: batched, broadcasting, with transposes, bias and a fused activation.

use super::activation::Activation;
use super::elementwise::{broadcast_shape, float_only, same_device, same_dtype};
use crate::autograd::{Op, record};
use crate::error::{Error, Result};
use crate::kernels::matmul::{self as km, Act, Gemm};
use crate::tensor::Tensor;

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

/// (batch dims, rows, cols) of a matrix operand, with the transpose applied.
fn mat_dims(op: &'static str, t: &Tensor, trans: bool) -> Result<(Vec<usize>, usize, usize)> {
    if t.rank() < 2 {
        return Err(Error::shape(
            op,
            format!(
                "operand of shape {:?} needs at least 2 dimensions",
                t.shape()
            ),
        ));
    }
    let r = t.rank();
    let (a, b) = (t.shape()[r - 2], t.shape()[r - 1]);
    Ok((
        t.shape()[..r - 2].to_vec(),
        if trans { b } else { a },
        if trans { a } else { b },
    ))
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
    let op = "matmul";
    let dtype = same_dtype(op, a, b)?;
    same_device(op, a, b)?;
    float_only(op, a)?;
    let (ab, m, k) = mat_dims(op, a, trans_a)?;
    let (bb, k2, n) = mat_dims(op, b, trans_b)?;
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
    if let Some(bias) = bias {
        same_dtype(op, a, bias)?;
        if bias.shape() != [n] {
            return Err(Error::shape(
                op,
                format!("bias of shape {:?} for {n} output columns", bias.shape()),
            ));
        }
    }
    let batch_shape = broadcast_shape(op, &ab, &bb)?;
    let batch: usize = batch_shape.iter().product();
    // An operand either has the full batch (stride one matrix) or a single matrix (stride 0);
    // other broadcasts are materialised.
    let fit = |t: &Tensor, dims: &[usize]| -> Result<(Tensor, usize)> {
        let count: usize = dims.iter().product();
        let mat = t.shape()[t.rank() - 2] * t.shape()[t.rank() - 1];
        // Broadcasting only repeats, so an operand with as many matrices as the output batch
        // already has the output's batch layout.
        if count == batch {
            Ok((t.clone(), mat))
        } else if count == 1 {
            Ok((t.clone(), 0))
        } else {
            let mut full = batch_shape.clone();
            full.extend_from_slice(&t.shape()[t.rank() - 2..]);
            Ok((t.broadcast_to(&full)?, mat))
        }
    };
    let (a2, a_bs) = fit(a, &ab)?;
    let (b2, b_bs) = fit(b, &bb)?;
    let mut out_shape = batch_shape.clone();
    out_shape.extend_from_slice(&[m, n]);
    let out = Tensor::uninit(a.device(), &out_shape, dtype)?;
    km::matmul(
        a.device(),
        &Gemm {
            a: a2.block(),
            b: b2.block(),
            c: out.block(),
            bias: bias.map(|t| t.block()),
            dtype,
            m,
            n,
            k,
            batch,
            trans_a,
            trans_b,
            a_bs,
            b_bs,
            a_mod: batch,
            b_mod: batch,
            act,
            offsets: (0, 0, 0),
            bias_rows: false,
            bias_bs: 0,
        },
    )?;
    Ok(out)
}

impl Tensor {
    /// Matrix product over the last two dimensions, broadcasting the leading ones.
    pub fn matmul(&self, other: &Tensor) -> Result<Tensor> {
        self.matmul_with(other, MatmulOpts::default())
    }

    /// Matrix product with transposes, bias and activation fused into one kernel.
    pub fn matmul_with(&self, other: &Tensor, o: MatmulOpts<'_>) -> Result<Tensor> {
        let mut inputs = vec![self, other];
        if let Some(b) = o.bias {
            inputs.push(b);
        }
        let recording =
            crate::autograd::is_grad_enabled() && inputs.iter().any(|t| t.requires_grad());
        // GELU's gradient needs its input, which the fused kernel does not keep: when
        // recording, run it as a separate op (it saves what it needs); so do activations the
        // epilogue has no code for.
        if let Some(a) = o.act
            && (a.fused().is_none() || (recording && a == Activation::Gelu))
        {
            return a.apply(&self.matmul_with(other, MatmulOpts { act: None, ..o })?);
        }
        let act = o.act.and_then(Activation::fused).unwrap_or(Act::None);
        let out = gemm(self, other, o.trans_a, o.trans_b, o.bias, act)?;
        let rec = record(&inputs, || Op::Matmul {
            a: self.clone(),
            b: other.clone(),
            bias: o.bias.cloned(),
            trans_a: o.trans_a,
            trans_b: o.trans_b,
            relu_out: (act == Act::Relu).then(|| out.detach()),
        });
        Ok(out.with_op(rec))
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

/// Gradients of `C = act(op(A) op(B) + bias)` for the inputs that need them.
pub(crate) fn matmul_grads(
    a: &Tensor,
    b: &Tensor,
    bias: Option<&Tensor>,
    trans_a: bool,
    trans_b: bool,
    relu_out: Option<&Tensor>,
    g: Tensor,
) -> Result<Vec<(Tensor, Tensor)>> {
    let g = match relu_out {
        Some(out) => relu_grad(out, &g)?,
        None => g,
    };
    let mut v = Vec::new();
    if a.requires_grad() {
        let ga = if trans_a {
            gemm(b, &g, trans_b, true, None, Act::None)?
        } else {
            gemm(&g, b, false, !trans_b, None, Act::None)?
        };
        v.push((a.clone(), ga.sum_to(a.shape())?));
    }
    if b.requires_grad() {
        let gb = if trans_b {
            gemm(&g, a, true, trans_a, None, Act::None)?
        } else {
            gemm(a, &g, !trans_a, false, None, Act::None)?
        };
        v.push((b.clone(), gb.sum_to(b.shape())?));
    }
    if let Some(bias) = bias
        && bias.requires_grad()
    {
        let n = bias.numel();
        v.push((bias.clone(), g.reshape(&[g.numel() / n, n])?.sum(0, false)?));
    }
    Ok(v)
}

/// The gradient through a fused ReLU, from its output: g where out > 0, else 0.
pub(crate) fn relu_grad(out: &Tensor, g: &Tensor) -> Result<Tensor> {
    let dx = Tensor::uninit(g.device(), g.shape(), g.dtype())?;
    crate::kernels::elementwise::unary_bwd(
        g.device(),
        crate::kernels::elementwise::Unary::Relu,
        out.block(),
        g.block(),
        dx.block(),
        g.dtype(),
        g.numel(),
        0.0,
        0.0,
    )?;
    Ok(dx)
}
