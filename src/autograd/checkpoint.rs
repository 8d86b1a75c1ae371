//! Gradient checkpointing: run a segment without keeping its activations, recompute them in
//! the backward pass.

use crate::error::{Error, Result};
use crate::tensor::Tensor;
use crate::tensor::graph::{Backward, Node, enable_grad, is_grad_enabled, no_grad};
use std::sync::Arc;

/// A recomputable segment of a model.
pub type Segment = Arc<dyn Fn(&Tensor) -> Result<Tensor> + Send + Sync>;

/// Runs `segment(input)` keeping nothing inside it for the backward pass: only the input and
/// the output are held. During backward the segment runs again (with the device's random seed
/// counter rewound, so dropout draws the same masks) and its gradients flow as if it had been
/// recorded. Parameters used inside the segment get their gradients as usual.
pub fn checkpoint(segment: Segment, input: &Tensor) -> Result<Tensor> {
    let recording = is_grad_enabled();
    let seed = input.device().seed_state();
    let out = no_grad(|| segment(input))?;
    if !recording {
        return Ok(out);
    }
    // The output needs gradients if the input does or the segment holds variables; the latter
    // cannot be seen from here, so a checkpoint always records.
    Ok(out.with_node(Some(Node {
        name: "checkpoint",
        inputs: smallvec::smallvec![input.clone()],
        back: Box::new(CheckpointBack { segment, seed }),
    })))
}

struct CheckpointBack {
    segment: Segment,
    seed: u64,
}

impl Backward for CheckpointBack {
    /// The input gradient of the segment; variables inside it accumulate their own.
    fn backward(&self, inputs: &[Tensor], _out: &Tensor, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        let x = &inputs[0];
        let dev = x.device();
        let resume = dev.seed_state();
        dev.set_seed_state(self.seed);
        // A fresh leaf standing for the input, so the recomputed graph ends here.
        let xin = x.detach().variable();
        let y = enable_grad(|| (self.segment)(&xin));
        dev.set_seed_state(resume);
        let y = y?;
        if y.shape() != g.shape() {
            return Err(Error::shape(
                "checkpoint",
                format!(
                    "recomputed output {:?} differs from the gradient {:?}",
                    y.shape(),
                    g.shape()
                ),
            ));
        }
        y.backward_with(&g.to_dtype(y.dtype())?)?;
        let gx = match xin.grad() {
            Some(gx) => gx,
            None => Tensor::zeros(dev, x.shape(), x.dtype())?,
        };
        Ok(vec![Some(gx)])
    }
}
