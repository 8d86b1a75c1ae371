//! Dynamic loss scaling for f16 training, and guarded optimizer steps.

use super::{Optimizer, clip_coefficient, grad_norm};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// What to do when a gradient holds inf or NaN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NonFinite {
    /// Return `Error::Invalid` naming the problem (the step is not taken).
    Error,
    /// Skip the step and carry on.
    Skip,
}

/// What a guarded step did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepReport {
    /// Global gradient norm before clipping (in the unscaled units).
    pub grad_norm: f32,
    /// Whether the parameters were updated.
    pub stepped: bool,
    /// The clipping multiplier applied (1 when not clipped).
    pub clip: f32,
}

/// One optimizer step with global-norm clipping (when `max_norm` is set) and a check for
/// non-finite gradients. `gmul` is multiplied into the gradients as well (1/loss scale, or
/// 1/accumulation steps). Reads one number back from the device.
pub fn guarded_step(
    opt: &mut dyn Optimizer,
    gmul: f32,
    max_norm: Option<f32>,
    on_nonfinite: NonFinite,
) -> Result<StepReport> {
    let norm = grad_norm(&opt.params())? * gmul;
    if !norm.is_finite() {
        return match on_nonfinite {
            NonFinite::Skip => Ok(StepReport {
                grad_norm: norm,
                stepped: false,
                clip: 1.0,
            }),
            NonFinite::Error => Err(Error::invalid(
                "optimizer step",
                format!("gradient norm is {norm}: a gradient holds inf or NaN"),
            )),
        };
    }
    let clip = max_norm.map_or(1.0, |m| clip_coefficient(norm, m));
    opt.step_scaled(gmul * clip)?;
    Ok(StepReport {
        grad_norm: norm,
        stepped: true,
        clip,
    })
}

/// Dynamic loss scaling (as in mixed-precision training): the loss is multiplied by `scale`
/// before backward so small f16 gradients do not flush to zero; the optimizer divides it back
/// out. A step whose gradients overflowed is skipped and the scale halved; after
/// `growth_interval` clean steps in a row the scale doubles.
#[derive(Clone, Debug)]
pub struct GradScaler {
    /// Current scale.
    pub scale: f32,
    /// Multiplier after `growth_interval` clean steps.
    pub growth: f32,
    /// Multiplier after an overflow.
    pub backoff: f32,
    /// Clean steps before growing.
    pub growth_interval: u32,
    pub(crate) clean: u32,
    /// Steps skipped so far.
    pub skipped: u64,
}

impl Default for GradScaler {
    fn default() -> Self {
        GradScaler {
            scale: 65536.0,
            growth: 2.0,
            backoff: 0.5,
            growth_interval: 2000,
            clean: 0,
            skipped: 0,
        }
    }
}

impl GradScaler {
    /// The scaler with PyTorch's defaults: scale 2^16, x2 after 2000 clean steps, x0.5 on
    /// overflow.
    pub fn new() -> Self {
        GradScaler::default()
    }

    /// `loss * scale`, to call backward on.
    pub fn scale_loss(&self, loss: &Tensor) -> Result<Tensor> {
        loss.mul_scalar(self.scale)
    }

    /// Unscales, checks, optionally clips, and steps (or skips and backs off). Returns the report.
    pub fn step(&mut self, opt: &mut dyn Optimizer, max_norm: Option<f32>) -> Result<StepReport> {
        let r = guarded_step(opt, 1.0 / self.scale, max_norm, NonFinite::Skip)?;
        if r.stepped {
            self.clean += 1;
            if self.clean >= self.growth_interval {
                self.scale *= self.growth;
                self.clean = 0;
            }
        } else {
            self.scale *= self.backoff;
            self.clean = 0;
            self.skipped += 1;
        }
        Ok(r)
    }
}
