//! Fully connected layer.

use super::init;
use super::module::Module;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// `y = x W^T + b` over the last axis, with W [out, in] (PyTorch's layout, so weights load
/// from PyTorch files unchanged).
///
/// ```
/// use wgrad::nn::{Linear, Module};
/// # fn main() -> wgrad::Result<()> {
/// let dev = wgrad::Device::new()?;
/// let w = dev.tensor(&[1.0f32, 0.0, 0.0, 0.0, 1.0, 1.0], &[2, 3])?; // [out, in]
/// let b = dev.tensor(&[0.5f32, -1.0], &[2])?;
/// let fc = Linear::from_tensors(w, Some(b))?;
/// let y = fc.forward(&dev.tensor(&[1.0f32, 2.0, 3.0], &[1, 3])?)?;
/// assert_eq!(y.to_vec::<f32>()?, [1.5, 4.0]);
///
/// // Any leading dimensions: [batch, seq, in] gives [batch, seq, out].
/// let fc = Linear::new(&dev, 3, 8, true, wgrad::DType::F32)?;
/// assert_eq!(fc.forward(&dev.randn(&[2, 5, 3], wgrad::DType::F32)?)?.shape(), [2, 5, 8]);
/// assert_eq!(fc.params().len(), 2); // "weight" and "bias", both variables
/// # Ok(())
/// # }
/// ```
pub struct Linear {
    /// [out, in].
    pub weight: Tensor,
    /// \[out\].
    pub bias: Option<Tensor>,
}

impl Linear {
    /// PyTorch's default initialisation.
    pub fn new(
        dev: &Device,
        inputs: usize,
        outputs: usize,
        bias: bool,
        dtype: DType,
    ) -> Result<Linear> {
        let weight = init::default_uniform(dev, &[outputs, inputs], inputs, dtype)?;
        let bias = if bias {
            Some(init::default_uniform(dev, &[outputs], inputs, dtype)?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }

    /// From existing tensors (made variables).
    pub fn from_tensors(weight: Tensor, bias: Option<Tensor>) -> Result<Linear> {
        if weight.rank() != 2
            || bias
                .as_ref()
                .is_some_and(|b| b.shape() != [weight.shape()[0]])
        {
            return Err(Error::shape(
                "Linear",
                format!(
                    "weight {:?}, bias {:?}",
                    weight.shape(),
                    bias.map(|b| b.shape().to_vec())
                ),
            ));
        }
        Ok(Linear {
            weight: weight.variable(),
            bias: bias.map(|b| b.variable()),
        })
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // Leading dimensions are folded into rows inside the product: one matmul with the
        // shared weight, forward and backward.
        if x.rank() >= 2 {
            return x.linear(&self.weight, self.bias.as_ref());
        }
        // One vector: as one row.
        let d = x.dim(-1)?;
        let y = x
            .reshape(&[1, d])?
            .linear(&self.weight, self.bias.as_ref())?;
        y.reshape(&[self.weight.shape()[0]])
    }

    fn params(&self) -> Vec<(String, Tensor)> {
        let mut v = vec![("weight".to_string(), self.weight.clone())];
        if let Some(b) = &self.bias {
            v.push(("bias".to_string(), b.clone()));
        }
        v
    }
}
