//! Embedding lookup.

use super::elementwise::float_only;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::embedding as ke;
use crate::tensor::Tensor;
use crate::tensor::graph::record_fn;

/// The table's gradient: a deterministic scatter-add of the output gradient's rows.
fn embedding_grad(w: &Tensor, idx: &Tensor, dy: Tensor) -> Result<Tensor> {
    let (vocab, dim) = (w.shape()[0], w.shape()[1]);
    let dy = dy.contiguous()?;
    let dw = Tensor::uninit(w.device(), w.shape(), dy.dtype())?;
    let op = "embedding backward";
    ke::scatter_add(
        w.device(),
        idx.dense_block(op)?,
        dy.dense_block(op)?,
        dw.dense_block(op)?,
        dy.dtype(),
        idx.numel(),
        dim,
        vocab,
    )?;
    Ok(dw)
}

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
        let (w, idx) = (self.contiguous()?, indices.contiguous()?);
        let out = Tensor::uninit(self.device(), &shape, self.dtype())?;
        ke::gather(
            self.device(),
            w.dense_block(op)?,
            idx.dense_block(op)?,
            out.dense_block(op)?,
            self.dtype(),
            indices.numel(),
            dim,
            vocab,
        )?;
        let rec = record_fn("embedding", self, move |w, g| embedding_grad(w, &idx, g));
        Ok(out.with_node(rec))
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
