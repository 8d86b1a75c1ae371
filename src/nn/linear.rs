//! Fully connected layer.

use super::init;
use super::module::Module;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// `y = x W^T + b` over the last axis, with W [out, in] (PyTorch's layout, so weights load
/// from PyTorch files unchanged).
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
