//! Reverse-mode automatic differentiation.
//!
//! Ops record an [`Op`] on their output only when an input requires gradients and recording is
//! enabled (see [`no_grad`]), so inference pays nothing. [`backward`] walks the recorded graph
//! from the root in reverse topological order. Each node's op is *taken* when its gradient is
//! computed, which drops the references it held to saved activations: memory is released as the
//! walk goes, not when the whole backward pass ends. The gradient rules are one `match` in
//! `backward.rs` with no wildcard arm, so a new op without its gradient does not compile.
//!
//! Autograd only calls tensor ops; it never touches wgpu.

mod backward;
mod checkpoint;
mod op;

pub use checkpoint::{Segment, checkpoint};
pub use op::Op;

use crate::error::{Error, Result};
use crate::tensor::{Tensor, TensorId, lock};
use std::cell::Cell;
use std::collections::{HashMap, HashSet};

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

/// The op to attach to an output, or `None` when no input needs gradients or recording is off.
pub(crate) fn record(inputs: &[&Tensor], make: impl FnOnce() -> Op) -> Option<Op> {
    if is_grad_enabled() && inputs.iter().any(|t| t.requires_grad()) {
        Some(make())
    } else {
        None
    }
}

/// Gradients of `root` (seeded with `grad`, or ones) accumulated into every variable it depends
/// on. Consumes the graph.
pub(crate) fn backward(root: &Tensor, grad: Option<Tensor>) -> Result<()> {
    if !root.requires_grad() {
        return Err(Error::invalid(
            "backward",
            "the tensor does not require grad (no variable was used to compute it)",
        ));
    }
    let seed = match grad {
        Some(g) => {
            if g.shape() != root.shape() {
                return Err(Error::shape(
                    "backward",
                    format!(
                        "gradient {:?} for a tensor of shape {:?}",
                        g.shape(),
                        root.shape()
                    ),
                ));
            }
            g
        }
        None => {
            if root.numel() != 1 {
                return Err(Error::shape(
                    "backward",
                    format!(
                        "backward() needs a one-element tensor, got {:?}; use backward_with(grad)",
                        root.shape()
                    ),
                ));
            }
            Tensor::ones(root.device(), root.shape(), root.dtype())?
        }
    };
    let order = topo_order(root);
    let mut grads: HashMap<TensorId, Tensor> = HashMap::new();
    grads.insert(root.id(), seed);
    no_grad(|| -> Result<()> {
        let mut order: Vec<Option<Tensor>> = order.into_iter().map(Some).collect();
        for slot in order.iter_mut() {
            let Some(node) = slot.take() else { continue };
            let Some(g) = grads.remove(&node.id()) else {
                continue;
            };
            let op = lock(&node.0.op).take();
            match op {
                None if node.0.variable => accumulate_leaf(&node, g)?,
                None => {
                    return Err(Error::invalid(
                        "backward",
                        "the graph was already consumed by an earlier backward (run the forward pass again)",
                    ));
                }
                Some(op) => {
                    for (input, gi) in backward::grads(&op, &node, g)? {
                        if !input.requires_grad() {
                            continue;
                        }
                        let gi = fit_grad(&input, gi)?;
                        let sum = match grads.remove(&input.id()) {
                            Some(prev) => prev.add(&gi)?,
                            None => gi,
                        };
                        grads.insert(input.id(), sum);
                    }
                }
            }
        }
        Ok(())
    })
}

/// Casts a gradient to its input's dtype (mixed-precision graphs) and checks its shape.
fn fit_grad(input: &Tensor, g: Tensor) -> Result<Tensor> {
    if g.shape() != input.shape() {
        return Err(Error::Gpu(format!(
            "internal: gradient of shape {:?} for an input of shape {:?}",
            g.shape(),
            input.shape()
        )));
    }
    g.to_dtype(input.dtype())
}

fn accumulate_leaf(leaf: &Tensor, g: Tensor) -> Result<()> {
    let mut slot = lock(&leaf.0.grad);
    *slot = Some(match slot.take() {
        Some(prev) => prev.add(&g)?,
        None => g,
    });
    Ok(())
}

/// Every tensor reachable from `root` through recorded ops, root first, each after all the
/// tensors computed from it.
fn topo_order(root: &Tensor) -> Vec<Tensor> {
    let mut seen = HashSet::new();
    let mut post = Vec::new();
    // Iterative DFS: deep graphs (long sequences of layers) must not overflow the stack.
    let mut stack: Vec<(Tensor, bool)> = vec![(root.clone(), false)];
    while let Some((t, expanded)) = stack.pop() {
        if expanded {
            post.push(t);
            continue;
        }
        if !seen.insert(t.id()) {
            continue;
        }
        let inputs: Vec<Tensor> = lock(&t.0.op)
            .as_ref()
            .map(|op| op.inputs().into_iter().cloned().collect())
            .unwrap_or_default();
        stack.push((t, true));
        for i in inputs {
            if i.requires_grad() && !seen.contains(&i.id()) {
                stack.push((i, false));
            }
        }
    }
    post.reverse();
    post
}
