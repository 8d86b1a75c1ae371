//! A module wrapper that checkpoints its inner module.

use super::module::Module;
use crate::autograd::{Segment, checkpoint};
use crate::error::Result;
use crate::tensor::Tensor;
use std::sync::Arc;

/// Runs the inner module through [`checkpoint`]: its activations are not kept for backward
/// but recomputed, trading compute (one more forward of the module) for memory.
///
/// Where it saves memory: the activations *inside* the module (a transformer block's
/// attention scores, its MLP's hidden layer) are freed after the forward pass and rebuilt
/// during the backward pass, so a stack of checkpointed blocks keeps only each block's input.
/// Where it does not: the module's input and output are kept as before, parameters and
/// optimizer state are unchanged, and a module whose activations are about the size of its
/// input (one linear layer, a norm) saves little while paying a second forward pass.
/// Randomness is replayed exactly (dropout draws the same mask twice); a layer with side
/// effects in training mode (BatchNorm's running statistics) sees them twice.
///
/// ```
/// # fn main() -> wgrad::Result<()> {
/// use wgrad::nn::{Checkpointed, Linear, Module};
/// let dev = wgrad::Device::new()?;
/// let layer: Box<dyn Module> = Box::new(Linear::new(&dev, 8, 8, true, wgrad::DType::F32)?);
/// let block = Checkpointed::new(layer);
/// let x = dev.randn(&[4, 8], wgrad::DType::F32)?;
/// block.forward(&x)?.sum_all()?.backward()?;
/// assert!(block.params().iter().all(|(_, p)| p.grad().is_some()));
/// # Ok(())
/// # }
/// ```
pub struct Checkpointed<M: Module + 'static> {
    inner: Arc<M>,
}

impl<M: Module + 'static> Checkpointed<M> {
    /// Wraps a module.
    pub fn new(inner: M) -> Self {
        Checkpointed {
            inner: Arc::new(inner),
        }
    }

    /// The wrapped module.
    pub fn inner(&self) -> &M {
        &self.inner
    }
}

impl<M: Module + 'static> Module for Checkpointed<M> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let m = Arc::clone(&self.inner);
        let seg: Segment = Arc::new(move |x: &Tensor| m.forward(x));
        checkpoint(seg, x)
    }
    fn params(&self) -> Vec<(String, Tensor)> {
        self.inner.params()
    }
    fn train(&self, on: bool) {
        self.inner.train(on);
    }
    fn buffers(&self) -> Vec<(String, Tensor)> {
        self.inner.buffers()
    }
}
