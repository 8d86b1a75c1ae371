//! Softmax and log-softmax along the last axis.

use super::elementwise::float_only;
use crate::error::{Error, Result};
use crate::kernels::softmax as ks;
use crate::tensor::Tensor;
use crate::tensor::graph::{Backward, record};

/// Softmax's (or log-softmax's) gradient from its saved output.
struct SoftmaxBack {
    x: Tensor,
    y: Tensor,
    log: bool,
}

impl Backward for SoftmaxBack {
    fn name(&self) -> &'static str {
        if self.log { "log_softmax" } else { "softmax" }
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.x]
    }
    fn backward(&self, _out: &Tensor, dy: Tensor) -> Result<Vec<Option<Tensor>>> {
        let y = &self.y;
        let dy = dy.contiguous()?;
        let len = *y.shape().last().unwrap_or(&1);
        let dx = Tensor::uninit(y.device(), y.shape(), dy.dtype())?;
        ks::backward(
            y.device(),
            y.dense_block("softmax backward")?,
            dy.dense_block("softmax backward")?,
            dx.dense_block("softmax backward")?,
            dy.dtype(),
            y.numel() / len.max(1),
            len,
            self.log,
        )?;
        Ok(vec![Some(dx)])
    }
}

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
        let x = self.contiguous()?;
        let out = Tensor::uninit(self.device(), self.shape(), self.dtype())?;
        ks::forward(
            self.device(),
            x.dense_block(name)?,
            out.dense_block(name)?,
            self.dtype(),
            rows,
            len,
            log,
        )?;
        let rec = record(&[self], || SoftmaxBack {
            x: self.clone(),
            y: out.detach(),
            log,
        });
        Ok(out.with_node(rec))
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
