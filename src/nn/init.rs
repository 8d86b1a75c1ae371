//! Parameter initialisation, drawn on the device from its seed counter.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;

/// Uniform in (-bound, bound), as a variable.
pub fn uniform(dev: &Device, shape: &[usize], bound: f32, dtype: DType) -> Result<Tensor> {
    Ok(Tensor::rand(dev, shape, -bound, bound, dtype)?.variable())
}

/// PyTorch's default for Linear and Conv weights and biases: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
pub fn default_uniform(
    dev: &Device,
    shape: &[usize],
    fan_in: usize,
    dtype: DType,
) -> Result<Tensor> {
    uniform(dev, shape, 1.0 / (fan_in.max(1) as f32).sqrt(), dtype)
}

/// Kaiming (He) uniform for ReLU networks: U(-b, b), b = sqrt(6 / fan_in).
pub fn kaiming_uniform(
    dev: &Device,
    shape: &[usize],
    fan_in: usize,
    dtype: DType,
) -> Result<Tensor> {
    uniform(dev, shape, (6.0 / fan_in.max(1) as f32).sqrt(), dtype)
}

/// Kaiming normal: N(0, 2 / fan_in).
pub fn kaiming_normal(
    dev: &Device,
    shape: &[usize],
    fan_in: usize,
    dtype: DType,
) -> Result<Tensor> {
    Ok(Tensor::randn(dev, shape, 0.0, (2.0 / fan_in.max(1) as f32).sqrt(), dtype)?.variable())
}

/// Xavier (Glorot) uniform: U(-b, b), b = sqrt(6 / (fan_in + fan_out)).
pub fn xavier_uniform(
    dev: &Device,
    shape: &[usize],
    fan_in: usize,
    fan_out: usize,
    dtype: DType,
) -> Result<Tensor> {
    uniform(
        dev,
        shape,
        (3.0 * glorot_var(fan_in, fan_out)).sqrt(),
        dtype,
    )
}

/// Xavier normal: N(0, 2 / (fan_in + fan_out)).
pub fn xavier_normal(
    dev: &Device,
    shape: &[usize],
    fan_in: usize,
    fan_out: usize,
    dtype: DType,
) -> Result<Tensor> {
    let std = glorot_var(fan_in, fan_out).sqrt();
    Ok(Tensor::randn(dev, shape, 0.0, std, dtype)?.variable())
}

/// Glorot's variance, 2 / (fan_in + fan_out), which keeps activations and gradients at the
/// same scale through a layer.
fn glorot_var(fan_in: usize, fan_out: usize) -> f32 {
    2.0 / (fan_in + fan_out).max(1) as f32
}

/// A constant, as a variable.
pub fn constant(dev: &Device, shape: &[usize], value: f32, dtype: DType) -> Result<Tensor> {
    Ok(Tensor::full(dev, shape, value, dtype)?.variable())
}
