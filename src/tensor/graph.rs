//! The recorded graph as tensors see it: what a differentiable op saves for its backward pass
//! (a [`Backward`]), and whether recording is on.
//!
//! This sits beneath the ops: each op file implements `Backward` beside its forward pass, and
//! `autograd` walks the graph through the trait without knowing any op. An op cannot record
//! itself without a backward pass: recording takes a `Backward`.

use super::Tensor;
use crate::error::Result;
use std::cell::Cell;

/// What a differentiable op keeps for its backward pass, and the pass itself. Saved outputs
/// are held *detached* (same storage, no node), never as the output tensor itself, which would
/// make a reference cycle.
pub trait Backward: Send + Sync {
    /// The op's name (for errors and traces).
    fn name(&self) -> &'static str;
    /// The tensors gradients may flow to, in a fixed order.
    fn inputs(&self) -> Vec<&Tensor>;
    /// The gradients of `inputs()`, in the same order (`None` where an input gets none),
    /// given the op's output and the gradient of that output. Runs with recording off.
    fn backward(&self, out: &Tensor, g: Tensor) -> Result<Vec<Option<Tensor>>>;
}

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// Runs `f` without recording the graph (evaluation, optimizer updates).
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
    inputs: &[&Tensor],
    make: impl FnOnce() -> B,
) -> Option<Box<dyn Backward>> {
    if recording(inputs) {
        Some(Box::new(make()))
    } else {
        None
    }
}

/// The node of a one-input op whose gradient is a function of that input and the output's
/// gradient: the short form for views and casts, whose saved state is only the input (and
/// what the closure captures).
pub(crate) fn record_fn<F>(name: &'static str, x: &Tensor, grad: F) -> Option<Box<dyn Backward>>
where
    F: Fn(&Tensor, Tensor) -> Result<Tensor> + Send + Sync + 'static,
{
    record(&[x], || FnBack {
        name,
        x: x.clone(),
        grad,
    })
}

struct FnBack<F> {
    name: &'static str,
    x: Tensor,
    grad: F,
}

impl<F> Backward for FnBack<F>
where
    F: Fn(&Tensor, Tensor) -> Result<Tensor> + Send + Sync,
{
    fn name(&self) -> &'static str {
        self.name
    }
    fn inputs(&self) -> Vec<&Tensor> {
        vec![&self.x]
    }
    fn backward(&self, _out: &Tensor, g: Tensor) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some((self.grad)(&self.x, g)?)])
    }
}
