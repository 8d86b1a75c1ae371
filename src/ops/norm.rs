//! LayerNorm and RMSNorm over the last axis.

use super::elementwise::{float_only, same_dtype};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::norm::{self as kn, Norm};
use crate::tensor::Tensor;
use crate::tensor::graph::{Backward, record};

/// LayerNorm's (or RMSNorm's) gradients from the saved per-row statistics; inputs x, gamma
/// and (LayerNorm) beta.
struct NormBack {
    stats: Tensor,
    eps: f32,
}

impl Backward for NormBack {
    fn backward(
        &self,
        inputs: &[Tensor],
        _out: &Tensor,
        dy: Tensor,
    ) -> Result<Vec<Option<Tensor>>> {
        self.grads(inputs, dy, None)
    }

    /// Adds the gradient x already has (a residual stream's, from the skip connection) in
    /// the dx kernel, where it is dense and of x's shape and dtype.
    fn backward_acc(
        &self,
        inputs: &[Tensor],
        _out: &Tensor,
        dy: Tensor,
        acc: &mut [Option<Tensor>],
    ) -> Result<Vec<Option<Tensor>>> {
        let x = &inputs[0];
        let fits =
            |t: &Tensor| t.shape() == x.shape() && t.dtype() == x.dtype() && t.layout().is_dense();
        let res = match acc.first_mut() {
            Some(slot) if slot.as_ref().is_some_and(fits) => slot.take(),
            _ => None,
        };
        self.grads(inputs, dy, res.as_ref())
    }
}

impl NormBack {
    /// dx (plus `res` where given), dgamma and (LayerNorm) dbeta.
    fn grads(
        &self,
        inputs: &[Tensor],
        dy: Tensor,
        res: Option<&Tensor>,
    ) -> Result<Vec<Option<Tensor>>> {
        let (x, gamma, has_beta) = (&inputs[0], &inputs[1], inputs.len() == 3);
        let len = gamma.numel();
        let dev = x.device();
        let dx = Tensor::uninit(dev, x.shape(), x.dtype())?;
        // Frozen gain and bias: dx alone, no parameter sums.
        let params = gamma.requires_grad() || (has_beta && inputs[2].requires_grad());
        let dgamma = if params {
            Some(Tensor::uninit(dev, &[len], x.dtype())?)
        } else {
            None
        };
        let dbeta = if has_beta && params {
            Some(Tensor::uninit(dev, &[len], x.dtype())?)
        } else {
            None
        };
        let dy = dy.to_dtype(x.dtype())?.contiguous()?;
        let (xg, gg) = (x.contiguous()?, gamma.contiguous()?);
        let n = Norm {
            x: xg.dense_block("norm backward")?,
            gamma: gg.dense_block("norm backward")?,
            beta: None,
            stats: self.stats.dense_block("norm backward")?,
            dtype: x.dtype(),
            rows: x.numel() / len.max(1),
            len,
            eps: self.eps,
        };
        let n = Norm {
            beta: if has_beta { Some(n.gamma) } else { None },
            ..n
        };
        kn::backward(
            dev,
            &n,
            dy.dense_block("norm backward")?,
            dx.dense_block("norm backward")?,
            match &dgamma {
                Some(t) => Some(t.dense_block("norm backward")?),
                None => None,
            },
            match &dbeta {
                Some(t) => Some(t.dense_block("norm backward")?),
                None => None,
            },
            match res {
                Some(t) => Some(t.dense_block("norm backward")?),
                None => None,
            },
        )?;
        let mut v = vec![Some(dx), dgamma];
        if has_beta {
            v.push(dbeta);
        }
        Ok(v)
    }
}

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
        let (x, g) = (self.contiguous()?, gamma.contiguous()?);
        let b = beta.map(Tensor::contiguous).transpose()?;
        let out = Tensor::uninit(dev, self.shape(), self.dtype())?;
        let stats = Tensor::uninit(dev, &[rows, 3], DType::F32)?;
        let n = Norm {
            x: x.dense_block(op)?,
            gamma: g.dense_block(op)?,
            beta: match &b {
                Some(b) => Some(b.dense_block(op)?),
                None => None,
            },
            stats: stats.dense_block(op)?,
            dtype: self.dtype(),
            rows,
            len,
            eps,
        };
        kn::forward(dev, &n, out.dense_block(op)?)?;
        let mut inputs = vec![self, gamma];
        inputs.extend(beta);
        let rec = record(op, &inputs, || NormBack { stats, eps });
        Ok(out.with_node(rec))
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
