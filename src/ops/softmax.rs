//! Softmax and log-softmax along the last axis.

use super::elementwise::float_only;
use crate::error::{Error, Result};
use crate::kernels::softmax as ks;
use crate::tensor::Tensor;
use crate::tensor::graph::record_fn;

/// Softmax's (or log-softmax's) gradient from its saved output.
fn softmax_grad(y: &Tensor, log: bool, dy: Tensor) -> Result<Tensor> {
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
        log,
    )?;
    Ok(dx)
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
        let y = out.detach();
        let rec = record_fn(name, self, move |_, g| softmax_grad(&y, log, g));
        Ok(out.with_node(rec))
    }

    /// Softmax along the last axis (numerically stable; rows of any length).
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// let logits = dev.tensor(&[1.0f32, 2.0, 3.0, 1000.0, 1000.0, 1000.0], &[2, 3])?;
    /// let p = logits.softmax()?.to_vec::<f32>()?;
    /// assert!((p[..3].iter().sum::<f32>() - 1.0).abs() < 1e-6);
    /// assert!(p[0] < p[1] && p[1] < p[2]);
    /// assert!(p[3..].iter().all(|&v| (v - 1.0 / 3.0).abs() < 1e-6)); // no overflow
    /// # Ok(())
    /// # }
    /// ```
    pub fn softmax(&self) -> Result<Tensor> {
        self.softmax_impl(false)
    }

    /// Log-softmax along the last axis.
    pub fn log_softmax(&self) -> Result<Tensor> {
        self.softmax_impl(true)
    }
}
