//! Normalisation layers.

use super::init;
use super::module::Module;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;

/// LayerNorm over the last axis with learned scale and shift.
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
