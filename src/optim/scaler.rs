//! Guarded optimizer steps decided on the device: global-norm clipping, skipping a step whose
//! gradients hold inf or NaN, and dynamic loss scaling for f16 training.
//!
//! A step's decision lives in a small f32 control block on the device ([`Control`]): the
//! `decide` kernel (optim.wgsl) sums the gradients' squares and writes the norm, the clip
//! coefficient, the gradient multiplier (0 for a skipped step) and the loss scaler's state;
//! the optimizer's update kernels read the multiplier from there, and the next step's loss is
//! multiplied by the scale there. So a step needs no read-back: [`GradScaler::step_deferred`]
//! starts a read of the block and collects it at the next step, by when it has long arrived.
//! The blocking forms ([`GradScaler::step`], [`guarded_step`]) read it at once.

use super::{Optimizer, sum_of_squares};
use crate::device::{Device, Readback};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::optim::{self as ko, CTL_LEN, Ctl, Decision};
use crate::memory::Block;
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

/// A guarded step's control block on the device (`Ctl` slots, f32): the loss scaler's state
/// and the last step's decision, which the optimizer's update kernels read.
pub struct Control(Tensor);

impl Control {
    fn new(dev: &Device, scale: f32, clean: u32, skipped: u64) -> Result<Control> {
        let mut v = [0.0f32; CTL_LEN];
        v[Ctl::Scale as usize] = scale;
        v[Ctl::Clean as usize] = clean as f32;
        v[Ctl::Skipped as usize] = skipped as f32;
        v[Ctl::Mul as usize] = 1.0;
        v[Ctl::Stepped as usize] = 1.0;
        v[Ctl::Clip as usize] = 1.0;
        Ok(Control(Tensor::from_f32(dev, &v, &[CTL_LEN], DType::F32)?))
    }

    /// The block of a step that is neither scaled nor skipped (multiplier 1).
    pub(crate) fn plain(dev: &Device) -> Result<Control> {
        Control::new(dev, 1.0, 0, 0)
    }

    pub(crate) fn block(&self) -> Result<&Block> {
        self.0.dense_block("optimizer step")
    }

    fn device(&self) -> &Device {
        self.0.device()
    }

    /// The current loss scale as a [1] view (no read-back).
    fn scale(&self) -> Result<Tensor> {
        self.0.narrow(0, Ctl::Scale as usize, 1)
    }

    /// The multiplier the step's update applies to the gradients (1/scale times the clip
    /// coefficient, and 0 for a step skipped because a gradient held inf or NaN), as a
    /// one-element f32 view \[1\] on the device, for optimizers outside this crate, whose
    /// `step_with` receives the block. A skipped step must be skipped through
    /// [`Control::stepped`] (`Tensor::where_cond`): its gradients hold inf or NaN, which a
    /// multiplier of 0 turns into NaN.
    pub fn multiplier(&self) -> Result<Tensor> {
        self.0.narrow(0, Ctl::Mul as usize, 1)
    }

    /// 1 when the step updates the parameters, 0 when it was skipped, as a one-element f32
    /// view \[1\] on the device.
    pub fn stepped(&self) -> Result<Tensor> {
        self.0.narrow(0, Ctl::Stepped as usize, 1)
    }
}

/// Host copies of a control block's values.
#[derive(Clone, Copy, Debug)]
struct Known {
    scale: f32,
    clean: u32,
    skipped: u64,
    report: StepReport,
}

impl Known {
    fn of(v: &[f32]) -> Result<Known> {
        if v.len() != CTL_LEN {
            return Err(Error::Internal(format!(
                "control block of {} values",
                v.len()
            )));
        }
        let at = |c: Ctl| v[c as usize];
        Ok(Known {
            scale: at(Ctl::Scale),
            clean: at(Ctl::Clean) as u32,
            skipped: at(Ctl::Skipped) as u64,
            report: StepReport {
                grad_norm: at(Ctl::Norm),
                stepped: at(Ctl::Stepped) != 0.0,
                clip: at(Ctl::Clip),
            },
        })
    }
}

/// Queues one guarded step into `ctl`: the gradients' sums of squares, the decision, the
/// update (which reads the decision).
fn queue(opt: &mut dyn Optimizer, ctl: &Control, d: Decision) -> Result<()> {
    let params = opt.param_tensors();
    if let Some(p) = params.first()
        && !p.device().same(ctl.device())
    {
        return Err(Error::invalid(
            "optimizer step",
            "the loss scaler's state lives on another device than the parameters",
        ));
    }
    // Without gradients the decision sums one zero: a clean step that updates nothing.
    let partial = match sum_of_squares(&params)? {
        Some(p) => p,
        None => Tensor::zeros(ctl.device(), &[1], DType::F32)?,
    };
    let op = "optimizer step";
    ko::decide(
        ctl.device(),
        partial.dense_block(op)?,
        partial.numel(),
        ctl.block()?,
        d,
    )?;
    opt.step_with(1.0, Some(ctl))
}

/// Takes a skipped step back from the optimizer's step count (Adam's bias correction counts
/// only the steps taken, as PyTorch's does when its scaler skips `optimizer.step`).
fn uncount_skipped(opt: &mut dyn Optimizer, r: &StepReport) {
    if !r.stepped {
        opt.set_steps(opt.steps().saturating_sub(1));
    }
}

/// One optimizer step with global-norm clipping (when `max_norm` is set) and a check for
/// non-finite gradients. `gmul` is multiplied into the gradients as well (1/loss scale, or
/// 1/accumulation steps). Decided on the device; reads the decision back before returning.
pub fn guarded_step(
    opt: &mut dyn Optimizer,
    gmul: f32,
    max_norm: Option<f32>,
    on_nonfinite: NonFinite,
) -> Result<StepReport> {
    let params = opt.param_tensors();
    let Some(first) = params.first() else {
        return Ok(StepReport {
            grad_norm: 0.0,
            stepped: true,
            clip: 1.0,
        });
    };
    let ctl = Control::plain(first.device())?;
    queue(
        opt,
        &ctl,
        Decision {
            gmul,
            max_norm: max_norm.unwrap_or(0.0),
            growth: 1.0,
            backoff: 1.0,
            interval: u32::MAX,
        },
    )?;
    let r = Known::of(&ctl.0.to_f32_vec()?)?.report;
    uncount_skipped(opt, &r);
    if !r.stepped && on_nonfinite == NonFinite::Error {
        return Err(Error::invalid(
            "optimizer step",
            format!(
                "gradient norm is {}: a gradient holds inf or NaN",
                r.grad_norm
            ),
        ));
    }
    Ok(r)
}

/// Dynamic loss scaling (as in mixed-precision training): the loss is multiplied by the scale
/// before backward so small f16 gradients do not flush to zero; the optimizer divides it back
/// out. A step whose gradients overflowed is skipped and the scale multiplied by `backoff`;
/// after `growth_interval` clean steps in a row it is multiplied by `growth`.
///
/// The scale and the decisions live on the device (see the module docs): [`GradScaler::step`]
/// waits for the decision and reports it; [`GradScaler::step_deferred`] does not wait, and
/// its report arrives with the next step ([`GradScaler::last_report`]). With `growth` and
/// `backoff` 1 and scale 1 ([`GradScaler::unscaled`]) it is a guarded step without scaling
/// that queues without waiting.
///
/// ```
/// use wgrad::optim::{GradScaler, Optimizer, Sgd};
/// # fn main() -> wgrad::Result<()> {
/// let dev = wgrad::Device::new()?;
/// let w = dev.tensor(&[1.0f32, -2.0], &[2])?.variable();
/// let mut opt = Sgd::new(vec![("w".into(), w.clone())], 0.1, 0.0, 0.0, false)?;
/// let mut scaler = GradScaler::with_scale(1024.0);
///
/// let loss = w.square()?.sum_all()?;
/// scaler.scale_loss(&loss)?.backward()?; // gradients 1024 times too large
/// let report = scaler.step(&mut opt, None)?; // divided back out, checked, applied
/// assert!(report.stepped);
/// assert!((report.grad_norm - 20f32.sqrt()).abs() < 1e-3); // |[2, -4]|, unscaled
///
/// // Gradients that overflow: the step is skipped and the scale backs off.
/// opt.zero_grad();
/// let huge = w.mul_scalar(1e30)?.square()?.sum_all()?;
/// scaler.scale_loss(&huge)?.backward()?;
/// let report = scaler.step(&mut opt, None)?;
/// assert!(!report.stepped);
/// assert_eq!(scaler.scale(), 512.0);
/// let v = w.to_vec::<f32>()?; // as after the first step
/// assert!((v[0] - 0.8).abs() < 1e-6 && (v[1] + 1.6).abs() < 1e-6);
/// # Ok(())
/// # }
/// ```
pub struct GradScaler {
    /// Multiplier after `growth_interval` clean steps.
    pub growth: f32,
    /// Multiplier after an overflow.
    pub backoff: f32,
    /// Clean steps before growing.
    pub growth_interval: u32,
    /// The state as the host last knew it (from the start, a restore, or a read-back).
    known: Known,
    /// The state on the device, from the first use on.
    ctl: Option<Control>,
    /// A read-back of the state after the last deferred step, not yet collected.
    pending: Option<Readback<f32>>,
}

impl Default for GradScaler {
    fn default() -> Self {
        GradScaler::with_scale(65536.0)
    }
}

impl GradScaler {
    /// The scaler with PyTorch's defaults: scale 2^16, x2 after 2000 clean steps, x0.5 on
    /// overflow.
    pub fn new() -> Self {
        GradScaler::default()
    }

    /// PyTorch's defaults with another starting scale.
    pub fn with_scale(scale: f32) -> Self {
        GradScaler {
            growth: 2.0,
            backoff: 0.5,
            growth_interval: 2000,
            known: Known {
                scale,
                clean: 0,
                skipped: 0,
                report: StepReport {
                    grad_norm: 0.0,
                    stepped: true,
                    clip: 1.0,
                },
            },
            ctl: None,
            pending: None,
        }
    }

    /// Scale 1 that never changes: clipping and skipping non-finite steps on the device,
    /// without loss scaling (for f32 training).
    pub fn unscaled() -> Self {
        GradScaler {
            growth: 1.0,
            backoff: 1.0,
            growth_interval: u32::MAX,
            ..GradScaler::with_scale(1.0)
        }
    }

    /// A scaler in a saved state (training checkpoints).
    pub(crate) fn restored(scale: f32, clean: u32, skipped: u64) -> Self {
        let mut s = GradScaler::with_scale(scale);
        s.known.clean = clean;
        s.known.skipped = skipped;
        s
    }

    /// The loss scale as last read back: exact after [`GradScaler::step`] or
    /// [`GradScaler::last_report`], one step behind after [`GradScaler::step_deferred`].
    pub fn scale(&self) -> f32 {
        self.known.scale
    }

    /// Steps skipped so far (as of the last read-back, like [`GradScaler::scale`]).
    pub fn skipped(&self) -> u64 {
        self.known.skipped
    }

    /// The state now on the device: (scale, clean steps, skipped steps, skipped steps whose
    /// report the host has not collected, so not yet taken back from the optimizer's count).
    /// Waits for the queued work (checkpoints call it).
    pub(crate) fn snapshot(&self) -> Result<(f32, u32, u64, u64)> {
        let k = match &self.ctl {
            Some(c) => Known::of(&c.0.to_f32_vec()?)?,
            None => self.known,
        };
        let untaken = k.skipped.saturating_sub(self.known.skipped);
        Ok((k.scale, k.clean, k.skipped, untaken))
    }

    fn control(&mut self, dev: &Device) -> Result<&Control> {
        if let Some(c) = &self.ctl
            && !c.device().same(dev)
        {
            return Err(Error::invalid(
                "loss scaler",
                "its state lives on another device (use one scaler per device)",
            ));
        }
        if self.ctl.is_none() {
            let k = self.known;
            self.ctl = Some(Control::new(dev, k.scale, k.clean, k.skipped)?);
        }
        self.ctl
            .as_ref()
            .ok_or_else(|| Error::Internal("loss scaler state".into()))
    }

    /// The current loss scale on `dev`, as a one-element f32 tensor \[1\] on the device: a
    /// view of the scaler's state, so it follows the scale as steps change it. (The state
    /// lives on the device of the first call.)
    pub fn scale_tensor(&mut self, dev: &Device) -> Result<Tensor> {
        self.control(dev)?.scale()
    }

    /// `loss * scale` (f32), to call backward on. The scale is read on the device.
    pub fn scale_loss(&mut self, loss: &Tensor) -> Result<Tensor> {
        let scale = self.scale_tensor(loss.device())?;
        let ones = vec![1; loss.rank()];
        loss.to_dtype(DType::F32)?.mul(&scale.reshape(&ones)?)
    }

    /// Collects the read-back of the last deferred step, if any: updates what the host knows
    /// and takes a skipped step back from `opt`'s step count.
    fn collect(&mut self, opt: Option<&mut dyn Optimizer>) -> Result<()> {
        if let Some(r) = self.pending.take() {
            self.known = Known::of(&r.wait()?)?;
            if let Some(opt) = opt {
                uncount_skipped(opt, &self.known.report);
            }
        }
        Ok(())
    }

    fn decision(&self, max_norm: Option<f32>) -> Decision {
        Decision {
            gmul: 1.0,
            max_norm: max_norm.unwrap_or(0.0),
            growth: self.growth,
            backoff: self.backoff,
            interval: self.growth_interval.max(1),
        }
    }

    /// Unscales, checks, optionally clips, and steps (or skips and backs off), all decided on
    /// the device; returns without waiting. What the step did is known at the next call (or
    /// [`GradScaler::last_report`]).
    pub fn step_deferred(&mut self, opt: &mut dyn Optimizer, max_norm: Option<f32>) -> Result<()> {
        // The last step's decision: read before this step's update, so a skipped step is
        // taken back from the count this update's bias correction uses.
        self.collect(Some(&mut *opt))?;
        let params = opt.param_tensors();
        let Some(first) = params.first() else {
            return Ok(());
        };
        let dev = first.device().clone();
        let d = self.decision(max_norm);
        let ctl = self.control(&dev)?;
        queue(opt, ctl, d)?;
        self.pending = Some(ctl.0.to_vec_async::<f32>()?);
        Ok(())
    }

    /// The report of the last step, waiting for it if it is still on its way.
    pub fn last_report(&mut self, opt: &mut dyn Optimizer) -> Result<StepReport> {
        self.collect(Some(opt))?;
        Ok(self.known.report)
    }

    /// [`GradScaler::step_deferred`], then waits for the decision and returns it.
    pub fn step(&mut self, opt: &mut dyn Optimizer, max_norm: Option<f32>) -> Result<StepReport> {
        self.step_deferred(opt, max_norm)?;
        self.last_report(opt)
    }
}
