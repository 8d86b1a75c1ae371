//! A model cut into stages on different devices, with micro-batches flowing through them.
//!
//! The forward pass runs as a wavefront: stage s is given every micro-batch in order, and
//! after each one the move of its output to stage s + 1 is queued ([`Tensor::to_device_async`])
//! without waiting. Stage s + 1 then waits for micro-batch 0's activation while stage s is
//! still computing micro-batch 1 and later: the devices work at the same time, and the host
//! waits only for what the computation did not cover (reported). The losses of all micro-batches
//! are summed (weighted by their rows) and one backward pass walks the graph across the
//! devices, each transfer moving its gradient back to the stage it came from. Gradients of every
//! stage's parameters end up on that stage's device, as if the model had run unsplit.

use crate::device::Device;
use crate::error::{Error, Result};
use crate::nn::Module;
use crate::ops::transfer::Transfer;
use crate::tensor::Tensor;
use std::ops::Range;
use std::time::{Duration, Instant};

/// What one [`Pipeline::train_step`] did.
#[derive(Clone, Debug)]
pub struct PipelineReport {
    /// The batch's loss (the row-weighted mean of the micro-batches' losses).
    pub loss: f32,
    /// Wall time of the step (forward, loss, backward).
    pub total: Duration,
    /// Time the host spent waiting for activations to come back from a stage in the forward
    /// pass: the transfer time the computation did not hide.
    pub transfer_wait: Duration,
}

/// Stages on devices; see the module documentation.
pub struct Pipeline {
    stages: Vec<(Device, Box<dyn Module>)>,
}

impl Pipeline {
    /// A pipeline of `(device, stage)` pairs, applied in order. Each stage's parameters must
    /// live on its device.
    pub fn new(stages: Vec<(Device, Box<dyn Module>)>) -> Result<Pipeline> {
        if stages.is_empty() {
            return Err(Error::invalid("Pipeline", "no stages"));
        }
        for (s, (dev, m)) in stages.iter().enumerate() {
            if let Some((name, _)) = m.params().iter().find(|(_, p)| !p.device().same(dev)) {
                return Err(Error::invalid(
                    "Pipeline",
                    format!("stage {s}'s parameter {name} is not on the stage's device"),
                ));
            }
        }
        Ok(Pipeline { stages })
    }

    /// The stages.
    pub fn stages(&self) -> &[(Device, Box<dyn Module>)] {
        &self.stages
    }

    /// Every parameter, named `<stage>.<name>`.
    pub fn params(&self) -> Vec<(String, Tensor)> {
        self.stages
            .iter()
            .enumerate()
            .flat_map(|(s, (_, m))| {
                m.params()
                    .into_iter()
                    .map(move |(n, t)| (format!("{s}.{n}"), t))
            })
            .collect()
    }

    /// Training or evaluation mode for every stage.
    pub fn train(&self, on: bool) {
        self.stages.iter().for_each(|(_, m)| m.train(on));
    }

    /// The whole batch through every stage (no micro-batches): the output on the last device.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (dev, m) in &self.stages {
            h = m.forward(&h.to_device(dev)?)?;
        }
        Ok(h)
    }

    /// Forward in `micro` micro-batches (rows of `x` split as evenly as possible), the loss of
    /// each from `loss(output, rows)` (a one-element mean over those rows, on the last device),
    /// and one backward pass of the batch's mean loss. Step the stages' optimizers afterwards.
    pub fn train_step(
        &self,
        x: &Tensor,
        micro: usize,
        loss: impl Fn(&Tensor, Range<usize>) -> Result<Tensor>,
    ) -> Result<PipelineReport> {
        let t0 = Instant::now();
        let rows = x.shape().first().copied().unwrap_or(0);
        if micro == 0 || micro > rows {
            return Err(Error::invalid(
                "Pipeline::train_step",
                format!("{micro} micro-batches for a batch of {rows} rows"),
            ));
        }
        let ranges: Vec<Range<usize>> = (0..micro)
            .map(|i| (i * rows / micro)..((i + 1) * rows / micro))
            .collect();
        let mut wait = Duration::ZERO;
        let first = &self.stages[0].0;
        let x = x.to_device(first)?;
        // Micro-batches entering the current stage: ready tensors for stage 0, transfers in
        // flight after it.
        enum Input {
            Ready(Tensor),
            Moving(Transfer),
        }
        let mut inputs: Vec<Input> = ranges
            .iter()
            .map(|r| x.narrow(0, r.start, r.len()).map(Input::Ready))
            .collect::<Result<_>>()?;
        let last = self.stages.len() - 1;
        for (s, (_, stage)) in self.stages.iter().enumerate() {
            let mut next = Vec::with_capacity(micro);
            for input in inputs {
                let h = match input {
                    Input::Ready(t) => t,
                    Input::Moving(tr) => {
                        let (t, w) = tr.wait_timed()?;
                        wait += w;
                        t
                    }
                };
                let y = stage.forward(&h)?;
                next.push(if s < last {
                    Input::Moving(y.to_device_async(&self.stages[s + 1].0)?)
                } else {
                    Input::Ready(y)
                });
            }
            inputs = next;
        }
        let mut total: Option<Tensor> = None;
        for (input, r) in inputs.into_iter().zip(&ranges) {
            let Input::Ready(y) = input else {
                return Err(Error::Internal(
                    "a micro-batch did not reach the last stage".into(),
                ));
            };
            let l = loss(&y, r.clone())?;
            if l.numel() != 1 {
                return Err(Error::shape(
                    "Pipeline::train_step",
                    format!("the loss must be one element, got {:?}", l.shape()),
                ));
            }
            let part = l.reshape(&[])?.mul_scalar(r.len() as f32 / rows as f32)?;
            total = Some(match total {
                Some(t) => t.add(&part)?,
                None => part,
            });
        }
        let total = total.ok_or_else(|| Error::Internal("no micro-batches".into()))?;
        total.backward()?;
        Ok(PipelineReport {
            loss: total.to_scalar()?,
            total: t0.elapsed(),
            transfer_wait: wait,
        })
    }
}
