//! 2-D convolution layer.

use super::init;
use super::module::Module;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::Conv2dOpts;
use crate::tensor::Tensor;

/// NCHW convolution with an OIHW weight (PyTorch's layout).
pub struct Conv2d {
    /// [out, in / groups, kh, kw].
    pub weight: Tensor,
    /// [out].
    pub bias: Option<Tensor>,
    /// Stride, padding, dilation, groups.
    pub opts: Conv2dOpts,
}

impl Conv2d {
    /// A square `k x k` convolution with PyTorch's default initialisation.
    pub fn new(
        dev: &Device,
        inputs: usize,
        outputs: usize,
        k: usize,
        opts: Conv2dOpts,
        dtype: DType,
    ) -> Result<Conv2d> {
        let fan_in = inputs / opts.groups.max(1) * k * k;
        let weight = init::default_uniform(
            dev,
            &[outputs, inputs / opts.groups.max(1), k, k],
            fan_in,
            dtype,
        )?;
        let bias = Some(init::default_uniform(dev, &[outputs], fan_in, dtype)?);
        Ok(Conv2d { weight, bias, opts })
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.conv2d(&self.weight, self.bias.as_ref(), self.opts)
    }

    fn params(&self) -> Vec<(String, Tensor)> {
        let mut v = vec![("weight".to_string(), self.weight.clone())];
        if let Some(b) = &self.bias {
            v.push(("bias".to_string(), b.clone()));
        }
        v
    }
}
