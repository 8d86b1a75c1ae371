//! A module wrapper that checkpoints its inner module.

use super::module::Module;
use crate::autograd::{Segment, checkpoint};
use crate::error::Result;
use crate::tensor::Tensor;
use std::sync::Arc;

/// Runs the inner module through [`checkpoint`]: its activations are not kept for backward
/// but recomputed, trading compute (one more forward of the module) for memory.
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
