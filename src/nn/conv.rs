//! Convolution layers.

use super::init;
use super::module::Module;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::Conv2dOpts;
use crate::tensor::Tensor;

/// NCHW convolution with an OIHW weight (PyTorch's layout).
///
/// ```
/// use wgrad::nn::{Conv2d, Module};
/// use wgrad::ops::Conv2dOpts;
/// use wgrad::{DType, Tensor};
/// # fn main() -> wgrad::Result<()> {
/// let dev = wgrad::Device::new()?;
/// // 1 channel in, 1 out, 3 x 3: a box filter of ones with bias 0.5.
/// let conv = Conv2d::new(&dev, 1, 1, 3, Conv2dOpts::default(), DType::F32)?;
/// conv.weight.copy_from_slice(&[1.0f32; 9])?;
/// conv.bias.as_ref().unwrap().copy_from_slice(&[0.5f32])?;
/// let x = Tensor::ones(&dev, &[1, 1, 4, 4], DType::F32)?;
/// let y = conv.forward(&x)?;
/// assert_eq!(y.shape(), [1, 1, 2, 2]);
/// assert_eq!(y.to_vec::<f32>()?, [9.5; 4]);
///
/// // Padding 1 and stride 2 on 3 -> 8 channels.
/// let opts = Conv2dOpts { padding: (1, 1), stride: (2, 2), ..Default::default() };
/// let conv = Conv2d::new(&dev, 3, 8, 3, opts, DType::F32)?;
/// let y = conv.forward(&dev.randn(&[2, 3, 16, 16], DType::F32)?)?;
/// assert_eq!(y.shape(), [2, 8, 8, 8]);
/// # Ok(())
/// # }
/// ```
pub struct Conv2d {
    /// [out, in / groups, kh, kw].
    pub weight: Tensor,
    /// \[out\].
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

/// 1-D convolution of [N, C, L] with an [out, in / groups, k] weight (PyTorch's Conv1d),
/// run as a 2-D convolution of height 1 (views, no copies).
pub struct Conv1d {
    /// [out, in / groups, k].
    pub weight: Tensor,
    /// \[out\].
    pub bias: Option<Tensor>,
    /// Step along the length.
    pub stride: usize,
    /// Zero padding at each end.
    pub padding: usize,
    /// Spacing of the kernel's taps.
    pub dilation: usize,
    /// Channel groups (the weight is then [out, in / groups, k]).
    pub groups: usize,
}

impl Conv1d {
    /// A convolution with kernel length `k` and PyTorch's default initialisation: stride 1,
    /// no padding, dilation 1 (set the fields to change them), one group.
    pub fn new(
        dev: &Device,
        inputs: usize,
        outputs: usize,
        k: usize,
        dtype: DType,
    ) -> Result<Conv1d> {
        let fan_in = inputs * k;
        Ok(Conv1d {
            weight: init::default_uniform(dev, &[outputs, inputs, k], fan_in, dtype)?,
            bias: Some(init::default_uniform(dev, &[outputs], fan_in, dtype)?),
            stride: 1,
            padding: 0,
            dilation: 1,
            groups: 1,
        })
    }
}

impl Module for Conv1d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() != 3 {
            return Err(crate::Error::shape(
                "Conv1d",
                format!("input {:?} must be [N, C, L]", x.shape()),
            ));
        }
        let w = &self.weight;
        let w4 = w.reshape(&[w.shape()[0], w.shape()[1], 1, w.shape()[2]])?;
        let opts = Conv2dOpts {
            stride: (1, self.stride),
            padding: (0, self.padding),
            dilation: (1, self.dilation),
            groups: self.groups,
            ..Default::default()
        };
        let y = x.unsqueeze(2)?.conv2d(&w4, self.bias.as_ref(), opts)?;
        y.squeeze(2)
    }

    fn params(&self) -> Vec<(String, Tensor)> {
        let mut v = vec![("weight".to_string(), self.weight.clone())];
        if let Some(b) = &self.bias {
            v.push(("bias".to_string(), b.clone()));
        }
        v
    }
}
