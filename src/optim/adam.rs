//! Adam and AdamW.

use super::{Control, Optimizer, Slots, named};
use crate::error::Result;
use crate::kernels::optim::Rule;
use crate::tensor::Tensor;

/// Adam (L2 weight decay added to the gradient) or AdamW (decoupled weight decay).
pub struct Adam {
    slots: Slots,
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    weight_decay: f32,
    decoupled: bool,
    t: u64,
}

impl Adam {
    /// Adam with the usual betas (0.9, 0.999) and eps 1e-8.
    pub fn new(params: Vec<(String, Tensor)>, lr: f32) -> Result<Adam> {
        Adam::with(params, lr, (0.9, 0.999), 1e-8, 0.0, false)
    }

    /// AdamW: decoupled weight decay.
    pub fn adamw(params: Vec<(String, Tensor)>, lr: f32, weight_decay: f32) -> Result<Adam> {
        Adam::with(params, lr, (0.9, 0.999), 1e-8, weight_decay, true)
    }

    /// Every hyper-parameter.
    pub fn with(
        params: Vec<(String, Tensor)>,
        lr: f32,
        betas: (f32, f32),
        eps: f32,
        weight_decay: f32,
        decoupled: bool,
    ) -> Result<Adam> {
        Ok(Adam {
            slots: named(params, 2)?,
            lr,
            beta1: betas.0,
            beta2: betas.1,
            eps,
            weight_decay,
            decoupled,
            t: 0,
        })
    }
}

impl Optimizer for Adam {
    fn step_with(&mut self, gmul: f32, control: Option<&Control>) -> Result<()> {
        self.t += 1;
        let rule = Rule::Adam {
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            step: self.t,
            decoupled: self.decoupled,
        };
        self.slots
            .update(rule, self.lr, self.weight_decay, gmul, control)
    }
    fn steps(&self) -> u64 {
        self.t
    }
    fn set_steps(&mut self, steps: u64) {
        self.t = steps;
    }
    slot_methods!(&["m", "v"]);
}
