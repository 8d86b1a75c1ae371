//! LayerNorm and RMSNorm over the last axis.

use super::elementwise::{float_only, same_dtype};
use crate::autograd::{Op, record};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::norm::{self as kn, Norm};
use crate::tensor::Tensor;

impl Tensor {
    fn norm_impl(&self, gamma: &Tensor, beta: Option<&Tensor>, eps: f32) -> Result<Tensor> {
        let op = if beta.is_some() {
            "layer_norm"
        } else {
            "rms_norm"
        };
        float_only(op, self)?;
        same_dtype(op, self, gamma)?;
        let Some(&len) = self.shape().last() else {
            return Err(Error::shape(op, "a scalar has no last axis".to_string()));
        };
        if gamma.shape() != [len] || beta.is_some_and(|b| b.shape() != [len]) {
            return Err(Error::shape(
                op,
                format!(
                    "input {:?} with gamma {:?} and beta {:?}",
                    self.shape(),
                    gamma.shape(),
                    beta.map(|b| b.shape().to_vec())
                ),
            ));
        }
        if let Some(b) = beta {
            same_dtype(op, self, b)?;
        }
        if len == 0 {
            return Err(Error::shape(
                op,
                format!("empty last axis in {:?}", self.shape()),
            ));
        }
        let rows = self.numel() / len;
        let dev = self.device();
        let out = Tensor::uninit(dev, self.shape(), self.dtype())?;
        let stats = Tensor::uninit(dev, &[rows, 3], DType::F32)?;
        let n = Norm {
            x: self.block(),
            gamma: gamma.block(),
            beta: beta.map(|b| b.block()),
            stats: stats.block(),
            dtype: self.dtype(),
            rows,
            len,
            eps,
        };
        kn::forward(dev, &n, out.block())?;
        let mut inputs = vec![self, gamma];
        inputs.extend(beta);
        let rec = record(&inputs, || Op::Norm {
            x: self.clone(),
            gamma: gamma.clone(),
            beta: beta.cloned(),
            stats,
            eps,
        });
        Ok(out.with_op(rec))
    }

    /// LayerNorm over the last axis: (x - mean) / sqrt(var + eps) * gamma + beta.
    pub fn layer_norm(&self, gamma: &Tensor, beta: &Tensor, eps: f32) -> Result<Tensor> {
        self.norm_impl(gamma, Some(beta), eps)
    }

    /// RMSNorm over the last axis: x / sqrt(mean(x^2) + eps) * gamma.
    pub fn rms_norm(&self, gamma: &Tensor, eps: f32) -> Result<Tensor> {
        self.norm_impl(gamma, None, eps)
    }
}

/// (dx, dgamma, dbeta) from the saved statistics.
pub(crate) fn norm_grads(
    x: &Tensor,
    gamma: &Tensor,
    beta: Option<&Tensor>,
    stats: &Tensor,
    eps: f32,
    dy: &Tensor,
) -> Result<[Tensor; 3]> {
    let len = gamma.numel();
    let dev = x.device();
    let dx = Tensor::uninit(dev, x.shape(), x.dtype())?;
    let dparams = Tensor::uninit(dev, &[2, len], x.dtype())?;
    let dy = dy.to_dtype(x.dtype())?;
    let n = Norm {
        x: x.block(),
        gamma: gamma.block(),
        beta: beta.map(|b| b.block()),
        stats: stats.block(),
        dtype: x.dtype(),
        rows: x.numel() / len.max(1),
        len,
        eps,
    };
    kn::backward(dev, &n, dy.block(), dx.block(), dparams.block())?;
    let dgamma = dparams.narrow(0, 0, 1)?.reshape(&[len])?;
    let dbeta = dparams.narrow(0, 1, 1)?.reshape(&[len])?;
    Ok([dx, dgamma, dbeta])
}
