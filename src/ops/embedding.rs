//! Embedding lookup and dropout.

use super::elementwise::float_only;
use crate::autograd::{Op, record};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::{embedding as ke, fill};
use crate::tensor::Tensor;

impl Tensor {
    /// Rows of the table `self` [vocab, dim] at u32 `indices` (any shape): the result has
    /// shape [indices..., dim]. An index past the vocabulary reads as NaN, or is an error
    /// naming the index on a checked device
    /// ([`DeviceOptions::checked`](crate::DeviceOptions::checked)).
    pub fn embedding(&self, indices: &Tensor) -> Result<Tensor> {
        let op = "embedding";
        float_only(op, self)?;
        if indices.dtype() != DType::U32 {
            return Err(Error::DType {
                op,
                expected: DType::U32,
                got: indices.dtype(),
            });
        }
        if self.rank() != 2 {
            return Err(Error::shape(
                op,
                format!("table {:?} must be [vocab, dim]", self.shape()),
            ));
        }
        let (vocab, dim) = (self.shape()[0], self.shape()[1]);
        if self.device().is_checked() {
            check_indices(op, indices, vocab)?;
        }
        let mut shape = indices.shape().to_vec();
        shape.push(dim);
        let out = Tensor::uninit(self.device(), &shape, self.dtype())?;
        ke::gather(
            self.device(),
            self.block(),
            indices.block(),
            out.block(),
            self.dtype(),
            indices.numel(),
            dim,
            vocab,
        )?;
        let rec = record(&[self], || Op::Embedding {
            w: self.clone(),
            idx: indices.clone(),
        });
        Ok(out.with_op(rec))
    }

    /// Zeroes each element with probability `p` and scales the rest by 1/(1-p). The mask comes
    /// from a counter-based generator keyed by a seed drawn from the device, so the backward
    /// pass (and a checkpoint's recomputation) regenerates it instead of storing it.
    pub fn dropout(&self, p: f32) -> Result<Tensor> {
        float_only("dropout", self)?;
        if !(0.0..1.0).contains(&p) {
            return Err(Error::invalid(
                "dropout",
                format!("probability {p} is not in [0, 1)"),
            ));
        }
        if p == 0.0 {
            return Ok(self.clone());
        }
        let seed = self.device().next_seed();
        let out = Tensor::uninit(self.device(), self.shape(), self.dtype())?;
        fill::dropout(
            self.device(),
            self.block(),
            out.block(),
            self.dtype(),
            self.numel(),
            p,
            seed,
        )?;
        let rec = record(&[self], || Op::Dropout {
            x: self.clone(),
            p,
            seed,
        });
        Ok(out.with_op(rec))
    }
}

/// Errors unless every index in `idx` (u32) is below `limit`: the checked mode's host-side
/// test (a read-back, so a sync).
pub(crate) fn check_indices(op: &'static str, idx: &Tensor, limit: usize) -> Result<()> {
    let v = idx.to_vec::<u32>()?;
    if let Some((i, &bad)) = v.iter().enumerate().find(|&(_, &x)| x as usize >= limit) {
        return Err(Error::invalid(
            op,
            format!("index {bad} at position {i} is out of range for size {limit}"),
        ));
    }
    Ok(())
}

/// d table from d output: a deterministic scatter-add.
pub(crate) fn embedding_grad(w: &Tensor, idx: &Tensor, dy: &Tensor) -> Result<Tensor> {
    let (vocab, dim) = (w.shape()[0], w.shape()[1]);
    let dw = Tensor::uninit(w.device(), w.shape(), dy.dtype())?;
    ke::scatter_add(
        w.device(),
        idx.block(),
        dy.block(),
        dw.block(),
        dy.dtype(),
        idx.numel(),
        dim,
        vocab,
    )?;
    Ok(dw)
}

/// The dropout mask applied again, to the gradient.
pub(crate) fn dropout_grad(dy: &Tensor, p: f32, seed: u64) -> Result<Tensor> {
    let dx = Tensor::uninit(dy.device(), dy.shape(), dy.dtype())?;
    fill::dropout(
        dy.device(),
        dy.block(),
        dx.block(),
        dy.dtype(),
        dy.numel(),
        p,
        seed,
    )?;
    Ok(dx)
}
