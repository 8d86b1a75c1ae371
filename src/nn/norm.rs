//! Normalisation layers.

use super::init;
use super::module::Module;
use crate::autograd::no_grad;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::sync::atomic::{AtomicBool, Ordering};

/// LayerNorm over the last axis with learned scale and shift.
///
/// ```
/// use wgrad::nn::{LayerNorm, Module};
/// # fn main() -> wgrad::Result<()> {
/// let dev = wgrad::Device::new()?;
/// let ln = LayerNorm::new(&dev, 4, wgrad::DType::F32)?;
/// let x = dev.tensor(&[1.0f32, 2.0, 3.0, 4.0, 10.0, 10.0, 10.0, 50.0], &[2, 4])?;
/// let y = ln.forward(&x)?; // each row to mean 0, variance 1 (then * 1 + 0)
/// for m in y.mean(-1, false)?.to_vec::<f32>()? {
///     assert!(m.abs() < 1e-5);
/// }
/// for v in y.var(-1, 0, false)?.to_vec::<f32>()? {
///     assert!((v - 1.0).abs() < 1e-3);
/// }
/// let names: Vec<String> = ln.params().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["weight", "bias"]); // PyTorch's names
/// # Ok(())
/// # }
/// ```
pub struct LayerNorm {
    /// Scale, initialised to 1.
    pub gamma: Tensor,
    /// Shift, initialised to 0.
    pub beta: Tensor,
    /// Added to the variance.
    pub eps: f32,
}

impl LayerNorm {
    /// LayerNorm over `dim` features.
    pub fn new(dev: &Device, dim: usize, dtype: DType) -> Result<LayerNorm> {
        Ok(LayerNorm {
            gamma: init::constant(dev, &[dim], 1.0, dtype)?,
            beta: init::constant(dev, &[dim], 0.0, dtype)?,
            eps: 1e-5,
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.layer_norm(&self.gamma, &self.beta, self.eps)
    }
    fn params(&self) -> Vec<(String, Tensor)> {
        vec![
            ("weight".into(), self.gamma.clone()),
            ("bias".into(), self.beta.clone()),
        ]
    }
}

/// RMSNorm over the last axis with a learned scale.
pub struct RmsNorm {
    /// Scale, initialised to 1.
    pub gamma: Tensor,
    /// Added to the mean square.
    pub eps: f32,
}

impl RmsNorm {
    /// RMSNorm over `dim` features.
    pub fn new(dev: &Device, dim: usize, dtype: DType) -> Result<RmsNorm> {
        Ok(RmsNorm {
            gamma: init::constant(dev, &[dim], 1.0, dtype)?,
            eps: 1e-6,
        })
    }
}

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.rms_norm(&self.gamma, self.eps)
    }
    fn params(&self) -> Vec<(String, Tensor)> {
        vec![("weight".into(), self.gamma.clone())]
    }
}

/// Per-channel statistics of [N, C, ...] as [C, N * ...] rows (a copy moving C first).
fn channel_rows(x: &Tensor) -> Result<Tensor> {
    let c = x.shape()[1];
    x.transpose(0, 1)?.reshape(&[c, x.numel() / c.max(1)])
}

/// `x` shaped [1, C, 1, ...] to broadcast over a tensor of rank `rank` along axis 1.
fn per_channel(x: &Tensor, rank: usize) -> Result<Tensor> {
    let mut s = vec![1; rank];
    s[1] = x.numel();
    x.reshape(&s)
}

/// Batch normalisation over [N, C, H, W] (PyTorch's BatchNorm2d): while training, each
/// channel is normalised with its batch mean and biased variance, and running estimates
/// (mean, and the unbiased variance) move toward them by `momentum`; in evaluation the
/// running estimates are used. Statistics are two-pass and kept in f32 whatever the
/// layer's dtype. The running estimates are buffers: weight files hold them
/// ([`Module::state_dict`]).
pub struct BatchNorm2d {
    /// Scale, initialised to 1.
    pub gamma: Tensor,
    /// Shift, initialised to 0.
    pub beta: Tensor,
    /// Added to the variance.
    pub eps: f32,
    /// Weight of the newest batch in the running estimates.
    pub momentum: f32,
    running_mean: Tensor,
    running_var: Tensor,
    training: AtomicBool,
}

impl BatchNorm2d {
    /// BatchNorm over `channels`, in training mode (eps 1e-5, momentum 0.1, as PyTorch).
    pub fn new(dev: &Device, channels: usize, dtype: DType) -> Result<BatchNorm2d> {
        Ok(BatchNorm2d {
            gamma: init::constant(dev, &[channels], 1.0, dtype)?,
            beta: init::constant(dev, &[channels], 0.0, dtype)?,
            eps: 1e-5,
            momentum: 0.1,
            running_mean: Tensor::zeros(dev, &[channels], DType::F32)?,
            running_var: Tensor::full(dev, &[channels], 1.0, DType::F32)?,
            training: AtomicBool::new(true),
        })
    }

    /// The running mean (f32, \[C\]).
    pub fn running_mean(&self) -> &Tensor {
        &self.running_mean
    }

    /// The running unbiased variance (f32, \[C\]).
    pub fn running_var(&self) -> &Tensor {
        &self.running_var
    }
}

impl Module for BatchNorm2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let op = "BatchNorm2d";
        let c = self.gamma.numel();
        if x.rank() != 4 || x.shape()[1] != c {
            return Err(Error::shape(
                op,
                format!("input {:?} must be [N, {c}, H, W]", x.shape()),
            ));
        }
        let (mean, var) = if self.training.load(Ordering::Relaxed) {
            let count = x.numel() / c.max(1);
            if count < 2 {
                return Err(Error::invalid(
                    op,
                    format!(
                        "training needs more than one value per channel, got {:?}",
                        x.shape()
                    ),
                ));
            }
            let rows = channel_rows(x)?;
            let (mean, var) = (rows.mean(1, false)?, rows.var(1, 0, false)?);
            no_grad(|| -> Result<()> {
                let m = self.momentum;
                let unbiased = var
                    .to_dtype(DType::F32)?
                    .mul_scalar(count as f32 / (count - 1) as f32)?;
                let new_mean = self
                    .running_mean
                    .mul_scalar(1.0 - m)?
                    .add(&mean.to_dtype(DType::F32)?.mul_scalar(m)?)?;
                let new_var = self
                    .running_var
                    .mul_scalar(1.0 - m)?
                    .add(&unbiased.mul_scalar(m)?)?;
                // In place, so handles from buffers() (and loaded weights) stay the state.
                self.running_mean.assign_cast(&new_mean)?;
                self.running_var.assign_cast(&new_var)
            })?;
            (mean, var)
        } else {
            (
                self.running_mean.to_dtype(x.dtype())?,
                self.running_var.to_dtype(x.dtype())?,
            )
        };
        let rstd = var.add_scalar(self.eps)?.sqrt()?.recip()?;
        x.sub(&per_channel(&mean, 4)?)?
            .mul(&per_channel(&rstd.mul(&self.gamma)?, 4)?)?
            .add(&per_channel(&self.beta, 4)?)
    }
    fn params(&self) -> Vec<(String, Tensor)> {
        vec![
            ("weight".into(), self.gamma.clone()),
            ("bias".into(), self.beta.clone()),
        ]
    }
    fn buffers(&self) -> Vec<(String, Tensor)> {
        vec![
            ("running_mean".into(), self.running_mean.clone()),
            ("running_var".into(), self.running_var.clone()),
        ]
    }
    fn train(&self, on: bool) {
        self.training.store(on, Ordering::Relaxed);
    }
}

/// Group normalisation (PyTorch's GroupNorm): the channels of [N, C, ...] split into
/// `groups` groups, each (sample, group) normalised over its channels and positions with a
/// two-pass mean and biased variance, then a per-channel scale and shift. The same in training
/// and evaluation; independent of the batch size.
pub struct GroupNorm {
    /// Channel groups (dividing the channels).
    pub groups: usize,
    /// Scale per channel, initialised to 1.
    pub gamma: Tensor,
    /// Shift per channel, initialised to 0.
    pub beta: Tensor,
    /// Added to the variance.
    pub eps: f32,
}

impl GroupNorm {
    /// GroupNorm of `channels` in `groups` groups (eps 1e-5).
    pub fn new(dev: &Device, groups: usize, channels: usize, dtype: DType) -> Result<GroupNorm> {
        if groups == 0 || !channels.is_multiple_of(groups) {
            return Err(Error::invalid(
                "GroupNorm",
                format!("{channels} channels do not split into {groups} groups"),
            ));
        }
        Ok(GroupNorm {
            groups,
            gamma: init::constant(dev, &[channels], 1.0, dtype)?,
            beta: init::constant(dev, &[channels], 0.0, dtype)?,
            eps: 1e-5,
        })
    }
}

impl Module for GroupNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let c = self.gamma.numel();
        if x.rank() < 2 || x.shape()[1] != c {
            return Err(Error::shape(
                "GroupNorm",
                format!("input {:?} must be [N, {c}, ...]", x.shape()),
            ));
        }
        let n = x.shape()[0];
        let g = x.reshape(&[n, self.groups, x.numel() / (n * self.groups).max(1)])?;
        let mean = g.mean(2, true)?;
        let rstd = g.var(2, 0, true)?.add_scalar(self.eps)?.sqrt()?.recip()?;
        let y = g.sub(&mean)?.mul(&rstd)?.reshape(x.shape())?;
        y.mul(&per_channel(&self.gamma, x.rank())?)?
            .add(&per_channel(&self.beta, x.rank())?)
    }
    fn params(&self) -> Vec<(String, Tensor)> {
        vec![
            ("weight".into(), self.gamma.clone()),
            ("bias".into(), self.beta.clone()),
        ]
    }
}
