//! Dropout, with its mask regenerated (not stored) for the backward pass.

use super::elementwise::float_only;
use crate::error::{Error, Result};
use crate::kernels::fill;
use crate::tensor::Tensor;
use crate::tensor::graph::record_fn;

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
}
