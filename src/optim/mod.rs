//! Optimizers with fused update kernels (one dispatch per parameter, state on the device),
//! learning-rate schedules, and gradient-norm utilities.

/// The `Optimizer` methods every optimizer shares, for a type with `slots` and `lr` fields;
/// `$state` names its per-parameter state tensors, in slot order.
macro_rules! slot_methods {
    ($state:expr) => {
        fn state(&self) -> Vec<(String, Tensor)> {
            crate::optim::slot_state(&self.slots, $state)
        }
        fn zero_grad(&self) {
            self.slots.iter().for_each(|s| s.p.zero_grad());
        }
        fn lr(&self) -> f32 {
            self.lr
        }
        fn set_lr(&mut self, lr: f32) {
            self.lr = lr;
        }
        fn params(&self) -> Vec<(String, Tensor)> {
            self.slots
                .iter()
                .map(|s| (s.name.clone(), s.p.clone()))
                .collect()
        }
    };
}

mod adam;
mod scaler;
mod schedule;
mod sgd;

pub use adam::Adam;
pub use scaler::{GradScaler, NonFinite, StepReport, guarded_step};
pub use schedule::LrSchedule;
pub use sgd::Sgd;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::optim::{self as ko, Rule, Slot};
use crate::tensor::Tensor;

/// What every optimizer does.
pub trait Optimizer {
    /// Updates every parameter that has a gradient, with the gradient multiplied by `gmul`
    /// (1/loss-scale, a clipping coefficient, 1/accumulation steps, or their product).
    fn step_scaled(&mut self, gmul: f32) -> Result<()>;
    /// [`Optimizer::step_scaled`] with a multiplier of 1.
    fn step(&mut self) -> Result<()> {
        self.step_scaled(1.0)
    }
    /// Clears every parameter's gradient.
    fn zero_grad(&self);
    /// The current learning rate.
    fn lr(&self) -> f32;
    /// Sets the learning rate (schedules call this every step).
    fn set_lr(&mut self, lr: f32);
    /// The parameters, by name.
    fn params(&self) -> Vec<(String, Tensor)>;
    /// The state kept per parameter, by name: `<param>.<state>` (Adam's `m` and `v`, SGD's
    /// `momentum`) and `<param>.master` (f32 master weights of f16 parameters). Writing into
    /// these tensors restores the state (training checkpoints do).
    fn state(&self) -> Vec<(String, Tensor)>;
    /// Steps taken, where the update depends on it (Adam's bias correction); 0 otherwise.
    fn steps(&self) -> u64 {
        0
    }
    /// Sets the step count (when restoring a checkpoint).
    fn set_steps(&mut self, _steps: u64) {}
}

/// Named state tensors of `slots` (see [`Optimizer::state`]).
pub(crate) fn slot_state(slots: &[Slotted], names: &[&str]) -> Vec<(String, Tensor)> {
    let mut v = Vec::new();
    for s in slots {
        for (t, n) in s.state.iter().zip(names) {
            v.push((format!("{}.{n}", s.name), t.clone()));
        }
        if let Some(m) = &s.master {
            v.push((format!("{}.master", s.name), m.clone()));
        }
    }
    v
}

/// A parameter with its optimizer state.
pub(crate) struct Slotted {
    pub name: String,
    pub p: Tensor,
    /// f32 master weights for f16 parameters.
    pub master: Option<Tensor>,
    /// f32 state tensors (momentum; or Adam's m and v).
    pub state: Vec<Tensor>,
}

impl Slotted {
    pub(crate) fn new(name: String, p: Tensor, n_state: usize) -> Result<Slotted> {
        if !p.is_variable() {
            return Err(Error::invalid(
                "optimizer",
                format!("parameter {name} is not a variable (make it with .variable())"),
            ));
        }
        if !p.layout().is_dense() {
            return Err(Error::invalid(
                "optimizer",
                format!(
                    "parameter {name} is a view ({:?}); give the optimizer the tensor it views",
                    p.shape()
                ),
            ));
        }
        let master = match p.dtype() {
            DType::F16 | DType::BF16 => Some(crate::autograd::no_grad(|| p.to_dtype(DType::F32))?),
            DType::F32 => None,
            DType::U32 => {
                return Err(Error::DType {
                    op: "optimizer",
                    expected: DType::F32,
                    got: DType::U32,
                });
            }
        };
        let state = (0..n_state)
            .map(|_| Tensor::zeros(p.device(), p.shape(), DType::F32))
            .collect::<Result<Vec<_>>>()?;
        Ok(Slotted {
            name,
            p,
            master,
            state,
        })
    }

    /// Runs one fused update if the parameter has a gradient.
    pub(crate) fn update(&self, rule: Rule, lr: f32, wd: f32, gmul: f32) -> Result<()> {
        let Some(g) = self.p.grad() else {
            return Ok(());
        };
        let g = g.to_dtype(self.p.dtype())?.contiguous()?;
        let op = "optimizer step";
        // Without state or master weights the kernel still binds something there; the
        // parameter itself is valid memory of the right size and is never written through it.
        let dummy = self.master.as_ref().unwrap_or(&self.p).dense_block(op)?;
        let state: Vec<_> = if self.state.is_empty() {
            vec![dummy]
        } else {
            self.state
                .iter()
                .map(|t| t.dense_block(op))
                .collect::<Result<Vec<_>>>()?
        };
        let slot = Slot {
            p: self.p.dense_block(op)?,
            p_dtype: self.p.dtype(),
            g: g.dense_block(op)?,
            master: match &self.master {
                Some(m) => Some(m.dense_block(op)?),
                None => None,
            },
            n: self.p.numel(),
        };
        ko::step(self.p.device(), &slot, rule, lr, wd, gmul, &state)
    }
}

/// The global L2 norm of the gradients of `params` (those that have one), accumulated in f32.
/// Reads one number back from the device. Infinite or NaN when any gradient element is.
pub fn grad_norm(params: &[(String, Tensor)]) -> Result<f32> {
    let mut parts = Vec::new();
    for (_, p) in params {
        let Some(g) = p.grad() else { continue };
        let g = g.contiguous()?;
        let n = g.numel();
        let partial = Tensor::uninit(g.device(), &[ko::sumsq_parts(n)], DType::F32)?;
        ko::sumsq(
            g.device(),
            g.dense_block("grad_norm")?,
            g.dtype(),
            n,
            partial.dense_block("grad_norm")?,
        )?;
        parts.push(partial);
    }
    if parts.is_empty() {
        return Ok(0.0);
    }
    let refs: Vec<&Tensor> = parts.iter().collect();
    let total = crate::autograd::no_grad(|| Tensor::cat(&refs, 0)?.sum_all())?;
    Ok(total.to_scalar()?.sqrt())
}

/// The multiplier that scales gradients of global norm `norm` down to at most `max_norm`.
pub fn clip_coefficient(norm: f32, max_norm: f32) -> f32 {
    if norm > max_norm && norm.is_finite() {
        max_norm / (norm + 1e-6)
    } else {
        1.0
    }
}

pub(crate) fn named(params: Vec<(String, Tensor)>, n_state: usize) -> Result<Vec<Slotted>> {
    params
        .into_iter()
        .map(|(n, p)| Slotted::new(n, p, n_state))
        .collect()
}
