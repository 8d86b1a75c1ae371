//! Reverse-mode automatic differentiation: the walk over the recorded graph.
//!
//! Ops record a node ([`Backward`], implemented in each op's
//! own file beside its forward pass) on their output only when an input requires gradients
//! and recording is enabled (see [`no_grad`]), so inference pays nothing. `backward` walks
//! the graph from the root in reverse topological order. Each node is *taken* when its
//! gradient is computed, which drops the references it held to saved activations: memory is
//! released as the walk goes, not when the whole backward pass ends.
//!
//! Autograd knows no op: it calls the nodes through the trait, and never touches wgpu.

mod checkpoint;

pub use crate::tensor::graph::{Backward, is_grad_enabled, no_grad};
pub use checkpoint::{Segment, checkpoint};

use crate::error::{Error, Result};
use crate::hash::{FastMap, FastSet};
use crate::tensor::{Tensor, TensorId, lock};
use smallvec::SmallVec;

impl Tensor {
    /// Computes gradients of this (scalar) tensor with respect to every variable it depends on
    /// and adds them to their `grad()`. The graph is consumed: intermediate results are freed
    /// as soon as the backward pass no longer needs them.
    ///
    /// ```
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// let x = dev.tensor(&[1.0f32, 2.0, 3.0], &[3])?.variable();
    /// let w = dev.tensor(&[0.5f32, -1.0, 2.0], &[3])?.variable();
    /// let loss = x.mul(&w)?.sum_all()?; // sum of x * w
    /// loss.backward()?;
    /// assert_eq!(x.grad().expect("x is a variable").to_vec::<f32>()?, [0.5, -1.0, 2.0]);
    /// assert_eq!(w.grad().expect("w is a variable").to_vec::<f32>()?, [1.0, 2.0, 3.0]);
    ///
    /// // Gradients add up over backward passes until cleared.
    /// x.mul(&w)?.sum_all()?.backward()?;
    /// assert_eq!(w.grad().unwrap().to_vec::<f32>()?, [2.0, 4.0, 6.0]);
    /// w.zero_grad();
    /// assert!(w.grad().is_none());
    /// # Ok(())
    /// # }
    /// ```
    pub fn backward(&self) -> Result<()> {
        backward(self, None, &mut |_| Ok(()))
    }

    /// Like [`Tensor::backward`] with an explicit gradient of this tensor (any shape).
    pub fn backward_with(&self, grad: &Tensor) -> Result<()> {
        backward(self, Some(grad.clone()), &mut |_| Ok(()))
    }

    /// Like [`Tensor::backward`], calling `on_leaf` with each variable as soon as its gradient
    /// for this pass is complete (each variable once, in the order the walk finishes them:
    /// roughly the reverse of the forward pass). The work that computed the gradient is queued
    /// on the device, not necessarily finished: data-parallel training starts the exchange of
    /// early gradients here while the rest of the backward pass is still being queued.
    pub fn backward_hooked(&self, on_leaf: &mut dyn FnMut(&Tensor) -> Result<()>) -> Result<()> {
        backward(self, None, on_leaf)
    }
}

/// Gradients of `root` (seeded with `grad`, or ones) accumulated into every variable it depends
/// on, each variable passed to `on_leaf` once its gradient is in. Consumes the graph.
fn backward(
    root: &Tensor,
    grad: Option<Tensor>,
    on_leaf: &mut dyn FnMut(&Tensor) -> Result<()>,
) -> Result<()> {
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
    // Sized for the walk: grown from empty, it reallocated and rehashed at every doubling.
    let mut grads: FastMap<TensorId, Tensor> =
        FastMap::with_capacity_and_hasher(order.len(), Default::default());
    grads.insert(root.id(), seed);
    no_grad(|| -> Result<()> {
        let mut order: Vec<Option<Tensor>> = order.into_iter().map(Some).collect();
        for slot in order.iter_mut() {
            let Some(node) = slot.take() else { continue };
            let Some(g) = grads.remove(&node.id()) else {
                continue;
            };
            let rec = lock(&node.0.node).take();
            match rec {
                None if node.is_variable() => {
                    accumulate_leaf(&node, g)?;
                    // A variable appears once in the order, after every tensor computed from
                    // it: its gradient for this pass is complete.
                    on_leaf(&node)?;
                }
                None => {
                    return Err(Error::invalid(
                        "backward",
                        "the graph was already consumed by an earlier backward (run the forward pass again)",
                    ));
                }
                Some(mut rec) => {
                    let inputs = std::mem::take(&mut rec.inputs);
                    // The gradients the inputs already have, offered to the op's kernels.
                    let mut acc: SmallVec<[Option<Tensor>; 3]> = inputs
                        .iter()
                        .map(|i| {
                            if i.requires_grad() {
                                grads.remove(&i.id())
                            } else {
                                None
                            }
                        })
                        .collect();
                    let gs = rec.back.backward_acc(&inputs, &node, g, &mut acc)?;
                    if gs.len() != inputs.len() {
                        return Err(Error::Internal(format!(
                            "{}: {} gradients for {} inputs",
                            rec.name,
                            gs.len(),
                            inputs.len()
                        )));
                    }
                    drop(rec);
                    for ((input, gi), prev) in inputs.into_iter().zip(gs).zip(acc) {
                        if !input.requires_grad() {
                            continue;
                        }
                        // An input listed twice finds the first listing's sum in the map.
                        let prev = prev.or_else(|| grads.remove(&input.id()));
                        let sum = match (prev, gi) {
                            (Some(prev), Some(gi)) => prev.add(&fit_grad(&input, gi)?)?,
                            (None, Some(gi)) => fit_grad(&input, gi)?,
                            (Some(prev), None) => prev,
                            (None, None) => continue,
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
        return Err(Error::Internal(format!(
            "gradient of shape {:?} for an input of shape {:?}",
            g.shape(),
            input.shape()
        )));
    }
    g.to_dtype(input.dtype())
}

fn accumulate_leaf(leaf: &Tensor, g: Tensor) -> Result<()> {
    // Kept dense: optimizers and users read gradients as plain buffers.
    let g = g.contiguous()?;
    let mut slot = lock(&leaf.0.grad);
    *slot = Some(match slot.take() {
        Some(prev) => prev.add(&g)?,
        None => g,
    });
    Ok(())
}

/// Every tensor reachable from `root` through recorded nodes, root first, each after all the
/// tensors computed from it.
fn topo_order(root: &Tensor) -> Vec<Tensor> {
    let mut seen = FastSet::default();
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
        // The inputs go straight onto the stack (a copy of the list was an allocation a
        // node), above the tensor's own post-order entry.
        let at = stack.len();
        if let Some(n) = lock(&t.0.node).as_ref() {
            for i in &n.inputs {
                if i.requires_grad() && !seen.contains(&i.id()) {
                    stack.push((i.clone(), false));
                }
            }
        }
        stack.insert(at, (t, true));
    }
    post.reverse();
    post
}
