//! Fused scaled dot-product attention.

use super::elementwise::{float_only, same_device, same_dtype};
use crate::autograd::{Op, record};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::attention::{self as ka, Dims, Grads};
use crate::tensor::Tensor;

fn dims(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool, scale: Option<f32>) -> Result<Dims> {
    let op = "attention";
    same_dtype(op, q, k)?;
    same_dtype(op, q, v)?;
    same_device(op, q, k)?;
    same_device(op, q, v)?;
    float_only(op, q)?;
    if q.rank() < 2 || k.rank() != q.rank() || v.shape() != k.shape() {
        return Err(Error::shape(
            op,
            format!(
                "q {:?}, k {:?}, v {:?}: want [..., seq, dim] with k and v alike",
                q.shape(),
                k.shape(),
                v.shape()
            ),
        ));
    }
    let r = q.rank();
    let (sq, d) = (q.shape()[r - 2], q.shape()[r - 1]);
    let skv = k.shape()[r - 2];
    if k.shape()[r - 1] != d || q.shape()[..r - 2] != k.shape()[..r - 2] {
        return Err(Error::shape(
            op,
            format!(
                "q {:?} and k {:?} differ outside the sequence axis",
                q.shape(),
                k.shape()
            ),
        ));
    }
    if causal && skv < sq {
        return Err(Error::shape(
            op,
            format!("causal attention needs at least as many keys ({skv}) as queries ({sq})"),
        ));
    }
    if sq == 0 || skv == 0 || d == 0 {
        return Err(Error::shape(
            op,
            format!("empty q {:?} or k {:?}", q.shape(), k.shape()),
        ));
    }
    let bh = q.numel() / (sq * d);
    Ok(Dims {
        bh,
        sq,
        skv,
        d,
        scale: scale.unwrap_or(1.0 / (d as f32).sqrt()),
        causal,
    })
}

impl Tensor {
    /// softmax(scale * q k^T [+ causal mask]) v over [..., seq, head_dim] tensors (typically
    /// [batch, heads, seq, head_dim]); scale defaults to 1/sqrt(head_dim). The score matrix is
    /// never stored: memory is O(seq) per head.
    pub fn attention(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        causal: bool,
        scale: Option<f32>,
    ) -> Result<Tensor> {
        let a = dims(q, k, v, causal, scale)?;
        let out = Tensor::uninit(q.device(), q.shape(), q.dtype())?;
        let lse = Tensor::uninit(q.device(), &[a.bh, a.sq], DType::F32)?;
        ka::forward(
            q.device(),
            &a,
            q.block(),
            k.block(),
            v.block(),
            out.block(),
            lse.block(),
            q.dtype(),
        )?;
        let rec = record(&[q, k, v], || Op::Attention {
            q: q.clone(),
            k: k.clone(),
            v: v.clone(),
            out: out.detach(),
            lse,
            causal,
            scale: a.scale,
        });
        Ok(out.with_op(rec))
    }
}

/// (dq, dk, dv) from the saved output and log-sum-exp.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_grads(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    out: &Tensor,
    lse: &Tensor,
    causal: bool,
    scale: f32,
    dout: &Tensor,
) -> Result<[Tensor; 3]> {
    let a = dims(q, k, v, causal, Some(scale))?;
    let dev = q.device();
    let delta = Tensor::uninit(dev, &[a.bh, a.sq], DType::F32)?;
    let dq = Tensor::uninit(dev, q.shape(), q.dtype())?;
    let dk = Tensor::uninit(dev, k.shape(), q.dtype())?;
    let dv = Tensor::uninit(dev, v.shape(), q.dtype())?;
    let dout = dout.to_dtype(q.dtype())?;
    ka::backward(
        dev,
        &a,
        &Grads {
            q: q.block(),
            k: k.block(),
            v: v.block(),
            o: out.block(),
            lse: lse.block(),
            dout: dout.block(),
            delta: delta.block(),
            dq: dq.block(),
            dk: dk.block(),
            dv: dv.block(),
        },
        q.dtype(),
    )?;
    Ok([dq, dk, dv])
}
