//! Dropout, with its mask regenerated (not stored) for the backward pass.

use super::elementwise::{float_only, same_device};
use crate::error::{Error, Result};
use crate::kernels::fill;
use crate::tensor::Tensor;
use crate::tensor::graph::{record, record_fn};

/// y = x * mask / (1 - p) for the mask drawn from `seed`.
fn apply(x: &Tensor, p: f32, seed: u64) -> Result<Tensor> {
    let x = x.contiguous()?;
    let out = Tensor::uninit(x.device(), x.shape(), x.dtype())?;
    fill::dropout(
        x.device(),
        x.dense_block("dropout")?,
        out.dense_block("dropout")?,
        x.dtype(),
        x.numel(),
        p,
        seed,
    )?;
    Ok(out)
}

impl Tensor {
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
        let out = apply(self, p, seed)?;
        // The gradient: the same mask (same seed) applied to it.
        let rec = record_fn("dropout", self, move |_, g| apply(&g, p, seed));
        Ok(out.with_node(rec))
    }

    /// `self + x.dropout(p)`: a residual connection joining a dropped-out branch, in one pass
    /// where the two have one shape, dtype and a multiple of 4 elements (the two ops
    /// otherwise). The same mask as `dropout` would draw; the sum is rounded once. The
    /// gradient passes to `self` unchanged and to `x` through the mask.
    pub fn add_dropout(&self, x: &Tensor, p: f32) -> Result<Tensor> {
        float_only("add_dropout", self)?;
        if !(0.0..1.0).contains(&p) {
            return Err(Error::invalid(
                "add_dropout",
                format!("probability {p} is not in [0, 1)"),
            ));
        }
        if p == 0.0 {
            return self.add(x);
        }
        same_device("add_dropout", self, x)?;
        let fused = self.shape() == x.shape()
            && self.dtype() == x.dtype()
            && self.numel().is_multiple_of(4);
        if !fused {
            return self.add(&x.dropout(p)?);
        }
        let seed = self.device().next_seed();
        let (r, xc) = (self.contiguous()?, x.contiguous()?);
        let out = Tensor::uninit(self.device(), self.shape(), self.dtype())?;
        fill::add_dropout(
            self.device(),
            r.dense_block("add_dropout")?,
            xc.dense_block("add_dropout")?,
            out.dense_block("add_dropout")?,
            self.dtype(),
            self.numel(),
            p,
            seed,
        )?;
        let rec = record("add_dropout", &[self, x], || {
            move |_: &[Tensor], _: &Tensor, g: Tensor| {
                let gx = apply(&g, p, seed)?;
                Ok(vec![Some(g), Some(gx)])
            }
        });
        Ok(out.with_node(rec))
    }
}
