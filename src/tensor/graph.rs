//! The recorded graph as tensors see it: what a differentiable op saves for its backward pass
//! (a [`Backward`]), and whether recording is on.
//!
//! This sits beneath the ops: each op file implements `Backward` beside its forward pass, and
//! `autograd` walks the graph through the trait without knowing any op. An op cannot record
//! itself without a backward pass: recording takes a `Backward`.

use super::Tensor;
use crate::error::Result;
use smallvec::SmallVec;
use std::cell::Cell;

/// An op's backward pass and what it saved for it (beyond its inputs, which the `Node`
/// holds). Saved outputs are held *detached* (same storage, no node), never as the output
/// tensor itself, which would make a reference cycle. A closure
/// `|inputs, out, g| -> Result<Vec<Option<Tensor>>>` is one.
pub trait Backward: Send + Sync {
    /// The gradients of `inputs`, in their order (`None` where an input gets none), given
    /// the op's output and the gradient of that output. Runs with recording off.
    fn backward(&self, inputs: &[Tensor], out: &Tensor, g: Tensor) -> Result<Vec<Option<Tensor>>>;

    /// [`Backward::backward`], offered the gradient each input already has from the ops
    /// walked before (`acc[i]`). An op whose kernel can add it into its own output takes it
    /// (leaving `None`) and returns the sum, which saves a separate add: a pre-norm residual
    /// stream's gradient from the skip connection meets the norm's. What is left in `acc` the
    /// caller adds as usual.
    fn backward_acc(
        &self,
        inputs: &[Tensor],
        out: &Tensor,
        g: Tensor,
        acc: &mut [Option<Tensor>],
    ) -> Result<Vec<Option<Tensor>>> {
        let _ = acc;
        self.backward(inputs, out, g)
    }
}

impl<F> Backward for F
where
    F: Fn(&[Tensor], &Tensor, Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync,
{
    fn backward(&self, inputs: &[Tensor], out: &Tensor, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        self(inputs, out, g)
    }
}

/// An op's inputs, inline up to three (a product with its bias, a norm with its weights).
pub(crate) type Inputs = SmallVec<[Tensor; 3]>;

/// How a tensor was computed: the op's name (for errors), the tensors gradients may flow to,
/// and its backward pass.
pub(crate) struct Node {
    pub name: &'static str,
    pub inputs: Inputs,
    pub back: Box<dyn Backward>,
}

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// Runs `f` without recording the graph (evaluation, optimizer updates).
///
/// Recording is per thread, and back to what it was once `f` returns.
///
/// ```
/// # fn main() -> wgrad::Result<()> {
/// let dev = wgrad::Device::new()?;
/// let w = dev.tensor(&[1.0f32, 2.0], &[2])?.variable();
/// let y = wgrad::no_grad(|| w.mul_scalar(3.0))?;
/// assert!(!y.requires_grad()); // nothing recorded, nothing kept for a backward pass
/// assert_eq!(y.to_vec::<f32>()?, [3.0, 6.0]);
/// assert!(wgrad::autograd::is_grad_enabled()); // on again outside
/// # Ok(())
/// # }
/// ```
pub fn no_grad<T>(f: impl FnOnce() -> T) -> T {
    let prev = GRAD_ENABLED.with(|g| g.replace(false));
    let out = f();
    GRAD_ENABLED.with(|g| g.set(prev));
    out
}

/// Runs `f` with recording on (inside `no_grad`, for recomputation).
pub(crate) fn enable_grad<T>(f: impl FnOnce() -> T) -> T {
    let prev = GRAD_ENABLED.with(|g| g.replace(true));
    let out = f();
    GRAD_ENABLED.with(|g| g.set(prev));
    out
}

/// Whether ops record the graph on this thread.
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(|g| g.get())
}

/// Whether an op with these inputs records itself: recording is on and an input needs
/// gradients.
pub(crate) fn recording(inputs: &[&Tensor]) -> bool {
    is_grad_enabled() && inputs.iter().any(|t| t.requires_grad())
}

/// The node to attach to an op's output, or `None` when it does not record.
pub(crate) fn record<B: Backward + 'static>(
    name: &'static str,
    inputs: &[&Tensor],
    make: impl FnOnce() -> B,
) -> Option<Node> {
    if recording(inputs) {
        Some(Node {
            name,
            inputs: inputs.iter().map(|&t| t.clone()).collect(),
            back: Box::new(make()),
        })
    } else {
        None
    }
}

/// The node of a one-input op whose gradient is a function of that input and the output's
/// gradient: the short form for views, casts and elementwise ops.
pub(crate) fn record_fn<F>(name: &'static str, x: &Tensor, grad: F) -> Option<Node>
where
    F: Fn(&Tensor, Tensor) -> Result<Tensor> + Send + Sync + 'static,
{
    record(name, &[x], || {
        move |xs: &[Tensor], _: &Tensor, g| Ok(vec![Some(grad(&xs[0], g)?)])
    })
}
