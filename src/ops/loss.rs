//! Losses: cross-entropy from logits, mean squared error.

use super::elementwise::float_only;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::loss as kl;
use crate::tensor::Tensor;
use crate::tensor::graph::record_fn;

/// Cross-entropy's gradient, softmax minus one-hot, from the dense logits and the saved row
/// statistics.
fn cross_entropy_grad(x: &Tensor, labels: &Tensor, stats: &Tensor, g: Tensor) -> Result<Tensor> {
    let (rows, classes) = (x.shape()[0], x.shape()[1]);
    let dx = Tensor::uninit(x.device(), x.shape(), x.dtype())?;
    let g = g.to_dtype(x.dtype())?.contiguous()?;
    let op = "cross_entropy backward";
    kl::backward(
        x.device(),
        x.dense_block(op)?,
        labels.dense_block(op)?,
        stats.dense_block(op)?,
        g.dense_block(op)?,
        dx.dense_block(op)?,
        x.dtype(),
        rows,
        classes,
    )?;
    Ok(dx)
}

impl Tensor {
    /// Per-row cross-entropy of logits \[rows, classes\] against u32 class labels \[rows\]. A
    /// label outside 0..classes gives a NaN loss for its row, or an error naming the label on a
    /// checked device ([`DeviceOptions::checked`](crate::DeviceOptions::checked)).
    pub fn cross_entropy_rows(&self, labels: &Tensor) -> Result<Tensor> {
        let op = "cross_entropy";
        float_only(op, self)?;
        if labels.dtype() != DType::U32 {
            return Err(Error::DType {
                op,
                expected: DType::U32,
                got: labels.dtype(),
            });
        }
        if self.rank() != 2 || labels.shape() != [self.shape()[0]] {
            return Err(Error::shape(
                op,
                format!(
                    "logits {:?} with labels {:?}: want [rows, classes] and [rows]",
                    self.shape(),
                    labels.shape()
                ),
            ));
        }
        let (rows, classes) = (self.shape()[0], self.shape()[1]);
        if classes == 0 {
            return Err(Error::shape(op, "zero classes".to_string()));
        }
        let dev = self.device();
        if dev.is_checked() {
            crate::ops::embedding::check_indices(op, labels, classes)?;
        }
        let (x, labels) = (self.contiguous()?, labels.contiguous()?);
        let loss = Tensor::uninit(dev, &[rows], self.dtype())?;
        let stats = Tensor::uninit(dev, &[rows, 2], DType::F32)?;
        kl::forward(
            dev,
            x.dense_block(op)?,
            labels.dense_block(op)?,
            loss.dense_block(op)?,
            stats.dense_block(op)?,
            self.dtype(),
            rows,
            classes,
        )?;
        // The node keeps the dense logits it ran on (the same tensor when it was dense).
        let rec = record_fn("cross_entropy", &x, move |x, g| {
            cross_entropy_grad(x, &labels, &stats, g)
        });
        Ok(loss.with_node(rec))
    }

    /// Mean cross-entropy of logits \[rows, classes\] against u32 labels \[rows\].
    pub fn cross_entropy(&self, labels: &Tensor) -> Result<Tensor> {
        self.cross_entropy_rows(labels)?.mean_all()
    }

    /// Mean squared error against `target` (same shape).
    pub fn mse_loss(&self, target: &Tensor) -> Result<Tensor> {
        if self.shape() != target.shape() {
            return Err(Error::shape(
                "mse_loss",
                format!("{:?} and {:?}", self.shape(), target.shape()),
            ));
        }
        self.sub(target)?.square()?.mean_all()
    }
}
