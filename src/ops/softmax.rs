//! Softmax and log-softmax along the last axis.

use super::elementwise::float_only;
use crate::autograd::{Op, record};
use crate::error::{Error, Result};
use crate::kernels::softmax as ks;
use crate::tensor::Tensor;

impl Tensor {
    fn softmax_impl(&self, log: bool) -> Result<Tensor> {
        let name = if log { "log_softmax" } else { "softmax" };
        float_only(name, self)?;
        let Some(&len) = self.shape().last() else {
            return Err(Error::shape(name, "a scalar has no last axis".to_string()));
        };
        if len == 0 {
            return Err(Error::shape(
                name,
                format!("empty last axis in {:?}", self.shape()),
            ));
        }
        let rows = self.numel() / len;
        let out = Tensor::uninit(self.device(), self.shape(), self.dtype())?;
        ks::forward(
            self.device(),
            self.block(),
            out.block(),
            self.dtype(),
            rows,
            len,
            log,
        )?;
        let rec = record(&[self], || Op::Softmax {
            x: self.clone(),
            y: out.detach(),
            log,
        });
        Ok(out.with_op(rec))
    }

    /// Softmax along the last axis (numerically stable; rows of any length).
    pub fn softmax(&self) -> Result<Tensor> {
        self.softmax_impl(false)
    }

    /// Log-softmax along the last axis.
    pub fn log_softmax(&self) -> Result<Tensor> {
        self.softmax_impl(true)
    }
}

/// dx from the saved output y and dy.
pub(crate) fn softmax_grad(y: &Tensor, dy: &Tensor, log: bool) -> Result<Tensor> {
    let len = *y.shape().last().unwrap_or(&1);
    let dx = Tensor::uninit(y.device(), y.shape(), dy.dtype())?;
    ks::backward(
        y.device(),
        y.block(),
        dy.block(),
        dx.block(),
        dy.dtype(),
        y.numel() / len.max(1),
        len,
        log,
    )?;
    Ok(dx)
}
