//! Stochastic gradient descent with momentum, Nesterov momentum and weight decay.

use super::{Control, Optimizer, Slots, named};
use crate::error::Result;
use crate::kernels::optim::Rule;
use crate::tensor::Tensor;

/// SGD: `b = momentum * b + g + wd * w; w -= lr * (nesterov ? g + momentum * b : b)`.
///
/// ```
/// use wgrad::optim::{Optimizer, Sgd};
/// # fn main() -> wgrad::Result<()> {
/// let dev = wgrad::Device::new()?;
/// let w = dev.tensor(&[1.0f32, -2.0], &[2])?.variable();
/// let mut opt = Sgd::new(vec![("w".into(), w.clone())], 0.1, 0.0, 0.0, false)?;
/// opt.zero_grad();
/// w.square()?.sum_all()?.backward()?; // gradient 2w
/// opt.step()?; // w -= 0.1 * 2w, in place
/// let v = w.to_vec::<f32>()?;
/// assert!((v[0] - 0.8).abs() < 1e-6 && (v[1] + 1.6).abs() < 1e-6);
/// # Ok(())
/// # }
/// ```
pub struct Sgd {
    slots: Slots,
    lr: f32,
    momentum: f32,
    weight_decay: f32,
    nesterov: bool,
}

impl Sgd {
    /// SGD over named parameters (variables).
    pub fn new(
        params: Vec<(String, Tensor)>,
        lr: f32,
        momentum: f32,
        weight_decay: f32,
        nesterov: bool,
    ) -> Result<Sgd> {
        let n_state = if momentum > 0.0 { 1 } else { 0 };
        Ok(Sgd {
            slots: named(params, n_state)?,
            lr,
            momentum,
            weight_decay,
            nesterov,
        })
    }
}

impl Optimizer for Sgd {
    fn step_with(&mut self, gmul: f32, control: Option<&Control>) -> Result<()> {
        let rule = Rule::Sgd {
            momentum: self.momentum,
            nesterov: self.nesterov,
        };
        self.slots
            .update(rule, self.lr, self.weight_decay, gmul, control)
    }
    slot_methods!(&["momentum"]);
}
