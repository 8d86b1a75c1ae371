//! Optimizers with fused update kernels (up to four parameters a dispatch, state on the
//! device), learning-rate schedules, gradient-norm utilities, and guarded steps (clipping,
//! overflow checks, loss scaling) decided on the device.
//!
//! An optimizer ([`Sgd`], [`Adam`], which is also AdamW) is built from a module's named
//! parameters and updates them in place; a step is `zero_grad`, `backward` on the loss, then
//! [`Optimizer::step`]. f16 and bf16 parameters get f32 master weights in the optimizer.
//! [`GradScaler`] wraps the step for mixed precision (loss scaling, skipping overflowed
//! steps) and clipping ([`guarded_step`] is the same without a scaler), and [`LrSchedule`]
//! gives the learning rate of each step ([`Optimizer::set_lr`]). [`Optimizer::state`] names
//! the state that training checkpoints save.

/// The `Optimizer` methods every optimizer shares, for a type with `slots` and `lr` fields;
/// `$state` names its per-parameter state tensors, in slot order.
macro_rules! slot_methods {
    ($state:expr) => {
        fn state(&self) -> Vec<(String, Tensor)> {
            crate::optim::slot_state(&self.slots, $state)
        }
        fn zero_grad(&self) {
            self.slots.list.iter().for_each(|s| s.p.zero_grad());
        }
        fn lr(&self) -> f32 {
            self.lr
        }
        fn set_lr(&mut self, lr: f32) {
            self.lr = lr;
        }
        fn params(&self) -> Vec<(String, Tensor)> {
            self.slots
                .list
                .iter()
                .map(|s| (s.name.clone(), s.p.clone()))
                .collect()
        }
        fn param_tensors(&self) -> Vec<Tensor> {
            self.slots.list.iter().map(|s| s.p.clone()).collect()
        }
        fn set_groups(&mut self, groups: &[crate::optim::Group]) -> Result<()> {
            self.slots.set_groups(groups);
            Ok(())
        }
    };
}

mod adam;
mod scaler;
mod schedule;
mod sgd;

pub use adam::Adam;
pub use scaler::{Control, GradScaler, NonFinite, StepReport, guarded_step};
pub use schedule::LrSchedule;
pub use sgd::Sgd;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::optim::{self as ko, Rule, Slot};
use crate::tensor::Tensor;

/// What every optimizer does.
pub trait Optimizer {
    /// Updates every parameter that has a gradient, with the gradient multiplied by `gmul`
    /// (1/loss-scale, a clipping coefficient, 1/accumulation steps, or their product) and, with
    /// a `control`, by the multiplier a guarded step decided on the device; where it decided
    /// to skip the step (inf or NaN in the gradients), the update changes nothing on the
    /// device (the host's step count still advances: [`GradScaler`] takes it back).
    fn step_with(&mut self, gmul: f32, control: Option<&Control>) -> Result<()>;
    /// [`Optimizer::step_with`] without a control block.
    fn step_scaled(&mut self, gmul: f32) -> Result<()> {
        self.step_with(gmul, None)
    }
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
    /// The parameters without their names: what a step reads every time (cloning every
    /// name was most of a guarded step's host allocations).
    fn param_tensors(&self) -> Vec<Tensor> {
        self.params().into_iter().map(|(_, p)| p).collect()
    }
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
    /// Gives parameters their group's learning-rate scale and weight decay: each parameter
    /// takes the first group whose pattern its name matches ([`names::matches`](crate::names::matches)),
    /// the others the optimizer's own (scale 1). Replaces earlier groups. An optimizer without
    /// groups (one written outside this crate that does not override this) refuses them.
    ///
    /// ```
    /// use wgrad::optim::{Adam, Group, Optimizer};
    /// # fn main() -> wgrad::Result<()> {
    /// let dev = wgrad::Device::new()?;
    /// let w = dev.tensor(&[1.0f32], &[1])?.variable();
    /// let b = dev.tensor(&[1.0f32], &[1])?.variable();
    /// let mut opt = Adam::adamw(vec![("fc.weight".into(), w.clone()), ("fc.bias".into(), b.clone())], 0.1, 0.5)?;
    /// opt.set_groups(&Group::no_decay(&["*.bias"]))?;
    /// w.mul_scalar(0.0)?.sum_all()?.backward()?; // zero gradients: only decay moves a value
    /// b.mul_scalar(0.0)?.sum_all()?.backward()?;
    /// opt.step()?;
    /// assert!(w.to_vec::<f32>()?[0] < 1.0); // decayed
    /// assert_eq!(b.to_vec::<f32>()?[0], 1.0); // no decay on biases
    /// # Ok(())
    /// # }
    /// ```
    fn set_groups(&mut self, groups: &[Group]) -> Result<()> {
        let _ = groups;
        Err(Error::invalid(
            "Optimizer::set_groups",
            "this optimizer has no parameter groups",
        ))
    }
}

/// Hyper-parameters for the parameters whose names match `pattern` (see
/// [`Optimizer::set_groups`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    /// A name pattern, `*` for any run of characters ([`names::matches`](crate::names::matches)).
    pub pattern: String,
    /// The group's learning rate over the optimizer's (schedules set the optimizer's).
    pub lr_scale: f32,
    /// The group's weight decay; `None` keeps the optimizer's.
    pub weight_decay: Option<f32>,
}

impl Group {
    /// The usual rule as groups: no weight decay on the parameters matching `patterns`
    /// (norms, biases and embeddings, by the model's names).
    pub fn no_decay(patterns: &[&str]) -> Vec<Group> {
        patterns
            .iter()
            .map(|p| Group {
                pattern: (*p).to_string(),
                lr_scale: 1.0,
                weight_decay: Some(0.0),
            })
            .collect()
    }
}

/// Named state tensors of `slots` (see [`Optimizer::state`]).
pub(crate) fn slot_state(slots: &Slots, names: &[&str]) -> Vec<(String, Tensor)> {
    let mut v = Vec::new();
    for s in &slots.list {
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
    /// Its group's learning-rate scale and weight decay (`None`: the optimizer's).
    pub lr_scale: f32,
    pub weight_decay: Option<f32>,
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
            lr_scale: 1.0,
            weight_decay: None,
            master,
            state,
        })
    }

    /// The blocks one update of this parameter touches, with `g` its gradient (dense, in the
    /// parameter's dtype).
    fn slot<'a>(&'a self, g: &'a Tensor) -> Result<Slot<'a>> {
        let op = "optimizer step";
        // Without state or master weights the kernel still binds something there; the
        // parameter itself is valid memory of the right size and is never written through it.
        let dummy = self.master.as_ref().unwrap_or(&self.p).dense_block(op)?;
        let state = match self.state.as_slice() {
            [] => [dummy, dummy],
            [a] => [a.dense_block(op)?, dummy],
            [a, b, ..] => [a.dense_block(op)?, b.dense_block(op)?],
        };
        Ok(Slot {
            p: self.p.dense_block(op)?,
            p_dtype: self.p.dtype(),
            g: g.dense_block(op)?,
            master: match &self.master {
                Some(m) => Some(m.dense_block(op)?),
                None => None,
            },
            state,
            n: self.p.numel(),
        })
    }
}

/// An optimizer's parameters with their state, and the control block of a plain step
/// (multiplier 1, stepped), which the update kernels read when no guarded step decided.
pub(crate) struct Slots {
    pub list: Vec<Slotted>,
    plain: Option<Control>,
}

impl Slots {
    /// Sets each parameter's group (see [`Optimizer::set_groups`]).
    pub(crate) fn set_groups(&mut self, groups: &[Group]) {
        for s in &mut self.list {
            let g = groups
                .iter()
                .find(|g| crate::names::matches(&g.pattern, &s.name));
            s.lr_scale = g.map_or(1.0, |g| g.lr_scale);
            s.weight_decay = g.and_then(|g| g.weight_decay);
        }
    }

    /// Every parameter's update, with `control` or the plain one.
    pub(crate) fn update(
        &self,
        rule: Rule,
        lr: f32,
        wd: f32,
        gmul: f32,
        control: Option<&Control>,
    ) -> Result<()> {
        let Some(ctl) = control.or(self.plain.as_ref()) else {
            return Ok(());
        };
        let ctl = ctl.block()?;
        // Every parameter with a gradient, the gradient dense and in the parameter's dtype.
        // Sized up front: grown from empty, the vector's reallocations past 1 KiB made glibc
        // consolidate its free lists, 6% of the recording thread's instructions a GPT step.
        let mut ready = Vec::with_capacity(self.list.len());
        for s in &self.list {
            if let Some(g) = s.p.grad() {
                ready.push((s, g.to_dtype(s.p.dtype())?.contiguous()?));
            }
        }
        let Some((first, _)) = ready.first() else {
            return Ok(());
        };
        let dev = first.p.device();
        // Consecutive parameters of one group share a dispatch (the GPT's 76 updates were 76
        // launches).
        let hyper = |s: &Slotted| (s.lr_scale, s.weight_decay.unwrap_or(wd));
        let mut rest = ready.as_slice();
        while let Some((first, _)) = rest.first() {
            let h = hyper(first);
            let run = rest.iter().take_while(|(s, _)| hyper(s) == h).count();
            let (same, next) = rest.split_at(run);
            for group in same.chunks(ko::group_len(dev)) {
                let slots = group
                    .iter()
                    .map(|(s, g)| s.slot(g))
                    .collect::<Result<Vec<_>>>()?;
                ko::step(dev, &slots, rule, lr * h.0, h.1, gmul, ctl)?;
            }
            rest = next;
        }
        Ok(())
    }
}

/// The f32 sums of squares of the gradients of `params` (those that have one), as partial
/// sums in one f32 tensor (to sum), or `None` when no parameter has a gradient.
pub(crate) fn sum_of_squares(params: &[Tensor]) -> Result<Option<Tensor>> {
    // Sized up front, as in `Slots::update`.
    let mut grads = Vec::with_capacity(params.len());
    for g in params.iter().filter_map(|p| p.grad()) {
        grads.push(g.contiguous()?);
    }
    let Some(first) = grads.first() else {
        return Ok(None);
    };
    if grads.iter().any(|g| !g.device().same(first.device())) {
        return Err(Error::invalid(
            "grad_norm",
            "the gradients live on more than one device",
        ));
    }
    let total: usize = grads.iter().map(|g| ko::sumsq_parts(g.numel())).sum();
    let partial = Tensor::uninit(first.device(), &[total], DType::F32)?;
    let op = "grad_norm";
    let mut at = 0;
    for group in grads.chunks(ko::sumsq_group(first.device())) {
        let xs = group
            .iter()
            .map(|g| Ok((g.dense_block(op)?, g.dtype(), g.numel())))
            .collect::<Result<Vec<_>>>()?;
        ko::sumsq(first.device(), &xs, partial.dense_block(op)?, at)?;
        at += group
            .iter()
            .map(|g| ko::sumsq_parts(g.numel()))
            .sum::<usize>();
    }
    Ok(Some(partial))
}

/// The global L2 norm of the gradients of `params` (those that have one), accumulated in f32.
/// Reads one number back from the device. Infinite or NaN when any gradient element is.
pub fn grad_norm(params: &[(String, Tensor)]) -> Result<f32> {
    let params: Vec<Tensor> = params.iter().map(|(_, p)| p.clone()).collect();
    match sum_of_squares(&params)? {
        Some(partial) => Ok(crate::autograd::no_grad(|| partial.sum_all())?
            .to_scalar()?
            .sqrt()),
        None => Ok(0.0),
    }
}

/// The multiplier that scales gradients of global norm `norm` down to at most `max_norm`.
pub fn clip_coefficient(norm: f32, max_norm: f32) -> f32 {
    if norm > max_norm && norm.is_finite() {
        max_norm / (norm + 1e-6)
    } else {
        1.0
    }
}

pub(crate) fn named(params: Vec<(String, Tensor)>, n_state: usize) -> Result<Slots> {
    // The update kernels read a control block on the parameters' device.
    if let Some((_, first)) = params.first()
        && params.iter().any(|(_, p)| !p.device().same(first.device()))
    {
        return Err(Error::invalid(
            "optimizer",
            "the parameters live on more than one device (use one optimizer per device)",
        ));
    }
    let plain = match params.first() {
        Some((_, p)) => Some(Control::plain(p.device())?),
        None => None,
    };
    // Frozen parameters get no gradient, so no state either.
    let list = params
        .into_iter()
        .filter(|(_, p)| !p.is_frozen())
        .map(|(n, p)| Slotted::new(n, p, n_state))
        .collect::<Result<_>>()?;
    Ok(Slots { list, plain })
}
