//! Adam and AdamW.

use super::{Control, Optimizer, Slots, named};
use crate::error::Result;
use crate::kernels::optim::Rule;
use crate::tensor::Tensor;

/// Adam (L2 weight decay added to the gradient) or AdamW (decoupled weight decay).
///
/// A training step on a model: gradients cleared, the loss's backward pass, the update.
///
/// ```
/// use wgrad::nn::{Linear, Module};
/// use wgrad::optim::{Adam, Optimizer};
/// use wgrad::DType;
/// # fn main() -> wgrad::Result<()> {
/// let dev = wgrad::Device::new()?;
/// let model = Linear::new(&dev, 4, 3, true, DType::F32)?;
/// let mut opt = Adam::adamw(model.params(), 1e-2, 0.01)?;
/// let x = dev.randn(&[8, 4], DType::F32)?;
/// let labels = dev.tensor(&[0u32, 1, 2, 0, 1, 2, 0, 1], &[8])?;
/// let first = model.forward(&x)?.cross_entropy(&labels)?.to_scalar()?;
/// for _ in 0..20 {
///     opt.zero_grad();
///     model.forward(&x)?.cross_entropy(&labels)?.backward()?;
///     opt.step()?;
/// }
/// assert_eq!(opt.steps(), 20);
/// assert!(model.forward(&x)?.cross_entropy(&labels)?.to_scalar()? < first);
/// # Ok(())
/// # }
/// ```
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
    ///
    /// Adam's first step moves every parameter by about `lr` against the sign of its
    /// gradient, whatever the gradient's size:
    ///
    /// ```
    /// use wgrad::optim::{Adam, Optimizer};
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// let w = dev.tensor(&[1.0f32, -2.0], &[2])?.variable();
    /// let mut opt = Adam::new(vec![("w".into(), w.clone())], 0.1)?;
    /// w.square()?.sum_all()?.backward()?; // gradient [2, -4]
    /// opt.step()?;
    /// let v = w.to_vec::<f32>()?;
    /// assert!((v[0] - 0.9).abs() < 1e-5 && (v[1] + 1.9).abs() < 1e-5);
    /// # Ok(())
    /// # }
    /// ```
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
